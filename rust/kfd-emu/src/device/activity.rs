//! The engines' busy time, as the SMU and KFD count it for amdgpu's
//! activity readings (`crate::sysfs::load` turns it into percentages):
//! each XCC's, the waves' memory accesses and the SDMA engines' per GPU,
//! and per process and GPU its resident waves and its SDMA busy time.
//!
//! The shader engine reports each round ([`Round`]): the time from the end
//! of its last round (or this one's start, after an idle spell) to this
//! one's end is busy time for every XCC that had waves resident in it, and
//! memory busy time when any wave accessed memory; what is busy after a
//! round counts as busy until the next ([`Activity::totals`]).  The SDMA engine
//! reports the time each queue's packets took to run.  The per-process
//! counts the live files show are those of the last [`Activity::sample`]
//! (the live sysfs's tick), and a process' counts go when it ends
//! ([`Activity::forget`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sysfs::load::{Busy, Totals};

/// What one round of the shader engine had busy, and what stays so.
#[derive(Clone, Debug, Default)]
pub struct Round {
    /// (GPU, XCC) with waves resident in the round.
    pub xccs: Vec<(usize, usize)>,
    /// GPUs whose waves accessed memory in the round (still busy after it
    /// when waves stay resident there).
    pub mem: Vec<usize>,
    /// (GPU, XCC) with waves resident after it.
    pub after: Vec<(usize, usize)>,
    /// (process, GPU, waves resident after the round).
    pub waves: Vec<(u32, usize, u32)>,
}

#[derive(Clone, Debug, Default)]
struct Meters {
    xcc: Vec<Busy>,
    mem: Busy,
    sdma_ns: u64,
}

#[derive(Debug, Default)]
struct Inner {
    gpus: Vec<Meters>,
    /// The end of the shader engine's last round that had waves.
    shader_last: Option<Instant>,
    /// Per (process, GPU): resident waves, SDMA busy ns.
    waves: HashMap<(u32, usize), u32>,
    sdma: HashMap<(u32, usize), u64>,
    /// Both as of the last [`Activity::sample`].
    sampled: HashMap<(u32, usize), (u32, u64)>,
}

/// The counts, shared by the engines and the live sysfs.
#[derive(Debug)]
pub struct Activity {
    start: Instant,
    inner: Mutex<Inner>,
}

fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

impl Activity {
    /// Counts for GPUs of `xccs[g]` XCCs each.
    pub fn new(xccs: &[usize]) -> Activity {
        let gpus = xccs
            .iter()
            .map(|&n| Meters {
                xcc: vec![Busy::default(); n.max(1)],
                ..Meters::default()
            })
            .collect();
        Activity {
            start: Instant::now(),
            inner: Mutex::new(Inner {
                gpus,
                ..Inner::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A round of the shader engine from `start` to `end`.
    pub fn shader_round(&self, start: Instant, end: Instant, r: &Round) {
        let mut i = self.lock();
        let span = ns(end.saturating_duration_since(i.shader_last.unwrap_or(start)));
        for m in &mut i.gpus {
            m.mem.now = false;
            m.xcc.iter_mut().for_each(|b| b.now = false);
        }
        for &(g, x) in &r.xccs {
            if let Some(b) = i.gpus.get_mut(g).and_then(|m| m.xcc.get_mut(x)) {
                b.ns += span;
            }
        }
        for &g in &r.mem {
            if let Some(m) = i.gpus.get_mut(g) {
                m.mem.ns += span;
                // Still accessing it while waves stay.
                m.mem.now = r.after.iter().any(|a| a.0 == g);
            }
        }
        for &(g, x) in &r.after {
            if let Some(b) = i.gpus.get_mut(g).and_then(|m| m.xcc.get_mut(x)) {
                b.now = true;
            }
        }
        i.waves = r.waves.iter().map(|&(p, g, w)| ((p, g), w)).collect();
        i.shader_last = (!r.after.is_empty()).then_some(end);
    }

    /// The SDMA engine ran packets of process `lead`'s queue on GPU `gpu`
    /// for `took`.
    pub fn sdma_ran(&self, lead: u32, gpu: usize, took: Duration) {
        let mut i = self.lock();
        if let Some(m) = i.gpus.get_mut(gpu) {
            m.sdma_ns += ns(took);
        }
        *i.sdma.entry((lead, gpu)).or_default() += ns(took);
    }

    /// Each GPU's counts now: what is busy now counts as busy since the
    /// shader engine's last round (a long round shows as it goes).
    pub fn totals(&self) -> Vec<Totals> {
        self.totals_at(Instant::now())
    }

    fn totals_at(&self, now: Instant) -> Vec<Totals> {
        let i = self.lock();
        let open = i
            .shader_last
            .map_or(0, |t| ns(now.saturating_duration_since(t)));
        let so_far = |b: &Busy| Busy {
            ns: b.ns + if b.now { open } else { 0 },
            now: b.now,
        };
        i.gpus
            .iter()
            .map(|m| Totals {
                at_ns: ns(now.saturating_duration_since(self.start)),
                xcc: m.xcc.iter().map(so_far).collect(),
                mem: so_far(&m.mem),
                sdma_ns: m.sdma_ns,
            })
            .collect()
    }

    /// Takes the per-process counts [`Activity::process`] shows.
    pub fn sample(&self) {
        let i = &mut *self.lock();
        let (waves, sdma) = (&i.waves, &i.sdma);
        i.sampled = waves
            .keys()
            .chain(sdma.keys())
            .map(|k| {
                let w = waves.get(k).copied().unwrap_or(0);
                (*k, (w, sdma.get(k).copied().unwrap_or(0)))
            })
            .collect();
    }

    /// Process `lead`'s resident waves on GPU `gpu` and its SDMA busy
    /// time there, µs, as of the last [`Activity::sample`].
    pub fn process(&self, lead: u32, gpu: usize) -> (u32, u64) {
        let i = self.lock();
        let (waves, sdma) = i.sampled.get(&(lead, gpu)).copied().unwrap_or((0, 0));
        (waves, sdma / 1000)
    }

    /// Forgets process `lead` (ended: a new process with its pid starts
    /// from nothing).
    pub fn forget(&self, lead: u32) {
        let mut i = self.lock();
        i.sdma.retain(|k, _| k.0 != lead);
        i.waves.retain(|k, _| k.0 != lead);
        i.sampled.retain(|k, _| k.0 != lead);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_count_busy_time_until_the_engine_idles() {
        let a = Activity::new(&[2, 1]);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let r = Round {
            xccs: vec![(0, 1)],
            mem: vec![0],
            after: vec![(0, 1)],
            waves: vec![(7, 0, 40)],
        };
        a.shader_round(ms(0), ms(10), &r);
        // The next round counts from the last one's end.
        a.shader_round(ms(15), ms(20), &r);
        let t = a.totals_at(ms(20));
        assert_eq!(
            t[0].xcc[1],
            Busy {
                ns: 20_000_000,
                now: true
            }
        );
        assert_eq!(t[0].xcc[0], Busy::default());
        assert_eq!(t[0].mem.ns, 20_000_000);
        // Read 4 ms into the next round: busy so far.
        assert_eq!(a.totals_at(ms(24))[0].xcc[1].ns, 24_000_000);
        assert_eq!(a.totals_at(ms(24))[0].xcc[0].ns, 0);
        // A process' counts show once sampled.
        assert_eq!(a.process(7, 0), (0, 0));
        a.sample();
        assert_eq!(a.process(7, 0), (40, 0));
        // The last waves finish: busy in the round, idle after.
        let end = Round {
            xccs: vec![(0, 1)],
            mem: vec![0],
            ..Round::default()
        };
        a.shader_round(ms(20), ms(25), &end);
        assert_eq!(
            a.totals_at(ms(30))[0].mem,
            Busy {
                ns: 25_000_000,
                now: false
            }
        );
        assert_eq!(
            a.totals_at(ms(30))[0].xcc[1],
            Busy {
                ns: 25_000_000,
                now: false
            }
        );
        assert_eq!(a.process(7, 0), (40, 0), "until the next sample");
        a.sample();
        assert_eq!(a.process(7, 0), (0, 0));
        // After an idle spell a round counts from its own start.
        a.shader_round(ms(100), ms(101), &r);
        assert_eq!(a.totals_at(ms(30))[0].xcc[1].ns, 26_000_000);
        a.sdma_ran(7, 1, Duration::from_micros(1500));
        assert_eq!(a.totals_at(ms(101))[1].sdma_ns, 1_500_000);
        a.sample();
        assert_eq!(a.process(7, 1), (0, 1500));
        a.sdma_ran(8, 1, Duration::from_micros(500));
        a.forget(7);
        assert_eq!(a.process(7, 1), (0, 0));
        a.sample();
        assert_eq!(a.process(7, 1), (0, 0), "forgotten, not sampled again");
        assert_eq!(a.process(8, 1), (0, 500));
    }
}
