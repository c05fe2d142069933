//! KERNEL_DISPATCH packets: what the CP reads and checks before the
//! waves start (the packet, the kernel object, the queue's scratch), and
//! the dynamic scratch handshake.
//!
//! A dispatch whose private segment does not fit the queue's scratch
//! (`amd_queue_t.scratch_workitem_byte_size`) stops the queue at the
//! packet with queue error 1 ("insufficient scratch") on
//! `queue_inactive_signal`: ROCr's handler reads the packet at the read
//! pointer, allocates scratch, rewrites the queue's scratch fields and
//! stores 0 to the signal, which resumes the queue at the same packet.

use gfx9::launch::{self, DispatchRegs, Grid, KernelCode, ShapeError, KERNEL_OBJECT_BYTES};
use gfx9::state::Apertures;

use super::ring::{self, amd_queue, error};
use super::Shaders;
use crate::device::shader::{JobKey, Launch, ScratchSplit};
use crate::device::state::{Done, Proc, Queue};
use crate::device::uapi;

/// The top of the GPU VA space the shader engine resolves.
pub const VA_TOP: u64 = 1 << 48;

/// What the CP makes of a dispatch packet.
pub enum Prepared {
    Launch(Box<Launch>),
    /// The queue waits for the runtime to grow its scratch.
    ScratchWait,
    /// The CP's queue error for the packet, and why.
    Error(i64, String),
}

/// `hsa_kernel_dispatch_packet_t`'s fields.
struct Packet {
    grid: Grid,
    private_size: u32,
    group_size: u32,
    object: u64,
    kernarg: u64,
}

fn le(b: &[u8], at: usize, n: usize) -> u64 {
    (0..n).fold(0, |v, k| v | (b[at + k] as u64) << (8 * k))
}

fn packet(b: &[u8; 64]) -> Packet {
    let dims = (le(b, 2, 2) & 3).max(1) as usize;
    let mut grid = Grid {
        size: [1; 3],
        group: [1; 3],
    };
    for d in 0..dims.min(3) {
        grid.group[d] = le(b, 4 + 2 * d, 2) as u32;
        grid.size[d] = le(b, 12 + 4 * d, 4) as u32;
    }
    Packet {
        grid,
        private_size: le(b, 24, 4) as u32,
        group_size: le(b, 28, 4) as u32,
        object: le(b, 32, 8),
        kernarg: le(b, 40, 8),
    }
}

fn shape_error(e: ShapeError) -> i64 {
    match e {
        ShapeError::Dimension => error::INVALID_DIMENSION,
        ShapeError::GroupTooLarge => error::GROUP_TOO_LARGE,
        ShapeError::Lds => error::INVALID_GROUP_MEMORY,
    }
}

/// The kernel object's first bytes, or the queue error for it.
fn kernel_object(p: &Proc, gpu: usize, object: u64) -> Result<KernelCode, (i64, String)> {
    let mut b = [0u8; KERNEL_OBJECT_BYTES];
    if object == 0 || !p.gpu_read(gpu, object, &mut b) {
        return Err((
            error::INVALID_CODE,
            format!("kernel dispatch: kernel object {object:#x} is not in the GPU VM"),
        ));
    }
    Ok(KernelCode::parse(&b))
}

/// The queue's scratch as ROCr set it up: the buffer resource, the base,
/// and its slice of each XCC; None when the dispatch's private segment
/// does not fit.
struct Scratch {
    resource: [u32; 4],
    base: u64,
    split: ScratchSplit,
}

fn scratch(p: &Proc, q: &Queue, private_size: u32) -> Option<Scratch> {
    let at = |off| q.rptr_addr + off;
    let per_lane = ring::read_u32(p, q.gpu, at(amd_queue::SCRATCH_PER_LANE))?;
    let bytes = ring::read_u64(p, q.gpu, at(amd_queue::SCRATCH_BYTES))?;
    let base = ring::read_u64(p, q.gpu, at(amd_queue::SCRATCH_BACKING))?;
    let tmpring = ring::read_u32(p, q.gpu, at(amd_queue::TMPRING_SIZE))?;
    let mut resource = [0u32; 4];
    for (k, r) in resource.iter_mut().enumerate() {
        *r = ring::read_u32(p, q.gpu, at(amd_queue::SCRATCH_RESOURCE + 4 * k as u64))?;
    }
    let split = split_scratch(bytes, launch::wave_scratch_bytes(per_lane), tmpring);
    if private_size > 0 && (private_size > per_lane || split.slots == 0) {
        return None;
    }
    Some(Scratch {
        resource,
        base,
        split,
    })
}

/// How the CP of each XCC uses the queue's scratch, in waves of
/// `wave_bytes`: `xcc_bytes`, `scratch_backing_memory_byte_size`, is one
/// XCC's slice (ROCr 6 stores `main_size / NumXcc` there; 1 XCC but on
/// MI300), holding the wave slots that fit it, at most
/// `compute_tmpring_size`'s WAVES (its slots per XCC) where the runtime
/// set them.
pub fn split_scratch(xcc_bytes: u64, wave_bytes: u64, tmpring: u32) -> ScratchSplit {
    let fit = xcc_bytes.checked_div(wave_bytes).unwrap_or(0);
    let waves = (tmpring & 0xfff) as u64;
    ScratchSplit {
        wave_bytes,
        slots: if waves == 0 { fit } else { fit.min(waves) },
        xcc_bytes,
    }
}

/// Reads and checks the dispatch packet at `slot` (packet `index` of
/// queue `id`) for GPU `gpu`.
pub fn prepare(
    p: &mut Proc,
    id: u32,
    q: &Queue,
    gpu: Shaders,
    (slot, index): (u64, u64),
    done: &mut Done,
) -> Prepared {
    let Some(target) = gpu.target else {
        let what = "kernel dispatch packet: the emulated GPU's ISA is not one the shader \
                    engine runs (gfx908, gfx90a, gfx942)";
        return Prepared::Error(error::INVALID_PACKET_FORMAT, what.into());
    };
    let mut b = [0u8; 64];
    if !p.gpu_read(q.gpu, slot, &mut b) {
        return Prepared::Error(
            error::INVALID_PACKET_FORMAT,
            "the ring is unreachable".into(),
        );
    }
    let pk = packet(&b);
    let lds = match pk.grid.check(pk.group_size) {
        Ok(l) => l,
        Err(e) => return Prepared::Error(shape_error(e), format!("kernel dispatch: {e}")),
    };
    let code = match kernel_object(p, q.gpu, pk.object) {
        Ok(c) => c,
        Err((code, what)) => return Prepared::Error(code, what),
    };
    let Some(s) = scratch(p, q, pk.private_size) else {
        return request_scratch(p, id, q, pk.private_size, done);
    };
    if pk.private_size > 0 {
        log::debug!(
            "kfd-emu: process {} AQL queue {id}: scratch at {:#x}, resource {:08x?}, {} bytes \
             per wave, {} wave slots in each of {} XCC slices of {:#x} bytes",
            p.lead,
            s.base,
            s.resource,
            s.split.wave_bytes,
            s.split.slots,
            gpu.cus.xccs,
            s.split.xcc_bytes
        );
    }
    let regs = DispatchRegs {
        packet: slot,
        queue: q.rptr_addr.wrapping_add(amd_queue::BASE as u64),
        kernarg: pk.kernarg,
        dispatch_id: index,
        scratch_resource: s.resource,
        scratch_base: s.base,
        private_size: pk.private_size,
        apertures: Apertures {
            shared_base: uapi::LDS_BASE,
            private_base: uapi::SCRATCH_BASE,
        },
    };
    Prepared::Launch(Box::new(Launch {
        key: JobKey {
            lead: p.lead,
            queue: id,
            gpu: q.gpu,
            index,
            object: pk.object,
        },
        target,
        packet: b,
        object: pk.object,
        code,
        grid: pk.grid,
        regs,
        lds,
        scratch: (pk.private_size > 0).then_some(s.split),
        cus: gpu.cus.enabled(&q.cu_mask),
        wave_slots: gpu.cus.slots,
        vm: p.gpu_range(q.gpu, 0, VA_TOP),
        resume: None,
    }))
}

/// Raises "insufficient scratch" for the runtime's handler.
fn request_scratch(p: &mut Proc, id: u32, q: &Queue, private: u32, done: &mut Done) -> Prepared {
    log::debug!(
        "kfd-emu: process {} AQL queue {id}: a dispatch needs {private} bytes of scratch per \
         work-item; asking the runtime for it",
        p.lead
    );
    if ring::raise(p, id, q, error::INSUFFICIENT_SCRATCH, done) {
        Prepared::ScratchWait
    } else {
        Prepared::Error(0, "scratch request failed".into())
    }
}
