//! The memory a wave reaches: GPU virtual addresses (global, flat, scalar, code) through the
//! [`Memory`] trait the caller implements, and the workgroup's LDS as a byte slice.

use std::fmt;

use crate::regfile::LANES;

/// A GPU virtual address that could not be accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub addr: u64,
    pub write: bool,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.write { "write to" } else { "read of" };
        write!(f, "{what} GPU VA {:#x} faults", self.addr)
    }
}

/// Read-modify-write operations of the atomic instructions (DS, FLAT/GLOBAL, MUBUF, SMEM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    Swap,
    /// Compare-and-swap: stores `src` when the old value equals `cmp`.
    CmpSwap,
    Add,
    Sub,
    /// `src - old` (DS's rsub).
    Rsub,
    SMin,
    UMin,
    SMax,
    UMax,
    And,
    Or,
    Xor,
    /// `old >= src ? 0 : old + 1`.
    Inc,
    /// `old == 0 || old > src ? src : old - 1`.
    Dec,
    /// IEEE add of f32 (4-byte) or f64 (8-byte) values.
    FAdd,
    FMin,
    FMax,
    /// Two packed f16 adds in one dword.
    PkAddF16,
}

impl AtomicOp {
    /// The new value for an old one, `size` bytes (4 or 8) wide. Implementations of
    /// [`Memory::atomic`] that cannot use a native atomic call this under their own lock.
    pub fn apply(self, size: usize, old: u64, src: u64, cmp: u64) -> u64 {
        let mask = if size == 8 { u64::MAX } else { u32::MAX as u64 };
        let sx = |v: u64| {
            if size == 8 {
                v as i64
            } else {
                v as u32 as i32 as i64
            }
        };
        let new = match self {
            AtomicOp::Swap => src,
            AtomicOp::CmpSwap => {
                if old == cmp {
                    src
                } else {
                    old
                }
            }
            AtomicOp::Add => old.wrapping_add(src),
            AtomicOp::Sub => old.wrapping_sub(src),
            AtomicOp::Rsub => src.wrapping_sub(old),
            AtomicOp::SMin => sx(old).min(sx(src)) as u64,
            AtomicOp::SMax => sx(old).max(sx(src)) as u64,
            AtomicOp::UMin => old.min(src),
            AtomicOp::UMax => old.max(src),
            AtomicOp::And => old & src,
            AtomicOp::Or => old | src,
            AtomicOp::Xor => old ^ src,
            AtomicOp::Inc => {
                if old >= src {
                    0
                } else {
                    old + 1
                }
            }
            AtomicOp::Dec => {
                if old == 0 || old > src {
                    src
                } else {
                    old - 1
                }
            }
            AtomicOp::FAdd | AtomicOp::FMin | AtomicOp::FMax => float_rmw(self, size, old, src),
            AtomicOp::PkAddF16 => pk_add_f16(old as u32, src as u32) as u64,
        };
        new & mask
    }
}

fn float_rmw(op: AtomicOp, size: usize, old: u64, src: u64) -> u64 {
    if size == 8 {
        let (a, b) = (f64::from_bits(old), f64::from_bits(src));
        let r = match op {
            AtomicOp::FAdd => a + b,
            AtomicOp::FMin => a.min(b),
            _ => a.max(b),
        };
        r.to_bits()
    } else {
        let (a, b) = (f32::from_bits(old as u32), f32::from_bits(src as u32));
        let r = match op {
            AtomicOp::FAdd => a + b,
            AtomicOp::FMin => a.min(b),
            _ => a.max(b),
        };
        r.to_bits() as u64
    }
}

fn pk_add_f16(a: u32, b: u32) -> u32 {
    use crate::fp::{f16_to_f32, f32_to_f16};
    let half = |x: u32, y: u32| f32_to_f16(f16_to_f32(x as u16) + f16_to_f32(y as u16)) as u32;
    half(a & 0xffff, b & 0xffff) | half(a >> 16, b >> 16) << 16
}

/// The GPU virtual memory of the process a wave runs in.
///
/// Every access names a 64-bit GPU VA; an unmapped or protected address returns a
/// [`Fault`] carrying it, which stops the wave at the faulting instruction. Accesses within
/// one call are at most 64 bytes and naturally sized for atomics.
pub trait Memory {
    /// Reads `buf.len()` bytes at `addr`.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), Fault>;
    /// Writes `data` at `addr`.
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), Fault>;
    /// Atomically replaces the `size`-byte (4 or 8) value at `addr` by
    /// `op.apply(size, old, src, cmp)` and returns the old value.
    fn atomic(
        &mut self,
        addr: u64,
        size: usize,
        op: AtomicOp,
        src: u64,
        cmp: u64,
    ) -> Result<u64, Fault>;

    /// Reads as [`Memory::read`] does, but sees memory as it is now: what a load that
    /// bypasses the wave's caches (GLC, or gfx90a's SCC: system scope) reads.
    /// Implementations that read ahead of the wave neither use nor fill what they read
    /// ahead here.
    fn read_fresh(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.read(addr, buf)
    }

    /// The wave invalidates its caches (`buffer_wbinvl1`, `buffer_inv`, `s_dcache_inv`, ...):
    /// reads after it see what other agents wrote before it. Data an implementation read
    /// ahead of the wave may serve its reads until here (and must reflect the wave's own
    /// writes); writes always reach memory at once.
    fn acquire(&mut self) {}

    /// The loads of one vector memory instruction: for each lane `l` of `mask`, in lane
    /// order, `bytes` (at most 16) at `addrs[l]` into `buf[l * bytes..][..bytes]`; `fresh`
    /// as [`Memory::read_fresh`]. The first fault stops it.
    fn read_lanes(&mut self, lanes: &Lanes<'_>, fresh: bool, buf: &mut [u8]) -> Result<(), Fault> {
        read_each_lane(self, lanes, fresh, buf)
    }

    /// The stores of one vector memory instruction: for each lane `l` of `mask`, in lane
    /// order, `data[l * bytes..][..bytes]` at `addrs[l]`. The first fault stops it (the
    /// lanes before it are written).
    fn write_lanes(&mut self, lanes: &Lanes<'_>, data: &[u8]) -> Result<(), Fault> {
        write_each_lane(self, lanes, data)
    }

    /// The address of byte `offset` of `lane`'s private (scratch) memory, for scratch_* and
    /// flat accesses to the private aperture, given the wave's FLAT_SCRATCH base. The
    /// default is GFX9's swizzle: dwords of the 64 lanes interleaved.
    fn private_address(&self, flat_scratch: u64, lane: usize, offset: u32) -> u64 {
        let dword = (offset / 4) as u64;
        flat_scratch + dword * 256 + lane as u64 * 4 + (offset % 4) as u64
    }
}

/// Where the lanes of one vector memory instruction go: lane `l` of `mask` accesses `bytes`
/// at `addrs[l]`.
#[derive(Clone, Copy, Debug)]
pub struct Lanes<'a> {
    pub addrs: &'a [u64; LANES],
    pub mask: u64,
    pub bytes: usize,
}

impl Lanes<'_> {
    /// The active lanes, in order.
    pub fn iter(&self) -> impl Iterator<Item = usize> {
        crate::regfile::lanes(self.mask)
    }

    /// The lowest address and the end of the highest access of the active lanes (None
    /// without any, or when an access wraps past the top of the address space).
    pub fn span(&self) -> Option<(u64, u64)> {
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        for l in self.iter() {
            let a = self.addrs[l];
            lo = lo.min(a);
            hi = hi.max(a.checked_add(self.bytes as u64)?);
        }
        (lo < hi).then_some((lo, hi))
    }
}

/// [`Memory::read_lanes`] lane by lane through [`Memory::read`] (or `read_fresh`): its
/// default, and the fallback of implementations with a faster path.
pub fn read_each_lane<M: Memory + ?Sized>(
    mem: &mut M,
    lanes: &Lanes<'_>,
    fresh: bool,
    buf: &mut [u8],
) -> Result<(), Fault> {
    let n = lanes.bytes;
    for l in lanes.iter() {
        let to = &mut buf[l * n..(l + 1) * n];
        if fresh {
            mem.read_fresh(lanes.addrs[l], to)?;
        } else {
            mem.read(lanes.addrs[l], to)?;
        }
    }
    Ok(())
}

/// [`Memory::write_lanes`] lane by lane through [`Memory::write`].
pub fn write_each_lane<M: Memory + ?Sized>(
    mem: &mut M,
    lanes: &Lanes<'_>,
    data: &[u8],
) -> Result<(), Fault> {
    let n = lanes.bytes;
    for l in lanes.iter() {
        mem.write(lanes.addrs[l], &data[l * n..(l + 1) * n])?;
    }
    Ok(())
}

/// A sparse memory of 4 KiB pages in a map: what tests, benches and examples run against.
/// Reads of pages never written fault, as unmapped VAs do.
#[derive(Clone, Debug, Default)]
pub struct VecMemory {
    pages: std::collections::HashMap<u64, Box<[u8; 4096]>, PageHash>,
}

/// Page numbers are their own good hash (one multiply spreads them); SipHash per lane
/// access would dominate a memory-bound kernel's time.
#[derive(Clone, Copy, Debug, Default)]
struct PageHash;

impl std::hash::BuildHasher for PageHash {
    type Hasher = PageHasher;
    fn build_hasher(&self) -> PageHasher {
        PageHasher(0)
    }
}

#[derive(Clone, Copy, Debug)]
struct PageHasher(u64);

impl std::hash::Hasher for PageHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | *b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl VecMemory {
    pub fn new() -> VecMemory {
        VecMemory::default()
    }

    /// Makes `[addr, addr + len)` accessible, zero-filled.
    pub fn map(&mut self, addr: u64, len: u64) {
        let first = addr >> 12;
        let last = (addr + len.max(1) - 1) >> 12;
        for p in first..=last {
            self.pages.entry(p).or_insert_with(|| Box::new([0; 4096]));
        }
    }

    /// Copies `data` to `addr`, mapping what it covers.
    pub fn load(&mut self, addr: u64, data: &[u8]) {
        self.map(addr, data.len() as u64);
        self.write(addr, data).expect("just mapped");
    }

    /// Calls `f(done, page_bytes)` for each page-sized piece of `[addr, addr + len)`.
    fn chunks(
        &mut self,
        addr: u64,
        len: usize,
        write: bool,
        mut f: impl FnMut(usize, &mut [u8]),
    ) -> Result<(), Fault> {
        let mut done = 0;
        while done < len {
            let a = addr.wrapping_add(done as u64);
            let at = (a & 0xfff) as usize;
            let n = (4096 - at).min(len - done);
            let page = self
                .pages
                .get_mut(&(a >> 12))
                .ok_or(Fault { addr: a, write })?;
            f(done, &mut page[at..at + n]);
            done += n;
        }
        Ok(())
    }
}

impl Memory for VecMemory {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        let len = buf.len();
        self.chunks(addr, len, false, |k, p| {
            buf[k..k + p.len()].copy_from_slice(p)
        })
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        self.chunks(addr, data.len(), true, |k, p| {
            p.copy_from_slice(&data[k..k + p.len()])
        })
    }

    fn atomic(
        &mut self,
        addr: u64,
        size: usize,
        op: AtomicOp,
        src: u64,
        cmp: u64,
    ) -> Result<u64, Fault> {
        let mut old = [0u8; 8];
        let at = (addr & 0xfff) as usize;
        if at + size > 4096 {
            self.read(addr, &mut old[..size])?;
            let old = u64::from_le_bytes(old);
            let new = op.apply(size, old, src, cmp);
            self.write(addr, &new.to_le_bytes()[..size])?;
            return Ok(old);
        }
        // Within one page (atomics are naturally aligned): one lookup.
        let page = self
            .pages
            .get_mut(&(addr >> 12))
            .ok_or(Fault { addr, write: false })?;
        old[..size].copy_from_slice(&page[at..at + size]);
        let old = u64::from_le_bytes(old);
        let new = op.apply(size, old, src, cmp);
        page[at..at + size].copy_from_slice(&new.to_le_bytes()[..size]);
        Ok(old)
    }
}
