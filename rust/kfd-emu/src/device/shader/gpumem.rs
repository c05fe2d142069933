//! A wave's view of memory: the process' GPU VM as one GPU reaches it
//! (the BOs mapped there, SVM ranges), resolved by the CP model under the
//! state lock and refreshed by the worker between rounds.  Word accesses
//! to VRAM and GTT go straight to the daemon's mapping of the BO, atomics
//! with the CPU's atomic instructions; USERPTR and SVM memory go through
//! the process' address space.  What every wave reads and nobody may
//! change while the dispatch runs (its kernarg segment, its AQL packet:
//! both often in system memory, a system call per read) is read once.

use std::sync::Arc;

use gfx9::{AtomicOp, Fault, Memory};

use crate::device::mem::Mapping;
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

pub struct GpuMemory {
    range: GpuRange,
    hot: Option<Hot>,
    /// The dispatch's kernarg segment and AQL packet.
    fixed: Vec<Segment>,
    /// What the VM says of the last fault.
    pub last_fault: Option<vm::Fault>,
}

impl GpuMemory {
    pub fn new(range: GpuRange) -> GpuMemory {
        GpuMemory {
            range,
            hot: None,
            fixed: Vec::new(),
            last_fault: None,
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
        self.fixed.retain(|s| !s.overlaps(addr, n));
    }

    /// Takes a freshly resolved view of the VM.
    pub fn refresh(&mut self, range: GpuRange) {
        self.range = range;
        self.hot = None;
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
        self.range
            .read(addr, buf)
            .map_err(|e| self.fault(addr, false, e))
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        self.forget(addr, data.len());
        if let Some((m, off)) = self.direct(addr, data.len()) {
            if m.write(off, data) {
                return Ok(());
            }
        }
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
        self.forget(addr, size);
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
