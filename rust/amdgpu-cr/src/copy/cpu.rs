//! CPU copy engine: map the BO through a device fd, window by window, and
//! copy with the CPU between the mapping and the pages file.
//!
//! Extra memory per worker is one mapping window (at most the staging size,
//! see `env::staging_size`) whatever the BO size: the bytes go straight
//! from the mapping into the pages writer (whose write buffer, part of the
//! same budget, aligns them for the page cache: see `pages::out`), and back
//! from the pages file straight into the mapping.

use std::io::{self, Read, Write};

use kfd_abi::handle::{Access, Mapping};

use super::{drain_to, fill_from, BoRef, CopyEngine, CopyError};
use crate::bo::PAGE_SIZE;
use crate::ids::MmapOffset;

/// Bytes handed to the sink at a time when dumping (but see
/// [`CopyEngine::read_bo_aligned`]).
const SINK_CHUNK: usize = 1 << 20;

/// The most bytes a live engine snapshots at a time (the largest unit
/// [`CopyEngine::read_bo_aligned`] is asked for: a content extent).
const SNAPSHOT_MAX: u64 = crate::pages::CONTENT_EXTENT;

/// The CPU engine; `window` bounds each mapping.
#[derive(Debug)]
pub struct CpuEngine {
    window: u64,
    /// Mappings made so far (for statistics and tests).
    pub windows_mapped: u64,
    /// Non-zero: the BOs may change while they are read (a pre-dump copies
    /// while the process runs), so each slice of at most this many bytes
    /// (taken out of the window) is copied once into `snapshot`, and the
    /// sink (hash, zero test, file) sees only that copy.
    snapshot_cap: usize,
    snapshot: Vec<u8>,
}

impl CpuEngine {
    /// `window` is rounded up to a page.
    pub fn new(window: u64) -> Self {
        CpuEngine {
            window: window.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE,
            windows_mapped: 0,
            snapshot_cap: 0,
            snapshot: Vec::new(),
        }
    }

    /// An engine for BOs that may change while they are read, within the
    /// same `window` bytes: its snapshot buffer (at most a content extent,
    /// at most half the window) is taken out of the mapping window.
    ///
    /// A sink reads what it is given more than once (a digest, then the
    /// bytes written; a zero test, then a hole or the bytes): read twice
    /// from a mapping the process writes, the digest recorded could be of
    /// other bytes than those saved, and a later incremental dump would
    /// take an extent for unchanged and leave the parent's stale bytes in
    /// its place, refused at restore only after the dump killed the
    /// process.  The snapshot makes every reader see the same bytes.
    pub fn live(window: u64) -> Self {
        let window = window.max(2 * PAGE_SIZE).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let snap = (window / 2 / PAGE_SIZE * PAGE_SIZE).min(SNAPSHOT_MAX);
        CpuEngine {
            window: window - snap,
            windows_mapped: 0,
            snapshot_cap: snap as usize,
            snapshot: Vec::new(),
        }
    }

    /// The most bytes of a BO mapped at once.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Maps the BO in windows of `window` bytes (at most the engine's) and
    /// calls `f` on each.
    fn each_window(
        &mut self,
        bo: &BoRef<'_>,
        window: u64,
        writable: bool,
        mut f: impl FnMut(&mut Mapping) -> Result<(), CopyError>,
    ) -> Result<(), CopyError> {
        let window = window.clamp(PAGE_SIZE, self.window);
        let (fd, base) = bo.cpu_map.ok_or_else(|| CopyError::NoEngine {
            gpu: bo.gpu,
            bo: bo.index,
            why: "the CPU engine needs a mappable fd".into(),
        })?;
        let mut done = 0u64;
        while done < bo.size {
            let len = (bo.size - done).min(window);
            let offset = base.0.checked_add(done).ok_or_else(|| CopyError::Map {
                gpu: bo.gpu,
                bo: bo.index,
                offset: base,
                len,
                source: io::Error::from_raw_os_error(libc::EOVERFLOW),
            })?;
            let access = if writable {
                Access::ReadWrite
            } else {
                Access::ReadOnly
            };
            // A read window is faulted in at once: write(2) into the page
            // cache copies with page faults disabled, and each fault on the
            // source would make it fall back to one page at a time (half the
            // throughput of CRIU's own page dump).
            let populate = !writable;
            let mut map = Mapping::of_file(fd, MmapOffset(offset), len as usize, access, populate)
                .map_err(|e| CopyError::Map {
                    gpu: bo.gpu,
                    bo: bo.index,
                    offset: MmapOffset(offset),
                    len,
                    source: e.into(),
                })?;
            self.windows_mapped += 1;
            f(&mut map)?;
            done += len;
        }
        Ok(())
    }
}

impl CpuEngine {
    /// Hands `sink` the BO in slices of `chunk` bytes of windows of
    /// `window`.
    fn read_in(
        &mut self,
        bo: &BoRef<'_>,
        window: u64,
        chunk: usize,
        sink: &mut dyn Write,
    ) -> Result<(), CopyError> {
        if self.snapshot_cap > 0 {
            let chunk = chunk.min(self.snapshot_cap);
            let mut snap = std::mem::take(&mut self.snapshot);
            snap.resize(chunk, 0);
            let r = self.each_window(bo, window, false, |map| {
                // The process and its GPU may write the BO meanwhile: read each slice once,
                // volatile, into our own memory, and hand on only that.
                let v = map.as_volatile_slice();
                let mut at = 0;
                while at < v.len() {
                    let part = v.subslice(at, chunk.min(v.len() - at)).ok_or_else(|| {
                        CopyError::Device {
                            gpu: bo.gpu,
                            bo: bo.index,
                            op: "snapshot of the mapping",
                            source: io::Error::from_raw_os_error(libc::EFAULT),
                        }
                    })?;
                    let n = part.copy_to(&mut snap);
                    drain_to(sink, &snap[..n], bo)?;
                    at += n;
                }
                Ok(())
            });
            self.snapshot = snap;
            return r;
        }
        self.each_window(bo, window, false, |map| {
            // SAFETY: no GPU or task writes the BO meanwhile: a dump copies while the KFD
            // process' queues are evicted (PROCESS_INFO paused them) and its tasks are
            // frozen (a pre-dump, whose process runs, uses a live engine: above).  Read in
            // place: the only copy is into the pages writer's aligned buffer.
            unsafe { map.as_slice() }
                .chunks(chunk)
                .try_for_each(|c| drain_to(sink, c, bo))
        })
    }
}

impl CopyEngine for CpuEngine {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn read_bo(&mut self, bo: &BoRef<'_>, sink: &mut dyn Write) -> Result<(), CopyError> {
        // Slices of a MiB keep what the sink hashes after writing in cache.
        self.read_in(bo, self.window, SINK_CHUNK, sink)
    }

    /// Windows of a whole number of units (the largest that fit the
    /// engine's), each handed to the sink a unit at a time; a window
    /// smaller than a unit is handed whole.
    fn read_bo_aligned(
        &mut self,
        bo: &BoRef<'_>,
        unit: u64,
        sink: &mut dyn Write,
    ) -> Result<(), CopyError> {
        match usize::try_from(unit) {
            Ok(u) if u > 0 && unit <= self.window => {
                self.read_in(bo, self.window / unit * unit, u, sink)
            }
            _ => self.read_in(bo, self.window, SINK_CHUNK, sink),
        }
    }

    fn write_bo(&mut self, bo: &BoRef<'_>, src: &mut dyn Read) -> Result<(), CopyError> {
        self.each_window(bo, self.window, true, |map| {
            // SAFETY: a restore writes a BO back after KFD's RESTORE, which leaves the
            // process' queues stopped until its task's RESUME, and the task issues RESUME only
            // once the writer's verdict says the copy is over; until then the task runs
            // CRIU's code, not its own, so nothing else touches the BO.
            let bytes = unsafe { map.as_mut_slice() };
            fill_from(src, bytes, bo)
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bo;
    use crate::copy::tests::device;
    use crate::ids::{GpuId, GpuVa};
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileExt;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// A VRAM BO of `size` bytes at offset `off` of `dev`, written with
    /// `pattern(.., seed)`: the BO and those bytes.
    fn patterned_vram_bo(
        dev: &std::fs::File,
        off: u64,
        size: u64,
        seed: u8,
    ) -> (BoRef<'_>, Vec<u8>) {
        let data = pattern(size as usize, seed);
        dev.write_all_at(&data, off).unwrap();
        let bo = BoRef {
            index: 0,
            gpu: GpuId(1),
            addr: GpuVa(0x10000),
            size,
            alloc_flags: bo::ALLOC_VRAM,
            cpu_map: Some((dev.as_fd(), MmapOffset(off))),
            dmabuf: None,
        };
        (bo, data)
    }

    #[test]
    fn copies_in_bounded_windows() {
        let dev = device(1 << 20);
        let size = 5 * PAGE_SIZE;
        let (bo, data) = patterned_vram_bo(&dev, 0x4000, size, 7);
        let mut e = CpuEngine::new(2 * PAGE_SIZE);
        let mut out = Vec::new();
        e.read_bo(&bo, &mut out).unwrap();
        assert_eq!(out, data);
        assert_eq!(e.windows_mapped, 3, "5 pages in windows of 2");

        let new = pattern(size as usize, 99);
        e.write_bo(&bo, &mut &new[..]).unwrap();
        let mut back = vec![0; size as usize];
        dev.read_exact_at(&mut back, 0x4000).unwrap();
        assert_eq!(back, new);
        // Neighbours untouched.
        let mut before = [1u8; 16];
        dev.read_exact_at(&mut before, 0x4000 - 16).unwrap();
        assert_eq!(before, [0; 16]);
    }

    /// Records the slices a sink is handed.
    #[derive(Default)]
    pub(crate) struct Slices {
        pub lens: Vec<usize>,
        pub bytes: Vec<u8>,
    }

    impl Write for Slices {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.lens.push(buf.len());
            self.bytes.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// `read_bo_aligned` hands whole units from the BO's start, in windows
    /// of whole units however the engine's window falls; a window smaller
    /// than a unit is handed as it is.
    #[test]
    fn aligned_reads_hand_whole_units() {
        let dev = device(1 << 20);
        let size = 11 * PAGE_SIZE;
        let (bo, data) = patterned_vram_bo(&dev, 0x2000, size, 3);
        let p = PAGE_SIZE as usize;
        for (window, unit, lens, maps) in [
            // Windows of 5 pages become windows of 4: units of 2 pages.
            (5, 2, vec![2, 2, 2, 2, 2, 1], 3),
            (3, 3, vec![3, 3, 3, 2], 4),
            // A unit larger than the window: the window's slices.
            (2, 4, vec![2, 2, 2, 2, 2, 1], 6),
        ] {
            let mut e = CpuEngine::new(window * PAGE_SIZE);
            let mut out = Slices::default();
            e.read_bo_aligned(&bo, unit * PAGE_SIZE, &mut out).unwrap();
            assert!(out.bytes == data, "window {window}, unit {unit}");
            let want: Vec<usize> = lens.iter().map(|l| l * p).collect();
            assert_eq!(out.lens, want, "window {window}, unit {unit}");
            assert_eq!(e.windows_mapped, maps, "window {window}, unit {unit}");
        }
    }

    #[test]
    fn short_source_and_bad_offset_are_errors() {
        let dev = device(1 << 16);
        let mut bo = BoRef {
            index: 3,
            gpu: GpuId(0x1a2b),
            addr: GpuVa(0),
            size: 2 * PAGE_SIZE,
            alloc_flags: bo::ALLOC_GTT,
            cpu_map: Some((dev.as_fd(), MmapOffset(0))),
            dmabuf: None,
        };
        let mut e = CpuEngine::new(1 << 20);
        let short = [0u8; 100];
        let err = e.write_bo(&bo, &mut &short[..]).unwrap_err().to_string();
        assert!(err.contains("BO 3") && err.contains("read"), "{err}");
        bo.cpu_map = Some((dev.as_fd(), MmapOffset(123)));
        let err = e.read_bo(&bo, &mut Vec::new()).unwrap_err();
        assert!(matches!(err, CopyError::Map { .. }));
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    }
}
