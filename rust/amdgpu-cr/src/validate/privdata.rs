//! KFD's private data against what KFD writes: an image is input from
//! elsewhere, and the kernel's RESTORE copies MQDs and control stacks by
//! the sizes the blob declares (kernels before 2026 trusted them), so every
//! value criu-rocm can know is checked before any KFD ioctl:
//!
//! * the blob's version is the kernel's, XNACK mode 0 or 1;
//! * each queue runs on a GPU of the image, has a type a process owns and
//!   a format that type has, ids within KFD's range and unique, an SDMA
//!   engine queue the GPU has (its device record's engine counts), an MQD
//!   of exactly KFD's size for its type and a control stack of the size
//!   KFD computes from the GPU's CU and wave counts (none on SDMA queues),
//!   its ring, end-of-pipe buffer and context save area inside one BO of
//!   the process (or one of its SVM ranges), its read and write pointers in
//!   the process' memory;
//! * each event has a type KFD knows and an id in that type's range, once;
//! * each SVM range is page aligned, inside the process' mappings
//!   (`mm-<pid>.img`) and apart from the others.
//!
//! The device records tell neither the GFX generation nor the XCC count,
//! so a size passes when some generation and XCC count
//! ([`criu::CWSR_GENERATIONS`], up to [`criu::MAX_XCC`]) make KFD write it.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::offset_of;
use std::path::Path;

use kfd_abi::criu::{self, queue_format, queue_type, CwsrProps};
use kfd_abi::layout::{
    kfd_criu_event_priv_data as EventRec, kfd_criu_queue_priv_data as QueueRec,
    kfd_criu_svm_range_priv_data as SvmRec, KFD_CRIU_PRIV_VERSION,
};

mod host;
pub use host::check_host;

use super::Refusal;
use crate::ids::GpuId;
use crate::image::KfdImage;
use crate::privdata::Object;
use crate::proto::KfdDeviceEntry;

const PAGE: u64 = 4096;
/// Above every user address of x86-64 (57-bit, five-level paging).
const USER_LIMIT: u64 = 1 << 57;

/// The checks of the module documentation, on the image `name` of the
/// directory `dir`.  A blob that does not parse is [`super::check_kfd`]'s
/// refusal already: nothing more to say here then.
pub fn check(dir: &Path, name: &str, image: &KfdImage) -> Result<(), Refusal> {
    let m = &image.msg;
    let Ok(objects) = blob_objects(image) else {
        return Ok(());
    };
    let vmas = crate::criu_images::vmas(dir, m.pid)
        .map_err(|e| Refusal::new(format!("mm-{}.img", m.pid), None, "", e))?;
    Blob {
        name,
        image,
        vmas: vmas.as_deref(),
    }
    .check(&objects)
}

/// The objects of the image's blob, with the BO record size recorded at
/// dump (or the one the blob parses with); why not when it does not parse.
fn blob_objects(image: &KfdImage) -> Result<Vec<Object>, String> {
    let m = &image.msg;
    let record = match m.priv_bo_record_size {
        Some(size) => u64::from(size),
        None => image
            .priv_layout()
            .map(|l| l.bo_record_size)
            .unwrap_or(crate::privdata::BO_RECORD_SIZES[1]),
    };
    crate::privdata::objects(
        &m.priv_data,
        m.num_of_gpus,
        m.num_of_bos,
        m.num_of_objects,
        record,
    )
}

/// One image's blob and what it is checked against.
struct Blob<'a> {
    name: &'a str,
    image: &'a KfdImage,
    /// The process' mappings, when the directory has its `mm-<pid>.img`.
    vmas: Option<&'a [(u64, u64)]>,
}

fn u32_at(b: &[u8], off: u64) -> u32 {
    let at = off as usize;
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_le_bytes(s.try_into().unwrap()))
}

fn u64_at(b: &[u8], off: u64) -> u64 {
    let at = off as usize;
    b.get(at..at + 8)
        .map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap()))
}

/// The SVM ranges `[start, end)` of the blob (unchecked).
fn svm_ranges(blob: &[u8], objects: &[Object]) -> Vec<(u64, u64)> {
    objects
        .iter()
        .filter(|o| o.kind == 2)
        .map(|o| {
            let start = u64_at(blob, o.offset + offset_of!(SvmRec, start_addr) as u64);
            let size = u64_at(blob, o.offset + offset_of!(SvmRec, size) as u64);
            (start, start.saturating_add(size))
        })
        .collect()
}

/// The control stack sizes KFD writes for a compute queue on `dev`: 0 (no
/// context save area) or the node's for some generation and XCC count,
/// once (kernels before the multi-XCC checkpoint) or once per XCC.
fn control_stack_sizes(dev: &KfdDeviceEntry) -> BTreeSet<u32> {
    let mut out = BTreeSet::from([0]);
    for xcc in 1..=criu::MAX_XCC {
        for gfx in criu::CWSR_GENERATIONS {
            let props = CwsrProps {
                gfx_target_version: gfx,
                simd_count: dev.simd_count,
                simd_per_cu: dev.simd_per_cu,
                array_count: dev.array_count,
                simd_arrays_per_engine: dev.simd_arrays_per_engine,
                num_xcc: xcc,
            };
            if let Some(ctl) = criu::ctl_stack_size(&props) {
                out.insert(ctl);
                out.extend(ctl.checked_mul(xcc));
            }
        }
    }
    out
}

impl Blob<'_> {
    fn refuse(&self, gpu: Option<u32>, field: String, reason: String) -> Refusal {
        Refusal::new(self.name, gpu.map(GpuId), field, reason)
    }

    fn check(&self, objects: &[Object]) -> Result<(), Refusal> {
        let blob = &self.image.msg.priv_data;
        let version = u32_at(blob, 0);
        if version != KFD_CRIU_PRIV_VERSION {
            return Err(self.refuse(
                None,
                "priv_data.version".into(),
                format!("is {version}, but kernels write version {KFD_CRIU_PRIV_VERSION}"),
            ));
        }
        let xnack = u32_at(blob, 4);
        if xnack > 1 {
            return Err(self.refuse(
                None,
                "priv_data.xnack_mode".into(),
                format!("is {xnack}, not 0 or 1"),
            ));
        }
        let svm = svm_ranges(blob, objects);
        self.check_svm(&svm)?;
        let mut queue_ids = BTreeMap::new();
        let mut doorbells = BTreeMap::new();
        let mut events = BTreeSet::new();
        let (mut nq, mut ne) = (0usize, 0usize);
        for o in objects {
            match o.kind {
                0 => {
                    self.check_queue(nq, o.offset, &svm, &mut queue_ids, &mut doorbells)?;
                    nq += 1;
                }
                1 => {
                    self.check_event(ne, o.offset, &mut events)?;
                    ne += 1;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A queue record, in steps: its GPU, its type and format, its ids,
    /// the sizes of its MQD and control stack, the memory it points into.
    fn check_queue(
        &self,
        i: usize,
        at: u64,
        svm: &[(u64, u64)],
        queue_ids: &mut BTreeMap<u32, usize>,
        doorbells: &mut BTreeMap<(u32, u32), usize>,
    ) -> Result<(), Refusal> {
        let (q, dev) = self.queue_record(i, at)?;
        let sdma = q.check_kind()?;
        q.check_ids(queue_ids, doorbells)?;
        if sdma {
            q.check_sdma_sizes(dev)?;
        } else {
            q.check_compute_sizes(dev)?;
        }
        q.check_memory(svm)
    }

    /// Queue `i`'s record at `at`, with the device record of its GPU.
    fn queue_record(&self, i: usize, at: u64) -> Result<(Queue<'_>, &KfdDeviceEntry), Refusal> {
        let q = Queue {
            blob: self,
            i,
            at,
            gpu: 0,
        };
        let gpu = q.u32(offset_of!(QueueRec, gpu_id));
        let Some(dev) = self
            .image
            .msg
            .device_entries
            .iter()
            .find(|d| d.gpu_id == gpu && gpu != 0)
        else {
            return Err(self.refuse(
                None,
                q.field("gpu_id"),
                format!("is {gpu:#x}, which is no GPU of the image's device_entries"),
            ));
        };
        Ok((Queue { gpu, ..q }, dev))
    }
    /// Whether `[addr, addr + size)` lies in one BO of the image.
    fn in_bo(&self, addr: u64, size: u64) -> bool {
        let Some(end) = addr.checked_add(size) else {
            return false;
        };
        self.image
            .msg
            .bo_entries
            .iter()
            .any(|b| addr >= b.addr && b.addr.checked_add(b.size).is_some_and(|e| end <= e))
    }

    fn check_event(&self, i: usize, at: u64, seen: &mut BTreeSet<u32>) -> Result<(), Refusal> {
        let blob = &self.image.msg.priv_data;
        let f32 = |off: usize| u32_at(blob, at + off as u64);
        let field = |f: &str| format!("priv_data.events[{i}].{f}");
        let (ty, id) = (
            f32(offset_of!(EventRec, type_)),
            f32(offset_of!(EventRec, event_id)),
        );
        if ty > criu::LAST_EVENT_TYPE {
            return Err(self.refuse(
                None,
                field("type"),
                format!("is {ty}, an event type KFD does not know"),
            ));
        }
        let signal = ty == kfd_abi::sys::KFD_IOC_EVENT_SIGNAL
            || ty == kfd_abi::sys::KFD_IOC_EVENT_DEBUG_EVENT;
        let in_range = if signal {
            id < criu::SIGNAL_EVENT_LIMIT
        } else {
            id >= criu::FIRST_NONSIGNAL_EVENT_ID
        };
        if !in_range {
            return Err(self.refuse(
                None,
                field("event_id"),
                format!(
                    "is {id:#x}, outside KFD's ids for events of type {ty} ({})",
                    if signal {
                        format!("below {}", criu::SIGNAL_EVENT_LIMIT)
                    } else {
                        format!("from {:#x}", criu::FIRST_NONSIGNAL_EVENT_ID)
                    }
                ),
            ));
        }
        if !seen.insert(id) {
            return Err(self.refuse(
                None,
                field("event_id"),
                format!("is {id:#x}, as an earlier event's"),
            ));
        }
        for (name, v) in [
            ("auto_reset", f32(offset_of!(EventRec, auto_reset))),
            ("signaled", f32(offset_of!(EventRec, signaled))),
        ] {
            if v > 1 {
                return Err(self.refuse(None, field(name), format!("is {v}, not 0 or 1")));
            }
        }
        Ok(())
    }

    fn check_svm(&self, ranges: &[(u64, u64)]) -> Result<(), Refusal> {
        let mut sorted: Vec<(u64, u64, usize)> = Vec::with_capacity(ranges.len());
        for (i, &(start, end)) in ranges.iter().enumerate() {
            let field = format!("priv_data.svm_ranges[{i}]");
            if start % PAGE != 0 || end % PAGE != 0 || end <= start || end > USER_LIMIT {
                return Err(self.refuse(
                    None,
                    field,
                    format!(
                        "is [{start:#x}, {end:#x}), not a page-aligned range of user addresses"
                    ),
                ));
            }
            if let Some(v) = self.vmas {
                if !covered(v, start, end) {
                    return Err(self.refuse(
                        None,
                        field,
                        format!(
                            "is [{start:#x}, {end:#x}), which the process' mappings \
                             (mm-{}.img) do not cover",
                            self.image.msg.pid
                        ),
                    ));
                }
            }
            sorted.push((start, end, i));
        }
        sorted.sort_unstable();
        for w in sorted.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(self.refuse(
                    None,
                    format!("priv_data.svm_ranges[{}]", w[1].2),
                    format!("overlaps svm_ranges[{}]", w[0].2),
                ));
            }
        }
        Ok(())
    }
}

/// Whether `[addr, addr + size)` lies in one of `ranges` (`[start, end)`).
fn inside(ranges: &[(u64, u64)], addr: u64, size: u64) -> bool {
    addr.checked_add(size)
        .is_some_and(|end| ranges.iter().any(|&(s, e)| addr >= s && end <= e))
}

/// Whether `[start, end)` is covered by `ranges` (adjacent ones joined).
fn covered(ranges: &[(u64, u64)], start: u64, end: u64) -> bool {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut at = start;
    for (s, e) in sorted {
        if s <= at && at < e {
            at = e;
        }
        if at >= end {
            return true;
        }
    }
    false
}

/// One queue record of a blob, on the GPU `gpu`.
struct Queue<'a> {
    blob: &'a Blob<'a>,
    i: usize,
    at: u64,
    gpu: u32,
}

impl Queue<'_> {
    fn u32(&self, off: usize) -> u32 {
        u32_at(&self.blob.image.msg.priv_data, self.at + off as u64)
    }

    fn u64(&self, off: usize) -> u64 {
        u64_at(&self.blob.image.msg.priv_data, self.at + off as u64)
    }

    fn field(&self, f: &str) -> String {
        format!("priv_data.queues[{}].{f}", self.i)
    }

    fn refuse(&self, f: &str, why: String) -> Refusal {
        self.blob.refuse(Some(self.gpu), self.field(f), why)
    }

    /// A type KFD gives a process and a format that type has; whether it
    /// is an SDMA queue.
    fn check_kind(&self) -> Result<bool, Refusal> {
        let qtype = self.u32(offset_of!(QueueRec, type_));
        let format = self.u32(offset_of!(QueueRec, format));
        if !queue_type::is_process_queue(qtype) {
            return Err(self.refuse(
                "type",
                format!("is {qtype}, a queue type KFD never gives a process"),
            ));
        }
        let sdma = queue_type::is_sdma(qtype);
        let format_ok = match format {
            queue_format::PM4 => true,
            queue_format::AQL => !sdma,
            _ => false,
        };
        if !format_ok {
            return Err(self.refuse(
                "format",
                format!("is {format}, which a queue of type {qtype} never has"),
            ));
        }
        Ok(sdma)
    }

    /// Queue and doorbell ids within KFD's range, each once (doorbells
    /// once per GPU).
    fn check_ids(
        &self,
        queue_ids: &mut BTreeMap<u32, usize>,
        doorbells: &mut BTreeMap<(u32, u32), usize>,
    ) -> Result<(), Refusal> {
        let q_id = self.u32(offset_of!(QueueRec, q_id));
        let db = self.u32(offset_of!(QueueRec, doorbell_id));
        for (name, v) in [("q_id", q_id), ("doorbell_id", db)] {
            if v >= criu::MAX_QUEUES_PER_PROCESS {
                return Err(self.refuse(
                    name,
                    format!(
                        "is {v}, past KFD's {} queues per process",
                        criu::MAX_QUEUES_PER_PROCESS
                    ),
                ));
            }
        }
        if let Some(j) = queue_ids.insert(q_id, self.i) {
            return Err(self.refuse("q_id", format!("is {q_id}, as queue {j}'s")));
        }
        if let Some(j) = doorbells.insert((self.gpu, db), self.i) {
            return Err(self.refuse(
                "doorbell_id",
                format!("is {db}, as queue {j}'s on the same GPU"),
            ));
        }
        Ok(())
    }

    /// An SDMA queue: an engine queue the GPU has, KFD's SDMA MQD size, no
    /// control stack.
    fn check_sdma_sizes(&self, dev: &KfdDeviceEntry) -> Result<(), Refusal> {
        let mqd = self.u32(offset_of!(QueueRec, mqd_size));
        let ctl = self.u32(offset_of!(QueueRec, ctl_stack_size));
        let engines = (dev.num_sdma_engines + dev.num_sdma_xgmi_engines)
            .saturating_mul(dev.num_sdma_queues_per_engine);
        let id = self.u32(offset_of!(QueueRec, sdma_id));
        if id >= engines {
            return Err(self.refuse(
                "sdma_id",
                format!("is {id}, but the GPU has {engines} SDMA engine queues"),
            ));
        }
        if mqd != criu::SDMA_MQD_SIZE {
            return Err(self.refuse(
                "mqd_size",
                format!(
                    "is {mqd}, but KFD's SDMA MQD is {} bytes",
                    criu::SDMA_MQD_SIZE
                ),
            ));
        }
        if ctl != 0 {
            return Err(self.refuse(
                "ctl_stack_size",
                format!("is {ctl}, but KFD saves no control stack for an SDMA queue"),
            ));
        }
        Ok(())
    }

    /// A compute queue: KFD's MQD size per XCC, a control stack of a size
    /// KFD computes for this GPU.
    fn check_compute_sizes(&self, dev: &KfdDeviceEntry) -> Result<(), Refusal> {
        let mqd = self.u32(offset_of!(QueueRec, mqd_size));
        let ctl = self.u32(offset_of!(QueueRec, ctl_stack_size));
        if mqd == 0
            || !mqd.is_multiple_of(criu::COMPUTE_MQD_SIZE)
            || mqd / criu::COMPUTE_MQD_SIZE > criu::MAX_XCC
        {
            return Err(self.refuse(
                "mqd_size",
                format!(
                    "is {mqd}, but KFD's compute MQD is {} bytes per XCC (at most {} XCCs)",
                    criu::COMPUTE_MQD_SIZE,
                    criu::MAX_XCC
                ),
            ));
        }
        let sizes = control_stack_sizes(dev);
        if sizes.contains(&ctl) {
            return Ok(());
        }
        let mut allowed: Vec<String> = sizes
            .iter()
            .filter(|&&c| c != 0)
            .take(6)
            .map(|c| format!("{c:#x}"))
            .collect();
        if sizes.len() > 7 {
            allowed.push("...".into());
        }
        Err(self.refuse(
            "ctl_stack_size",
            format!(
                "is {ctl:#x}, but KFD sizes this GPU's control stacks ({} CUs) at \
                 {} (or 0 without a context save area)",
                dev.simd_count / dev.simd_per_cu.max(1),
                allowed.join(" or ")
            ),
        ))
    }

    /// The ring, end-of-pipe buffer and context save area inside one BO or
    /// SVM range; the read and write pointers in the process' memory.
    fn check_memory(&self, svm: &[(u64, u64)]) -> Result<(), Refusal> {
        let ring = (
            self.u64(offset_of!(QueueRec, q_address)),
            self.u64(offset_of!(QueueRec, q_size)),
        );
        if !ring.1.is_power_of_two() {
            return Err(self.refuse("q_size", format!("is {:#x}, not a power of two", ring.1)));
        }
        let regions = [
            ("q_address", ring.0, ring.1),
            (
                "eop_ring_buffer_address",
                self.u64(offset_of!(QueueRec, eop_ring_buffer_address)),
                u64::from(self.u32(offset_of!(QueueRec, eop_ring_buffer_size))),
            ),
            (
                "ctx_save_restore_area_address",
                self.u64(offset_of!(QueueRec, ctx_save_restore_area_address)),
                u64::from(self.u32(offset_of!(QueueRec, ctx_save_restore_area_size))),
            ),
        ];
        for (name, addr, size) in regions {
            if name != "q_address" && addr == 0 {
                continue;
            }
            if !self.blob.in_bo(addr, size) && !inside(svm, addr, size) {
                return Err(self.refuse(
                    name,
                    format!(
                        "is {addr:#x} ({size:#x} bytes), which no BO or SVM range of the \
                         process holds"
                    ),
                ));
            }
        }
        for (name, off) in [
            ("read_ptr_addr", offset_of!(QueueRec, read_ptr_addr)),
            ("write_ptr_addr", offset_of!(QueueRec, write_ptr_addr)),
        ] {
            let addr = self.u64(off);
            let mapped = self.blob.vmas.is_some_and(|v| inside(v, addr, 8));
            if !self.blob.in_bo(addr, 8) && !inside(svm, addr, 8) && !mapped {
                return Err(self.refuse(
                    name,
                    format!("is {addr:#x}, which no BO, SVM range or mapping of the process holds"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
