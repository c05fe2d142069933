//! SDMA user-mode queues: a ring and its read/write pointers in GTT memory the GPU reaches,
//! a doorbell in the GPU's doorbell slice, and packets from [`crate::sdma`].
//!
//! As in the thunk, the doorbell slice is a DOORBELL BO that the GPU's first queue allocates
//! and maps on /dev/kfd at the slice's offset; CREATE_QUEUE's `doorbell_offset` is that
//! offset plus the queue's doorbell within the slice (GFX9+), so every queue's doorbell is
//! an address in the one mapping (see `KfdClient::doorbell_address`).
//!
//! GFX9+ SDMA queues use 64-bit pointers that count bytes since the queue was created and
//! never wrap; only the ring address is taken modulo the ring size. Writing the new write
//! pointer to the doorbell tells the engine there is work.

use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use kfd_abi::handle::Error as IoctlError;
use kfd_abi::ids::{GpuId, GpuVa, QueueId};
use kfd_abi::sys;
use kfd_abi::volatile::VolatileSlice;

use crate::sdma::{self, PacketError};
use crate::{Bo, Gpu, KfdClient, MemKind};

pub use crate::client::DOORBELL_RANGE;

/// Why a queue operation failed; every variant names the GPU.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Allocating the ring or pointer memory.
    #[error(transparent)]
    Client(#[from] crate::Error),
    /// An ioctl or mmap of the queue.
    #[error("GPU {}: SDMA queue: {step}: {source}", .gpu.get())]
    Ioctl {
        gpu: GpuId,
        step: &'static str,
        source: IoctlError,
    },
    /// A packet that cannot be encoded.
    #[error("GPU {}: {source}", .gpu.get())]
    Packet { gpu: GpuId, source: PacketError },
    /// A submission larger than the ring.
    #[error(
        "GPU {}: SDMA queue {queue}: {bytes} bytes of packets do not fit a {ring} byte ring",
        .gpu.get()
    )]
    TooBig {
        gpu: GpuId,
        queue: QueueId,
        bytes: u64,
        ring: u64,
    },
    /// The engine did not reach the write pointer in time.
    #[error("GPU {}: SDMA queue {queue}: read pointer {rptr:#x} did not reach {target:#x} within {waited:?}", .gpu.get())]
    Timeout {
        gpu: GpuId,
        queue: QueueId,
        rptr: u64,
        target: u64,
        waited: Duration,
    },
}

/// Offsets inside the pointer BO: the engine writes the read pointer, we the write pointer.
const RPTR_OFF: usize = 0;
const WPTR_OFF: usize = 8;

/// An SDMA queue on one GPU. Dropping it destroys the queue before its memory is freed.
#[derive(Debug)]
pub struct SdmaQueue<'c> {
    client: &'c KfdClient,
    gpu: GpuId,
    /// The GPU, for HDP flushes before ringing the doorbell.
    gpu_ref: &'c Gpu,
    id: QueueId,
    ring: Bo<'c>,
    ptrs: Bo<'c>,
    /// The queue's doorbell, inside the GPU's doorbell BO.
    doorbell: VolatileSlice<'c>,
    /// Bytes submitted since creation (the 64-bit write pointer).
    wptr: u64,
    alive: bool,
}

impl<'c> SdmaQueue<'c> {
    /// Creates an SDMA queue with a `ring_size`-byte ring (a power of two, at least a page).
    pub fn create(client: &'c KfdClient, gpu: GpuId, ring_size: u64) -> Result<Self, QueueError> {
        let gpu_ref = client.gpu(gpu)?;
        let ring = client.alloc(gpu, ring_size, MemKind::Gtt)?;
        let ptrs = client.alloc(gpu, 4096, MemKind::Gtt)?;
        let ioctl_err = |step, source| QueueError::Ioctl { gpu, step, source };
        if !ring.size().is_power_of_two() {
            return Err(ioctl_err(
                "ring size",
                IoctlError {
                    ioctl: "AMDKFD_IOC_CREATE_QUEUE",
                    errno: libc::EINVAL,
                },
            ));
        }
        let mut args = sys::kfd_ioctl_create_queue_args {
            ring_base_address: ring.va().0,
            write_pointer_address: ptrs.va().0 + WPTR_OFF as u64,
            read_pointer_address: ptrs.va().0 + RPTR_OFF as u64,
            ring_size: ring.size() as u32,
            gpu_id: gpu.0,
            queue_type: sys::KFD_IOC_QUEUE_TYPE_SDMA,
            queue_percentage: sys::KFD_MAX_QUEUE_PERCENTAGE,
            queue_priority: 7,
            ..Default::default()
        };
        // SAFETY: the ring and the pointers lie in `ring` and `ptrs`, GTT BOs that KFD
        // allocated (not USERPTR: the GPU touches only their pages, never other process
        // memory), mapped at those VAs and owned by the queue; the failure path below,
        // `destroy` and `Drop` (which runs before the fields drop) destroy the queue
        // before the BOs are freed.
        let id = unsafe { client.kfd().create_queue(&mut args) }
            .map_err(|e| ioctl_err("AMDKFD_IOC_CREATE_QUEUE", e))?;
        // From here the queue exists: a failure must destroy it. The GPU's first queue
        // allocates the doorbell BO, after CREATE_QUEUE as in the thunk, because the offset
        // to map it at comes from CREATE_QUEUE.
        let doorbell = match client.doorbell(gpu, args.doorbell_offset) {
            Ok(a) => a,
            Err(e) => {
                let _ = client.kfd().destroy_queue(id);
                return Err(e.into());
            }
        };
        Ok(Self {
            client,
            gpu,
            gpu_ref,
            id,
            ring,
            ptrs,
            doorbell,
            wptr: 0,
            alive: true,
        })
    }

    pub fn id(&self) -> QueueId {
        self.id
    }

    pub fn gpu(&self) -> GpuId {
        self.gpu
    }

    /// Address of the queue's doorbell (CPU address and GPU VA): inside the GPU's doorbell
    /// BO ([`crate::Gpu::doorbell_bo`]).
    pub fn doorbell_va(&self) -> GpuVa {
        GpuVa(self.doorbell.as_ptr() as u64)
    }

    /// The queue's doorbell (8 bytes; the engine reads it as one 64-bit word).
    pub fn doorbell(&self) -> VolatileSlice<'c> {
        self.doorbell
    }

    /// Bytes submitted so far (the write pointer).
    pub fn submitted(&self) -> u64 {
        self.wptr
    }

    /// The engine's read pointer, as it last wrote it.
    pub fn rptr(&self) -> u64 {
        // The GPU writes it behind our back: one volatile read.
        self.ptrs.volatile().read_u64(RPTR_OFF)
    }

    /// Encodes packets with `f` and submits them; returns the write pointer after them.
    pub fn submit_with(
        &mut self,
        f: impl FnOnce(&mut Vec<u32>) -> Result<(), PacketError>,
    ) -> Result<u64, QueueError> {
        let mut v = Vec::new();
        f(&mut v).map_err(|source| QueueError::Packet {
            gpu: self.gpu,
            source,
        })?;
        self.submit(&v, Duration::from_secs(10))
    }

    /// Copies `dwords` into the ring and rings the doorbell; waits up to `timeout` for space.
    /// A run that would cross the end of the ring is moved to its start behind a NOP. The
    /// HDP is flushed first, so the packets see what the CPU wrote to VRAM before.
    pub fn submit(&mut self, dwords: &[u32], timeout: Duration) -> Result<u64, QueueError> {
        let ring = self.ring.size();
        let bytes = dwords.len() as u64 * 4;
        let pos = self.wptr % ring;
        let pad = if pos + bytes > ring { ring - pos } else { 0 };
        if bytes + pad > ring || bytes == 0 {
            return Err(QueueError::TooBig {
                gpu: self.gpu,
                queue: self.id,
                bytes,
                ring,
            });
        }
        // Space: everything up to wptr + pad + bytes - ring must have been consumed.
        let need = (self.wptr + pad + bytes).saturating_sub(ring);
        self.wait_rptr(need, timeout)?;
        let mut staged = Vec::with_capacity(dwords.len() + pad as usize / 4);
        if pad > 0 {
            sdma::nop(&mut staged, pad as usize / 4).map_err(|source| QueueError::Packet {
                gpu: self.gpu,
                source,
            })?;
        }
        staged.extend_from_slice(dwords);
        let ring_mem = self.ring.volatile();
        let mut w = self.wptr;
        for d in staged {
            // Volatile: the engine reads the ring concurrently.
            ring_mem.write_u32((w % ring) as usize, d);
            w += 4;
        }
        self.wptr = w;
        // The packets (and the CPU's VRAM writes, through the HDP) must be visible before
        // the engine can see the new write pointer; hdp_flush fences first.
        self.gpu_ref.hdp_flush();
        fence(Ordering::SeqCst);
        self.ptrs.volatile().write_u64(WPTR_OFF, w);
        self.doorbell.write_u64(0, w);
        Ok(w)
    }

    fn wait_rptr(&self, target: u64, timeout: Duration) -> Result<(), QueueError> {
        let start = Instant::now();
        let mut nap = Duration::from_micros(20);
        loop {
            let r = self.rptr();
            if r >= target {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(QueueError::Timeout {
                    gpu: self.gpu,
                    queue: self.id,
                    rptr: r,
                    target,
                    waited: start.elapsed(),
                });
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(2));
        }
    }

    /// Waits until the engine has consumed everything submitted.
    pub fn wait_idle(&self, timeout: Duration) -> Result<(), QueueError> {
        self.wait_rptr(self.wptr, timeout)
    }

    /// Destroys the queue and frees its memory, reporting errors.
    pub fn destroy(mut self) -> Result<(), QueueError> {
        self.alive = false;
        self.client
            .kfd()
            .destroy_queue(self.id)
            .map_err(|source| QueueError::Ioctl {
                gpu: self.gpu,
                step: "AMDKFD_IOC_DESTROY_QUEUE",
                source,
            })
    }
}

impl Drop for SdmaQueue<'_> {
    fn drop(&mut self) {
        if self.alive {
            // Errors cannot be reported from drop; `destroy` reports them.
            let _ = self.client.kfd().destroy_queue(self.id);
        }
    }
}
