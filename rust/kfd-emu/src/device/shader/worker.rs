//! The worker thread: runs the waves of every live dispatch in rounds,
//! one slice of each per round, so that dispatches of all queues, GPUs
//! and processes progress together.  Between rounds it asks its [`Host`]
//! (under the state lock, once for all dispatches) whether each process is
//! still there and running, and takes a fresh view of its GPU VM.  With no
//! dispatch it sleeps on a condition variable: an idle emulator does not
//! poll.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use gfx9::exec::CodeCache;

use super::cwsr::{self, SaveJob, Saved};
use super::sched::{Progress, Run};
use super::{JobKey, Launch, Outcome};
use crate::device::activity::Round;
use crate::device::vm::GpuRange;

/// log2 of the decoded-instruction cache entries per process and GPU.
const CACHE_BITS: u32 = 12;
/// How long a round in which no wave could run (all asleep, at barriers
/// or paused) waits before the next.
const IDLE_ROUND: Duration = Duration::from_millis(1);

/// A dispatch's process as the state lock shows it.
pub enum Refresh {
    /// The process or the queue is gone: drop the dispatch.
    Gone,
    /// The process' queues are evicted (a checkpoint, a restore): wait.
    Paused,
    /// Running; its GPU VM now.
    Live(GpuRange),
}

/// What the worker needs of the device model.
pub trait Host {
    /// The state of each dispatch's process, in order.
    fn refresh(&self, keys: &[JobKey]) -> Vec<Refresh>;
    /// Waves of a dispatch raised the SQ's message interrupt with these
    /// data words (M0).
    fn interrupt(&self, key: &JobKey, data: &[u32]);
    /// A dispatch ended.
    fn finish(&self, key: &JobKey, outcome: &Outcome);
    /// A round from `start` to `end` kept `r` busy.
    fn busy(&self, start: Instant, end: Instant, r: &Round);
}

#[derive(Default)]
struct Inbox {
    launches: Vec<Launch>,
    /// (process, GPU index) whose instruction caches are invalid.
    invalidate: Vec<(u32, usize)>,
    /// Queues to save, and where their outcomes go.
    saves: Vec<(Vec<SaveJob>, Sender<Vec<Saved>>)>,
    stop: bool,
}

impl Inbox {
    fn is_empty(&self) -> bool {
        self.launches.is_empty() && self.invalidate.is_empty() && self.saves.is_empty()
    }
}

/// The shader engine's queue of work; [`Engine::run`] is its thread.
#[derive(Default)]
pub struct Engine {
    inbox: Mutex<Inbox>,
    cv: Condvar,
}

type Caches = HashMap<(u32, usize), CodeCache>;

impl Engine {
    fn inbox(&self) -> std::sync::MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands dispatches and cache invalidations to the worker.
    pub fn submit(&self, launches: Vec<Launch>, invalidate: Vec<(u32, usize)>) {
        if launches.is_empty() && invalidate.is_empty() {
            return;
        }
        let mut i = self.inbox();
        i.launches.extend(launches);
        i.invalidate.extend(invalidate);
        self.cv.notify_all();
    }

    /// Saves the dispatches of the queues `jobs` name between two rounds
    /// (see `cwsr`); waits for the outcome of each, in order.  The caller
    /// must not hold the state lock (a round takes it).  Queues whose
    /// waves are saved leave the engine.
    pub fn save(&self, jobs: Vec<SaveJob>) -> Vec<Saved> {
        let n = jobs.len();
        let (tx, rx) = channel();
        {
            let mut i = self.inbox();
            if i.stop {
                return vec![Saved::Failed("the shader engine is stopping".into()); n];
            }
            i.saves.push((jobs, tx));
        }
        self.cv.notify_all();
        rx.recv()
            .unwrap_or_else(|_| vec![Saved::Failed("the shader engine stopped".into()); n])
    }

    /// Makes [`Engine::run`] return.
    pub fn stop(&self) {
        self.inbox().stop = true;
        self.cv.notify_all();
    }

    /// New work; blocks while there is none and `idle`; waits at most
    /// `pause` otherwise.  None when stopping.
    fn take(&self, idle: bool, pause: Option<Duration>) -> Option<Inbox> {
        let mut i = self.inbox();
        let empty = |i: &Inbox| i.is_empty() && !i.stop;
        if idle {
            i = self
                .cv
                .wait_while(i, |i| empty(i))
                .unwrap_or_else(|e| e.into_inner());
        } else if let Some(d) = pause.filter(|_| empty(&i)) {
            i = self
                .cv
                .wait_timeout(i, d)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if i.stop {
            return None;
        }
        Some(std::mem::take(&mut *i))
    }

    /// The worker's loop, until [`Engine::stop`].
    pub fn run(&self, host: &dyn Host) {
        let mut runs: Vec<Run> = Vec::new();
        let mut caches = Caches::new();
        let mut pause = None;
        while let Some(new) = self.take(runs.is_empty(), pause) {
            for key in new.invalidate {
                caches.remove(&key);
            }
            for l in new.launches {
                let key = l.key;
                match cwsr::restore(l) {
                    Ok(run) => runs.push(run),
                    Err(outcome) => host.finish(&key, &outcome),
                }
            }
            for (jobs, tx) in new.saves {
                let _ = tx.send(save(&mut runs, &jobs));
            }
            let start = Instant::now();
            let mut busy = Round::default();
            let ran = round(host, &mut runs, &mut caches, &mut busy);
            host.busy(start, Instant::now(), &busy);
            pause = (ran == 0).then_some(IDLE_ROUND);
        }
    }
}

/// Saves the dispatch of each queue of `jobs`; a saved one leaves `runs`.
fn save(runs: &mut Vec<Run>, jobs: &[SaveJob]) -> Vec<Saved> {
    jobs.iter()
        .map(|job| {
            let at = runs
                .iter()
                .position(|r| r.launch.key.lead == job.lead && r.launch.key.queue == job.queue);
            let Some(k) = at else {
                return Saved::Idle;
            };
            match cwsr::save(&runs[k], job) {
                Ok(stacks) => {
                    let run = runs.remove(k);
                    log_save(&run, &stacks);
                    Saved::Stack(stacks)
                }
                Err(why) => Saved::Failed(why),
            }
        })
        .collect()
}

/// Logs a saved dispatch: its waves and, on a GPU of several XCCs, the
/// waves each XCC saved.
fn log_save(run: &Run, stacks: &[Vec<u8>]) {
    let k = &run.launch.key;
    let bytes: usize = stacks.iter().map(Vec::len).sum();
    let xccs = if stacks.len() > 1 {
        let per = cwsr::waves_per_xcc(run, stacks.len());
        let used = per.iter().filter(|&&w| w > 0).count();
        let list: Vec<String> = per
            .iter()
            .enumerate()
            .map(|(x, w)| format!("XCC {x}: {w}"))
            .collect();
        format!(
            " ({used} of {} XCCs saved waves: {})",
            stacks.len(),
            list.join(", ")
        )
    } else {
        String::new()
    };
    log::info!(
        "kfd-emu: process {} queue {} packet {}: {} resident waves saved into the context save \
         area{xccs}, control stacks of {bytes} bytes",
        k.lead,
        k.queue,
        k.index,
        run.resident()
    );
}

/// The XCCs with waves of `run` resident (each once).
fn resident_xccs(run: &Run) -> Vec<usize> {
    let mut v: Vec<usize> = run.groups.iter().map(|g| run.xcc_of(g.linear)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// What `run`, live in a round, kept busy: its XCCs (`before`: resident
/// when the round began), its GPU's memory when its waves accessed it
/// (`accesses`: the count before the slice), and what stays resident
/// (`after`).
fn note_busy(run: &Run, before: &[usize], after: &[usize], accesses: u64, r: &mut Round) {
    let gpu = run.launch.key.gpu;
    r.xccs.extend(before.iter().map(|&x| (gpu, x)));
    if run.mem.accesses != accesses {
        r.mem.push(gpu);
    }
    r.after.extend(after.iter().map(|&x| (gpu, x)));
    let (lead, waves) = (run.launch.key.lead, run.resident() as u32);
    match r.waves.iter_mut().find(|w| w.0 == lead && w.1 == gpu) {
        Some(w) => w.2 += waves,
        None if waves > 0 => r.waves.push((lead, gpu, waves)),
        None => {}
    }
}

/// One slice of every dispatch; returns the instructions retired, and
/// notes in `busy` what the round kept busy.
fn round(host: &dyn Host, runs: &mut Vec<Run>, caches: &mut Caches, busy: &mut Round) -> u64 {
    let keys: Vec<JobKey> = runs.iter().map(|r| r.launch.key).collect();
    let states = host.refresh(&keys);
    let mut ran = 0;
    let mut k = 0;
    for state in states {
        let run = &mut runs[k];
        let progress = match state {
            Refresh::Gone => {
                runs.remove(k);
                continue;
            }
            Refresh::Paused => Progress::Running(0),
            Refresh::Live(vm) => {
                run.mem.refresh(vm);
                let key = (run.launch.key.lead, run.launch.key.gpu);
                let cache = caches
                    .entry(key)
                    .or_insert_with(|| CodeCache::new(CACHE_BITS));
                // Only a slice changes what is resident: the XCCs after
                // the last one are those before this one.
                let before = run.xccs_after.take().unwrap_or_else(|| resident_xccs(run));
                let accesses = run.mem.accesses;
                let t = thread_cpu();
                let p = run.slice(cache);
                run.cpu += thread_cpu().saturating_sub(t);
                let after = resident_xccs(run);
                note_busy(run, &before, &after, accesses, busy);
                run.xccs_after = Some(after);
                if !run.interrupts.is_empty() {
                    host.interrupt(&run.launch.key, &std::mem::take(&mut run.interrupts));
                }
                p
            }
        };
        match progress {
            Progress::Running(n) => {
                ran += n;
                k += 1;
            }
            Progress::Finished(outcome) => {
                let run = runs.remove(k);
                report(&run, &outcome);
                host.finish(&run.launch.key, &outcome);
            }
        }
    }
    caches.retain(|&(lead, gpu), _| {
        runs.iter()
            .any(|r| r.launch.key.lead == lead && r.launch.key.gpu == gpu)
    });
    ran
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The log line of a finished dispatch: counts, wall time and the rate
/// per CPU second of the worker, at debug level.
fn report(run: &Run, outcome: &Outcome) {
    let k = &run.launch.key;
    let secs = run.started.elapsed().as_secs_f64();
    let cpu = run.cpu.as_secs_f64();
    let rate = run.instructions as f64 / cpu.max(1e-9) / 1e6;
    log::debug!(
        "kfd-emu: process {} queue {} packet {}: kernel object {:#x}, grid {:?} in groups of \
         {:?}: {outcome}; {} wave instructions, {} lane operations in {secs:.3} s, \
         {cpu:.3} s of CPU ({rate:.1} M/s)",
        k.lead,
        k.queue,
        k.index,
        k.object,
        run.launch.grid.size,
        run.launch.grid.group,
        run.instructions,
        run.lanes
    );
}
