//! How busy a GPU is, as amdgpu's activity readings show it: from the
//! busy time the device model counts for its engines ([`Totals`], since
//! the emulator started), the load over a window between two such counts
//! ([`window`]), which `gpu_metrics`, `gpu_busy_percent`,
//! `mem_busy_percent` and the current DPM clock levels show.
//!
//! * GFX: an XCC is busy while a dispatch has waves resident on it
//!   (running, asleep or at a barrier; not while its queue is evicted);
//!   the GPU's GFX activity is the mean of its XCCs'.
//! * Memory (UMC): busy while the shader engine's waves access memory and
//!   while the SDMA engines move bytes; the two are added and capped at
//!   100 %.
//!
//! The accumulated activities of the table (`gfx_activity_acc`,
//! `mem_activity_acc`) count percent per millisecond sample, as the SMU
//! adds its activity reading up: a fully busy millisecond adds 100.

/// An engine's busy time so far, and whether it is busy now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Busy {
    pub ns: u64,
    pub now: bool,
}

/// One GPU's engines as the device model counts them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// When counted, ns on the counter's clock.
    pub at_ns: u64,
    /// Each XCC's shader work.
    pub xcc: Vec<Busy>,
    /// The waves' memory accesses.
    pub mem: Busy,
    /// The SDMA engines' work, ns (a queue's packets run at once, so they
    /// are never busy between two counts).
    pub sdma_ns: u64,
}

/// One GPU's load over a window, percent (0 to 100).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Which XCCs have waves resident now.
    pub xcc_now: Vec<bool>,
    /// The GPU's GFX activity (the mean of its XCCs').
    pub gfx: u16,
    /// Memory activity.
    pub umc: u16,
    /// Memory in use now (or in the window).
    pub mem_now: bool,
    /// Accumulated GFX and memory activity since the start (see the
    /// module's notes).
    pub gfx_acc: u64,
    pub mem_acc: u64,
}

impl Load {
    /// An idle GPU of `xccs` XCCs that has never been busy.
    pub fn idle(xccs: usize) -> Load {
        Load {
            xcc_now: vec![false; xccs],
            ..Load::default()
        }
    }

    /// Whether any XCC has waves resident now.
    pub fn gfx_now(&self) -> bool {
        self.xcc_now.iter().any(|&b| b)
    }
}

/// ns of busy time that make one percent-millisecond sample.
const NS_PER_ACC: u64 = 10_000;

fn percent(busy_ns: u64, span_ns: u64) -> u16 {
    if span_ns == 0 {
        return 0;
    }
    (busy_ns.saturating_mul(100) / span_ns).min(100) as u16
}

/// The load between `prev` and `now` (counts of the same GPU).
pub fn window(prev: &Totals, now: &Totals) -> Load {
    let span = now.at_ns.saturating_sub(prev.at_ns);
    let delta = |a: &Busy, b: &Busy| b.ns.saturating_sub(a.ns);
    let zero = Busy::default();
    let xcc: Vec<u16> = now
        .xcc
        .iter()
        .enumerate()
        .map(|(i, b)| percent(delta(prev.xcc.get(i).unwrap_or(&zero), b), span))
        .collect();
    let n = xcc.len().max(1) as u64;
    let gfx = (xcc.iter().map(|&p| u64::from(p)).sum::<u64>() / n) as u16;
    let umc = (percent(delta(&prev.mem, &now.mem), span)
        + percent(now.sdma_ns.saturating_sub(prev.sdma_ns), span))
    .min(100);
    let gfx_ns = now.xcc.iter().map(|b| b.ns).sum::<u64>() / n;
    Load {
        xcc_now: now.xcc.iter().map(|b| b.now).collect(),
        gfx,
        umc,
        mem_now: now.mem.now || umc > 0,
        gfx_acc: gfx_ns / NS_PER_ACC,
        mem_acc: (now.mem.ns + now.sdma_ns) / NS_PER_ACC,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(ns: u64, now: bool) -> Busy {
        Busy { ns, now }
    }

    #[test]
    fn a_window_averages_what_was_busy_in_it() {
        let prev = Totals {
            at_ns: 1_000_000_000,
            xcc: vec![busy(0, false), busy(500_000_000, true)],
            mem: busy(0, false),
            sdma_ns: 0,
        };
        let now = Totals {
            at_ns: 2_000_000_000,
            xcc: vec![busy(1_000_000_000, true), busy(750_000_000, false)],
            mem: busy(300_000_000, true),
            sdma_ns: 900_000_000,
        };
        let l = window(&prev, &now);
        assert_eq!(l.xcc_now, [true, false]);
        // The mean of 100 % and 25 %.
        assert_eq!(l.gfx, 62);
        assert!(l.gfx_now());
        assert_eq!(l.umc, 100, "30 % + 90 % capped");
        assert!(l.mem_now);
        // (1 s + 0.75 s) / 2 busy: 875 ms at 100 per ms.
        assert_eq!(l.gfx_acc, 87_500);
        assert_eq!(l.mem_acc, 120_000);
        // An idle window after it: nothing busy, the sums stay.
        let later = Totals {
            at_ns: 3_000_000_000,
            xcc: vec![busy(1_000_000_000, false), busy(750_000_000, false)],
            mem: busy(300_000_000, false),
            sdma_ns: 900_000_000,
        };
        let l = window(&now, &later);
        assert_eq!((l.gfx, l.umc, l.gfx_now(), l.mem_now), (0, 0, false, false));
        assert_eq!(l.gfx_acc, 87_500);
        assert_eq!(window(&later, &later).gfx, 0, "an empty window");
    }
}
