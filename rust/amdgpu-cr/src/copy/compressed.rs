//! Compressed dumps ([`crate::pages::zstd`]): lanes that take whole chunks
//! in turn, hash and compress them in their own zstd context, and place
//! their records in the GPU's pages file in chunk order.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Instant;

use super::budget::{zstd_lanes, MIN_ZSTD_WINDOW};
use super::extents::{compose_pieces, outcome, Piece, PieceDigests};
use super::lanes::{count, lanes_per_gpu, merge_stats, run_parallel, Lane};
use super::{BoRef, CopyError, DumpOutcome, GpuJob, GpuStats, ParentDigests};
use crate::bo;
use crate::env;
use crate::image::FileId;
use crate::pages::zstd::{ZstdPagesFile, CHUNK};
use crate::pages::{pages_image_name, Compress, Encoding, CONTENT_EXTENT};

/// One GPU's compressed dump: its pages file, the pieces its lanes take in
/// turn (whole chunks, or whole BOs when one engine copies), and where each
/// BO's chunks start in the file's chunk list.
struct ZstdGpu<'a> {
    file: ZstdPagesFile,
    pieces: Vec<Piece<'a>>,
    next: std::sync::atomic::AtomicUsize,
    first_chunk: BTreeMap<usize, usize>,
}

/// [`dump_contents`] into compressed pages files ([`crate::pages::zstd`]):
/// per GPU, lanes (threads; one when an SDMA engine copies) take whole
/// chunks in turn, each hashing and compressing a chunk straight from the
/// engine's window or staging buffer into memory with its own
/// single-threaded zstd context; the file places the records in chunk
/// order.  The compressors live in each lane's share of the budget (see
/// [`zstd_lanes`]); with `parent`, each chunk (an extent) is handed whole
/// ([`CopyEngine::read_bo_aligned`]) and hashed in place first, and one the
/// parent holds with the same digest is neither copied nor compressed but
/// written as a zero record and listed as inherited.
///
/// The steps: the level and lanes each GPU's budget holds, each GPU's pages
/// file opened with its lanes, the lanes run, the files finished, the
/// outcome gathered.
///
/// [`dump_contents`]: super::dump_contents
/// [`CopyEngine::read_bo_aligned`]: super::CopyEngine::read_bo_aligned
pub fn dump_compressed(
    dir: &Path,
    id: FileId,
    jobs: Vec<GpuJob<'_>>,
    c: Compress,
    parent: &ParentDigests,
) -> Result<DumpOutcome, CopyError> {
    let (level, plan) = plan_lanes(&jobs, c, !parent.is_empty())?;
    let mut gpus = Vec::with_capacity(jobs.len());
    let mut lanes = Vec::new();
    for (g, (job, n)) in jobs.into_iter().zip(plan).enumerate() {
        let (gpu, its_lanes) = open_gpu(dir, id, job, n, level)?;
        gpus.push(gpu);
        lanes.extend(its_lanes.into_iter().map(|l| (g, l)));
    }
    let inherited = Mutex::default();
    let counts = ChunkCounts::default();
    let per_lane = run_compressing_lanes(id, &gpus, lanes, level, parent, &inherited, &counts)?;
    for g in &gpus {
        g.file.finish()?;
    }
    let inherited = inherited.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(gather(per_lane, inherited, counts, level))
}

/// The zstd level of the image (the lowest any GPU's share of the budget
/// holds at the level asked for) and each GPU's number of compressing
/// lanes (`c.threads`, or the CPU cores shared out among the GPUs; one
/// when an SDMA engine copies).
fn plan_lanes(
    jobs: &[GpuJob<'_>],
    c: Compress,
    incremental: bool,
) -> Result<(i32, Vec<usize>), CopyError> {
    let cores = lanes_per_gpu(jobs.len());
    let want = c.threads.map_or(cores, |t| t.max(1) as usize);
    let mut level = c.level;
    let mut plan = Vec::with_capacity(jobs.len());
    for job in jobs {
        let want = if job.engines.sdma.is_some() { 1 } else { want };
        let (n, l) = gpu_lanes(job, want, c.level, incremental)?;
        level = level.min(l);
        plan.push(n);
    }
    Ok((level, plan))
}

/// The compressing lanes (at most `want`) and level (at most `level`)
/// `job`'s share of the budget holds, saying so when they are fewer or
/// lower than asked; refused when not one lane at level 1 fits.
fn gpu_lanes(
    job: &GpuJob<'_>,
    want: usize,
    level: i32,
    incremental: bool,
) -> Result<(usize, i32), CopyError> {
    use crate::pages::zstd::compressor_memory;
    let budget = job.engines.budget;
    let Some((n, l)) = zstd_lanes(budget, want, level, incremental) else {
        return Err(CopyError::Setup {
            gpu: job.user,
            what: format!(
                "{budget} bytes of {} per GPU cannot hold a zstd compressor ({} bytes at level 1) \
                 and a copy window of {MIN_ZSTD_WINDOW}: raise {} or unset {}",
                env::MAX_BUFFER_SIZE_VAR,
                compressor_memory(1),
                env::MAX_BUFFER_SIZE_VAR,
                env::COMPRESS_VAR
            ),
        });
    };
    if n < want {
        log::warn!(
            "GPU {}: {n} compressing lanes (not {want}): each holds a zstd compressor of {} \
             bytes at level {l} within {} ({budget} bytes for this GPU; see {})",
            job.user,
            compressor_memory(l),
            env::MAX_BUFFER_SIZE_VAR,
            env::COMPRESS_THREADS_VAR
        );
    }
    if l < level {
        log::warn!(
            "GPU {}: zstd level {l}, not {level} ({}): a compressor at level {level} needs {} \
             bytes, more than {} leaves this GPU ({budget} bytes)",
            job.user,
            env::COMPRESS_VAR,
            compressor_memory(level),
            env::MAX_BUFFER_SIZE_VAR,
        );
    }
    Ok((n, l))
}

/// `job`'s compressed pages file, its pieces (whole chunks when `n` lanes
/// share them, else whole BOs) and its lanes (at most `n`, at most one a
/// piece), each with an equal share of the GPU's budget: a compressor at
/// `level` and a CPU window of the rest.
fn open_gpu<'a>(
    dir: &Path,
    id: FileId,
    job: GpuJob<'a>,
    n: usize,
    level: i32,
) -> Result<(ZstdGpu<'a>, Vec<Lane<'a>>), CopyError> {
    let GpuJob {
        user,
        actual,
        bos,
        mut engines,
    } = job;
    let list: Vec<(usize, u64)> = bos.iter().map(|b| (b.index, b.size)).collect();
    let file = ZstdPagesFile::create(dir, id, user, &list, CHUNK)?;
    let mut first_chunk = BTreeMap::new();
    for (k, ch) in file.chunks().iter().enumerate() {
        first_chunk.entry(ch.bo).or_insert(k);
    }
    let split = engines.sdma.is_none() && n > 1;
    let pieces: Vec<Piece<'_>> = bos
        .into_iter()
        .flat_map(|b| chunk_pieces(b, split))
        .collect();
    let n = n.min(pieces.len()).max(1);
    let lane_budget = engines.budget / n as u64;
    let zmem = crate::pages::zstd::compressor_memory(level);
    let window =
        (lane_budget.saturating_sub(zmem) / bo::PAGE_SIZE * bo::PAGE_SIZE).max(bo::PAGE_SIZE);
    engines.set_window(window);
    engines.budget = lane_budget;
    let like = engines.another_lane(lane_budget);
    let mut engines = Some(engines);
    let lanes = (0..n)
        .map(|_| Lane {
            user,
            actual,
            pieces: Vec::new(),
            engines: engines.take().unwrap_or_else(|| {
                let mut e = like.another_lane(lane_budget);
                e.set_window(window);
                e
            }),
        })
        .collect();
    let gpu = ZstdGpu {
        file,
        pieces,
        next: Default::default(),
        first_chunk,
    };
    Ok((gpu, lanes))
}

/// Runs every lane (paired with the index of its GPU in `gpus`) on a
/// thread of its own until its GPU has no piece left; gives each lane's
/// statistics and piece digests.  A lane that fails or panics stops the
/// other lanes of its GPU, which would otherwise wait for its chunk's
/// record for ever; the first error is returned.
fn run_compressing_lanes<'a>(
    id: FileId,
    gpus: &[ZstdGpu<'a>],
    lanes: Vec<(usize, Lane<'a>)>,
    level: i32,
    parent: &ParentDigests,
    inherited: &Mutex<BTreeMap<usize, Vec<u64>>>,
    counts: &ChunkCounts,
) -> Result<Vec<(GpuStats, Vec<PieceDigests>)>, CopyError> {
    run_parallel(
        lanes,
        |(_, l)| l.user,
        |(g, mut lane)| {
            let gpu = &gpus[g];
            struct StopOnPanic<'f>(&'f ZstdPagesFile);
            impl Drop for StopOnPanic<'_> {
                fn drop(&mut self) {
                    if std::thread::panicking() {
                        self.0.fail();
                    }
                }
            }
            let _stop = StopOnPanic(&gpu.file);
            match zstd_lane(id, gpu, &mut lane, level, parent, inherited, counts) {
                // A lane stopped by another's failure: the other gives the
                // cause.
                Err(_) if gpu.file.fail() => Ok((lane.stats(), Vec::new())),
                r => r,
            }
        },
    )
}

/// The dump's outcome from its lanes' statistics and digests, the chunks
/// left to the parent and the lanes' counts (warning of chunks that came in
/// parts).
fn gather(
    per_lane: Vec<(GpuStats, Vec<PieceDigests>)>,
    inherited: BTreeMap<usize, Vec<u64>>,
    counts: ChunkCounts,
    level: i32,
) -> DumpOutcome {
    let mut stats = Vec::new();
    let mut digests = Vec::new();
    for (s, d) in per_lane {
        stats.push(s);
        digests.extend(d);
    }
    let parted = counts.parted.into_inner();
    if parted > 0 {
        log::warn!(
            "{parted} chunk(s) of {} came in parts (a copy window or staging buffer smaller \
             than a chunk: {} too small for the GPUs, compressors and copy threads), so they \
             were compressed even if unchanged",
            crate::units::human_bytes(CHUNK),
            env::MAX_BUFFER_SIZE_VAR
        );
    }
    outcome(
        merge_stats(stats),
        compose_pieces(digests),
        inherited,
        counts.compressed.into_inner(),
        Encoding::Zstd {
            level,
            chunk: CHUNK,
        },
    )
}

/// `bo` cut into pieces of one chunk each when `split`, else whole (each
/// hashed in extents of [`CONTENT_EXTENT`], a chunk's size).
fn chunk_pieces(bo: BoRef<'_>, split: bool) -> Vec<Piece<'_>> {
    let extent = Some(CONTENT_EXTENT);
    if !split || bo.size <= CONTENT_EXTENT {
        return vec![Piece::whole(bo, extent)];
    }
    Piece::runs(bo, CONTENT_EXTENT, extent)
}

/// One compressing lane: takes the GPU's next piece until none is left.
fn zstd_lane<'a>(
    id: FileId,
    gpu: &ZstdGpu<'a>,
    lane: &mut Lane<'a>,
    level: i32,
    parent: &ParentDigests,
    inherited: &Mutex<BTreeMap<usize, Vec<u64>>>,
    counts: &ChunkCounts,
) -> Result<(GpuStats, Vec<PieceDigests>), CopyError> {
    use std::sync::atomic::Ordering;
    let start = Instant::now();
    let mut stats = lane.stats();
    let mut out = Vec::new();
    let setup = |what: String| CopyError::Setup {
        gpu: lane.user,
        what,
    };
    let mut enc = crate::pages::zstd::FrameEncoder::new(level)
        .map_err(|e| setup(format!("zstd compressor: {e}")))?;
    loop {
        let i = gpu.next.fetch_add(1, Ordering::Relaxed);
        let Some(p) = gpu.pieces.get(i) else { break };
        let first = gpu.first_chunk.get(&p.bo.index).copied().unwrap_or(0);
        let mut sink = ChunkSink {
            file: &gpu.file,
            enc: &mut enc,
            next: first + (p.start / CHUNK) as usize,
            left: 0,
            k: p.start / CHUNK,
            hasher: xxhash_rust::xxh3::Xxh3::new(),
            parent: parent.get(&p.bo.index).map(Vec::as_slice),
            digests: Vec::new(),
            kept: Vec::new(),
            compressed: 0,
            parted: 0,
        };
        // With a parent, each chunk whole from the window or staging
        // buffer (when it holds one), to be hashed there before anything
        // is compressed.
        let (kind, ()) = lane
            .engines
            .with_engine(&p.bo, |engine| match sink.parent {
                Some(_) => engine.read_bo_aligned(&p.bo, CHUNK, &mut sink),
                None => engine.read_bo(&p.bo, &mut sink),
            })?;
        counts
            .compressed
            .fetch_add(sink.compressed, Ordering::Relaxed);
        counts.parted.fetch_add(sink.parted, Ordering::Relaxed);
        if sink.left != 0 {
            return Err(CopyError::Stream {
                gpu: p.bo.gpu,
                bo: p.bo.index,
                file: pages_image_name(id, p.bo.gpu),
                op: "compress",
                source: io::Error::other("the copy ended inside a chunk"),
            });
        }
        if !sink.kept.is_empty() {
            let mut m = inherited.lock().unwrap_or_else(|e| e.into_inner());
            m.entry(p.bo.index).or_default().extend(sink.kept.iter());
        }
        out.push((p.bo.index, p.start, std::mem::take(&mut sink.digests)));
        count(&mut stats, kind, p);
        log::debug!(
            "GPU {}: BO {}, bytes {}..{}: compressed to the pages file",
            lane.user,
            p.bo.index,
            p.start,
            p.start + p.bo.size
        );
    }
    stats.elapsed = start.elapsed();
    Ok((stats, out))
}

/// What a compressed dump's lanes did, counted across them.
#[derive(Default)]
struct ChunkCounts {
    /// Bytes of the chunks compressed (not those left to the parent).
    compressed: AtomicU64,
    /// Chunks an incremental dump was handed in parts, and so compressed
    /// whether they changed or not.
    parted: AtomicU64,
}

/// A compressing lane's sink for one piece (which starts at a chunk): a
/// chunk is hashed and compressed as it streams in, its record placed in
/// the file when it ends.  With a parent, a chunk handed whole
/// ([`CopyEngine::read_bo_aligned`]) is hashed in place first (in the
/// engine's window or staging buffer) and, when the parent's has the same
/// digest, not compressed (a zero record, listed in `kept`); one handed
/// in parts (a window or staging buffer smaller than a chunk) is
/// compressed as it comes, as in a full dump: holding it back until its
/// digest is known would take a chunk of memory outside the budget.
///
/// [`CopyEngine::read_bo_aligned`]: super::CopyEngine::read_bo_aligned
struct ChunkSink<'s> {
    file: &'s ZstdPagesFile,
    enc: &'s mut crate::pages::zstd::FrameEncoder,
    /// Index in the file of the chunk being written.
    next: usize,
    /// Its bytes still to come (0: none begun).
    left: u64,
    /// Its index in its BO (an extent's).
    k: u64,
    hasher: xxhash_rust::xxh3::Xxh3,
    parent: Option<&'s [u64]>,
    digests: Vec<u64>,
    kept: Vec<u64>,
    /// Bytes of the chunks compressed.
    compressed: u64,
    /// Chunks the parent has a digest for that came in parts.
    parted: u64,
}

impl ChunkSink<'_> {
    fn zfail(e: String) -> io::Error {
        io::Error::other(format!("zstd compression: {e}"))
    }

    /// Places the record of the chunk just ended, of `len` bytes and
    /// digest `d`.
    fn place(&mut self, len: u64, d: u64, compressed: bool) -> io::Result<()> {
        let rec = if compressed {
            self.compressed += len;
            self.enc.end().map_err(Self::zfail)?
        } else {
            self.kept.push(self.k);
            self.enc.skip()
        };
        self.file.place(self.next, rec)?;
        self.digests.push(d);
        self.next += 1;
        self.k += 1;
        Ok(())
    }
}

impl Write for ChunkSink<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let c = self.file.chunks().get(self.next).copied().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "write past the last chunk")
            })?;
            let parent = self.parent.and_then(|p| p.get(self.k as usize)).copied();
            let whole = usize::try_from(c.len).ok().filter(|&n| n <= buf.len());
            match (parent, whole) {
                (Some(p), Some(n)) => {
                    // The chunk whole, in place: hashed before anything
                    // is done with it.
                    let bytes = &buf[..n];
                    let d = xxhash_rust::xxh3::xxh3_64(bytes);
                    let changed = d != p;
                    if changed {
                        self.enc.begin(c.len);
                        self.enc.put(bytes).map_err(Self::zfail)?;
                    }
                    self.place(c.len, d, changed)?;
                    return Ok(n);
                }
                (Some(_), None) => self.parted += 1,
                (None, _) => {}
            }
            self.left = c.len;
            self.enc.begin(c.len);
            self.hasher.reset();
        }
        let n = self.left.min(buf.len() as u64) as usize;
        self.hasher.update(&buf[..n]);
        self.enc.put(&buf[..n]).map_err(Self::zfail)?;
        self.left -= n as u64;
        if self.left == 0 {
            let len = self.file.chunks()[self.next].len;
            let d = self.hasher.digest();
            self.place(len, d, true)?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::tests::*;

    /// A compressed dump in two lanes: every chunk's record in order (the
    /// file reads back whole), zero chunks as bare records, the hashes
    /// those of the uncompressed dump; then restored in lanes.
    #[test]
    fn a_compressed_dump_in_lanes_round_trips() {
        use crate::image::tests::tempdir;
        use std::os::unix::fs::FileExt;

        let (off, size) = (1u64 << 20, 9 * CONTENT_EXTENT + 4096);
        let dev = device(off + size);
        let mut data: Vec<u8> = (0..size)
            .map(|x| (x % 251) as u8 ^ (x >> 21) as u8)
            .collect();
        let e = CONTENT_EXTENT as usize;
        data[3 * e..4 * e].fill(0);
        dev.write_all_at(&data, off).unwrap();
        let jobs = || one_vram_bo(dev.as_fd(), off, size);
        let plain = dump_contents(&tempdir(), FileId(3), jobs()).unwrap();
        let dir = tempdir();
        let out = dump_contents_encoded(
            &dir,
            FileId(3),
            jobs(),
            Some((3, Some(2))),
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(out.hashes, plain.hashes, "hashed as the uncompressed dump");
        assert_eq!(out.extents, plain.extents);
        let enc = Encoding::Zstd {
            level: 3,
            chunk: CONTENT_EXTENT,
        };
        assert_eq!(out.encoding, enc);
        let gpu = GpuId(0x1a2b);
        let len = std::fs::metadata(dir.join(pages_image_name(FileId(3), gpu)))
            .unwrap()
            .len();
        assert!(len < size / 4, "compressed to {len} of {size}");
        let bos = [(0usize, size)];
        let mut r = PagesReader::open_encoded(&dir, FileId(3), gpu, &bos, enc, None).unwrap();
        let mut back = Vec::new();
        r.read_to_end(&mut back).unwrap();
        assert!(back == data, "the records are in chunk order");
        dev.write_all_at(&vec![0xee; size as usize], off).unwrap();
        restore_contents_encoded(&dir, FileId(3), jobs(), &out.hashes, enc, &BTreeMap::new())
            .unwrap();
        let mut back = vec![0; size as usize];
        dev.read_exact_at(&mut back, off).unwrap();
        assert!(back == data, "every byte comes back");
    }

    /// A chain of four dumps of one BO, uncompressed and compressed in
    /// turn, each changing one extent: each link leaves the others to its
    /// parents, and every link restores through [`chain::resolve`] (its
    /// extents read from plain and compressed ancestors alike).
    #[test]
    fn a_mixed_chain_of_compressed_and_plain_dumps_restores() {
        use crate::image::tests::tempdir;
        use crate::validate::chain;
        use std::os::unix::fs::FileExt;

        let (off, size) = (1u64 << 20, 5 * CONTENT_EXTENT + 4096);
        let dev = device(off + size);
        let mut data: Vec<u8> = (0..size).map(|x| (x % 253) as u8 | 1).collect();
        let gpu = GpuId(0x1a2b);
        let id = FileId(5);
        let jobs = || one_vram_bo(dev.as_fd(), off, size);
        let root = tempdir();
        let mut prev: Option<(std::path::PathBuf, DumpOutcome)> = None;
        let mut links = Vec::new();
        for (n, compress) in [None, Some(3), None, Some(1)].into_iter().enumerate() {
            let e = CONTENT_EXTENT as usize;
            if n > 0 {
                data[n * e + 5] ^= 0x5a;
            }
            dev.write_all_at(&data, off).unwrap();
            let dir = root.join(format!("l{n}"));
            std::fs::create_dir(&dir).unwrap();
            let parent: ParentDigests = match &prev {
                Some((pdir, p)) => {
                    std::os::unix::fs::symlink(pdir, dir.join(chain::PARENT_LINK)).unwrap();
                    BTreeMap::from([(0, p.extents[&0].clone())])
                }
                None => BTreeMap::new(),
            };
            let out =
                dump_contents_encoded(&dir, id, jobs(), compress.map(|l| (l, Some(2))), &parent)
                    .unwrap();
            if n > 0 {
                let mut want: Vec<u64> = (0..6).filter(|&k| k != n as u64).collect();
                want.sort_unstable();
                assert_eq!(out.inherited, BTreeMap::from([(0, want)]), "link {n}");
                // Only the changed chunk is compressed (or copied):
                // `written` counts the bytes given to the compressors.
                assert_eq!(out.written, CONTENT_EXTENT, "link {n}: bytes written");
            }
            let image = write_link_image(&dir, id, size, &out);
            links.push((dir.clone(), image, out.clone(), data.clone()));
            prev = Some((dir, out));
        }
        let compressed = std::fs::metadata(links[3].0.join(pages_image_name(id, gpu)))
            .unwrap()
            .len();
        assert!(
            compressed < size / 4,
            "the compressed child is {compressed} bytes"
        );
        for (n, (dir, image, out, want)) in links.iter().enumerate() {
            let overlays = chain::resolve(dir, &crate::image::kfd_image_name(id), image).unwrap();
            assert_eq!(overlays.is_empty(), n == 0, "link {n}");
            dev.write_all_at(&vec![0; size as usize], off).unwrap();
            restore_contents_encoded(dir, id, jobs(), &out.hashes, out.encoding, &overlays)
                .unwrap_or_else(|e| panic!("link {n}: {e}"));
            let mut back = vec![0; size as usize];
            dev.read_exact_at(&mut back, off).unwrap();
            assert!(back == *want, "link {n}: every byte comes back");
        }
        // Without its ancestors' extents the last link's hash check fails.
        let (dir, _, out, _) = &links[3];
        let e =
            restore_contents_encoded(dir, id, jobs(), &out.hashes, out.encoding, &BTreeMap::new())
                .unwrap_err();
        assert!(matches!(e, CopyError::HashMismatch { .. }), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// The KFD image (and digests) of link `dir` of a chain of dumps of
    /// one VRAM BO of `size` bytes, dumped as `out`: a child names the
    /// extents it leaves to its parent.
    fn write_link_image(
        dir: &std::path::Path,
        id: FileId,
        size: u64,
        out: &DumpOutcome,
    ) -> crate::image::KfdImage {
        use crate::image::tests::sample_kfd;
        use crate::validate::chain;
        use crate::validate::digests::{self, Digests};

        let mut m = sample_kfd();
        m.device_entries.truncate(2);
        m.num_of_gpus = 1;
        m.bo_entries.truncate(1);
        m.num_of_bos = 1;
        let b = &mut m.bo_entries[0];
        b.addr = 0x7000_0000_0000;
        b.size = size;
        b.alloc_flags = bo::ALLOC_VRAM;
        b.content_xxh3 = Some(out.hashes[&0].value);
        b.content_hash_extent = Some(CONTENT_EXTENT);
        b.content_extent_xxh3 = out.extents[&0].clone();
        if let Some(ks) = out.inherited.get(&0) {
            b.parent_extents = Some(chain::bitmap(ks));
            b.parent_bo = Some(0);
            m.criu_rocm_parent = Some(crate::image::kfd_image_name(id));
        }
        out.encoding.record(&mut m);
        let image = crate::image::KfdImage { msg: m };
        image.write(dir, id).unwrap();
        let mut d = Digests::default();
        d.add_kfd_in(dir, id, &image);
        std::fs::write(dir.join(digests::FILE), d.encode()).unwrap();
        image
    }

    /// A compressed incremental dump under a budget whose copy window is
    /// smaller than a chunk: the chunks come in parts and are compressed
    /// whole, unchanged or not (nothing held back outside the budget), and
    /// the dump restores on its own.
    #[test]
    fn a_compressed_incremental_dump_with_a_window_below_a_chunk_compresses_everything() {
        use crate::image::tests::tempdir;
        use crate::pages::zstd::{compressor_memory, CHUNK};
        use std::os::unix::fs::FileExt;

        let (off, size) = (1u64 << 20, 3 * CHUNK);
        let dev = device(off + size);
        let mut data: Vec<u8> = (0..size).map(|x| (x % 251) as u8 | 1).collect();
        dev.write_all_at(&data, off).unwrap();
        let budget = compressor_memory(1) + MIN_ZSTD_WINDOW + 4096;
        assert_eq!(zstd_lanes(budget, 1, 1, true), Some((1, 1)));
        let jobs = || {
            let mut j = one_vram_bo(dev.as_fd(), off, size);
            j[0].engines = Engines::new(EnginePolicy::Auto, budget, None);
            j
        };
        let z = Some((1, Some(1)));
        let parent =
            dump_contents_encoded(&tempdir(), FileId(1), jobs(), z, &BTreeMap::new()).unwrap();
        assert_eq!(parent.written, size);
        data[(CHUNK + 7) as usize] ^= 0xff;
        dev.write_all_at(&data, off).unwrap();
        let dir = tempdir();
        let out = dump_contents_encoded(&dir, FileId(2), jobs(), z, &parent.extents).unwrap();
        assert_eq!(out.written, size, "every chunk compressed");
        assert!(out.inherited.is_empty(), "{:?}", out.inherited);
        assert_eq!(out.extents[&0].len(), 3, "still hashed in chunks");
        dev.write_all_at(&vec![0; size as usize], off).unwrap();
        restore_contents_encoded(
            &dir,
            FileId(2),
            jobs(),
            &out.hashes,
            out.encoding,
            &BTreeMap::new(),
        )
        .unwrap();
        let mut back = vec![0; size as usize];
        dev.read_exact_at(&mut back, off).unwrap();
        assert!(back == data, "every byte comes back");
    }
}
