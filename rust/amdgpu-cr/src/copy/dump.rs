//! Dumps into plain pages files: every GPU's BOs copied by its lanes,
//! hashed in extents, an incremental dump's unchanged extents left as holes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::compressed::dump_compressed;
use super::extents::{outcome, HashingWriter, IncrementalWriter};
use super::lanes::{into_lanes, run_lanes};
use super::{CopyError, DumpOutcome, GpuJob, ParentDigests};
use crate::image::FileId;
use crate::pages::{Compress, Encoding, ExtentHasher, PagesWriter, CONTENT_EXTENT};

/// Dumps every job's BOs into `amdgpu-pages-<id>-<user gpu_id>.img` in
/// `dir`: one worker per GPU, split into lanes over the spare CPU cores
/// when the CPU does the copying (see [`MIN_LANE_BYTES`]).  All workers
/// run to completion; the first error is returned.
///
/// [`MIN_LANE_BYTES`]: super::MIN_LANE_BYTES
pub fn dump_contents(
    dir: &Path,
    id: FileId,
    jobs: Vec<GpuJob<'_>>,
) -> Result<DumpOutcome, CopyError> {
    dump_contents_encoded(dir, id, jobs, None, &BTreeMap::new())
}

/// [`dump_contents`], compressing the pages files with zstd when
/// `compress` gives a level and lanes (`None` lanes: the CPU cores shared
/// out among the GPUs), see [`dump_compressed`].
///
/// `parent` (incremental dump): the extent digests of BOs the parent image
/// holds too; an extent whose digest is the parent's is left out (a hole,
/// or a zero chunk record) and listed in [`DumpOutcome::inherited`].
pub fn dump_contents_encoded(
    dir: &Path,
    id: FileId,
    jobs: Vec<GpuJob<'_>>,
    compress: Option<(i32, Option<u32>)>,
    parent: &ParentDigests,
) -> Result<DumpOutcome, CopyError> {
    if let Some((level, threads)) = compress {
        return dump_compressed(dir, id, jobs, Compress { level, threads }, parent);
    }
    let extent = CONTENT_EXTENT;
    // An incremental dump hashes each extent in place, in a CPU window
    // that holds it: fewer lanes rather than windows too small for one.
    let min_window = if parent.is_empty() { 0 } else { extent };
    // A streamed pages file is written in order: one lane per GPU.
    let lanes = into_lanes(
        jobs,
        &|_| Some(extent),
        crate::stream::active().is_some(),
        min_window,
        |gpu, lens, buffer, _| PagesWriter::create_lanes_buffered(dir, id, gpu, lens, buffer),
    )?;
    let inherited: std::sync::Mutex<BTreeMap<usize, Vec<u64>>> = Default::default();
    let (written, parted) = (AtomicU64::new(0), AtomicU64::new(0));
    let (stats, digests) = run_lanes(
        lanes,
        "copied to the pages file",
        |engine, p, out| {
            let Some(from) = parent.get(&p.bo.index) else {
                let mut sink = HashingWriter {
                    inner: out,
                    hasher: ExtentHasher::new(p.extent),
                };
                engine.read_bo(&p.bo, &mut sink)?;
                written.fetch_add(p.bo.size, Ordering::Relaxed);
                return Ok(sink.hasher.digests());
            };
            let mut sink = IncrementalWriter::new(out, p, from);
            engine.read_bo_aligned(&p.bo, sink.extent, &mut sink)?;
            written.fetch_add(sink.written, Ordering::Relaxed);
            parted.fetch_add(sink.parted, Ordering::Relaxed);
            if !sink.kept.is_empty() {
                let mut m = inherited.lock().unwrap_or_else(|e| e.into_inner());
                m.entry(p.bo.index).or_default().extend(sink.kept);
            }
            Ok(sink.digests)
        },
        |out| out.finish().map(drop).map_err(CopyError::from),
    )?;
    let parted = parted.into_inner();
    if parted > 0 {
        log::warn!(
            "{parted} extent(s) of {} came in parts (a copy window or staging buffer smaller \
             than an extent: KFD_MAX_BUFFER_SIZE too small for the GPUs and copy threads), \
             so they were written whole even if unchanged",
            crate::units::human_bytes(extent)
        );
    }
    let inherited = inherited.into_inner().unwrap_or_else(|e| e.into_inner());
    let written = written.into_inner();
    Ok(outcome(stats, digests, inherited, written, Encoding::Raw))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::tests::*;

    /// Restores the uncompressed incremental dump `out` of one BO of `size`
    /// bytes (KFD file 2 in `dir`), its extents `kept` read through an
    /// overlay of the parent's pages file (KFD file 1 in `parent_dir`).
    fn restore_over_parent(
        dir: &Path,
        parent_dir: &Path,
        gpu: GpuId,
        size: u64,
        kept: &[u64],
        jobs: Vec<GpuJob<'_>>,
        out: &DumpOutcome,
    ) -> Result<(), CopyError> {
        use crate::pages::Overlay;
        let src = std::sync::Arc::new(
            std::fs::File::open(parent_dir.join(pages_image_name(FileId(1), gpu))).unwrap(),
        );
        let mut o = Overlay::default();
        for &k in kept {
            let start = 8 + k * CONTENT_EXTENT;
            let len = CONTENT_EXTENT.min(size - k * CONTENT_EXTENT);
            o.push(start, len, src.clone(), start);
        }
        o.finish();
        let overlays = BTreeMap::from([(gpu, std::sync::Arc::new(o))]);
        restore_contents_encoded(dir, FileId(2), jobs, &out.hashes, Encoding::Raw, &overlays)
            .map(drop)
    }

    /// A BO of `size` bytes dumped whole, then (after the extents
    /// `changed` changed) incrementally against that dump with a memory
    /// budget of `budget`; restored from the incremental dump through an
    /// overlay of the parent's pages file, every byte checked.  Gives the
    /// incremental dump's outcome and its pages file's disk bytes.
    fn incremental_round_trip(size: u64, changed: &[u64], budget: u64) -> (DumpOutcome, u64) {
        use crate::image::tests::tempdir;
        use std::os::unix::fs::{FileExt, MetadataExt};

        let off = 1u64 << 20;
        let dev = device(off + size);
        let data: Vec<u8> = (0..size).map(|x| (x % 251) as u8 | 1).collect();
        dev.write_all_at(&data, off).unwrap();
        let gpu = GpuId(0x1a2b);
        let jobs = || {
            let mut j = one_vram_bo(dev.as_fd(), off, size);
            j[0].engines = Engines::new(EnginePolicy::Auto, budget, None);
            j
        };
        let parent_dir = tempdir();
        let parent = dump_contents(&parent_dir, FileId(1), jobs()).unwrap();
        let mut now = data;
        for &k in changed {
            now[(k * CONTENT_EXTENT + 7) as usize] ^= 0xff;
        }
        dev.write_all_at(&now, off).unwrap();
        let dir = tempdir();
        let out = dump_contents_encoded(&dir, FileId(2), jobs(), None, &parent.extents).unwrap();
        let pages = dir.join(pages_image_name(FileId(2), gpu));
        let disk = std::fs::metadata(&pages).unwrap().blocks() * 512;
        let kept: Vec<u64> = out.inherited.get(&0).cloned().unwrap_or_default();
        dev.write_all_at(&vec![0; size as usize], off).unwrap();
        restore_over_parent(&dir, &parent_dir, gpu, size, &kept, jobs(), &out).unwrap();
        let mut back = vec![0; size as usize];
        dev.read_exact_at(&mut back, off).unwrap();
        assert!(back == now, "every byte comes back");
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&parent_dir).unwrap();
        (out, disk)
    }

    /// An incremental dump writes the changed extents and nothing of the
    /// others, whichever lane hashes them (a BO cut into pieces at 32 MiB
    /// when there are cores to spare), the last, shorter extent included:
    /// the bytes written and the pages file's disk blocks are those of the
    /// changed extents (and of the file blocks they share with the holes
    /// beside them), every other extent is left to the parent.
    #[test]
    fn an_incremental_dump_writes_only_changed_extents() {
        let size = 2 * HASH_EXTENT + (3 << 20);
        let n = size.div_ceil(CONTENT_EXTENT);
        let last = n - 1;
        let changed = [0, HASH_EXTENT / CONTENT_EXTENT, last];
        let (out, disk) = incremental_round_trip(size, &changed, 64 << 20);
        let want = 2 * CONTENT_EXTENT + (size - last * CONTENT_EXTENT);
        assert_eq!(out.written, want, "bytes written");
        let kept: Vec<u64> = (0..n).filter(|k| !changed.contains(k)).collect();
        assert_eq!(out.inherited, BTreeMap::from([(0, kept)]));
        let slack = 2 * changed.len() as u64 * crate::pages::SPARSE_BLOCK;
        assert!(
            disk <= want + slack,
            "{disk} bytes on disk for {want} written"
        );
        assert_eq!(out.stats[0].bytes, size, "every byte hashed");
    }

    /// A memory budget whose copy window is smaller than an extent: the
    /// extents that come in parts are written whole, unchanged or not,
    /// without holding an extent back (the last, of a page, fits a window
    /// and is left to the parent); the dump still restores.
    #[test]
    fn an_incremental_dump_under_a_budget_below_an_extent_writes_everything() {
        let size = 3 * CONTENT_EXTENT + 4096;
        let budget = CONTENT_EXTENT / 2;
        assert!(env::lane_split(budget).0 < CONTENT_EXTENT);
        let (out, _) = incremental_round_trip(size, &[1], budget);
        assert_eq!(out.written, 3 * CONTENT_EXTENT);
        assert_eq!(out.inherited, BTreeMap::from([(0, vec![3])]));
        assert_eq!(out.extents[&0].len(), 4, "still hashed in extents");
    }

    /// An incremental dump leaves out (as holes) the extents whose digest
    /// is the parent's, and lists them; the restore reads those from the
    /// parent's pages file through an overlay and gets every byte back.
    #[test]
    fn an_incremental_dump_leaves_unchanged_extents_to_its_parent() {
        use crate::image::tests::tempdir;
        use std::os::unix::fs::FileExt;

        let (off, size) = (1u64 << 20, 4 * CONTENT_EXTENT + 4096);
        let dev = device(off + size);
        let data: Vec<u8> = (0..size).map(|x| (x % 253) as u8 | 1).collect();
        dev.write_all_at(&data, off).unwrap();
        let gpu = GpuId(0x1a2b);
        let jobs = || one_vram_bo(dev.as_fd(), off, size);
        let parent_dir = tempdir();
        let parent = dump_contents(&parent_dir, FileId(1), jobs()).unwrap();
        // Extent 2 changes after the parent.
        let mut now = data.clone();
        now[(2 * CONTENT_EXTENT + 7) as usize] ^= 0xff;
        dev.write_all_at(&now, off).unwrap();
        let dir = tempdir();
        let out = dump_contents_encoded(&dir, FileId(2), jobs(), None, &parent.extents).unwrap();
        assert_eq!(out.inherited, BTreeMap::from([(0, vec![0, 1, 3, 4])]));
        assert_eq!(out.written, CONTENT_EXTENT, "only extent 2 is written");
        assert_eq!(out.hashes[&0].value, compose(&out.extents[&0]));
        let pages = dir.join(pages_image_name(FileId(2), gpu));
        let f = std::fs::read(&pages).unwrap();
        assert_eq!(f.len() as u64, 8 + size, "the layout is kept");
        let e = CONTENT_EXTENT as usize;
        assert!(f[8..8 + e].iter().all(|&b| b == 0), "extent 0 is left out");
        assert_eq!(
            f[8 + 2 * e..8 + 3 * e],
            now[2 * e..3 * e],
            "extent 2 is written"
        );
        // Restore: the left-out extents from the parent's file.
        dev.write_all_at(&vec![0; size as usize], off).unwrap();
        restore_over_parent(&dir, &parent_dir, gpu, size, &[0, 1, 3, 4], jobs(), &out).unwrap();
        let mut back = vec![0; size as usize];
        dev.read_exact_at(&mut back, off).unwrap();
        assert!(back == now, "every byte comes back");
        // Without the parent's extents the hash check fails.
        let e = restore_contents(&dir, FileId(2), jobs(), &out.hashes).unwrap_err();
        assert!(matches!(e, CopyError::HashMismatch { .. }), "{e}");
    }

    /// A pre-dump copies while the process writes its BOs: whatever bytes
    /// a live engine saves, the digests it records are theirs (an extent
    /// recorded with another's digest would later be taken for unchanged,
    /// and the parent's stale bytes restored in its place), plain and
    /// incremental, with a block that flips between zero and not.
    #[test]
    fn a_live_dump_records_the_digests_of_the_bytes_it_saves() {
        use crate::image::tests::tempdir;
        use std::os::unix::fs::FileExt;
        use std::sync::atomic::{AtomicBool, Ordering};
        use xxhash_rust::xxh3::xxh3_64;

        let (off, size) = (1u64 << 20, 3 * CONTENT_EXTENT);
        let dev = device(off + size);
        let mut data: Vec<u8> = (0..size).map(|x| (x % 251) as u8 | 1).collect();
        let zero_block = (CONTENT_EXTENT + 8192) as usize;
        data[zero_block..zero_block + 4096].fill(0);
        dev.write_all_at(&data, off).unwrap();
        let gpu = GpuId(0x1a2b);
        let live_jobs = || {
            let mut j = one_vram_bo(dev.as_fd(), off, size);
            j[0].engines.set_live();
            j
        };
        let stop = AtomicBool::new(false);
        let writer = dev.try_clone().unwrap();
        // Stops the writing thread however the checks end (a failed assert
        // would otherwise wait for it for ever).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        std::thread::scope(|s| {
            let _stop = Stop(&stop);
            s.spawn(|| {
                // One byte of each extent, and one of the zero block, flipping.
                let mut b = 0u8;
                while !stop.load(Ordering::Relaxed) {
                    b = b.wrapping_add(1);
                    for at in [7, CONTENT_EXTENT + 11, 2 * CONTENT_EXTENT + 13] {
                        writer.write_all_at(&[b | 1], off + at).unwrap();
                    }
                    writer
                        .write_all_at(&[b & 1], off + zero_block as u64 + 100)
                        .unwrap();
                }
            });
            let check = |dir: &std::path::Path, id: FileId, out: &DumpOutcome| {
                let f = std::fs::read(dir.join(pages_image_name(id, gpu))).unwrap();
                let e = CONTENT_EXTENT as usize;
                let inherited = out.inherited.get(&0).cloned().unwrap_or_default();
                for (k, &d) in out.extents[&0].iter().enumerate() {
                    if inherited.contains(&(k as u64)) {
                        continue;
                    }
                    let saved = &f[8 + k * e..8 + (k + 1) * e];
                    assert_eq!(
                        d,
                        xxh3_64(saved),
                        "extent {k}: its digest is of other bytes"
                    );
                }
            };
            for round in 0..20 {
                let dir = tempdir();
                let out = dump_contents(&dir, FileId(1), live_jobs()).unwrap();
                check(&dir, FileId(1), &out);
                let idir = tempdir();
                let inc = dump_contents_encoded(&idir, FileId(2), live_jobs(), None, &out.extents)
                    .unwrap();
                check(&idir, FileId(2), &inc);
                assert!(round < 19 || inc.written > 0, "the flipping bytes are seen");
            }
        });
    }
}
