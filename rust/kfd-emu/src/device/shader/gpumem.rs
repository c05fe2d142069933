//! A wave's view of memory: the process' GPU VM as one GPU reaches it
//! (the BOs mapped there, SVM ranges), resolved by the CP model under the
//! state lock and refreshed by the worker between rounds.  Word accesses
//! to VRAM and GTT go straight to the daemon's mapping of the BO, atomics
//! with the CPU's atomic instructions; USERPTR and SVM memory go through
//! the process' address space.

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

pub struct GpuMemory {
    range: GpuRange,
    hot: Option<Hot>,
    /// What the VM says of the last fault.
    pub last_fault: Option<vm::Fault>,
}

impl GpuMemory {
    pub fn new(range: GpuRange) -> GpuMemory {
        GpuMemory {
            range,
            hot: None,
            last_fault: None,
        }
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
