//! KFD's private data against the host GPU that takes each image GPU over.
//!
//! [`super::check`] knows the image only: it accepts a size when some GFX
//! generation and XCC count make KFD write it.  Once the restore (and
//! `gpu-check`) has matched the image's GPUs to this host's, the sizes
//! RESTORE copies by are pinned to what this host's KFD writes for the
//! GPU that runs the queue: the MQD of its type times the node's XCCs,
//! a control stack of the size KFD computes from the node's
//! `gfx_target_version`, CU and wave counts (per XCC, or none without a
//! context save area), a context save area of the size KFD computes for
//! one XCC (the control stack and each CU's saved workgroup: GPUs whose
//! control stacks agree differ here), an end-of-pipe buffer of the
//! generation's size, an SDMA engine queue the node has.  A queue the
//! host GPU's KFD would never have written is refused naming the queue,
//! the image GPU and the field, before `/dev/kfd` is opened; so is private
//! data whose objects cannot be walked.

use std::mem::offset_of;

use kfd_abi::criu::{self, queue_type, CwsrProps};
use kfd_abi::layout::kfd_criu_queue_priv_data as QueueRec;

use super::{blob_objects, u32_at, Refusal};
use crate::ids::GpuId;
use crate::image::KfdImage;
use crate::matcher::GpuMap;
use crate::topology::{Node, Topology};

/// The checks of the module documentation on the image `name`, whose GPUs
/// `map` takes to the GPUs of `host`.  A queue on a GPU the map does not
/// take is the matcher's refusal, not this one's.  Private data whose
/// objects cannot be walked is refused: nothing of it would be checked.
pub fn check_host(
    name: &str,
    image: &KfdImage,
    map: &GpuMap,
    host: &Topology,
) -> Result<(), Refusal> {
    let objects = blob_objects(image).map_err(|e| {
        Refusal::new(
            name,
            None,
            "priv_data",
            format!("its objects cannot be walked to check them against this host: {e}"),
        )
    })?;
    let blob = &image.msg.priv_data;
    for (i, o) in objects.iter().filter(|o| o.kind == 0).enumerate() {
        let at = |off: usize| u32_at(blob, o.offset + off as u64);
        let gpu = GpuId(at(offset_of!(QueueRec, gpu_id)));
        let Some(node) = map.get(gpu).and_then(|h| host.gpu(h)) else {
            continue;
        };
        let q = HostQueue {
            name,
            i,
            gpu,
            node,
            qtype: at(offset_of!(QueueRec, type_)),
            mqd: at(offset_of!(QueueRec, mqd_size)),
            ctl: at(offset_of!(QueueRec, ctl_stack_size)),
            ctx: at(offset_of!(QueueRec, ctx_save_restore_area_size)),
            eop: at(offset_of!(QueueRec, eop_ring_buffer_size)),
            sdma_id: at(offset_of!(QueueRec, sdma_id)),
        };
        q.check_mqd()?;
        if queue_type::is_sdma(q.qtype) {
            q.check_sdma_engine()?;
        } else {
            q.check_control_stack()?;
            q.check_save_area()?;
            q.check_eop()?;
        }
    }
    Ok(())
}

/// The XCCs of a host node: sysfs' `num_xcc`, 1 on kernels without it.
fn xccs(node: &Node) -> u32 {
    node.kernel.num_xcc.max(1)
}

/// One queue record and the host node that runs it.
struct HostQueue<'a> {
    name: &'a str,
    i: usize,
    /// The image's GPU (the host's is the map's).
    gpu: GpuId,
    node: &'a Node,
    qtype: u32,
    mqd: u32,
    ctl: u32,
    /// One XCC's context save area (0: none).
    ctx: u32,
    /// The end-of-pipe buffer (0: none).
    eop: u32,
    sdma_id: u32,
}

impl HostQueue<'_> {
    fn refuse(&self, field: &str, reason: String) -> Refusal {
        let host = self
            .node
            .gpu_id
            .map_or_else(String::new, |h| format!(" (host GPU {h})"));
        Refusal::new(
            self.name,
            Some(self.gpu),
            format!("priv_data.queues[{}].{field}", self.i),
            format!("{reason}{host}"),
        )
    }

    fn check_mqd(&self) -> Result<(), Refusal> {
        let xcc = xccs(self.node);
        let want = criu::mqd_size(self.qtype, xcc);
        if want == Some(self.mqd) {
            return Ok(());
        }
        Err(self.refuse(
            "mqd_size",
            match want {
                Some(w) => format!(
                    "is {}, but this host's KFD writes {w} bytes of MQD for a queue of type {} \
                     on a GPU of {xcc} XCC(s)",
                    self.mqd, self.qtype
                ),
                None => format!("is of type {}, which KFD never gives a process", self.qtype),
            },
        ))
    }

    fn check_sdma_engine(&self) -> Result<(), Refusal> {
        let p = &self.node.props;
        let engines = (p.num_sdma_engines + p.num_sdma_xgmi_engines)
            .saturating_mul(p.num_sdma_queues_per_engine);
        if self.sdma_id < engines {
            return Ok(());
        }
        Err(self.refuse(
            "sdma_id",
            format!(
                "is {}, but the GPU that restores it has {engines} SDMA engine queues",
                self.sdma_id
            ),
        ))
    }

    fn cwsr_props(&self) -> CwsrProps {
        let p = &self.node.props;
        CwsrProps {
            gfx_target_version: self.node.kernel.gfx_target_version,
            simd_count: p.simd_count,
            simd_per_cu: p.simd_per_cu,
            array_count: p.array_count,
            simd_arrays_per_engine: p.simd_arrays_per_engine,
            num_xcc: xccs(self.node),
        }
    }

    fn cus(&self) -> u32 {
        let p = &self.node.props;
        p.simd_count / p.simd_per_cu.max(1)
    }

    /// None or one XCC's context save area of the size KFD computes for
    /// the node (its `cwsr_size`: the control stack and each CU's saved
    /// workgroup), or, on GFX 9.4 parts, the one a libhsakmt older than
    /// them computes (256 KiB of VGPRs per CU).  GPUs whose control stacks
    /// are of one size (104 and 110 CUs of gfx90a) differ here.  Without
    /// `gfx_target_version` in sysfs the image check's bound stands.
    fn check_save_area(&self) -> Result<(), Refusal> {
        let k = self.node.kernel;
        if self.ctx == 0 || k.gfx_target_version == 0 {
            return Ok(());
        }
        let wants = criu::cwsr_sizes(&self.cwsr_props());
        if wants.contains(&self.ctx) {
            return Ok(());
        }
        Err(self.refuse(
            "ctx_save_restore_area_size",
            match wants.first() {
                Some(w) => format!(
                    "is {:#x}, but this host's KFD takes {w:#x} bytes of context save area \
                     per XCC for a compute queue of this GPU (gfx_target_version {}, {} CUs, \
                     {} XCC(s)) or none",
                    self.ctx,
                    k.gfx_target_version,
                    self.cus(),
                    xccs(self.node),
                ),
                None => format!(
                    "is {:#x}, but this host's KFD saves no context for this GPU \
                     (gfx_target_version {})",
                    self.ctx, k.gfx_target_version
                ),
            },
        ))
    }

    /// None or the end-of-pipe buffer KFD takes for the node's generation.
    fn check_eop(&self) -> Result<(), Refusal> {
        let gfxv = self.node.kernel.gfx_target_version;
        if self.eop == 0 || gfxv == 0 {
            return Ok(());
        }
        let want = criu::eop_buffer_size(gfxv);
        if want == Some(self.eop) {
            return Ok(());
        }
        Err(self.refuse(
            "eop_ring_buffer_size",
            match want {
                Some(w) => format!(
                    "is {:#x}, but this host's KFD takes {w:#x} bytes of end-of-pipe buffer \
                     for a compute queue of this GPU (gfx_target_version {gfxv}) or none",
                    self.eop
                ),
                None => format!(
                    "is {:#x}, but this host's KFD takes no end-of-pipe buffer for this GPU \
                     (gfx_target_version {gfxv})",
                    self.eop
                ),
            },
        ))
    }

    /// None (no context save area) or the node's control stack once per
    /// XCC.  Without `gfx_target_version` in sysfs the size cannot be
    /// computed for this node; the image check's bound stands then.
    fn check_control_stack(&self) -> Result<(), Refusal> {
        let k = self.node.kernel;
        if self.ctl == 0 || k.gfx_target_version == 0 {
            return Ok(());
        }
        let xcc = xccs(self.node);
        let per_xcc = criu::ctl_stack_size(&self.cwsr_props());
        let want = per_xcc.and_then(|c| c.checked_mul(xcc));
        if want == Some(self.ctl) {
            return Ok(());
        }
        Err(self.refuse(
            "ctl_stack_size",
            match want {
                Some(w) => format!(
                    "is {:#x}, but this host's KFD saves {w:#x} bytes of control stack for a \
                     compute queue of this GPU (gfx_target_version {}, {} CUs, {xcc} XCC(s)) \
                     or none",
                    self.ctl,
                    k.gfx_target_version,
                    self.cus(),
                ),
                None => format!(
                    "is {:#x}, but this host's KFD saves no control stack for this GPU \
                     (gfx_target_version {})",
                    self.ctl, k.gfx_target_version
                ),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{compute_queue, image, put32, sdma_queue, GPU};
    use super::*;
    use crate::topology::KernelProps;
    use std::collections::BTreeMap;

    /// The host GPU 0x77 (64 CUs of 4 SIMDs, 8 arrays of 1 per engine) of
    /// `gfx` and `xcc`, taking the image's GPU.
    fn host(gfx: u32, xcc: u32) -> (GpuMap, Topology) {
        host_of(gfx, xcc, 64)
    }

    /// The same with `cus` CUs.
    fn host_of(gfx: u32, xcc: u32, cus: u32) -> (GpuMap, Topology) {
        let mut n = crate::topology::tests::gpu(1, 0x77, &[]);
        n.props.simd_count = cus * 4;
        n.props.simd_per_cu = 4;
        n.props.array_count = 8;
        n.props.simd_arrays_per_engine = 1;
        n.props.num_sdma_engines = 2;
        n.props.num_sdma_queues_per_engine = 8;
        n.kernel = KernelProps {
            gfx_target_version: gfx,
            num_xcc: xcc,
        };
        let map = GpuMap::new(BTreeMap::from([(GpuId(GPU), GpuId(0x77))]));
        (map, Topology::new(vec![n]))
    }

    fn verdict(objects: &[Vec<u8>], gfx: u32, xcc: u32) -> Result<(), String> {
        verdict_on(objects, host(gfx, xcc))
    }

    fn verdict_on(objects: &[Vec<u8>], (map, topo): (GpuMap, Topology)) -> Result<(), String> {
        check_host("amdgpu-kfd-5.img", &image(objects), &map, &topo).map_err(|r| r.to_string())
    }

    /// [`compute_queue`] with the context save area KFD sizes for a gfx908
    /// GPU of 64 CUs (the sample's): 6 pages of control stack and 64 CUs of
    /// 0x95000.
    fn mi100_compute(id: u32) -> Vec<u8> {
        let mut q = compute_queue(id);
        put32(
            &mut q,
            offset_of!(QueueRec, ctx_save_restore_area_size),
            0x6000 + 64 * 0x9_5000,
        );
        q
    }

    /// A gfx90a compute queue whose control stack (4096 waves, 9 pages)
    /// and context save area KFD sizes for `cus` CUs.
    fn mi200_compute(cus: u32) -> Vec<u8> {
        let mut q = compute_queue(1);
        put32(&mut q, offset_of!(QueueRec, ctl_stack_size), 0x9000);
        put32(
            &mut q,
            offset_of!(QueueRec, ctx_save_restore_area_size),
            0x9000 + cus * 0x9_5000,
        );
        q.resize(120 + 2048 + 0x9000, 0);
        q
    }

    /// An MI300X compute queue (gfx942, 304 CUs over 8 XCCs): 8 MQDs, 8
    /// control stacks of 3 pages (38 CUs each) and one XCC's save area.
    fn mi300x_compute() -> Vec<u8> {
        let mut q = compute_queue(1);
        put32(&mut q, offset_of!(QueueRec, mqd_size), 8 * 2048);
        put32(&mut q, offset_of!(QueueRec, ctl_stack_size), 8 * 0x3000);
        put32(
            &mut q,
            offset_of!(QueueRec, ctx_save_restore_area_size),
            0x3000 + 38 * 0x9_5000,
        );
        q.resize(120 + 8 * 2048 + 8 * 0x3000, 0);
        q
    }

    /// A multi-XCC queue passes on a host whose GPU has its XCCs and CUs,
    /// and is refused, naming the field, on one of another XCC count or
    /// with other CUs per XCC.
    #[test]
    fn a_multi_xcc_queue_needs_the_hosts_xccs() {
        let q = [mi300x_compute()];
        assert_eq!(verdict_on(&q, host_of(90402, 8, 304)), Ok(()));
        let e = verdict_on(&q, host_of(90402, 4, 304)).unwrap_err();
        for w in ["queues[0].mqd_size", "16384", "4 XCC(s)"] {
            assert!(e.contains(w), "{e} lacks {w}");
        }
        let e = verdict_on(&q, host_of(90402, 8, 256)).unwrap_err();
        assert!(
            e.contains("queues[0].ctx_save_restore_area_size") && e.contains("per XCC"),
            "{e}"
        );
    }

    #[test]
    fn what_this_hosts_kfd_writes_passes() {
        // MI100 (gfx908): 2560 waves of 8 bytes, 6 pages.
        assert_eq!(
            verdict(&[sdma_queue(0), mi100_compute(1)], 90008, 0),
            Ok(())
        );
        let no_cwsr = {
            let mut q = compute_queue(2);
            put32(&mut q, offset_of!(QueueRec, ctl_stack_size), 0);
            put32(&mut q, offset_of!(QueueRec, ctx_save_restore_area_size), 0);
            // Its bytes: the MQD alone (with the control stack's bytes left
            // the blob would not walk, and that is refused).
            q.truncate(120 + 2048);
            q
        };
        assert_eq!(verdict(&[no_cwsr], 90008, 1), Ok(()));
        // Without gfx_target_version only the MQD and engines are pinned.
        assert_eq!(verdict(&[compute_queue(1)], 0, 0), Ok(()));
    }

    #[test]
    fn sizes_of_another_gpu_are_refused_naming_queue_gpu_and_field() {
        // The image's control stack is a gfx9 one; a GFX 11 host sizes
        // 2048 waves of 12 bytes (7 pages).
        let e = verdict(&[sdma_queue(0), compute_queue(1)], 110000, 1).unwrap_err();
        for w in [
            "amdgpu-kfd-5.img",
            &format!("GPU {}", GpuId(GPU)),
            "priv_data.queues[1].ctl_stack_size",
            "0x7000",
            "host GPU",
        ] {
            assert!(e.contains(w), "{e} lacks {w}");
        }
        // A host of 2 XCCs writes two MQDs.
        let e = verdict(&[compute_queue(1)], 90008, 2).unwrap_err();
        assert!(
            e.contains("queues[0].mqd_size") && e.contains("4096 bytes"),
            "{e}"
        );
        // An SDMA engine queue the host GPU lacks.
        let mut q = sdma_queue(0);
        put32(&mut q, offset_of!(QueueRec, sdma_id), 16);
        let e = verdict(&[q], 90008, 1).unwrap_err();
        assert!(e.contains("queues[0].sdma_id") && e.contains("16"), "{e}");
    }

    /// MI210 (104 CUs) and an MI250X GCD (110 CUs) share a control stack
    /// size but not a context save area: a queue of one is refused on the
    /// other, naming the field and the host's CUs.
    #[test]
    fn a_save_area_of_another_cu_count_is_refused() {
        assert_eq!(
            verdict_on(&[mi200_compute(104)], host_of(90010, 1, 104)),
            Ok(())
        );
        let e = verdict_on(&[mi200_compute(110)], host_of(90010, 1, 104)).unwrap_err();
        for w in [
            "amdgpu-kfd-5.img",
            "priv_data.queues[0].ctx_save_restore_area_size",
            &format!("{:#x}", 0x9000 + 110 * 0x9_5000),
            &format!("takes {:#x}", 0x9000 + 104 * 0x9_5000),
            "104 CUs",
            "host GPU",
        ] {
            assert!(e.contains(w), "{e} lacks {w}");
        }
        // An end-of-pipe buffer KFD never takes on gfx9.
        let mut q = mi100_compute(1);
        put32(&mut q, offset_of!(QueueRec, eop_ring_buffer_size), 0x2000);
        let e = verdict(&[q], 90008, 1).unwrap_err();
        assert!(
            e.contains("queues[0].eop_ring_buffer_size") && e.contains("takes 0x1000"),
            "{e}"
        );
    }

    #[test]
    fn private_data_that_cannot_be_walked_is_refused() {
        let mut img = image(&[mi100_compute(1)]);
        img.msg.num_of_objects = 3;
        let (map, topo) = host(90008, 1);
        let e = check_host("amdgpu-kfd-5.img", &img, &map, &topo)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("amdgpu-kfd-5.img")
                && e.contains("priv_data")
                && e.contains("cannot be walked"),
            "{e}"
        );
    }

    #[test]
    fn a_queue_on_an_unmapped_gpu_is_the_matchers() {
        let (_, topo) = host(90008, 1);
        let map = GpuMap::new(BTreeMap::new());
        assert_eq!(
            check_host("k", &image(&[compute_queue(1)]), &map, &topo),
            Ok(())
        );
    }
}
