//! The memory budget (`KFD_MAX_BUFFER_SIZE`): how many lanes a GPU's share
//! holds with a CPU window of a given size, and room for zstd compressors
//! and decompressors within it.

use super::engine::Engines;
use crate::bo;
use crate::env;
use crate::ids::GpuId;

/// The most lanes, up to `max`, among which `budget` can be shared so that
/// each lane's CPU window holds `window` bytes; one if none can.
pub(super) fn lanes_with_window(budget: u64, window: u64, max: usize) -> usize {
    (1..=max)
        .rev()
        .find(|&n| env::lane_split(budget / n as u64).0 >= window)
        .unwrap_or(1)
}

/// Takes the memory of `decoders` zstd decompressors out of the CPU
/// window of a lane of GPU `user` with `engines`, so that the budget still
/// bounds the whole copy.
pub(super) fn make_room_for_zstd(user: GpuId, engines: &mut Engines<'_>, decoders: u64) {
    if engines.cpu.is_none() {
        return;
    }
    let zstd = decoders * crate::pages::zstd::decompressor_memory();
    if engines.budget < zstd + 2 * bo::PAGE_SIZE {
        log::warn!(
            "GPU {user}: a copy lane's share of {} ({} bytes) cannot hold its {decoders} \
             zstd decompressor(s) ({zstd} bytes) and a window: the restore uses more \
             memory than the budget; raise {}",
            env::MAX_BUFFER_SIZE_VAR,
            engines.budget,
            env::MAX_BUFFER_SIZE_VAR
        );
    }
    let budget = engines.budget.saturating_sub(zstd);
    engines.set_window(env::lane_split(budget).0);
}

/// The least CPU window a compressing lane keeps besides its compressor.
pub const MIN_ZSTD_WINDOW: u64 = 1 << 20;

/// How many compressing lanes a GPU's share of the budget (`budget`, past
/// any SDMA staging) holds at `level`, at most `want`, and the level: each
/// lane holds a
/// compressor ([`crate::pages::zstd::compressor_memory`]) and a CPU window
/// of at least [`MIN_ZSTD_WINDOW`], or of a chunk when `incremental` (its
/// chunks are hashed in place in the window, and an unchanged one is
/// neither copied nor compressed).  Fewer lanes, then a lower level, when
/// the budget cannot hold them (the caller says so); an incremental dump
/// whose budget holds no lane with a chunk's window falls back to windows
/// of [`MIN_ZSTD_WINDOW`] (its chunks then come in parts and are
/// compressed whole, changed or not).  `None` when not even one lane at
/// level 1 fits.
pub fn zstd_lanes(budget: u64, want: usize, level: i32, incremental: bool) -> Option<(usize, i32)> {
    let fit = |window: u64| {
        let lane = |level: i32| crate::pages::zstd::compressor_memory(level) + window;
        let lanes = (budget / lane(level)).min(want.max(1) as u64) as usize;
        if lanes >= 1 {
            return Some((lanes, level));
        }
        (1..level)
            .rev()
            .find(|&l| lane(l) <= budget)
            .map(|l| (1, l))
    };
    let chunk = crate::pages::zstd::CHUNK.max(MIN_ZSTD_WINDOW);
    if incremental {
        fit(chunk).or_else(|| fit(MIN_ZSTD_WINDOW))
    } else {
        fit(MIN_ZSTD_WINDOW)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::tests::*;

    /// A budget too small for a compressor at the level asked for lowers
    /// the lanes, then the level; one too small for any is refused naming
    /// the knob.  An incremental dump's lanes want a chunk's window (no
    /// other buffer), else fall back to the least window.
    #[test]
    fn the_compressors_fit_in_the_budget() {
        use crate::pages::zstd::{compressor_memory, CHUNK};
        let lane = |l| compressor_memory(l) + MIN_ZSTD_WINDOW;
        assert_eq!(zstd_lanes(64 << 20, 2, 3, false), Some((2, 3)));
        assert_eq!(zstd_lanes(lane(3) + 4096, 2, 3, false), Some((1, 3)));
        assert_eq!(zstd_lanes(lane(3) - 4096, 1, 3, false), Some((1, 2)));
        assert_eq!(zstd_lanes(lane(1) - 4096, 1, 3, false), None);
        assert!(lane(19) > lane(3) && lane(3) > lane(1));
        let whole = |l| compressor_memory(l) + CHUNK;
        assert_eq!(zstd_lanes(2 * whole(3), 2, 3, true), Some((2, 3)));
        assert_eq!(zstd_lanes(2 * whole(3) - 4096, 2, 3, true), Some((1, 3)));
        assert_eq!(zstd_lanes(whole(1) - 4096, 1, 1, true), Some((1, 1)));
        assert_eq!(zstd_lanes(lane(1) - 4096, 1, 1, true), None);
        let f = std::fs::File::open("/dev/null").unwrap();
        let job = GpuJob {
            user: GpuId(7),
            actual: GpuId(7),
            bos: vec![bo_ref(Some(f.as_fd()), None, bo::ALLOC_VRAM)],
            engines: Engines::new(EnginePolicy::Auto, 1 << 20, None),
        };
        let e = dump_contents_encoded(
            &crate::image::tests::tempdir(),
            FileId(1),
            vec![job],
            Some((3, None)),
            &BTreeMap::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("KFD_MAX_BUFFER_SIZE"), "{e}");
    }
}
