//! A wave's view of memory: the process' GPU VM as one GPU reaches it
//! (the BOs mapped there, SVM ranges), resolved by the CP model under the
//! state lock and refreshed by the worker between rounds.  Word accesses
//! to VRAM and GTT go straight to the daemon's mapping of the BO, atomics
//! with the CPU's atomic instructions; USERPTR and SVM memory go through
//! the process' address space.  What every wave reads and nobody may
//! change while the dispatch runs (its kernarg segment, its AQL packet:
//! both often in system memory, a system call per read) is read once.
//!
//! Reads of the process' own memory (USERPTR, SVM: a system call each)
//! are served from blocks read ahead, as the GPU's caches keep lines of
//! system memory: until the wave invalidates its caches (an acquire), a
//! load bypasses them (GLC, or gfx90a's SCC: system scope), or the round
//! ends; the dispatch starts with none.  The dispatch's own writes go
//! through at once and update the blocks they hit; its atomics drop them.
//! A wave may thus miss what the process' CPU wrote since the block was
//! read only where the memory model lets a GPU miss it: between two
//! acquires, within one round.

use std::sync::Arc;

use gfx9::memory::{read_each_lane, write_each_lane, Lanes};
use gfx9::{AtomicOp, Fault, Memory};

use crate::device::mem::Mapping;
use crate::device::uapi;
use crate::device::vm::{self, GpuRange};

/// The last VRAM/GTT piece an access hit: its VA range and mapping.
struct Hot {
    start: u64,
    end: u64,
    map: Arc<Mapping>,
    base: u64,
}

/// The largest segment read once for all waves.
const SEGMENT_MAX: u32 = 64 * 1024;

/// Memory read once for a dispatch: its VA and bytes.
struct Segment {
    va: u64,
    bytes: Vec<u8>,
}

impl Segment {
    /// The byte range of `[addr, addr+n)` in the segment, when it lies within.
    fn span(&self, addr: u64, n: usize) -> Option<std::ops::Range<usize>> {
        let off = addr.checked_sub(self.va)?;
        let end = off.checked_add(n as u64)?;
        (end <= self.bytes.len() as u64).then_some(off as usize..end as usize)
    }

    fn overlaps(&self, addr: u64, n: usize) -> bool {
        addr < self.va + self.bytes.len() as u64 && self.va < addr.saturating_add(n as u64)
    }
}

/// Bytes read ahead per block of the process' own memory.
const AHEAD_BYTES: u64 = 32 * 1024;
/// Blocks read ahead at once (waves stream through several regions).
const AHEAD_BLOCKS: usize = 8;

/// A block of the process' own memory read ahead: its VA and bytes.
struct Block {
    va: u64,
    bytes: Vec<u8>,
}

impl Block {
    fn overlap(&self, addr: u64, n: usize) -> Option<(usize, usize, usize)> {
        let (s, e) = (self.va, self.va + self.bytes.len() as u64);
        let (a, b) = (addr.max(s), addr.saturating_add(n as u64).min(e));
        (a < b).then(|| ((a - s) as usize, (a - addr) as usize, (b - a) as usize))
    }
}

/// The blocks read ahead, replaced round robin.
#[derive(Default)]
struct Ahead {
    blocks: Vec<Block>,
    next: usize,
}

impl Ahead {
    /// Copies `[addr, addr+buf.len())` out of a block that holds it all.
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let n = buf.len();
        let Some(b) = self.blocks.iter().find(|b| {
            b.overlap(addr, n)
                .is_some_and(|(_, at, len)| at == 0 && len == n)
        }) else {
            return false;
        };
        let off = (addr - b.va) as usize;
        buf.copy_from_slice(&b.bytes[off..off + n]);
        true
    }

    /// Keeps a block; returns it.
    fn keep(&mut self, va: u64, bytes: Vec<u8>) -> &Block {
        let k = if self.blocks.len() < AHEAD_BLOCKS {
            self.blocks.push(Block { va, bytes });
            self.blocks.len() - 1
        } else {
            let k = self.next;
            self.next = (k + 1) % AHEAD_BLOCKS;
            self.blocks[k] = Block { va, bytes };
            k
        };
        &self.blocks[k]
    }

    /// A write of `data` at `addr` went through: blocks show it too.
    fn wrote(&mut self, addr: u64, data: &[u8]) {
        for b in &mut self.blocks {
            if let Some((off, at, len)) = b.overlap(addr, data.len()) {
                b.bytes[off..off + len].copy_from_slice(&data[at..at + len]);
            }
        }
    }

    /// Drops the blocks `[addr, addr+n)` overlaps.
    fn drop_overlapping(&mut self, addr: u64, n: usize) {
        self.blocks.retain(|b| b.overlap(addr, n).is_none());
        self.next = 0;
    }

    fn clear(&mut self) {
        self.blocks.clear();
        self.next = 0;
    }
}

pub struct GpuMemory {
    range: GpuRange,
    hot: Option<Hot>,
    /// Blocks of the process' own memory read ahead of the waves.
    ahead: Ahead,
    /// The dispatch's kernarg segment and AQL packet.
    fixed: Vec<Segment>,
    /// What the VM says of the last fault.
    pub last_fault: Option<vm::Fault>,
    /// The waves' memory accesses so far (reads, writes, atomics).
    pub accesses: u64,
}

impl GpuMemory {
    pub fn new(range: GpuRange) -> GpuMemory {
        GpuMemory {
            range,
            hot: None,
            ahead: Ahead::default(),
            fixed: Vec::new(),
            last_fault: None,
            accesses: 0,
        }
    }

    /// Reads `size` bytes at `va` that stay as they are while the dispatch
    /// runs (its kernarg segment, its packet) once, so that waves find them
    /// here; nothing is kept when they cannot be read (the waves then fault
    /// on them as they would).
    pub fn read_once(&mut self, va: u64, size: Option<u32>) {
        let Some(size) = size.filter(|&s| s > 0 && s <= SEGMENT_MAX) else {
            return;
        };
        let mut bytes = vec![0; size as usize];
        if self.read(va, &mut bytes).is_ok() {
            self.fixed.push(Segment { va, bytes });
        }
    }

    /// Forgets the segments `[addr, addr+n)` overlaps: a wave writes there.
    fn forget(&mut self, addr: u64, n: usize) {
        if self.fixed.iter().any(|s| s.overlaps(addr, n)) {
            self.fixed.retain(|s| !s.overlaps(addr, n));
        }
    }

    /// Takes a freshly resolved view of the VM (between rounds: what was
    /// read ahead is dropped too).
    pub fn refresh(&mut self, range: GpuRange) {
        self.range = range;
        self.hot = None;
        self.ahead.clear();
    }

    /// Reads `[addr, addr+buf.len())` of the process' own memory through a
    /// block read ahead (read now when none holds it); false when the bytes
    /// are not all in one such piece or cannot be read (the caller then
    /// reads them directly, and faults as that read does).
    fn read_ahead(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        if self.ahead.read(addr, buf) {
            return true;
        }
        if addr >= self.range.len() {
            return false;
        }
        let Some((start, len)) = self.range.user_piece(addr) else {
            return false;
        };
        let from = (addr & !(uapi::PAGE - 1)).max(start);
        let to = (from + AHEAD_BYTES).min(start + len);
        if addr + buf.len() as u64 > to {
            return false;
        }
        let mut bytes = vec![0; (to - from) as usize];
        if self.range.read(from, &mut bytes).is_err() {
            return false;
        }
        let b = self.ahead.keep(from, bytes);
        let off = (addr - b.va) as usize;
        buf.copy_from_slice(&b.bytes[off..off + buf.len()]);
        true
    }

    /// Reads without the fixed segments or blocks read ahead.
    fn read_now(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        if let Some((m, off)) = self.direct(addr, buf.len()) {
            if m.read(off, buf) {
                return Ok(());
            }
        }
        self.range
            .read(addr, buf)
            .map_err(|e| self.fault(addr, false, e))
    }

    /// The mapping and its offset for `[addr, addr+n)` when one VRAM/GTT
    /// piece holds it all.
    fn direct(&mut self, addr: u64, n: usize) -> Option<(&Mapping, u64)> {
        let end = addr.checked_add(n as u64)?;
        let hit = self
            .hot
            .as_ref()
            .is_some_and(|h| h.start <= addr && end <= h.end);
        if !hit {
            if addr >= self.range.len() {
                return None;
            }
            let (start, len, map, base) = self.range.mapped_piece(addr)?;
            self.hot = Some(Hot {
                start,
                end: start + len,
                map: map.clone(),
                base,
            });
        }
        let h = self.hot.as_ref()?;
        (end <= h.end).then(|| (&*h.map, h.base + (addr - h.start)))
    }

    /// The mapping, the mapping offset of the lowest address and that
    /// address when one VRAM/GTT piece holds the bytes of every lane.
    fn lanes_direct(&mut self, lanes: &Lanes<'_>) -> Option<(&Mapping, u64, u64)> {
        let (lo, hi) = lanes.span()?;
        let (m, base) = self.direct(lo, (hi - lo) as usize)?;
        Some((m, base, lo))
    }

    fn fault(&mut self, addr: u64, write: bool, e: vm::Fault) -> Fault {
        let at = match &e {
            vm::Fault::Unmapped { va, .. } | vm::Fault::Unmodelled { va, .. } => *va,
            vm::Fault::UserMemory { va, .. } => *va,
        };
        self.last_fault = Some(e);
        Fault {
            addr: if at == 0 { addr } else { at },
            write,
        }
    }
}

fn rmw(op: AtomicOp, size: usize, src: u64, cmp: u64) -> impl Fn(u64) -> Option<u64> {
    move |old| Some(op.apply(size, old, src, cmp))
}

impl Memory for GpuMemory {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.accesses += 1;
        for s in &self.fixed {
            if let Some(r) = s.span(addr, buf.len()) {
                buf.copy_from_slice(&s.bytes[r]);
                return Ok(());
            }
        }
        if let Some((m, off)) = self.direct(addr, buf.len()) {
            if m.read(off, buf) {
                return Ok(());
            }
        }
        if self.read_ahead(addr, buf) {
            return Ok(());
        }
        self.read_now(addr, buf)
    }

    fn read_fresh(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.accesses += 1;
        self.read_now(addr, buf)
    }

    fn acquire(&mut self) {
        self.ahead.clear();
    }

    fn read_lanes(&mut self, lanes: &Lanes<'_>, fresh: bool, buf: &mut [u8]) -> Result<(), Fault> {
        self.accesses += 1;
        let n = lanes.bytes;
        let one_piece = self.lanes_direct(lanes).is_some_and(|(m, base, lo)| {
            lanes.iter().all(|l| {
                let to = &mut buf[l * n..(l + 1) * n];
                m.read(base + (lanes.addrs[l] - lo), to)
            })
        });
        if one_piece {
            return Ok(());
        }
        read_each_lane(self, lanes, fresh, buf)
    }

    fn write_lanes(&mut self, lanes: &Lanes<'_>, data: &[u8]) -> Result<(), Fault> {
        self.accesses += 1;
        let n = lanes.bytes;
        if let Some((lo, hi)) = lanes.span() {
            self.forget(lo, (hi - lo) as usize);
        }
        // A lane the mapping refuses (none does: it holds the span) is
        // written again, in order, with the rest.
        let one_piece = self.lanes_direct(lanes).is_some_and(|(m, base, lo)| {
            lanes.iter().all(|l| {
                let from = &data[l * n..(l + 1) * n];
                m.write(base + (lanes.addrs[l] - lo), from)
            })
        });
        if one_piece {
            return Ok(());
        }
        write_each_lane(self, lanes, data)
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        self.accesses += 1;
        self.forget(addr, data.len());
        if let Some((m, off)) = self.direct(addr, data.len()) {
            if m.write(off, data) {
                return Ok(());
            }
        }
        self.ahead.wrote(addr, data);
        self.range
            .write(addr, data)
            .map_err(|e| self.fault(addr, true, e))
    }

    fn atomic(
        &mut self,
        addr: u64,
        size: usize,
        op: AtomicOp,
        src: u64,
        cmp: u64,
    ) -> Result<u64, Fault> {
        self.accesses += 1;
        self.forget(addr, size);
        self.ahead.drop_overlapping(addr, size);
        let f = rmw(op, size, src, cmp);
        let r = if size == 8 {
            self.range.atomic_u64(addr, f)
        } else {
            self.range
                .atomic_u32(addr, |old| f(old as u64).map(|v| v as u32))
                .map(|v| v as u64)
        };
        r.map_err(|e| self.fault(addr, true, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::state::Span;

    const VA: u64 = 0x10_0000;

    /// A GPU VM whose only piece is `host`, this process' memory, as USERPTR.
    fn user_memory(host: &[u8]) -> GpuMemory {
        let span = Span::User(std::process::id(), host.as_ptr() as u64);
        let len = host.len() as u64;
        GpuMemory::new(GpuRange::from_spans(
            0,
            VA + len,
            vec![(VA, len, Some(span))],
        ))
    }

    fn word(m: &mut GpuMemory, at: u64, fresh: bool) -> u32 {
        let mut b = [0u8; 4];
        if fresh {
            m.read_fresh(VA + at, &mut b).expect("USERPTR readable");
        } else {
            m.read(VA + at, &mut b).expect("USERPTR readable");
        }
        u32::from_le_bytes(b)
    }

    fn set(host: &mut [u8], at: usize, v: u32) {
        host[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn userptr_reads_ahead_until_an_acquire_glc_or_the_round_ends() {
        let mut host = vec![0u8; 3 * AHEAD_BYTES as usize];
        set(&mut host, 64, 1);
        let mut m = user_memory(&host);
        assert_eq!(word(&mut m, 64, false), 1);
        // The process writes; the block read ahead still holds the old word...
        set(&mut host, 64, 2);
        std::hint::black_box(&host);
        assert_eq!(word(&mut m, 64, false), 1, "served from the block");
        // ...which a GLC load bypasses, an acquire or a new round drops.
        assert_eq!(word(&mut m, 64, true), 2, "GLC reads memory now");
        m.acquire();
        assert_eq!(word(&mut m, 64, false), 2, "after an acquire");
        set(&mut host, 64, 3);
        std::hint::black_box(&host);
        let range = GpuRange::from_spans(
            0,
            VA + host.len() as u64,
            vec![(
                VA,
                host.len() as u64,
                Some(Span::User(std::process::id(), host.as_ptr() as u64)),
            )],
        );
        m.refresh(range);
        assert_eq!(word(&mut m, 64, false), 3, "after the round");
    }

    #[test]
    fn userptr_writes_go_through_and_show_in_the_blocks() {
        let mut host = vec![0u8; 2 * AHEAD_BYTES as usize];
        set(&mut host, 8, 5);
        let mut m = user_memory(&host);
        assert_eq!(word(&mut m, 8, false), 5);
        m.write(VA + 8, &9u32.to_le_bytes()).expect("writable");
        assert_eq!(u32::from_le_bytes(host[8..12].try_into().unwrap()), 9);
        assert_eq!(word(&mut m, 8, false), 9, "own write seen");
        let old = m.atomic(VA + 8, 4, AtomicOp::Add, 1, 0).expect("atomic");
        assert_eq!(old, 9);
        assert_eq!(word(&mut m, 8, false), 10, "an atomic drops the block");
        // Lanes past the piece's end fault at the first such lane, as lane by lane.
        let mut addrs = [VA; 64];
        addrs[3] = VA + host.len() as u64;
        let lanes = Lanes {
            addrs: &addrs,
            mask: 0xff,
            bytes: 4,
        };
        let mut buf = [0u8; 256];
        let fault = m.read_lanes(&lanes, false, &mut buf).unwrap_err();
        assert_eq!(fault.addr, VA + host.len() as u64);
    }
}
