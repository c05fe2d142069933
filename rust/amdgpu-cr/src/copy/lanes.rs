//! Lanes: a GPU's work shared out among threads over the spare cores, each
//! lane a contiguous run of pieces in bucket order (one range of the pages
//! file), run in parallel, their statistics and digests gathered.

use std::time::{Duration, Instant};

use super::budget::lanes_with_window;
use super::engine::{EngineKind, Engines};
use super::extents::{compose_pieces, ExtentDigests, Piece};
use super::{CopyEngine, CopyError, GpuJob, GpuStats};
use crate::env;
use crate::ids::GpuId;
use crate::image::ImageError;

pub(super) fn run_parallel<I: Send, T: Send>(
    items: Vec<I>,
    gpu_of: impl Fn(&I) -> GpuId,
    work: impl Fn(I) -> Result<T, CopyError> + Sync,
) -> Result<Vec<T>, CopyError> {
    let gpus: Vec<GpuId> = items.iter().map(gpu_of).collect();
    let results: Vec<std::thread::Result<Result<T, CopyError>>> = std::thread::scope(|s| {
        let handles: Vec<_> = items
            .into_iter()
            .map(|item| {
                let work = &work;
                s.spawn(move || work(item))
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut out = Vec::with_capacity(results.len());
    let mut first_err = None;
    for (gpu, r) in gpus.into_iter().zip(results) {
        match r {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                log::error!("{e}");
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(CopyError::Panicked { gpu });
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// The pieces of one GPU that one thread copies: a contiguous run in
/// bucket order, so its bytes are one range of the pages file.
pub(super) struct Lane<'a> {
    pub(super) user: GpuId,
    pub(super) actual: GpuId,
    pub(super) pieces: Vec<Piece<'a>>,
    pub(super) engines: Engines<'a>,
}

impl Lane<'_> {
    pub(super) fn bytes(&self) -> Result<u64, CopyError> {
        self.pieces
            .iter()
            .try_fold(0u64, |t, p| t.checked_add(p.bo.size))
            .ok_or_else(|| CopyError::Setup {
                gpu: self.user,
                what: "sum of BO sizes overflows".into(),
            })
    }

    pub(super) fn stats(&self) -> GpuStats {
        GpuStats {
            user: self.user,
            actual: self.actual,
            bos: 0,
            bytes: 0,
            cpu_bos: 0,
            sdma_bos: 0,
            elapsed: Duration::ZERO,
        }
    }
}

/// A GPU's work is split into lanes only when each gets at least this much.
pub const MIN_LANE_BYTES: u64 = 32 << 20;

/// Threads per GPU: the CPU cores shared out among the GPUs.
pub(super) fn lanes_per_gpu(gpus: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / gpus.max(1)).max(1)
}

/// Splits a GPU's job into at most `max` lanes of about equal bytes, BOs
/// larger than their hash extent (`extent_of` a bucket index) in pieces of
/// extents.  A job with an SDMA engine (one per GPU) stays whole, its BOs
/// too; the CPU window is shared out among the lanes, so a GPU never maps
/// more than the job's window at once.
fn split_job<'a>(
    job: GpuJob<'a>,
    max: usize,
    extent_of: &dyn Fn(usize) -> Option<u64>,
) -> Vec<Lane<'a>> {
    let GpuJob {
        user,
        actual,
        bos,
        mut engines,
    } = job;
    let split = engines.sdma.is_none() && max > 1;
    let pieces: Vec<Piece<'a>> = bos
        .into_iter()
        .flat_map(|b| Piece::of(b, extent_of(b.index), split))
        .collect();
    let total: u64 = pieces
        .iter()
        .map(|p| p.bo.size)
        .fold(0, u64::saturating_add);
    let n = (total / MIN_LANE_BYTES)
        .min(max as u64)
        .min(pieces.len() as u64)
        .max(1) as usize;
    if n == 1 || engines.sdma.is_some() {
        return vec![Lane {
            user,
            actual,
            pieces,
            engines,
        }];
    }
    let budget = engines.budget / n as u64;
    engines.set_window(env::lane_split(budget).0);
    engines.budget = budget;
    let like = engines.another_lane(budget);
    let sizes: Vec<u64> = pieces.iter().map(|p| p.bo.size).collect();
    let mut engines = Some(engines);
    let mut rest = pieces;
    let mut lanes: Vec<Lane<'_>> = Vec::with_capacity(n);
    let mut start = 0;
    for end in lane_ends(&sizes, n) {
        let tail = rest.split_off(end - start);
        lanes.push(Lane {
            user,
            actual,
            pieces: std::mem::replace(&mut rest, tail),
            engines: engines.take().unwrap_or_else(|| like.another_lane(budget)),
        });
        start = end;
    }
    lanes
}

/// Where `n` contiguous lanes over pieces of `sizes` end (exclusive
/// indices, the last one `sizes.len()`): each boundary is the piece
/// boundary nearest to its share of the bytes, every lane keeps at least
/// one piece.  Nearest, not
/// the first boundary past the share: four BOs of 64 MiB followed by a
/// doorbell page go to two lanes two and two, not three and one (which made
/// the slower lane take 1.5 times as long as an even split).
fn lane_ends(sizes: &[u64], n: usize) -> Vec<usize> {
    let m = sizes.len();
    let n = n.clamp(1, m.max(1));
    let mut prefix = Vec::with_capacity(m + 1);
    prefix.push(0u128);
    for &s in sizes {
        prefix.push(prefix[prefix.len() - 1] + u128::from(s));
    }
    let total = prefix[m];
    let mut ends = Vec::with_capacity(n);
    let mut prev = 0;
    for k in 1..n {
        let ideal = total * k as u128 / n as u128;
        // Leave at least one BO for each lane after this one.
        let end = (prev + 1..=m - (n - k))
            .min_by_key(|&i| prefix[i].abs_diff(ideal))
            .unwrap_or(prev + 1);
        ends.push(end);
        prev = end;
    }
    ends.push(m);
    ends
}

/// Every job split into lanes (one per GPU when `one_lane`; fewer when
/// sharing its budget out would leave a lane a CPU window smaller than
/// `min_window`), each paired with its range of the GPU's pages file
/// (`open` gives one writer or reader per lane length, with write buffers
/// of the given bytes; it is also given the GPU's BOs, bucket index and
/// size, in file order).
pub(super) fn into_lanes<'a, F>(
    jobs: Vec<GpuJob<'a>>,
    extent_of: &dyn Fn(usize) -> Option<u64>,
    one_lane: bool,
    min_window: u64,
    open: impl Fn(GpuId, &[u64], usize, &[(usize, u64)]) -> Result<Vec<F>, ImageError>,
) -> Result<Vec<(Lane<'a>, F)>, CopyError> {
    let per_gpu = if one_lane {
        1
    } else {
        lanes_per_gpu(jobs.len())
    };
    let mut lanes = Vec::new();
    for job in jobs {
        let bos: Vec<(usize, u64)> = job.bos.iter().map(|b| (b.index, b.size)).collect();
        let max = lanes_with_window(job.engines.budget, min_window, per_gpu);
        let split = split_job(job, max, extent_of);
        let lens = split
            .iter()
            .map(Lane::bytes)
            .collect::<Result<Vec<_>, _>>()?;
        let files = open(split[0].user, &lens, split[0].engines.write_buffer(), &bos)?;
        lanes.extend(split.into_iter().zip(files));
    }
    Ok(lanes)
}

/// Adds up the lanes' statistics per GPU (elapsed: the slowest lane).
pub(super) fn merge_stats(lanes: Vec<GpuStats>) -> Vec<GpuStats> {
    let mut out: Vec<GpuStats> = Vec::new();
    for s in lanes {
        log::debug!(
            "GPU {}: lane of {} bytes in {:.1} ms",
            s.actual,
            s.bytes,
            s.elapsed.as_secs_f64() * 1e3
        );
        match out.iter_mut().find(|o| o.user == s.user) {
            Some(o) => {
                o.bos += s.bos;
                o.bytes += s.bytes;
                o.cpu_bos += s.cpu_bos;
                o.sdma_bos += s.sdma_bos;
                o.elapsed = o.elapsed.max(s.elapsed);
            }
            None => out.push(s),
        }
    }
    out
}

/// Runs every lane on a thread of its own: `move_piece` moves a piece
/// between its engine and the lane's range of the pages file (`F`), hashed
/// on the way, and returns the piece's extent digests; `finish` closes the
/// range.  All lanes run to completion; the first error is returned.  Gives
/// the statistics per GPU and each BO's hash.  Each piece done is logged
/// at debug level with `done` ("copied to the pages file").
pub(super) fn run_lanes<'a, F: Send>(
    lanes: Vec<(Lane<'a>, F)>,
    done: &str,
    move_piece: impl Fn(&mut dyn CopyEngine, &Piece<'a>, &mut F) -> Result<Vec<u64>, CopyError> + Sync,
    finish: impl Fn(F) -> Result<(), CopyError> + Sync,
) -> Result<(Vec<GpuStats>, ExtentDigests), CopyError> {
    let per_lane = run_parallel(
        lanes,
        |(l, _)| l.user,
        |(mut lane, mut file)| {
            let start = Instant::now();
            let mut stats = lane.stats();
            let mut digests = Vec::with_capacity(lane.pieces.len());
            for p in &lane.pieces {
                let (kind, d) = lane
                    .engines
                    .with_engine(&p.bo, |engine| move_piece(engine, p, &mut file))?;
                digests.push((p.bo.index, p.start, d));
                count(&mut stats, kind, p);
                log::debug!(
                    "GPU {}: BO {}, bytes {}..{}: {done}",
                    lane.user,
                    p.bo.index,
                    p.start,
                    p.start + p.bo.size
                );
            }
            finish(file)?;
            stats.elapsed = start.elapsed();
            Ok((stats, digests))
        },
    )?;
    let mut stats = Vec::new();
    let mut digests = Vec::new();
    for (s, d) in per_lane {
        stats.push(s);
        digests.extend(d);
    }
    Ok((merge_stats(stats), compose_pieces(digests)))
}

/// Counts a piece: its bytes, and its BO once (with the piece at its start).
pub(super) fn count(stats: &mut GpuStats, kind: EngineKind, p: &Piece<'_>) {
    stats.bytes += p.bo.size;
    if p.start != 0 {
        return;
    }
    stats.bos += 1;
    match kind {
        EngineKind::Cpu => stats.cpu_bos += 1,
        EngineKind::Sdma => stats.sdma_bos += 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::tests::*;

    /// A GPU's BOs split into lanes: contiguous, in bucket order, about
    /// equal in bytes, the CPU window shared out; small or SDMA jobs stay
    /// whole.
    #[test]
    fn lanes_split_a_gpu_by_bytes() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let mib = 1u64 << 20;
        let bos: Vec<BoRef<'_>> = [40, 24, 40, 8]
            .iter()
            .enumerate()
            .map(|(i, &m)| BoRef {
                index: i,
                size: m * mib,
                ..bo_ref(Some(f.as_fd()), None, bo::ALLOC_VRAM)
            })
            .collect();
        fn job(bos: Vec<BoRef<'_>>) -> GpuJob<'_> {
            GpuJob {
                user: GpuId(7),
                actual: GpuId(8),
                bos,
                engines: Engines::new(EnginePolicy::Auto, 64 << 20, None),
            }
        }
        let whole = |_| None;
        let lanes = split_job(job(bos.clone()), 2, &whole);
        let idx: Vec<Vec<usize>> = lanes
            .iter()
            .map(|l| l.pieces.iter().map(|p| p.bo.index).collect())
            .collect();
        assert_eq!(idx, vec![vec![0, 1], vec![2, 3]]);
        // The GPU's budget is shared out: each lane maps at most 31 MiB
        // and buffers 1 MiB of the pages file.
        for l in &lanes {
            assert_eq!(l.engines.budget, 32 * mib);
            assert_eq!(l.engines.cpu.as_ref().unwrap().window(), 31 * mib);
            assert_eq!(l.engines.write_buffer(), 1 << 20);
        }
        assert_eq!(
            split_job(job(bos.clone()), 8, &whole).len(),
            3,
            "at least 32 MiB a lane"
        );
        assert_eq!(
            split_job(job(bos[3..].to_vec()), 8, &whole).len(),
            1,
            "small job"
        );
        // Equal BOs and a few small ones: the boundary nearest to half the
        // bytes, not the first BO boundary past it.
        let even: Vec<BoRef<'_>> = [64 * mib, 64 * mib, 64 * mib, 64 * mib, 4096, 65536]
            .iter()
            .enumerate()
            .map(|(i, &size)| BoRef {
                index: i,
                size,
                ..bo_ref(Some(f.as_fd()), None, bo::ALLOC_VRAM)
            })
            .collect();
        let lanes = split_job(job(even), 2, &whole);
        let per_lane: Vec<u64> = lanes.iter().map(|l| l.bytes().unwrap()).collect();
        assert_eq!(per_lane, vec![128 * mib, 128 * mib + 4096 + 65536]);
        let mut with_sdma = job(bos);
        with_sdma.engines.sdma = Some(Box::new(FakeGpu::new().0));
        assert_eq!(
            split_job(with_sdma, 4, &whole).len(),
            1,
            "one SDMA engine per GPU"
        );
    }

    /// One BO larger than its hash extent goes to several lanes in pieces
    /// of extents, each mapped at its own offset; with SDMA, or hashed
    /// whole, it stays in one piece.
    #[test]
    fn a_large_bo_is_shared_out_in_extents() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let mib = 1u64 << 20;
        let big = BoRef {
            index: 3,
            size: 100 * mib,
            addr: GpuVa(0x7000_0000_0000),
            cpu_map: Some((f.as_fd(), MmapOffset(0x1_0000_0000))),
            dmabuf: Some(f.as_fd()),
            ..bo_ref(None, None, bo::ALLOC_VRAM)
        };
        let job = |sdma: bool| GpuJob {
            user: GpuId(7),
            actual: GpuId(8),
            bos: vec![big],
            engines: Engines::new(
                EnginePolicy::Auto,
                64 << 20,
                sdma.then(|| Box::new(FakeGpu::new().0) as Box<dyn GpuEngine>),
            ),
        };
        let extent = |_| Some(32 * mib);
        let lanes = split_job(job(false), 4, &extent);
        let pieces: Vec<Vec<(u64, u64, u64, u64)>> = lanes
            .iter()
            .map(|l| {
                l.pieces
                    .iter()
                    .map(|p| (p.start, p.bo.size, p.bo.addr.0, p.bo.cpu_map.unwrap().1 .0))
                    .collect()
            })
            .collect();
        let (a, m) = (0x7000_0000_0000u64, 0x1_0000_0000u64);
        assert_eq!(
            pieces,
            vec![
                vec![(0, 32 * mib, a, m)],
                vec![(32 * mib, 32 * mib, a + 32 * mib, m + 32 * mib)],
                vec![
                    (64 * mib, 32 * mib, a + 64 * mib, m + 64 * mib),
                    (96 * mib, 4 * mib, a + 96 * mib, m + 96 * mib)
                ],
            ]
        );
        assert!(lanes
            .iter()
            .all(|l| l.pieces.iter().all(|p| p.bo.dmabuf.is_none())));
        assert!(lanes
            .iter()
            .all(|l| l.pieces.iter().all(|p| p.bo.index == 3)));
        let one = split_job(job(true), 4, &extent);
        assert_eq!(
            (one.len(), one[0].pieces.len()),
            (1, 1),
            "SDMA copies it whole"
        );
        assert_eq!(
            one[0].pieces[0].extent,
            Some(32 * mib),
            "still hashed in extents"
        );
        let one = split_job(job(false), 4, &|_| None);
        assert_eq!((one.len(), one[0].pieces.len()), (1, 1), "hashed whole");
        let one = split_job(job(false), 1, &extent);
        assert_eq!(
            (one.len(), one[0].pieces.len()),
            (1, 1),
            "one core: not cut"
        );
    }

    #[test]
    fn lane_ends_are_balanced_and_never_empty() {
        assert_eq!(lane_ends(&[10, 10, 10, 10], 2), vec![2, 4]);
        assert_eq!(lane_ends(&[10, 10, 10, 10, 1], 2), vec![2, 5]);
        assert_eq!(lane_ends(&[100, 1, 1, 1], 2), vec![1, 4]);
        assert_eq!(lane_ends(&[1, 1, 1, 100], 3), vec![2, 3, 4]);
        assert_eq!(lane_ends(&[5, 5], 4), vec![1, 2], "no more lanes than BOs");
        assert_eq!(lane_ends(&[7], 1), vec![1]);
        assert_eq!(lane_ends(&[u64::MAX, u64::MAX, u64::MAX], 3), vec![1, 2, 3]);
    }
}
