//! Restores from pages files (plain or compressed, in a directory or
//! streamed, over an incremental dump's ancestors): every GPU's BOs filled
//! by its lanes, each BO's hash checked once all are done.

use std::collections::BTreeMap;
use std::path::Path;

use super::budget::make_room_for_zstd;
use super::extents::{ExtentDigests, HashingReader};
use super::lanes::{into_lanes, run_lanes};
use super::{ContentHash, CopyError, GpuJob, GpuStats, HASH_EXTENT};
use crate::ids::{GpuId, GpuVa};
use crate::image::{FileId, ImageError};
use crate::pages::{compose, pages_image_name, Encoding, ExtentHasher, PagesReader, SparseFile};

/// Restores every job's BOs from its pages file in `dir`, with the workers
/// and lanes of [`dump_contents`].  `hashes` (bucket index → hash, from the
/// image's optional fields) are verified when present, once every lane is
/// done; a BO hashed whole (an image from before extents) is copied by one
/// lane.
///
/// [`dump_contents`]: super::dump_contents
pub fn restore_contents(
    dir: &Path,
    id: FileId,
    jobs: Vec<GpuJob<'_>>,
    hashes: &BTreeMap<usize, ContentHash>,
) -> Result<Vec<GpuStats>, CopyError> {
    restore_contents_encoded(dir, id, jobs, hashes, Encoding::Raw, &BTreeMap::new())
}

/// [`restore_contents`] from pages files in `encoding` (the KFD image's):
/// a compressed file is decompressed as it streams, by lanes that start at
/// its chunks (see [`crate::pages::zstd`]).
///
/// `overlays`: per GPU, the ranges of an incremental dump's pages file
/// read from its ancestors' ([`crate::validate::chain::resolve`]),
/// compressed or not.
pub fn restore_contents_encoded(
    dir: &Path,
    id: FileId,
    jobs: Vec<GpuJob<'_>>,
    hashes: &BTreeMap<usize, ContentHash>,
    encoding: Encoding,
    overlays: &BTreeMap<GpuId, std::sync::Arc<crate::pages::Overlay>>,
) -> Result<Vec<GpuStats>, CopyError> {
    restore_contents_from(&PagesFrom::Dir(dir), id, jobs, hashes, encoding, overlays)
}

/// Where a restore reads its pages files.
pub enum PagesFrom<'a> {
    /// `amdgpu-pages-<id>-<gpu>.img` of this directory.
    Dir(&'a Path),
    /// Their pipes from the image streamer, by GPU (user gpu_id): each
    /// read in order by one lane (see [`crate::stream`]).
    Stream(std::sync::Mutex<BTreeMap<GpuId, crate::stream::Pipe>>),
}

/// [`restore_contents_encoded`] of the GPU of `job` from its pages file's
/// pipe from the image streamer: one lane, in order, the end of the
/// stream checked (no parent: a stream carries none).
pub fn restore_contents_streamed(
    pipe: crate::stream::Pipe,
    id: FileId,
    job: GpuJob<'_>,
    hashes: &BTreeMap<usize, ContentHash>,
    encoding: Encoding,
) -> Result<Vec<GpuStats>, CopyError> {
    let from = PagesFrom::Stream(std::sync::Mutex::new([(job.user, pipe)].into()));
    restore_contents_from(&from, id, vec![job], hashes, encoding, &BTreeMap::new())
}

/// The steps of a restore from `from` (a directory's pages files over
/// `overlays`, or the image streamer's pipes): the BOs' lanes, their
/// readers opened, the copies run, the hashes checked.
pub fn restore_contents_from(
    from: &PagesFrom<'_>,
    id: FileId,
    jobs: Vec<GpuJob<'_>>,
    hashes: &BTreeMap<usize, ContentHash>,
    encoding: Encoding,
    overlays: &BTreeMap<GpuId, std::sync::Arc<crate::pages::Overlay>>,
) -> Result<Vec<GpuStats>, CopyError> {
    let names: BTreeMap<usize, (GpuId, GpuVa, u64)> = jobs
        .iter()
        .flat_map(|j| j.bos.iter().map(|b| (b.index, (b.gpu, b.addr, b.size))))
        .collect();
    let extent_of = |i: usize| hashes.get(&i).map_or(Some(HASH_EXTENT), |h| h.extent);
    let one_lane =
        needs_one_lane(&jobs, &extent_of, encoding) || matches!(from, PagesFrom::Stream(_));
    let mut lanes = into_lanes(jobs, &extent_of, one_lane, 0, |gpu, lens, _, bos| {
        open_readers(
            from,
            id,
            gpu,
            bos,
            encoding,
            lens,
            overlays.get(&gpu).cloned(),
        )
    })?;
    let decoders =
        u64::from(encoding != Encoding::Raw) + u64::from(overlays.values().any(|o| o.has_frames()));
    if decoders > 0 {
        for (l, _) in &mut lanes {
            make_room_for_zstd(l.user, &mut l.engines, decoders);
        }
    }
    let (stats, got_hashes) = run_lanes(
        lanes,
        "copied from the pages file",
        |engine, p, input| {
            let mut src = HashingReader {
                inner: input,
                hasher: ExtentHasher::new(p.extent),
            };
            engine.write_bo(&p.bo, &mut src)?;
            Ok(src.hasher.digests())
        },
        |input| input.finish_stream().map(drop).map_err(CopyError::from),
    )?;
    check_hashes(id, got_hashes, hashes, &names)?;
    Ok(stats)
}

/// Whether a GPU's BOs must be copied by one lane: lanes of a compressed
/// file start at its chunks, and pieces are runs of whole extents (see
/// Piece::of), which start at chunks when the chunk divides the run; a BO
/// hashed otherwise keeps one lane per GPU.
fn needs_one_lane(
    jobs: &[GpuJob<'_>],
    extent_of: &dyn Fn(usize) -> Option<u64>,
    encoding: Encoding,
) -> bool {
    match encoding {
        Encoding::Raw => false,
        Encoding::Zstd { chunk, .. } => !jobs.iter().flat_map(|j| j.bos.iter()).all(|b| {
            b.size <= chunk
                || extent_of(b.index).is_some_and(|e| {
                    let run = e.saturating_mul((HASH_EXTENT / e.max(1)).max(1));
                    e > 0 && run % chunk == 0
                })
        }),
    }
}

/// The readers of GPU `gpu`'s lanes (`lens` bytes each): its pages file
/// in the directory (over `overlay`, its ancestors' ranges), or its pipe
/// from the image streamer, taken once.
fn open_readers(
    from: &PagesFrom<'_>,
    id: FileId,
    gpu: GpuId,
    bos: &[(usize, u64)],
    encoding: Encoding,
    lens: &[u64],
    overlay: Option<std::sync::Arc<crate::pages::Overlay>>,
) -> Result<Vec<PagesReader<SparseFile>>, ImageError> {
    match from {
        PagesFrom::Dir(dir) => {
            PagesReader::open_encoded_lanes(dir, id, gpu, bos, encoding, lens, overlay)
        }
        PagesFrom::Stream(pipes) => {
            let pipe = pipes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&gpu)
                .ok_or_else(|| {
                    ImageError::invalid(
                        &pages_image_name(id, gpu),
                        "",
                        "the image streamer gave no such file",
                    )
                })?;
            Ok(vec![PagesReader::streamed(pipe, gpu, bos, encoding)?])
        }
    }
}

/// Each restored BO's hash, composed from its extents', against the
/// image's (`names`: bucket index -> GPU, address, size, for the error).
fn check_hashes(
    id: FileId,
    got_hashes: ExtentDigests,
    hashes: &BTreeMap<usize, ContentHash>,
    names: &BTreeMap<usize, (GpuId, GpuVa, u64)>,
) -> Result<(), CopyError> {
    for (index, got) in got_hashes {
        let got = compose(&got);
        let (Some(want), Some(&(gpu, addr, size))) = (hashes.get(&index), names.get(&index)) else {
            continue;
        };
        if want.value != got {
            return Err(CopyError::HashMismatch {
                file: pages_image_name(id, gpu),
                gpu,
                bo: index,
                addr,
                size,
                expected: want.value,
                got,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::tests::*;

    /// A BO of three hash extents: dumped and restored (in pieces when
    /// there are cores to spare), its hash composed from the extents'; an
    /// image hashing it whole restores too; a flipped byte in its second
    /// extent fails the restore.
    #[test]
    fn a_bo_of_several_extents_round_trips() {
        use crate::image::tests::tempdir;
        use std::os::unix::fs::FileExt;
        use xxhash_rust::xxh3::xxh3_64;

        let (off, size) = (1u64 << 20, 2 * HASH_EXTENT + (5 << 20));
        let dev = device(off + size);
        let data: Vec<u8> = (0..size)
            .map(|x| (x % 251) as u8 ^ (x >> 20) as u8)
            .collect();
        dev.write_all_at(&data, off).unwrap();
        let jobs = || one_vram_bo(dev.as_fd(), off, size);
        let dir = tempdir();
        let out = dump_contents(&dir, FileId(3), jobs()).unwrap();
        let by_hand: Vec<u64> = data.chunks(CONTENT_EXTENT as usize).map(xxh3_64).collect();
        assert_eq!(by_hand.len() as u64, size.div_ceil(CONTENT_EXTENT));
        let want = ContentHash {
            value: compose(&by_hand),
            extent: Some(CONTENT_EXTENT),
        };
        assert_eq!(out.extents, BTreeMap::from([(0, by_hand.clone())]));
        assert_eq!(out.hashes, BTreeMap::from([(0, want)]));
        assert_eq!((out.stats[0].bos, out.stats[0].bytes), (1, size));
        let pages = std::fs::read(dir.join(pages_image_name(FileId(3), GpuId(0x1a2b)))).unwrap();
        assert!(pages[8..] == data[..], "pages file holds the BO in order");

        let wipe = || dev.write_all_at(&vec![0; size as usize], off).unwrap();
        let back = || {
            let mut b = vec![0; size as usize];
            dev.read_exact_at(&mut b, off).unwrap();
            b == data
        };
        wipe();
        let stats = restore_contents(&dir, FileId(3), jobs(), &out.hashes).unwrap();
        assert_eq!((stats[0].bos, stats[0].bytes), (1, size));
        assert!(back());
        // An image from before extents: the plain hash, the BO copied whole.
        wipe();
        let whole = ContentHash {
            value: xxh3_64(&data),
            extent: None,
        };
        restore_contents(&dir, FileId(3), jobs(), &BTreeMap::from([(0, whole)])).unwrap();
        assert!(back());
        // The composed hash read as a whole-BO one does not match.
        let misread = ContentHash {
            extent: None,
            ..want
        };
        let e =
            restore_contents(&dir, FileId(3), jobs(), &BTreeMap::from([(0, misread)])).unwrap_err();
        assert!(matches!(e, CopyError::HashMismatch { bo: 0, .. }), "{e}");

        let path = dir.join(pages_image_name(FileId(3), GpuId(0x1a2b)));
        let mut bytes = pages;
        bytes[8 + HASH_EXTENT as usize + 7] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = restore_contents(&dir, FileId(3), jobs(), &out.hashes).unwrap_err();
        assert!(matches!(e, CopyError::HashMismatch { bo: 0, .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The GPUs of [`parallel_dump_and_restore_with_hashes`].
    const TWO_GPUS: [GpuId; 2] = [GpuId(0x1a2b), GpuId(0x5c3d)];

    /// Its BOs: (gpu index, offset, size, bucket index).
    const TWO_GPU_LAYOUT: [(usize, u64, u64, usize); 3] = [
        (0, 0x10_0000, 3 * 4096, 0),
        (1, 0x20_0000, 5 << 20, 1),
        (0, 0x80_0000, 4096, 2),
    ];

    /// Its jobs: each GPU's BOs of [`TWO_GPU_LAYOUT`] in its device
    /// `devs[g]`, copied under `policy`.
    fn two_gpu_jobs(devs: &[std::fs::File; 2], policy: EnginePolicy) -> Vec<GpuJob<'_>> {
        (0..2)
            .map(|g| GpuJob {
                user: TWO_GPUS[g],
                actual: GpuId(0x100 + g as u32),
                bos: TWO_GPU_LAYOUT
                    .iter()
                    .filter(|l| l.0 == g)
                    .map(|&(_, off, size, i)| BoRef {
                        index: i,
                        gpu: TWO_GPUS[g],
                        addr: GpuVa(off),
                        size,
                        alloc_flags: bo::ALLOC_VRAM,
                        cpu_map: Some((devs[g].as_fd(), MmapOffset(off))),
                        dmabuf: None,
                    })
                    .collect(),
                engines: Engines::new(policy, 1 << 20, None),
            })
            .collect()
    }

    /// Two GPUs, each a memfd "render node" holding its BOs; dump both in
    /// parallel, wipe the memory, restore, compare; then corrupt a pages
    /// file and see the hash check fail.
    #[test]
    fn parallel_dump_and_restore_with_hashes() {
        use crate::image::tests::tempdir;
        use std::os::unix::fs::FileExt;

        let devs = [device(64 << 20), device(64 << 20)];
        let gpus = TWO_GPUS;
        let fill = |seed: u8| {
            for &(g, off, size, i) in &TWO_GPU_LAYOUT {
                let data: Vec<u8> = (0..size)
                    .map(|x| (x as u8) ^ seed ^ (i as u8 * 17))
                    .collect();
                devs[g].write_all_at(&data, off).unwrap();
            }
        };
        let jobs = |policy| two_gpu_jobs(&devs, policy);
        let dir = tempdir();
        fill(0x3c);
        let out = dump_contents(&dir, FileId(8), jobs(EnginePolicy::Auto)).unwrap();
        assert_eq!(out.hashes.len(), 3);
        assert_eq!(out.stats.len(), 2);
        assert_eq!(
            (out.stats[0].bos, out.stats[0].bytes, out.stats[0].cpu_bos),
            (2, 4 * 4096, 2)
        );
        assert_eq!(out.stats[1].bytes, 5 << 20);
        let pages = std::fs::read(dir.join(pages_image_name(FileId(8), gpus[0]))).unwrap();
        assert_eq!(u64::from_le_bytes(pages[..8].try_into().unwrap()), 4 * 4096);
        let mut bo2 = vec![0; 4096];
        devs[0].read_exact_at(&mut bo2, 0x80_0000).unwrap();
        assert_eq!(
            &pages[8 + 3 * 4096..],
            &bo2[..],
            "bucket order within the file"
        );

        fill(0);
        let hashes = out.hashes.clone();
        let stats = restore_contents(&dir, FileId(8), jobs(EnginePolicy::Auto), &hashes).unwrap();
        assert_eq!(stats.len(), 2);
        let again = dump_contents(&tempdir(), FileId(8), jobs(EnginePolicy::Cpu)).unwrap();
        assert_eq!(again.hashes, out.hashes);

        // Flip one byte of BO 1's saved contents.
        let path = dir.join(pages_image_name(FileId(8), gpus[1]));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8 + 12345] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = restore_contents(&dir, FileId(8), jobs(EnginePolicy::Auto), &hashes).unwrap_err();
        assert!(matches!(e, CopyError::HashMismatch { bo: 1, .. }), "{e}");
        // Forcing SDMA without an SDMA engine is an error naming the knob.
        let e = dump_contents(&dir, FileId(9), jobs(EnginePolicy::Sdma)).unwrap_err();
        assert!(e.to_string().contains("CRIU_ROCM_COPY_ENGINE"), "{e}");
        // A missing pages file names the file.
        std::fs::remove_file(&path).unwrap();
        let e = restore_contents(&dir, FileId(8), jobs(EnginePolicy::Auto), &hashes).unwrap_err();
        assert!(
            e.to_string()
                .contains(&pages_image_name(FileId(8), gpus[1])),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
