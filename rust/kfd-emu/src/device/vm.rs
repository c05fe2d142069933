//! A GPU's view of a process' memory: a GPU VA reaches memory only through
//! a BO of the process that MAP_MEMORY_TO_GPU mapped on that GPU, as the
//! GPU's page tables hold only mapped BOs.  The SDMA engine reads its ring,
//! writes its read pointer and accesses packet operands through here.
//!
//! A [`GpuRange`] resolves a VA range once (under the state lock) into the
//! pieces of the BOs that back it, holes included; bytes move later without
//! the lock, and touching a hole is a GPU page fault at that address, as on
//! the hardware, where a packet faults at the first unmapped page it
//! touches (what it did before stays done).

use std::sync::Arc;

use super::mem::Mapping;
use super::state::gem::RenderFile;
use super::state::svm;
use super::state::{Bo, Proc, Span};
use super::uapi::{self, alloc};

/// What backs one piece of a range.
enum Backing {
    Mem(Span),
    /// No BO mapped on the GPU covers it; what is there instead (a BO
    /// mapped elsewhere), for the log.
    Unmapped(Option<String>),
    /// A mapped BO whose memory the model cannot reach (DOORBELL, MMIO).
    Unmodelled(&'static str),
}

struct Piece {
    va: u64,
    len: u64,
    backing: Backing,
}

/// Why an access through a [`GpuRange`] failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The GPU VA is not in a BO mapped on the GPU: a GPU page fault.
    /// `note` describes a BO of the process there that is not mapped on
    /// this GPU, if any.
    Unmapped { va: u64, note: Option<String> },
    /// The VA is in a BO type the model does not back with memory.
    Unmodelled { va: u64, what: &'static str },
    /// USERPTR memory the process no longer has (KFD would still reach
    /// the pages it pinned; the model reaches the process' address space).
    /// `gone`: the process exits (`mem::memory_gone`), which on KFD ends
    /// its dispatches quietly at its release.
    UserMemory { va: u64, cpu: u64, gone: bool },
}

impl Fault {
    /// The VA of a GPU page fault (not of the model's own limits).
    pub fn page_fault_va(&self) -> Option<u64> {
        match self {
            Fault::Unmapped { va, .. } => Some(*va),
            _ => None,
        }
    }

    /// The process exits: its address space is gone, not the VA.
    pub fn process_gone(&self) -> bool {
        matches!(self, Fault::UserMemory { gone: true, .. })
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Unmapped { va, note } => {
                write!(
                    f,
                    "GPU page fault at VA {va:#x}: no BO of the process mapped on this GPU \
                     covers it"
                )?;
                match note {
                    Some(n) => write!(f, " ({n})"),
                    None => Ok(()),
                }
            }
            Fault::Unmodelled { va, what } => write!(
                f,
                "VA {va:#x} is in a {what} BO, which the emulated engine cannot access"
            ),
            Fault::UserMemory {
                va,
                cpu,
                gone: false,
            } => write!(
                f,
                "VA {va:#x}: USERPTR memory at CPU address {cpu:#x} is no longer accessible \
                 in the process"
            ),
            Fault::UserMemory { va, gone: true, .. } => write!(
                f,
                "VA {va:#x}: the process exits, its address space is gone"
            ),
        }
    }
}

pub type Access<T> = Result<T, Fault>;

/// GPU VA range `[va, va+len)` as one GPU of the process reaches it.
/// Holds the VRAM/GTT mappings it covers alive.
pub struct GpuRange {
    va: u64,
    len: u64,
    pieces: Vec<Piece>,
}

fn backing(p: &Proc, bo: &Bo, va: u64) -> Backing {
    match (&bo.map, bo.mem_type()) {
        (Some(m), _) => Backing::Mem(Span::Map(m.clone(), va - bo.va)),
        (None, alloc::USERPTR) => Backing::Mem(Span::User(p.lead, bo.user_addr + (va - bo.va))),
        (None, alloc::DOORBELL) => Backing::Unmodelled("DOORBELL"),
        (None, alloc::MMIO_REMAP) => Backing::Unmodelled("MMIO_REMAP"),
        (None, _) => Backing::Unmodelled("memory-less"),
    }
}

impl Proc {
    /// Resolves `[va, va+len)` through the VM of GPU index `gpu`: the BOs
    /// mapped there, and holes where none is.  Never fails; accesses to a
    /// hole do.
    pub fn gpu_range(&self, gpu: usize, va: u64, len: u64) -> GpuRange {
        let Some(end) = va.checked_add(len) else {
            // Past the top of the address space: no BO is there.
            return GpuRange {
                va,
                len,
                pieces: vec![Piece {
                    va,
                    len,
                    backing: Backing::Unmapped(None),
                }],
            };
        };
        let bos: Vec<&Bo> = self
            .bos
            .overlapping(va, end)
            .map(|(_, b)| b)
            .filter(|b| b.mapped.contains(&gpu))
            .collect();
        let mut pieces = Vec::with_capacity(bos.len() + 1);
        let mut vmas = None;
        let mut cur = va;
        for b in bos {
            if b.va > cur {
                self.fill_hole(gpu, cur, b.va, &mut pieces, &mut vmas);
                cur = b.va;
            }
            let stop = (b.va + b.size).min(end);
            pieces.push(Piece {
                va: cur,
                len: stop - cur,
                backing: backing(self, b, cur),
            });
            cur = stop;
        }
        if cur < end {
            self.fill_hole(gpu, cur, end, &mut pieces, &mut vmas);
        }
        GpuRange { va, len, pieces }
    }
}

impl Proc {
    /// The pieces of `[va, end)`, where no BO of the process is: the
    /// process' own memory where an SVM range gives GPU `gpu` access (or
    /// access in place), as KFD maps such ranges on the GPUs of their
    /// access bitmaps; with XNACK on, also any other memory the process
    /// has mapped (a fault there makes KFD create a range and map it); the
    /// rest is unmapped.  `vmas` caches the process' mappings.
    fn fill_hole(
        &self,
        gpu: usize,
        va: u64,
        end: u64,
        pieces: &mut Vec<Piece>,
        vmas: &mut Option<Vec<svm::Vma>>,
    ) {
        let page = uapi::PAGE;
        let bit = 1u64.checked_shl(gpu as u32).unwrap_or(0);
        let mut cur = va;
        let mut gap = |pieces: &mut Vec<Piece>, a: u64, b: u64| {
            if a >= b {
                return;
            }
            if !self.xnack {
                pieces.push(Piece {
                    va: a,
                    len: b - a,
                    backing: Backing::Unmapped(self.unmapped_note(gpu, a, b)),
                });
                return;
            }
            let maps = vmas.get_or_insert_with(|| svm::vmas(self.lead).unwrap_or_default());
            let mut at = a;
            while at < b {
                let v = maps
                    .iter()
                    .find(|v| !v.device && v.start * page <= at && at < v.end * page);
                let stop = match v {
                    Some(v) => (v.end * page).min(b),
                    None => maps
                        .iter()
                        .filter(|v| !v.device && v.start * page > at)
                        .map(|v| v.start * page)
                        .min()
                        .unwrap_or(b)
                        .min(b),
                };
                pieces.push(Piece {
                    va: at,
                    len: stop - at,
                    backing: match v {
                        Some(_) => Backing::Mem(Span::User(self.lead, at)),
                        None => Backing::Unmapped(self.unmapped_note(gpu, at, stop)),
                    },
                });
                at = stop;
            }
        };
        let (first, last) = (va / page, (end - 1) / page);
        for (&s, r) in self.svm.ranges.range(..=last) {
            if r.last < first || (r.access | r.in_place) & bit == 0 {
                continue;
            }
            let rs = (s * page).max(cur);
            let re = ((r.last + 1) * page).min(end);
            if rs >= re {
                continue;
            }
            gap(pieces, cur, rs);
            pieces.push(Piece {
                va: rs,
                len: re - rs,
                backing: Backing::Mem(Span::User(self.lead, rs)),
            });
            cur = re;
        }
        gap(pieces, cur, end);
    }

    /// Reads `buf.len()` bytes at `va` as GPU index `gpu` does; false on a
    /// fault.
    pub fn gpu_read(&self, gpu: usize, va: u64, buf: &mut [u8]) -> bool {
        self.gpu_range(gpu, va, buf.len() as u64)
            .read(0, buf)
            .is_ok()
    }

    /// Writes `data` at `va` as GPU index `gpu` does; false on a fault.
    pub fn gpu_write(&self, gpu: usize, va: u64, data: &[u8]) -> bool {
        self.gpu_range(gpu, va, data.len() as u64)
            .write(0, data)
            .is_ok()
    }

    /// What lies in `[va, end)` though not mapped on GPU `gpu`: the first
    /// BO of the process there, with the GPUs it is mapped on.
    fn unmapped_note(&self, gpu: usize, va: u64, end: u64) -> Option<String> {
        let (k, b) = self.bos.overlapping(va, end).next()?;
        let ids = |g: usize| self.pdds.get(g).map_or(0, |d| d.user_id);
        let mapped: Vec<String> = b.mapped.iter().map(|&g| ids(g).to_string()).collect();
        Some(format!(
            "BO [{:#x}, {:#x}) of type {:#x} of GPU {} is mapped on GPUs [{}], not on GPU {}",
            b.va,
            b.va + b.size,
            b.mem_type(),
            ids(k.gpu),
            mapped.join(", "),
            ids(gpu)
        ))
    }
}

impl RenderFile {
    /// `[va, va+len)` as the file's GEM VM shows it.
    pub fn range(&self, va: u64, len: u64) -> GpuRange {
        GpuRange::from_spans(va, len, self.spans(va, len))
    }
}

impl GpuRange {
    /// `[va, va+len)` of a VM other than a process' KFD one (a render
    /// file's GEM VM): `pieces` are `(va, len, memory)` in VA order, None
    /// where nothing is mapped; gaps between them are unmapped too.
    pub fn from_spans(va: u64, len: u64, spans: Vec<(u64, u64, Option<Span>)>) -> GpuRange {
        let mut pieces = Vec::with_capacity(spans.len() + 1);
        let mut cur = va;
        let end = va.saturating_add(len);
        for (a, n, m) in spans {
            if a > cur {
                pieces.push(Piece {
                    va: cur,
                    len: a - cur,
                    backing: Backing::Unmapped(None),
                });
            }
            pieces.push(Piece {
                va: a,
                len: n,
                backing: match m {
                    Some(s) => Backing::Mem(s),
                    None => Backing::Unmapped(None),
                },
            });
            cur = a + n;
        }
        if cur < end {
            pieces.push(Piece {
                va: cur,
                len: end - cur,
                backing: Backing::Unmapped(None),
            });
        }
        GpuRange { va, len, pieces }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// The VRAM/GTT piece holding byte `off` of the range: its offset in
    /// the range, its length, its mapping and the mapping offset of its
    /// first byte (a fast path for word-sized accesses).
    pub fn mapped_piece(&self, off: u64) -> Option<(u64, u64, &Arc<Mapping>, u64)> {
        let (p, _, _) = self.walk(off, 1).next()?;
        match &p.backing {
            Backing::Mem(Span::Map(m, base)) => Some((p.va - self.va, p.len, m, *base)),
            _ => None,
        }
    }

    /// The piece of the process' own memory (USERPTR, SVM) holding byte
    /// `off` of the range: its offset in the range and its length.
    pub fn user_piece(&self, off: u64) -> Option<(u64, u64)> {
        let (p, _, _) = self.walk(off, 1).next()?;
        match &p.backing {
            Backing::Mem(Span::User(..)) => Some((p.va - self.va, p.len)),
            _ => None,
        }
    }

    /// The pieces covering `[off, off+n)` of the range, each as (piece,
    /// offset into it, bytes), in order.  The caller checked the bounds.
    fn walk(&self, off: u64, n: u64) -> impl Iterator<Item = (&Piece, u64, u64)> {
        // Offsets are relative to the range, so a range at the top of the
        // address space (one piece) does not overflow.
        let start = off;
        let end = off + n;
        let first = self
            .pieces
            .partition_point(|p| p.va - self.va + p.len <= start);
        self.pieces[first..]
            .iter()
            .take_while(move |p| p.va - self.va < end)
            .map(move |p| {
                let pstart = p.va - self.va;
                let s = start.max(pstart);
                let e = end.min(pstart + p.len);
                (p, s - pstart, e - s)
            })
    }

    fn check(&self, off: u64, n: u64) -> Access<()> {
        if off.checked_add(n).is_none_or(|e| e > self.len) {
            // A caller bug: ranges are resolved for what packets access.
            return Err(Fault::Unmapped {
                va: self.va.wrapping_add(off),
                note: None,
            });
        }
        Ok(())
    }

    fn span(p: &Piece, at: u64) -> Access<&Span> {
        let va = p.va.wrapping_add(at);
        match &p.backing {
            Backing::Mem(s) => Ok(s),
            Backing::Unmapped(note) => Err(Fault::Unmapped {
                va,
                note: note.clone(),
            }),
            Backing::Unmodelled(what) => Err(Fault::Unmodelled { va, what }),
        }
    }

    fn user_fault(p: &Piece, at: u64, s: &Span) -> Fault {
        let (cpu, gone) = match s {
            Span::User(pid, a) => (a + at, super::mem::memory_gone(*pid)),
            Span::Map(..) => (0, false),
        };
        Fault::UserMemory {
            va: p.va.wrapping_add(at),
            cpu,
            gone,
        }
    }

    /// Reads `buf.len()` bytes at byte `off` of the range.
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Access<()> {
        self.check(off, buf.len() as u64)?;
        let mut done = 0usize;
        for (p, at, n) in self.walk(off, buf.len() as u64) {
            let s = Self::span(p, at)?;
            let part = &mut buf[done..done + n as usize];
            if !s.at(at).read(part) {
                return Err(Self::user_fault(p, at, s));
            }
            done += n as usize;
        }
        Ok(())
    }

    /// Writes `data` at byte `off` of the range; the pieces before a fault
    /// are written.
    pub fn write(&self, off: u64, data: &[u8]) -> Access<()> {
        self.check(off, data.len() as u64)?;
        let mut done = 0usize;
        for (p, at, n) in self.walk(off, data.len() as u64) {
            let s = Self::span(p, at)?;
            if !s.at(at).write(&data[done..done + n as usize]) {
                return Err(Self::user_fault(p, at, s));
            }
            done += n as usize;
        }
        Ok(())
    }

    /// Copies `n` bytes from `src` at `soff` to here at `off`, as if
    /// through a buffer (overlapping ranges copy like memmove).
    pub fn copy_from(&self, off: u64, src: &GpuRange, soff: u64, n: u64) -> Access<()> {
        self.check(off, n)?;
        src.check(soff, n)?;
        if n == 0 {
            return Ok(());
        }
        // One VRAM/GTT piece on each side: a direct copy.
        let mut d = self.walk(off, n);
        let mut s = src.walk(soff, n);
        if let (Some((dp, dat, dn)), Some((sp, sat, sn))) = (d.next(), s.next()) {
            if dn == n && sn == n {
                if let (Backing::Mem(Span::Map(dm, doff)), Backing::Mem(Span::Map(sm, so))) =
                    (&dp.backing, &sp.backing)
                {
                    if dm.copy_from(doff + dat, sm, so + sat, n as usize) {
                        return Ok(());
                    }
                }
            }
        }
        let mut buf = vec![0u8; n as usize];
        src.read(soff, &mut buf)?;
        self.write(off, &buf)
    }

    /// Applies `f` to the naturally aligned 32-bit word at `off`
    /// atomically; `f` returns the new value, or None to leave the word.
    /// Returns the old value.
    pub fn atomic_u32(&self, off: u64, f: impl FnMut(u32) -> Option<u32>) -> Access<u32> {
        self.rmw(off, f, |m, o, f| m.atomic_u32(o, f))
    }

    /// As [`GpuRange::atomic_u32`] for a 64-bit word.
    pub fn atomic_u64(&self, off: u64, f: impl FnMut(u64) -> Option<u64>) -> Access<u64> {
        self.rmw(off, f, |m, o, f| m.atomic_u64(o, f))
    }

    /// A read-modify-write of one word: a CPU atomic on VRAM/GTT (the
    /// daemon's mapping shares the pages the process maps), a read and a
    /// write through `process_vm_*` on USERPTR memory.  The latter is
    /// atomic with respect to the engine (one thread) but not to the
    /// process' own CPU writes of the same word in between.
    fn rmw<const N: usize, T: Word<N>, F: FnMut(T) -> Option<T>>(
        &self,
        off: u64,
        mut f: F,
        on_map: impl FnOnce(&Mapping, u64, &mut F) -> Option<T>,
    ) -> Access<T> {
        self.check(off, N as u64)?;
        let (p, at, n) = self.walk(off, N as u64).next().expect("checked range");
        let s = Self::span(p, at)?;
        if let (Span::Map(m, base), true) = (s, n == N as u64) {
            if let Some(old) = on_map(m, base + at, &mut f) {
                return Ok(old);
            }
        }
        // USERPTR, or a word the caller failed to align.
        let mut b = [0u8; N];
        self.read(off, &mut b)?;
        let old = T::from_bytes(b);
        if let Some(new) = f(old) {
            self.write(off, &new.to_bytes())?;
        }
        Ok(old)
    }
}

trait Word<const N: usize>: Copy {
    fn from_bytes(b: [u8; N]) -> Self;
    fn to_bytes(self) -> [u8; N];
}

impl Word<4> for u32 {
    fn from_bytes(b: [u8; 4]) -> Self {
        u32::from_le_bytes(b)
    }
    fn to_bytes(self) -> [u8; 4] {
        self.to_le_bytes()
    }
}

impl Word<8> for u64 {
    fn from_bytes(b: [u8; 8]) -> Self {
        u64::from_le_bytes(b)
    }
    fn to_bytes(self) -> [u8; 8] {
        self.to_le_bytes()
    }
}
