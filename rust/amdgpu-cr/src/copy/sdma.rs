//! SDMA copy engine: the GPU's DMA engine copies between the BO (imported
//! from its dmabuf) and a userptr staging buffer in our memory.
//!
//! **Hardware only.**  No AMD GPU exists where this crate is developed and
//! the emulator cannot hand out dmabuf fds, so this engine is exercised
//! only against [`SdmaDevice`] models in the unit tests: packet encoding is
//! checked dword by dword against the documented COPY_LINEAR layout, and
//! the submission sequence against a model that executes the packets.
//!
//! Corrections over upstream 4.1.1's `sdma_copy_bo`:
//! * the COPY_LINEAR `count` is `bytes - 1` on family ≥ AI (GFX9+), `bytes`
//!   before (upstream always writes `bytes`, copying one byte too many);
//! * every error (import, VA map, submit, fence wait, timeout, short file
//!   I/O) is returned; cleanup errors never hide a transfer error;
//! * the IB is sized from the padded packet count;
//! * one context and one staging/IB registration per worker, not per IB;
//! * GPU VAs come from a window the caller chose away from the process'
//!   own BOs (see [`pick_va_window`]), not from an allocator that does not
//!   know about KFD's addresses.

use std::io::{self, Read, Write};
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::time::Duration;

use super::{drain_to, fill_from, BoRef, CopyEngine, CopyError};
use crate::bo::PAGE_SIZE;
use crate::ids::GpuId;

/// First GPU family (Vega10/GFX9, "AI") whose SDMA encodes `count` as
/// bytes − 1.
pub const AMDGPU_FAMILY_AI: u32 = 141;
/// SDMA opcode COPY.
pub const SDMA_OP_COPY: u32 = 1;
/// SDMA sub-opcode LINEAR (of COPY).
pub const SDMA_SUBOP_COPY_LINEAR: u32 = 0;
/// SDMA NOP (one dword).
pub const SDMA_OP_NOP: u32 = 0;
/// Dwords in one COPY_LINEAR packet.
pub const COPY_LINEAR_DWORDS: usize = 7;
/// IBs are padded with NOPs to a multiple of this many dwords.
pub const IB_ALIGN_DWORDS: usize = 8;
/// Largest copy of one packet: 2 MiB (safe on every SDMA generation).
pub const MAX_CHUNK: u64 = 1 << 21;
/// `AMDGPU_HW_IP_DMA`: the ring type the IB is submitted to.
pub const AMDGPU_HW_IP_DMA: u32 = 2;
/// How long one IB may run before we call it hung.  One IB moves at most
/// the staging size (64 MiB by default), milliseconds on any SDMA.
pub const FENCE_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest byte count of one COPY_LINEAR packet for `family`: older SDMA
/// encodes the byte count itself in a 21-bit field.
pub fn max_chunk(family: u32) -> u64 {
    if family >= AMDGPU_FAMILY_AI {
        MAX_CHUNK
    } else {
        MAX_CHUNK - 1
    }
}

/// One COPY_LINEAR packet copying `bytes` (1..=max_chunk) from GPU VA
/// `src` to `dst`.
pub fn copy_linear(family: u32, src: u64, dst: u64, bytes: u64) -> [u32; COPY_LINEAR_DWORDS] {
    assert!(
        bytes > 0 && bytes <= max_chunk(family),
        "chunk of {bytes} bytes"
    );
    let count = if family >= AMDGPU_FAMILY_AI {
        bytes - 1
    } else {
        bytes
    } as u32;
    [
        (SDMA_SUBOP_COPY_LINEAR << 8) | SDMA_OP_COPY,
        count,
        0, // no endian swap
        src as u32,
        (src >> 32) as u32,
        dst as u32,
        (dst >> 32) as u32,
    ]
}

/// Splits `len` bytes into consecutive `(offset, size)` pieces of at most
/// `max` bytes.
pub fn chunks(len: u64, max: u64) -> impl Iterator<Item = (u64, u64)> {
    assert!(max > 0);
    (0..len.div_ceil(max)).map(move |i| {
        let off = i * max;
        (off, (len - off).min(max))
    })
}

/// The IB copying `len` bytes from `src` to `dst`: COPY_LINEAR packets of
/// at most [`max_chunk`] bytes, NOP-padded to a multiple of 8 dwords.
pub fn build_ib(family: u32, src: u64, dst: u64, len: u64) -> Vec<u32> {
    let mut ib = Vec::with_capacity(ib_dwords(family, len));
    for (off, size) in chunks(len, max_chunk(family)) {
        ib.extend_from_slice(&copy_linear(family, src + off, dst + off, size));
    }
    while ib.len() % IB_ALIGN_DWORDS != 0 {
        ib.push(SDMA_OP_NOP);
    }
    ib
}

/// Dwords of the IB [`build_ib`] makes for `len` bytes.
pub fn ib_dwords(family: u32, len: u64) -> usize {
    let packets = len.div_ceil(max_chunk(family)) as usize;
    (packets * COPY_LINEAR_DWORDS).div_ceil(IB_ALIGN_DWORDS) * IB_ALIGN_DWORDS
}

/// Lowest `align`-aligned address in `[lo, hi)` where `need` bytes do not
/// overlap any of the `busy` `(start, size)` ranges.  The restore runs the
/// copies in the restored process' own GPU VM, so the caller passes every
/// BO range of the image as busy.
pub fn pick_va_window(lo: u64, hi: u64, busy: &[(u64, u64)], need: u64, align: u64) -> Option<u64> {
    let align_up = |x: u64| x.checked_add(align - 1).map(|v| v / align * align);
    let mut ranges: Vec<(u64, u64)> = busy
        .iter()
        .map(|&(s, n)| (s, s.saturating_add(n)))
        .collect();
    ranges.sort_unstable();
    let mut cand = align_up(lo)?;
    for (s, e) in ranges {
        if e <= cand {
            continue;
        }
        if s >= cand.checked_add(need)? {
            break;
        }
        cand = align_up(e)?;
    }
    (cand.checked_add(need)? <= hi).then_some(cand)
}

/// A GEM handle on the render node.
pub type GemHandle = u32;

/// The DRM/amdgpu operations the SDMA path needs, in the shape of the ABI
/// crate's `RenderNode` methods.  Every method keeps errno.
pub trait SdmaDevice: Send {
    /// GPU family (`AMDGPU_INFO_DEV_INFO.family`).
    fn family(&self) -> u32;
    /// `PRIME_FD_TO_HANDLE`.
    fn import_dmabuf(&mut self, dmabuf: BorrowedFd<'_>) -> io::Result<GemHandle>;
    /// `AMDGPU_GEM_USERPTR` over `[addr, addr + size)`.
    ///
    /// # Safety
    /// The memory must stay mapped and not be used for anything else until
    /// the handle is closed: the GPU reads and writes it.
    unsafe fn userptr(&mut self, addr: NonNull<u8>, size: u64) -> io::Result<GemHandle>;
    /// `AMDGPU_GEM_VA` map (read/write) of the whole object at `va`.
    fn va_map(&mut self, handle: GemHandle, va: u64, size: u64) -> io::Result<()>;
    /// `AMDGPU_GEM_VA` unmap.
    fn va_unmap(&mut self, handle: GemHandle, va: u64, size: u64) -> io::Result<()>;
    /// `AMDGPU_CTX` alloc.
    fn ctx_create(&mut self) -> io::Result<u32>;
    /// `AMDGPU_CTX` free.
    fn ctx_free(&mut self, ctx: u32) -> io::Result<()>;
    /// `AMDGPU_CS`: one IB of `dwords` at `ib_va` on the DMA ring 0, with
    /// `bos` resident; returns the fence sequence number.
    fn submit(&mut self, ctx: u32, ib_va: u64, dwords: u32, bos: &[GemHandle]) -> io::Result<u64>;
    /// `AMDGPU_WAIT_CS`: `Ok(true)` when the fence signalled, `Ok(false)`
    /// on timeout.
    fn wait(&mut self, ctx: u32, seq: u64, timeout: Duration) -> io::Result<bool>;
    /// `GEM_CLOSE`.
    fn gem_close(&mut self, handle: GemHandle) -> io::Result<()>;
}

/// Page-aligned anonymous memory (staging buffer, IB), unmapped on drop.
struct AnonBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain private memory owned by this value.
unsafe impl Send for AnonBuf {}

impl AnonBuf {
    fn new(len: usize) -> io::Result<Self> {
        // SAFETY: an anonymous private mapping at a kernel-chosen address
        // aliases nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(AnonBuf { ptr, len })
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr..ptr+len is our live mapping, borrowed mutably.  The
        // GPU only touches it between submit and fence wait, while no slice
        // is alive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AnonBuf {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `new`; no borrow outlives self.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Where the engine places its GPU mappings: `[start, start + len)` of the
/// render node's VM (see [`pick_va_window`]).
#[derive(Clone, Copy, Debug)]
pub struct VaWindow {
    pub start: u64,
    pub len: u64,
}

/// VA alignment of the engine's mappings (keeps large-page fragments).
pub const VA_ALIGN: u64 = 1 << 21;

impl VaWindow {
    /// A window for an engine with this staging size and largest BO inside
    /// the device's usable VA range `[lo, hi)` that overlaps none of the
    /// `busy` `(addr, size)` ranges (at restore: every BO of the image,
    /// because the copies run in the restored process' own VM).
    pub fn pick(
        lo: u64,
        hi: u64,
        busy: &[(u64, u64)],
        staging: u64,
        family: u32,
        largest_bo: u64,
    ) -> Option<Self> {
        let len = Self::needed(staging, family, largest_bo);
        pick_va_window(lo, hi, busy, len, VA_ALIGN).map(|start| VaWindow { start, len })
    }

    /// Bytes of VA an engine with this staging size and largest BO needs.
    pub fn needed(staging: u64, family: u32, largest_bo: u64) -> u64 {
        let round = |x: u64| x.div_ceil(VA_ALIGN) * VA_ALIGN;
        round(staging) + round(ib_bytes(family, staging)) + round(largest_bo)
    }
}

fn ib_bytes(family: u32, staging: u64) -> u64 {
    ((ib_dwords(family, staging) * 4) as u64).div_ceil(PAGE_SIZE) * PAGE_SIZE
}

/// The SDMA engine of one GPU worker.
pub struct SdmaEngine<D: SdmaDevice> {
    dev: D,
    gpu: GpuId,
    family: u32,
    ctx: u32,
    staging: AnonBuf,
    staging_handle: GemHandle,
    staging_va: u64,
    ib: AnonBuf,
    ib_handle: GemHandle,
    ib_va: u64,
    bo_va: u64,
    bo_va_len: u64,
    /// Fence timeout per IB.
    pub timeout: Duration,
    /// IBs submitted so far.
    pub submissions: u64,
}

impl<D: SdmaDevice> SdmaEngine<D> {
    /// Sets up staging and IB buffers (registered as userptr BOs and mapped
    /// in `va`) and a context.  `staging` must be page aligned.
    pub fn new(
        mut dev: D,
        gpu: GpuId,
        staging: u64,
        largest_bo: u64,
        va: VaWindow,
    ) -> Result<Self, CopyError> {
        let setup = |what: String| CopyError::Setup { gpu, what };
        if staging == 0 || !staging.is_multiple_of(PAGE_SIZE) {
            return Err(setup(format!(
                "staging size {staging} is not a positive multiple of the page size"
            )));
        }
        let family = dev.family();
        let need = VaWindow::needed(staging, family, largest_bo);
        if !va.start.is_multiple_of(VA_ALIGN) || va.len < need {
            return Err(setup(format!(
                "VA window {:#x}+{:#x} is unaligned or smaller than the {need:#x} bytes needed",
                va.start, va.len
            )));
        }
        let round = |x: u64| x.div_ceil(VA_ALIGN) * VA_ALIGN;
        let staging_va = va.start;
        let ib_len = ib_bytes(family, staging);
        let ib_va = staging_va + round(staging);
        let bo_va = ib_va + round(ib_len);
        let dev_err = |op: &'static str| {
            move |source| CopyError::Device {
                gpu,
                bo: usize::MAX,
                op,
                source,
            }
        };

        let mut staging_buf =
            AnonBuf::new(staging as usize).map_err(dev_err("allocate staging buffer"))?;
        let mut ib = AnonBuf::new(ib_len as usize).map_err(dev_err("allocate IB"))?;
        // Build the engine step by step so a failure releases what exists.
        enum Undo {
            Close(GemHandle),
            Unmap(GemHandle, u64, u64),
        }
        let mut undo: Vec<Undo> = Vec::new();
        let result = (|| {
            // SAFETY: staging_buf lives in the engine until Drop closes the
            // handle first; nothing else uses that memory.
            let staging_handle = unsafe { dev.userptr(staging_buf.ptr, staging) }
                .map_err(dev_err("GEM_USERPTR staging"))?;
            undo.push(Undo::Close(staging_handle));
            dev.va_map(staging_handle, staging_va, staging)
                .map_err(dev_err("GEM_VA map staging"))?;
            undo.push(Undo::Unmap(staging_handle, staging_va, staging));
            // SAFETY: as for the staging buffer.
            let ib_handle =
                unsafe { dev.userptr(ib.ptr, ib_len) }.map_err(dev_err("GEM_USERPTR IB"))?;
            undo.push(Undo::Close(ib_handle));
            dev.va_map(ib_handle, ib_va, ib_len)
                .map_err(dev_err("GEM_VA map IB"))?;
            undo.push(Undo::Unmap(ib_handle, ib_va, ib_len));
            let ctx = dev.ctx_create().map_err(dev_err("AMDGPU_CTX alloc"))?;
            Ok((staging_handle, ib_handle, ctx))
        })();
        let result = result.inspect_err(|_| {
            for u in undo.drain(..).rev() {
                // Best effort: the setup error is what the caller needs.
                let _ = match u {
                    Undo::Close(h) => dev.gem_close(h),
                    Undo::Unmap(h, va, len) => dev.va_unmap(h, va, len),
                };
            }
        });
        match result {
            Ok((staging_handle, ib_handle, ctx)) => {
                // Touch the pages now so the userptr BOs validate quickly.
                staging_buf.as_mut_slice()[0] = 0;
                ib.as_mut_slice()[0] = 0;
                Ok(SdmaEngine {
                    dev,
                    gpu,
                    family,
                    ctx,
                    staging: staging_buf,
                    staging_handle,
                    staging_va,
                    ib,
                    ib_handle,
                    ib_va,
                    bo_va,
                    bo_va_len: round(largest_bo),
                    timeout: FENCE_TIMEOUT,
                    submissions: 0,
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Runs one IB copying `len` bytes `src` → `dst` and waits for it.
    fn run(
        &mut self,
        bo: &BoRef<'_>,
        handle: GemHandle,
        src: u64,
        dst: u64,
        len: u64,
    ) -> Result<(), CopyError> {
        let ib = build_ib(self.family, src, dst, len);
        let bytes = self.ib.as_mut_slice();
        for (slot, dw) in bytes.chunks_exact_mut(4).zip(&ib) {
            slot.copy_from_slice(&dw.to_le_bytes());
        }
        let err = |op: &'static str| {
            move |source| CopyError::Device {
                gpu: bo.gpu,
                bo: bo.index,
                op,
                source,
            }
        };
        let seq = self
            .dev
            .submit(
                self.ctx,
                self.ib_va,
                ib.len() as u32,
                &[handle, self.staging_handle, self.ib_handle],
            )
            .map_err(err("AMDGPU_CS"))?;
        self.submissions += 1;
        if !self
            .dev
            .wait(self.ctx, seq, self.timeout)
            .map_err(err("AMDGPU_WAIT_CS"))?
        {
            return Err(CopyError::Timeout {
                gpu: bo.gpu,
                bo: bo.index,
                timeout: self.timeout,
            });
        }
        Ok(())
    }

    /// Imports and maps the BO, runs `body`, then unmaps and closes it;
    /// an error of `body` wins over cleanup errors.
    fn with_bo(
        &mut self,
        bo: &BoRef<'_>,
        body: impl FnOnce(&mut Self, GemHandle) -> Result<(), CopyError>,
    ) -> Result<(), CopyError> {
        let dmabuf = bo.dmabuf.ok_or_else(|| CopyError::NoEngine {
            gpu: bo.gpu,
            bo: bo.index,
            why: "SDMA needs the BO's dmabuf fd".into(),
        })?;
        if bo.size > self.bo_va_len {
            return Err(CopyError::Setup {
                gpu: self.gpu,
                what: format!(
                    "BO {} of {:#x} bytes exceeds the VA slot of {:#x}",
                    bo.index, bo.size, self.bo_va_len
                ),
            });
        }
        let err = |op: &'static str| {
            move |source| CopyError::Device {
                gpu: bo.gpu,
                bo: bo.index,
                op,
                source,
            }
        };
        let handle = self
            .dev
            .import_dmabuf(dmabuf)
            .map_err(err("PRIME_FD_TO_HANDLE"))?;
        let mapped = self
            .dev
            .va_map(handle, self.bo_va, bo.size)
            .map_err(err("GEM_VA map BO"));
        let result = mapped.and_then(|()| {
            let r = body(self, handle);
            let unmapped = self
                .dev
                .va_unmap(handle, self.bo_va, bo.size)
                .map_err(err("GEM_VA unmap BO"));
            r.and(unmapped)
        });
        let closed = self.dev.gem_close(handle).map_err(err("GEM_CLOSE"));
        result.and(closed)
    }
}

impl<D: SdmaDevice> CopyEngine for SdmaEngine<D> {
    fn name(&self) -> &'static str {
        "sdma"
    }

    fn read_bo(&mut self, bo: &BoRef<'_>, sink: &mut dyn Write) -> Result<(), CopyError> {
        self.with_bo(bo, |eng, handle| {
            for (off, len) in chunks(bo.size, eng.staging.len as u64) {
                let (src, dst) = (eng.bo_va + off, eng.staging_va);
                eng.run(bo, handle, src, dst, len)?;
                drain_to(sink, &eng.staging.as_mut_slice()[..len as usize], bo)?;
            }
            Ok(())
        })
    }

    fn write_bo(&mut self, bo: &BoRef<'_>, src: &mut dyn Read) -> Result<(), CopyError> {
        self.with_bo(bo, |eng, handle| {
            for (off, len) in chunks(bo.size, eng.staging.len as u64) {
                fill_from(src, &mut eng.staging.as_mut_slice()[..len as usize], bo)?;
                let (from, to) = (eng.staging_va, eng.bo_va + off);
                eng.run(bo, handle, from, to, len)?;
            }
            Ok(())
        })
    }
}

impl<D: SdmaDevice> Drop for SdmaEngine<D> {
    fn drop(&mut self) {
        // The userptr handles must be closed before the memory is unmapped
        // (the buffers drop after this body).
        let ib_len = self.ib.len as u64;
        let staging = self.staging.len as u64;
        let steps = [
            ("AMDGPU_CTX free", self.dev.ctx_free(self.ctx)),
            (
                "GEM_VA unmap IB",
                self.dev.va_unmap(self.ib_handle, self.ib_va, ib_len),
            ),
            ("GEM_CLOSE IB", self.dev.gem_close(self.ib_handle)),
            (
                "GEM_VA unmap staging",
                self.dev
                    .va_unmap(self.staging_handle, self.staging_va, staging),
            ),
            ("GEM_CLOSE staging", self.dev.gem_close(self.staging_handle)),
        ];
        for (op, r) in steps {
            if let Err(e) = r {
                log::warn!("GPU {}: SDMA teardown: {op}: {e}", self.gpu);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bo;
    use crate::ids::{GpuVa, MmapOffset};
    use std::collections::HashMap;
    use std::os::fd::{AsFd, AsRawFd};
    use std::sync::{Arc, Mutex};

    #[test]
    fn copy_linear_layout_gfx9() {
        let p = copy_linear(
            AMDGPU_FAMILY_AI,
            0x1122_3344_5566_7788,
            0x99aa_bbcc_ddee_ff00,
            4096,
        );
        assert_eq!(
            p,
            [
                0x0000_0001,
                4095,
                0,
                0x5566_7788,
                0x1122_3344,
                0xddee_ff00,
                0x99aa_bbcc
            ]
        );
        let p = copy_linear(AMDGPU_FAMILY_AI, 0, 0x1000, MAX_CHUNK);
        assert_eq!(p[1], (1 << 21) - 1);
    }

    #[test]
    fn copy_linear_layout_pre_gfx9() {
        // Polaris (family 130) counts bytes.
        let p = copy_linear(130, 0x2000, 0x1_0000_3000, 4096);
        assert_eq!(p, [1, 4096, 0, 0x2000, 0, 0x3000, 1]);
        assert_eq!(max_chunk(130), (1 << 21) - 1);
    }

    #[test]
    #[should_panic]
    fn oversized_chunk_is_a_bug() {
        copy_linear(AMDGPU_FAMILY_AI, 0, 0, MAX_CHUNK + 1);
    }

    #[test]
    fn chunking_and_padding() {
        let c: Vec<_> = chunks(5 * MAX_CHUNK / 2, MAX_CHUNK).collect();
        assert_eq!(
            c,
            vec![
                (0, MAX_CHUNK),
                (MAX_CHUNK, MAX_CHUNK),
                (2 * MAX_CHUNK, MAX_CHUNK / 2)
            ]
        );
        assert_eq!(chunks(0, 7).count(), 0);
        // 1 packet = 7 dwords → padded to 8; 3 packets = 21 → 24.
        let ib = build_ib(AMDGPU_FAMILY_AI, 0x10_0000, 0x20_0000, 4096);
        assert_eq!(ib.len(), 8);
        assert_eq!(ib[7], SDMA_OP_NOP);
        let ib = build_ib(AMDGPU_FAMILY_AI, 0x10_0000, 0x80_0000, 5 * MAX_CHUNK / 2);
        assert_eq!(ib.len(), 24);
        assert_eq!(ib.len(), ib_dwords(AMDGPU_FAMILY_AI, 5 * MAX_CHUNK / 2));
        // Second packet: addresses advance by one chunk.
        assert_eq!(
            &ib[7..14],
            &copy_linear(AMDGPU_FAMILY_AI, 0x30_0000, 0xa0_0000, MAX_CHUNK)
        );
        assert_eq!(ib[14 + 1], (MAX_CHUNK / 2 - 1) as u32);
        assert!(ib[21..].iter().all(|&d| d == SDMA_OP_NOP));
        // 8 packets = 56 dwords, already aligned.
        assert_eq!(ib_dwords(AMDGPU_FAMILY_AI, 8 * MAX_CHUNK), 56);
    }

    #[test]
    fn engine_window_avoids_the_image_bos() {
        let busy = [(0, 0x40_0000), (0x60_0000, 0x1000)];
        let w = VaWindow::pick(0, 1 << 47, &busy, PAGE_SIZE, AMDGPU_FAMILY_AI, 0x3000).unwrap();
        assert_eq!(w.start, 0x80_0000);
        assert_eq!(w.len, 3 * VA_ALIGN);
        assert!(VaWindow::pick(0, 0x100_0000, &busy, 1 << 30, AMDGPU_FAMILY_AI, 1 << 30).is_none());
    }

    #[test]
    fn va_window_avoids_busy_ranges() {
        let busy = [(0x20_0000, 0x10_0000), (0x40_0000, 0x40_0000)];
        assert_eq!(
            pick_va_window(0, 1 << 40, &busy, 0x20_0000, VA_ALIGN),
            Some(0)
        );
        assert_eq!(
            pick_va_window(0x10_0000, 1 << 40, &busy, 0x20_0000, VA_ALIGN),
            Some(0x80_0000)
        );
        assert_eq!(
            pick_va_window(0x10_0000, 0x90_0000, &busy, 0x20_0000, VA_ALIGN),
            None
        );
        assert_eq!(
            pick_va_window(u64::MAX - 10, u64::MAX, &[], 1, VA_ALIGN),
            None
        );
    }

    /// A model of a render node whose DMA ring executes COPY_LINEAR packets
    /// on its objects: dmabufs are shared byte vectors, userptrs our own
    /// memory.  Copies must lie inside one mapping, as on hardware where
    /// anything else faults.
    struct Model {
        family: u32,
        next: u32,
        dmabufs: HashMap<i32, Arc<Mutex<Vec<u8>>>>,
        objects: HashMap<GemHandle, Obj>,
        vas: Vec<(u64, u64, GemHandle)>,
        ctxs: u32,
        seq: u64,
        fail_submit: Option<u64>,
        hang: bool,
        calls: Arc<Mutex<Vec<String>>>,
    }

    enum Obj {
        Dmabuf(Arc<Mutex<Vec<u8>>>),
        User(NonNull<u8>, u64),
    }

    // SAFETY: the model is used by one thread at a time; its raw pointers
    // point at the engine's buffers, which outlive the registrations.
    unsafe impl Send for Model {}

    impl Model {
        fn new(family: u32) -> Self {
            Model {
                family,
                next: 1,
                dmabufs: HashMap::new(),
                objects: HashMap::new(),
                vas: Vec::new(),
                ctxs: 0,
                seq: 0,
                fail_submit: None,
                hang: false,
                calls: Arc::new(Mutex::new(Vec::new())),
            }
        }

        fn log(&self, s: String) {
            self.calls.lock().unwrap().push(s);
        }

        fn resolve(&self, va: u64, len: u64) -> io::Result<(GemHandle, u64)> {
            self.vas
                .iter()
                .find(|(s, n, _)| va >= *s && va.checked_add(len).is_some_and(|e| e <= s + n))
                .map(|&(s, _, h)| (h, va - s))
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
        }

        fn read(&self, h: GemHandle, off: u64, len: u64) -> Vec<u8> {
            match &self.objects[&h] {
                Obj::Dmabuf(m) => m.lock().unwrap()[off as usize..(off + len) as usize].to_vec(),
                // SAFETY: resolve() checked the range lies in the registered
                // userptr, which the engine keeps alive.
                Obj::User(p, _) => {
                    // SAFETY: off is inside the registration (see above).
                    let start = unsafe { p.as_ptr().add(off as usize) };
                    // SAFETY: as above; the bytes are initialised memory.
                    unsafe { std::slice::from_raw_parts(start, len as usize) }.to_vec()
                }
            }
        }

        fn write(&self, h: GemHandle, off: u64, data: &[u8]) {
            match &self.objects[&h] {
                Obj::Dmabuf(m) => {
                    m.lock().unwrap()[off as usize..off as usize + data.len()].copy_from_slice(data)
                }
                // SAFETY: as in read().
                Obj::User(p, _) => {
                    // SAFETY: off is inside the registration (see read()).
                    let dst = unsafe { p.as_ptr().add(off as usize) };
                    // SAFETY: resolve() checked dst..dst+len is registered
                    // memory, which cannot overlap `data` (a fresh Vec).
                    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) }
                }
            }
        }
    }

    impl SdmaDevice for Model {
        fn family(&self) -> u32 {
            self.family
        }
        fn import_dmabuf(&mut self, fd: BorrowedFd<'_>) -> io::Result<GemHandle> {
            let mem = self
                .dmabufs
                .get(&fd.as_raw_fd())
                .cloned()
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
            let h = self.next;
            self.next += 1;
            self.objects.insert(h, Obj::Dmabuf(mem));
            self.log(format!("import {h}"));
            Ok(h)
        }
        unsafe fn userptr(&mut self, addr: NonNull<u8>, size: u64) -> io::Result<GemHandle> {
            if !(addr.as_ptr() as u64).is_multiple_of(PAGE_SIZE) || !size.is_multiple_of(PAGE_SIZE)
            {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            let h = self.next;
            self.next += 1;
            self.objects.insert(h, Obj::User(addr, size));
            self.log(format!("userptr {h}"));
            Ok(h)
        }
        fn va_map(&mut self, h: GemHandle, va: u64, size: u64) -> io::Result<()> {
            let obj_size = match &self
                .objects
                .get(&h)
                .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?
            {
                Obj::Dmabuf(m) => m.lock().unwrap().len() as u64,
                Obj::User(_, n) => *n,
            };
            let overlaps = self
                .vas
                .iter()
                .any(|(s, n, _)| va < s + n && *s < va + size);
            if size > obj_size || overlaps || !va.is_multiple_of(PAGE_SIZE) {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            self.vas.push((va, size, h));
            self.log(format!("map {h}"));
            Ok(())
        }
        fn va_unmap(&mut self, h: GemHandle, va: u64, size: u64) -> io::Result<()> {
            let i = self
                .vas
                .iter()
                .position(|&e| e == (va, size, h))
                .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
            self.vas.remove(i);
            self.log(format!("unmap {h}"));
            Ok(())
        }
        fn ctx_create(&mut self) -> io::Result<u32> {
            self.ctxs += 1;
            Ok(self.ctxs)
        }
        fn ctx_free(&mut self, _ctx: u32) -> io::Result<()> {
            self.log("ctx_free".into());
            Ok(())
        }
        fn submit(
            &mut self,
            _ctx: u32,
            ib_va: u64,
            dwords: u32,
            bos: &[GemHandle],
        ) -> io::Result<u64> {
            if Some(self.seq + 1) == self.fail_submit {
                return Err(io::Error::from_raw_os_error(libc::ENOMEM));
            }
            if !(dwords as usize).is_multiple_of(IB_ALIGN_DWORDS) {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            let (ibh, iboff) = self.resolve(ib_va, u64::from(dwords) * 4)?;
            let raw = self.read(ibh, iboff, u64::from(dwords) * 4);
            let ib: Vec<u32> = raw
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let mut i = 0;
            while i < ib.len() {
                match ib[i] & 0xff {
                    0 => i += 1,
                    1 if (ib[i] >> 8) & 0xff == 0 => {
                        let count = u64::from(ib[i + 1] & 0x3f_ffff);
                        let bytes = if self.family >= AMDGPU_FAMILY_AI {
                            count + 1
                        } else {
                            count
                        };
                        let src = u64::from(ib[i + 3]) | u64::from(ib[i + 4]) << 32;
                        let dst = u64::from(ib[i + 5]) | u64::from(ib[i + 6]) << 32;
                        let (sh, so) = self.resolve(src, bytes)?;
                        let (dh, doff) = self.resolve(dst, bytes)?;
                        if !bos.contains(&sh) || !bos.contains(&dh) {
                            return Err(io::Error::from_raw_os_error(libc::EFAULT));
                        }
                        let data = self.read(sh, so, bytes);
                        self.write(dh, doff, &data);
                        i += COPY_LINEAR_DWORDS;
                    }
                    _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
                }
            }
            self.seq += 1;
            self.log(format!("submit {}", self.seq));
            Ok(self.seq)
        }
        fn wait(&mut self, _ctx: u32, seq: u64, _t: Duration) -> io::Result<bool> {
            Ok(!self.hang && seq <= self.seq)
        }
        fn gem_close(&mut self, h: GemHandle) -> io::Result<()> {
            self.objects
                .remove(&h)
                .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
            self.log(format!("close {h}"));
            Ok(())
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(13) ^ seed)
            .collect()
    }

    fn bo_ref<'a>(fd: BorrowedFd<'a>, size: u64) -> BoRef<'a> {
        BoRef {
            index: 2,
            gpu: GpuId(0x1a2b),
            addr: GpuVa(0x7000_0000),
            size,
            alloc_flags: bo::ALLOC_VRAM,
            cpu_map: None,
            dmabuf: Some(fd),
        }
    }

    fn roundtrip(family: u32) {
        let size = 2 * MAX_CHUNK + 3 * PAGE_SIZE;
        let staging = MAX_CHUNK + MAX_CHUNK / 2;
        // Any open fd serves as the dmabuf's identity in the model.
        let fd = std::fs::File::open("/dev/null").unwrap();
        // One byte of slack after the BO: a copy past the end would land
        // there only if the model's mapping allowed it, which it does not.
        let mem = Arc::new(Mutex::new(pattern(size as usize, 5)));
        let mut model = Model::new(family);
        model.dmabufs.insert(fd.as_raw_fd(), mem.clone());
        let calls = model.calls.clone();
        let va = VaWindow {
            start: 0x100_0000_0000,
            len: VaWindow::needed(staging, family, size),
        };
        let mut eng = SdmaEngine::new(model, GpuId(0x1a2b), staging, size, va).unwrap();
        let bo = bo_ref(fd.as_fd(), size);
        let mut out = Vec::new();
        eng.read_bo(&bo, &mut out).unwrap();
        assert_eq!(out, *mem.lock().unwrap());
        assert_eq!(eng.submissions, 2, "two staging fills");

        let new = pattern(size as usize, 0xa5);
        eng.write_bo(&bo, &mut &new[..]).unwrap();
        assert_eq!(*mem.lock().unwrap(), new);
        drop(eng);
        let calls = calls.lock().unwrap();
        let opened = calls
            .iter()
            .filter(|c| c.starts_with("import") || c.starts_with("userptr"))
            .count();
        let closed = calls.iter().filter(|c| c.starts_with("close")).count();
        assert_eq!(opened, closed, "{calls:?}");
        let maps = calls.iter().filter(|c| c.starts_with("map")).count();
        let unmaps = calls.iter().filter(|c| c.starts_with("unmap")).count();
        assert_eq!(maps, unmaps, "{calls:?}");
    }

    #[test]
    fn roundtrip_gfx9_through_model() {
        roundtrip(AMDGPU_FAMILY_AI);
    }

    #[test]
    fn roundtrip_pre_gfx9_through_model() {
        roundtrip(130);
    }

    #[test]
    fn bytes_count_encoding_would_overrun() {
        // The model interprets GFX9 counts as bytes−1; an IB built with the
        // pre-GFX9 encoding copies one byte too many and faults past the
        // end of the last mapping — the upstream defect.
        let mut model = Model::new(AMDGPU_FAMILY_AI);
        let fd = std::fs::File::open("/dev/null").unwrap();
        model
            .dmabufs
            .insert(fd.as_raw_fd(), Arc::new(Mutex::new(vec![0; 4096])));
        let h = model.import_dmabuf(fd.as_fd()).unwrap();
        model.va_map(h, 0x10_0000, 4096).unwrap();
        let mut ib_mem = AnonBuf::new(4096).unwrap();
        let mut dst = AnonBuf::new(4096).unwrap();
        // SAFETY: both buffers outlive the model's use in this test.
        let ibh = unsafe { model.userptr(ib_mem.ptr, 4096) }.unwrap();
        // SAFETY: as above.
        let dh = unsafe { model.userptr(dst.ptr, 4096) }.unwrap();
        model.va_map(ibh, 0x20_0000, 4096).unwrap();
        model.va_map(dh, 0x30_0000, 4096).unwrap();
        let mut ib = build_ib(130, 0x10_0000, 0x30_0000, 4096);
        ib[1] = 4096; // what upstream writes on GFX9
        for (slot, dw) in ib_mem.as_mut_slice().chunks_exact_mut(4).zip(&ib) {
            slot.copy_from_slice(&dw.to_le_bytes());
        }
        let e = model.submit(1, 0x20_0000, 8, &[h, ibh, dh]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
        let good = build_ib(AMDGPU_FAMILY_AI, 0x10_0000, 0x30_0000, 4096);
        for (slot, dw) in ib_mem.as_mut_slice().chunks_exact_mut(4).zip(&good) {
            slot.copy_from_slice(&dw.to_le_bytes());
        }
        model.submit(1, 0x20_0000, 8, &[h, ibh, dh]).unwrap();
        let _ = dst.as_mut_slice();
    }

    #[test]
    fn errors_are_propagated_and_resources_released() {
        let size = 4 * PAGE_SIZE;
        let fd = std::fs::File::open("/dev/null").unwrap();
        let setup = |fail_submit: Option<u64>, hang: bool| {
            let mut model = Model::new(AMDGPU_FAMILY_AI);
            model
                .dmabufs
                .insert(fd.as_raw_fd(), Arc::new(Mutex::new(vec![0; size as usize])));
            model.fail_submit = fail_submit;
            model.hang = hang;
            let calls = model.calls.clone();
            let va = VaWindow {
                start: 0,
                len: VaWindow::needed(PAGE_SIZE, AMDGPU_FAMILY_AI, size),
            };
            (
                SdmaEngine::new(model, GpuId(0x1a2b), PAGE_SIZE, size, va).unwrap(),
                calls,
            )
        };
        let bo = bo_ref(fd.as_fd(), size);

        // Third submission fails: the error names the ioctl and keeps errno.
        let (mut eng, calls) = setup(Some(3), false);
        let e = eng.read_bo(&bo, &mut Vec::new()).unwrap_err();
        assert!(
            e.to_string().contains("AMDGPU_CS") && e.to_string().contains("BO 2"),
            "{e}"
        );
        assert_eq!(e.raw_os_error(), Some(libc::ENOMEM));
        // The BO was unmapped and closed anyway.
        let log = calls.lock().unwrap().clone();
        assert!(
            log.ends_with(&["unmap 3".to_string(), "close 3".to_string()]),
            "{log:?}"
        );

        let (mut eng, _) = setup(None, true);
        let e = eng
            .write_bo(&bo, &mut &vec![0u8; size as usize][..])
            .unwrap_err();
        assert!(matches!(e, CopyError::Timeout { .. }), "{e}");

        // Short pages file on restore: an error, not silent success.
        let (mut eng, _) = setup(None, false);
        let e = eng.write_bo(&bo, &mut &[0u8; 100][..]).unwrap_err();
        assert!(matches!(e, CopyError::Stream { .. }), "{e}");

        // A BO larger than the VA slot, and a BO without dmabuf.
        let (mut eng, _) = setup(None, false);
        let big = bo_ref(fd.as_fd(), VA_ALIGN + PAGE_SIZE);
        assert!(matches!(
            eng.read_bo(&big, &mut Vec::new()),
            Err(CopyError::Setup { .. })
        ));
        let mut nodma = bo_ref(fd.as_fd(), size);
        nodma.dmabuf = None;
        nodma.cpu_map = Some((fd.as_fd(), MmapOffset(0)));
        assert!(matches!(
            eng.read_bo(&nodma, &mut Vec::new()),
            Err(CopyError::NoEngine { .. })
        ));
    }

    #[test]
    fn setup_rejects_small_va_window_and_unaligned_staging() {
        let va = VaWindow {
            start: 0,
            len: VA_ALIGN,
        };
        let e = SdmaEngine::new(
            Model::new(AMDGPU_FAMILY_AI),
            GpuId(1),
            PAGE_SIZE,
            1 << 30,
            va,
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("VA window"), "{e}");
        let va = VaWindow {
            start: 0,
            len: 1 << 40,
        };
        let e = SdmaEngine::new(Model::new(AMDGPU_FAMILY_AI), GpuId(1), 100, 4096, va)
            .err()
            .unwrap();
        assert!(e.to_string().contains("staging size"), "{e}");
    }
}
