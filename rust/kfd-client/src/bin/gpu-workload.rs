//! gpu-workload: keeps GPU memory and an SDMA job alive so that checkpoint/restore can be
//! judged from inside the process.
//!
//! On every selected GPU it fills VRAM and GTT BOs with a pattern computed from (process
//! index, GPU index, BO index, offset), so verification needs no stored copy, and runs a
//! counter on an SDMA queue: each step writes the next value with WRITE_LINEAR, then FENCE,
//! and checks that the previous step landed before issuing the next. Each step also shifts
//! a history of step numbers by one (two COPY_LINEARs through a scratch area) and puts its
//! own number in front, so a step that ran twice or never (a replayed or lost packet) shows
//! even though the values it writes are absolute.
//! All verification state lives in this process's memory, so it survives a dump/restore
//! with the process.
//!
//! Options add what a checkpoint must also carry: more and larger BOs, threads with SDMA
//! counters of their own, child processes with KFD processes of their own, a signal event,
//! and a check that new allocations and queues still work.
//!
//! Prints `{"ready":...}` once set up (with `--procs`, once every child is ready too);
//! SIGUSR2 rewrites a tenth of the big BO's 2 MiB blocks (`--big-bo-mib`; another tenth each
//! time; `--change-every N`: one block in N) with the pattern of a new generation, as a
//! training step changes part of VRAM, and prints `{"changed":...}`;
//! SIGUSR1 prints a verification line and continues; SIGTERM verifies, prints and exits 0
//! (all good) or 1. Each process prints its own lines; the first one passes both signals on
//! to its children and, on SIGTERM, counts their exit status in its own verdict.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kfd_abi::ids::GpuId;
use kfd_client::events::{Event, Events, WaitResult};
use kfd_client::queue::SdmaQueue;
use kfd_client::sdma;
use kfd_client::{Bo, KfdClient, MemKind};

static VERIFY: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);
static CHANGE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only atomics here: async-signal-safe.
    if sig == libc::SIGTERM {
        STOP.store(true, Ordering::SeqCst);
    } else if sig == libc::SIGUSR2 {
        CHANGE.store(true, Ordering::SeqCst);
    } else {
        VERIFY.store(true, Ordering::SeqCst);
    }
}

const USAGE: &str = "usage: gpu-workload [OPTIONS]
  --mib N              MiB of BOs per GPU (default 8)
  --bos N              BOs per GPU, alternately VRAM and GTT (default 4)
  --gpus I,J           GPU indices in topology order, counting only the GPUs whose
                       render node this process can open (default: all of those)
  --interval-ms N      pause between SDMA counter steps (default 2)
  --small-bos N        N more 4 KiB BOs per GPU, alternately GTT and VRAM (default 0)
  --big-bo-mib N       one more VRAM BO of N MiB per GPU (default 0: none)
  --big-bo-fill F      what the big BO holds (SIGUSR2 rewrites a tenth of it, another
                       tenth each time): pattern (default), sparse (zeros but for
                       one pattern dword per MiB, as fresh GPU memory partly used),
                       zero (for sparse pages files) or fp16 (weight-like fp16 values of
                       magnitude 2^-4..2^-1, for compression)
  --change-every N     SIGUSR2 rewrites one 2 MiB block of the big BO in N, another one
                       each time (default 10: a tenth; 20: 5 %)
  --threads N          N more threads, each stepping an SDMA counter of its own (its own
                       queue, counter and 64 KiB BO, on the GPUs in turn) (default 0)
  --procs N            N processes: this one and N-1 children forked before /dev/kfd is
                       opened, each a KFD process of its own with its own BOs (default 1)
  --events             a signal event per process, checked at each verification: fired
                       by SDMA (FENCE + TRAP) and by SET_EVENT, the latter left pending
                       until the next verification
  --fresh              each verification also allocates new BOs and a new SDMA queue on
                       every GPU, copies between the BOs with SDMA, checks and frees them
  --dump-expected DIR  writes the bytes each data BO must hold to
                       DIR/<pid>-<gpu_id, %04x>-<address, %x>.bin
  --host-mib N         N MiB of host memory per process (private, anonymous), filled
                       with a pattern and checked at each verification, as the host
                       tensors of a training job (default 0)
  --vmas N             N more mappings per process, each a VMA of its own: one page of
                       private anonymous memory each, read-write and read-only in turn
                       (so that no two merge), one in 8 holding a pattern; each
                       verification checks every page and that /proc/self/maps still
                       shows the N one-page VMAs with their protections (default 0)
  --other-render-opens each process opens every render node once more before /dev/kfd
                       and keeps it open, as a process also using Mesa or VA-API: that
                       file comes first in fd order and owns none of the KFD BOs (the
                       kernel refuses their mapping through it with EACCES)
  --gem-bo             with --other-render-opens: a 1 MiB GTT GEM BO is made on the first
                       of those files (GEM_CREATE) and kept, as a Mesa or VA-API client's
                       buffer, filled with a pattern (criu-rocm saves it with that render
                       file)";

struct Options {
    mib: u64,
    bos: usize,
    gpus: Option<Vec<usize>>,
    interval: Duration,
    small_bos: usize,
    big_bo_mib: u64,
    big_bo_fill: usize,
    change_every: u32,
    threads: usize,
    procs: usize,
    events: bool,
    fresh: bool,
    dump_expected: Option<PathBuf>,
    host_mib: u64,
    vmas: usize,
    other_render_opens: bool,
    gem_bo: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mib: 8,
            bos: 4,
            gpus: None,
            interval: Duration::from_millis(2),
            small_bos: 0,
            big_bo_mib: 0,
            big_bo_fill: 0,
            change_every: 10,
            threads: 0,
            procs: 1,
            events: false,
            fresh: false,
            dump_expected: None,
            host_mib: 0,
            vmas: 0,
            other_render_opens: false,
            gem_bo: false,
        }
    }
}

/// The value of option `name`, the next argument.
fn value(args: &mut impl Iterator<Item = String>, name: &str) -> Result<String, String> {
    args.next().ok_or(format!("{name} needs a value"))
}

/// The value of option `name` as a number.
fn num<T: std::str::FromStr>(
    args: &mut impl Iterator<Item = String>,
    name: &str,
) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    value(args, name)?
        .parse()
        .map_err(|e| format!("{name}: {e}"))
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let args = &mut args;
        match a.as_str() {
            "--mib" => o.mib = num(args, "--mib")?,
            "--bos" => o.bos = num(args, "--bos")?,
            "--small-bos" => o.small_bos = num(args, "--small-bos")?,
            "--big-bo-mib" => o.big_bo_mib = num(args, "--big-bo-mib")?,
            "--big-bo-fill" => o.big_bo_fill = big_bo_fill(&value(args, "--big-bo-fill")?)?,
            "--change-every" => o.change_every = num(args, "--change-every")?,
            "--threads" => o.threads = num(args, "--threads")?,
            "--host-mib" => o.host_mib = num(args, "--host-mib")?,
            "--vmas" => o.vmas = num(args, "--vmas")?,
            "--procs" => o.procs = num(args, "--procs")?,
            "--interval-ms" => o.interval = Duration::from_millis(num(args, "--interval-ms")?),
            "--gpus" => o.gpus = Some(gpu_list(&value(args, "--gpus")?)?),
            "--events" => o.events = true,
            "--fresh" => o.fresh = true,
            "--other-render-opens" => o.other_render_opens = true,
            "--gem-bo" => o.gem_bo = true,
            "--dump-expected" => o.dump_expected = Some(value(args, "--dump-expected")?.into()),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    o.check()?;
    Ok(o)
}

/// `--big-bo-fill F`: the big BO's index bits for its fill.
fn big_bo_fill(f: &str) -> Result<usize, String> {
    match f {
        "pattern" => Ok(0),
        "sparse" => Ok(SPARSE_BO),
        "zero" => Ok(ZERO_BO),
        "fp16" => Ok(WEIGHTS_BO),
        f => Err(format!(
            "--big-bo-fill {f:?}: pattern, sparse, zero or fp16"
        )),
    }
}

/// `--gpus I,J,...`: topology GPU indices.
fn gpu_list(list: &str) -> Result<Vec<usize>, String> {
    list.split(',')
        .map(|s| {
            s.trim()
                .parse::<usize>()
                .map_err(|e| format!("--gpus {s:?}: {e}"))
        })
        .collect()
}

impl Options {
    fn check(&self) -> Result<(), String> {
        if self.mib == 0 || self.bos == 0 {
            return Err("--mib and --bos must be at least 1".to_owned());
        }
        if self.procs == 0 {
            return Err("--procs must be at least 1".to_owned());
        }
        if self.change_every == 0 {
            return Err("--change-every must be at least 1".to_owned());
        }
        if self.bos + self.small_bos + 1 >= THREAD_BO_BASE {
            return Err(format!(
                "--bos plus --small-bos must stay below {}",
                THREAD_BO_BASE - 1
            ));
        }
        Ok(())
    }
}

/// Pattern BO indices: data BOs count from 0 (then the small BOs, then the big one); a
/// thread's BO is `THREAD_BO_BASE + thread`; a verification's fresh BO is `FRESH_BO`.
const THREAD_BO_BASE: usize = 1 << 15;
const FRESH_BO: usize = (1 << 16) - 1;
/// Set in a data BO index (below `THREAD_BO_BASE`) whose pattern is sparse:
/// zero but for the dword at the start of each MiB.
const SPARSE_BO: usize = 1 << 14;
/// Set in a data BO index (below `THREAD_BO_BASE`) whose pattern is zero.
const ZERO_BO: usize = 1 << 13;
/// Set in a data BO index (below `THREAD_BO_BASE`) whose pattern is weight-like: fp16
/// values of magnitude 2^-4..2^-1 with a random sign and mantissa, as a model's weights.
const WEIGHTS_BO: usize = 1 << 12;
/// Set in the big BO's index (`--big-bo-mib`): SIGUSR2 changes one block in
/// `--change-every` of it.
const BIG_BO: usize = 1 << 11;
/// Dwords per block a change rewrites whole (2 MiB: the extent criu-rocm's incremental
/// dump compares).
const CHANGE_DWORDS: u64 = 1 << 19;
/// The pattern "GPU" and "BO" of host memory (no GPU has this index).
const HOST_GPU: usize = 0xffff;
/// The pattern "GPU" of the `--vmas` pages (no GPU has this index either).
const VMAS_GPU: usize = 0xfffe;
/// One `--vmas` page in this many holds a pattern.
const VMAS_FILLED_EVERY: usize = 8;
const SMALL_BO_BYTES: u64 = 4096;
const THREAD_BO_BYTES: u64 = 64 << 10;
const FRESH_BO_BYTES: u64 = 1 << 20;
/// How long a verification waits for the SDMA queues, and for an event to fire.
const QUEUE_WAIT: Duration = Duration::from_secs(10);

/// The dword expected at dword index `i` of BO `bo` of GPU `gpu` in process `proc`: distinct
/// per process, GPU and BO, never constant along a BO, never zero-filled-looking.
fn pattern(proc: usize, gpu: usize, bo: usize, i: u64) -> u32 {
    let seed = ((proc as u64) << 56) ^ ((gpu as u64) << 40) ^ ((bo as u64) << 24) ^ i;
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xa5a5_5a5a_c3c3_3c3c;
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (x ^ (x >> 32)) as u32
}

/// Which pattern a BO holds.
#[derive(Clone, Copy, Debug)]
struct Seed {
    proc: usize,
    gpu: usize,
    bo: usize,
    /// SIGUSR2s so far: the big BO's changed MiBs hold this generation's pattern.
    gen: u32,
    /// `--change-every`: a change rewrites one 2 MiB block of the big BO in this many.
    every: u32,
}

impl Seed {
    /// The generation dword `i` holds: change `g` rewrites the 2 MiB blocks `m` of the big
    /// BO with `m % N == (g - 1) % N` (N = `every`), so each change touches one block in N,
    /// other blocks than the change before.
    fn gen_at(self, i: u64) -> u32 {
        if self.bo & BIG_BO == 0 {
            return 0;
        }
        let n = self.every.max(1);
        let r = ((i / CHANGE_DWORDS) % u64::from(n)) as u32 + 1;
        if self.gen < r {
            0
        } else {
            r + n * ((self.gen - r) / n)
        }
    }

    fn at(self, i: u64) -> u32 {
        let g = self.gen_at(i);
        if g > 0 {
            let base = pattern(self.proc, self.gpu, self.bo, i);
            return (base ^ g.wrapping_mul(0x9e37_79b9)) | 1;
        }
        if self.bo < THREAD_BO_BASE
            && (self.bo & ZERO_BO != 0 || (self.bo & SPARSE_BO != 0 && !i.is_multiple_of(1 << 18)))
        {
            return 0;
        }
        let p = pattern(self.proc, self.gpu, self.bo, i);
        if self.bo < THREAD_BO_BASE && self.bo & WEIGHTS_BO != 0 {
            return weight(p as u16) | weight((p >> 16) as u16) << 16;
        }
        p
    }
}

/// An fp16 weight from 16 random bits: sign, exponent 11..=14, 10-bit mantissa.
fn weight(r: u16) -> u32 {
    let (sign, exp, man) = (r >> 15, 11 + ((r >> 10) & 3), r & 0x3ff);
    u32::from(sign << 15 | exp << 10 | man)
}

/// Bytes of a BO filled or checked at a time, through a buffer of ours (the GPU may write
/// the BO: it is copied, never borrowed).
const CHUNK: usize = 1 << 20;

fn fill(bo: &mut Bo<'_>, s: Seed) {
    let v = bo.volatile();
    let mut buf = vec![0u8; CHUNK.min(v.len())];
    for off in (0..v.len()).step_by(CHUNK) {
        let n = CHUNK.min(v.len() - off);
        for (j, d) in buf[..n].chunks_exact_mut(4).enumerate() {
            d.copy_from_slice(&s.at((off / 4 + j) as u64).to_le_bytes());
        }
        v.subslice(off, n).expect("in bounds").copy_from(&buf[..n]);
    }
}

/// The first mismatching dword of a BO, if any.
fn check(bo: &Bo<'_>, s: Seed) -> Option<(u64, u32, u32)> {
    let v = bo.volatile();
    let mut buf = vec![0u8; CHUNK.min(v.len())];
    (0..v.len()).step_by(CHUNK).find_map(|off| {
        let n = v
            .subslice(off, CHUNK.min(v.len() - off))
            .expect("in bounds")
            .copy_to(&mut buf);
        buf[..n]
            .chunks_exact(4)
            .enumerate()
            .map(|(j, d)| {
                (
                    (off / 4 + j) as u64,
                    u32::from_le_bytes([d[0], d[1], d[2], d[3]]),
                )
            })
            .find(|&(i, v)| v != s.at(i))
            .map(|(i, v)| (i * 4, v, s.at(i)))
    })
}

/// Writes the bytes BO `bo` (at `va` on `gpu`) must hold to `dir`.
fn write_expected(dir: &Path, gpu: GpuId, bo: &Bo<'_>, s: Seed) -> Result<(), String> {
    let path = dir.join(format!(
        "{}-{:04x}-{:x}.bin",
        std::process::id(),
        gpu.0,
        bo.va().0
    ));
    let err = |e: std::io::Error| format!("--dump-expected: {}: {e}", path.display());
    let mut w = BufWriter::new(File::create(&path).map_err(err)?);
    for i in 0..bo.size() / 4 {
        w.write_all(&s.at(i).to_le_bytes()).map_err(err)?;
    }
    w.flush().map_err(err)
}

fn read_u32(bo: &Bo<'_>, off: usize) -> u32 {
    bo.volatile().read_u32(off)
}

/// Offsets in each GPU's counter BO: the counter, its fence, the step history and its
/// scratch area.  Step n copies the history to the scratch area, copies that back one
/// dword further and writes n in front, so after step n the history reads n, n-1, n-2, ...
/// A step run twice repeats a number; one skipped leaves a gap.
const COUNTER_OFF: usize = 0;
const FENCE_OFF: usize = 64;
const HISTORY_OFF: usize = 1024;
const SCRATCH_OFF: usize = 2048;
const HISTORY_LEN: usize = 64;

/// An SDMA counter on one GPU with the data BOs it guards.
struct GpuWork<'c> {
    proc: usize,
    index: usize,
    gpu: GpuId,
    bos: Vec<(usize, Bo<'c>)>,
    counter: Bo<'c>,
    queue: SdmaQueue<'c>,
    /// Last value whose FENCE was seen; the counter must equal it.
    done: u32,
    /// Value submitted and not yet confirmed (0: none in flight).
    inflight: u32,
    errors: Vec<String>,
    /// SIGUSR2s so far.
    gen: u32,
    /// `--change-every`.
    every: u32,
}

impl<'c> GpuWork<'c> {
    fn new(
        client: &'c KfdClient,
        proc: usize,
        index: usize,
        gpu: GpuId,
        bos: Vec<(usize, Bo<'c>)>,
        every: u32,
    ) -> Result<Self, String> {
        let counter = client
            .alloc(gpu, 4096, MemKind::Gtt)
            .map_err(|e| e.to_string())?;
        let queue = SdmaQueue::create(client, gpu, 64 * 1024).map_err(|e| e.to_string())?;
        Ok(GpuWork {
            proc,
            index,
            gpu,
            bos,
            counter,
            queue,
            done: 0,
            inflight: 0,
            errors: Vec::new(),
            gen: 0,
            every,
        })
    }

    fn seed(&self, bo: usize) -> Seed {
        Seed {
            proc: self.proc,
            gpu: self.index,
            bo,
            gen: self.gen,
            every: self.every,
        }
    }

    /// SIGUSR2: the next generation in one block in `every` of the big BO; bytes
    /// rewritten.
    fn change(&mut self) -> u64 {
        self.gen += 1;
        let mut bytes = 0;
        for i in 0..self.bos.len() {
            let idx = self.bos[i].0;
            if idx & BIG_BO == 0 {
                continue;
            }
            let s = self.seed(idx);
            let v = self.bos[i].1.volatile();
            let mut buf = vec![0u8; (2 << 20).min(v.len())];
            for (block, off) in (0..v.len()).step_by(2 << 20).enumerate() {
                let first = block as u64 * CHANGE_DWORDS;
                if s.gen_at(first) != s.gen {
                    continue;
                }
                let n = (2 << 20).min(v.len() - off);
                for (j, d) in buf[..n].chunks_exact_mut(4).enumerate() {
                    d.copy_from_slice(&s.at(first + j as u64).to_le_bytes());
                }
                v.subslice(off, n).expect("in bounds").copy_from(&buf[..n]);
                bytes += n as u64;
            }
        }
        bytes
    }

    /// One counter step: confirm the value in flight, then submit the next.
    fn step(&mut self) -> Result<(), String> {
        if self.inflight != 0 {
            if read_u32(&self.counter, FENCE_OFF) != self.inflight {
                return Ok(()); // still running
            }
            let c = read_u32(&self.counter, COUNTER_OFF);
            if c != self.inflight {
                return Err(format!(
                    "GPU {}: counter {c} != fenced value {}",
                    self.gpu.get(),
                    self.inflight
                ));
            }
            self.check_history(self.inflight)?;
            self.done = self.inflight;
            self.inflight = 0;
        }
        let c = read_u32(&self.counter, COUNTER_OFF);
        if c != self.done {
            return Err(format!(
                "GPU {}: counter went from {} to {c}",
                self.gpu.get(),
                self.done
            ));
        }
        let next = self.done.wrapping_add(1).max(1);
        let base = self.counter.va().0;
        let hist = base + HISTORY_OFF as u64;
        let scratch = base + SCRATCH_OFF as u64;
        let shifted = (HISTORY_LEN as u64 - 1) * 4;
        self.queue
            .submit_with(|v| {
                sdma::copy_linear(v, hist, scratch, shifted)?;
                sdma::copy_linear(v, scratch, hist + 4, shifted)?;
                sdma::write_linear(v, hist, &[next])?;
                sdma::write_linear(v, base + COUNTER_OFF as u64, &[next])?;
                sdma::fence(v, base + FENCE_OFF as u64, next)
            })
            .map_err(|e| e.to_string())?;
        self.inflight = next;
        Ok(())
    }

    /// After step `n` landed, its history must read n, n-1, ... (down to 1).
    fn check_history(&self, n: u32) -> Result<(), String> {
        for i in 0..HISTORY_LEN.min(n as usize) {
            let want = n - i as u32;
            let got = read_u32(&self.counter, HISTORY_OFF + 4 * i);
            if got != want {
                return Err(format!(
                    "GPU {}: after SDMA step {n}, the history holds {got} {i} step(s) back, \
                     expected {want}: a step was lost or ran twice",
                    self.gpu.get()
                ));
            }
        }
        Ok(())
    }

    /// A step whose first error is kept for the next verification.
    fn step_recording(&mut self) {
        if let Err(e) = self.step() {
            // Keep running so a later verification reports it; record only the first.
            if self.errors.is_empty() {
                eprintln!("gpu-workload: {e}");
                self.errors.push(e);
            }
        }
    }

    /// Waits (until `deadline` at most) for the value in flight, then checks every BO.
    fn verify(&mut self, deadline: Instant) -> (u64, Vec<String>) {
        let mut errs = self.errors.clone();
        let left = deadline.saturating_duration_since(Instant::now());
        if let Err(e) = self.queue.wait_idle(left) {
            errs.push(e.to_string());
        } else if self.inflight != 0 && read_u32(&self.counter, FENCE_OFF) != self.inflight {
            // The engine consumed every packet, yet the step's FENCE never landed.
            errs.push(format!(
                "GPU {}: the queue is idle but SDMA step {} never landed: a step was lost",
                self.gpu.get(),
                self.inflight
            ));
        } else if let Err(e) = self.step() {
            if !errs.contains(&e) {
                errs.push(e);
            }
        }
        let mut bytes = 0;
        for (idx, bo) in &self.bos {
            bytes += bo.size();
            if let Some((off, got, want)) = check(bo, self.seed(*idx)) {
                errs.push(format!(
                    "GPU {} BO {idx} at {}: offset {off:#x} holds {got:#010x}, expected {want:#010x}",
                    self.gpu.get(),
                    bo.va()
                ));
            }
        }
        (bytes, errs)
    }
}

/// `--events`: one auto-reset signal event, fired through the first GPU's counter queue.
struct EventCheck<'c> {
    events: Events<'c>,
    event: Event,
    /// SET_EVENT was issued at the end of the last verification and not waited for.
    pending: bool,
    /// Waits that saw the event fire.
    fired: u64,
}

impl EventCheck<'_> {
    fn check(&mut self, queue: &mut SdmaQueue<'_>, errs: &mut Vec<String>) {
        let e = self.event;
        let mut expect =
            |what: &str, timeout: Duration, want: WaitResult, fired: &mut u64| match self
                .events
                .wait(e, timeout)
            {
                Ok(WaitResult::Signaled) if want == WaitResult::Signaled => *fired += 1,
                Ok(r) if r == want => {}
                Ok(r) => errs.push(format!("event {}: {what}: {r:?}, expected {want:?}", e.id)),
                Err(err) => errs.push(format!("event {}: {what}: {err}", e.id)),
            };
        let mut fired = 0;
        // What the last verification left: signaled once, then reset by the wait.
        if self.pending {
            expect(
                "SET_EVENT of the last verification",
                QUEUE_WAIT,
                WaitResult::Signaled,
                &mut fired,
            );
        }
        expect(
            "no signal pending",
            Duration::ZERO,
            WaitResult::TimedOut,
            &mut fired,
        );
        match queue.submit_with(|v| {
            sdma::fence(v, e.slot_va.0, 0)?;
            sdma::trap(v, e.id.0)
        }) {
            Ok(_) => {
                expect(
                    "SDMA FENCE + TRAP",
                    QUEUE_WAIT,
                    WaitResult::Signaled,
                    &mut fired,
                );
            }
            Err(err) => errs.push(format!("event {}: SDMA FENCE + TRAP: {err}", e.id)),
        }
        self.pending = match self.events.set(e) {
            Ok(()) => true,
            Err(err) => {
                errs.push(format!("event {}: SET_EVENT: {err}", e.id));
                false
            }
        };
        self.fired += fired;
    }
}

/// `--fresh`: new BOs and a new queue on `gpu`, an SDMA copy between them, checked.
fn fresh_check(client: &KfdClient, proc: usize, index: usize, gpu: GpuId) -> Result<(), String> {
    let seed = Seed {
        proc,
        gpu: index,
        bo: FRESH_BO,
        gen: 0,
        every: 1,
    };
    let e =
        |what: &str, err: &dyn std::fmt::Display| format!("GPU {}: new {what}: {err}", gpu.get());
    let mut src = client
        .alloc(gpu, FRESH_BO_BYTES, MemKind::Vram)
        .map_err(|x| e("VRAM BO", &x))?;
    let dst = client
        .alloc(gpu, FRESH_BO_BYTES, MemKind::Gtt)
        .map_err(|x| e("GTT BO", &x))?;
    fill(&mut src, seed);
    dst.volatile().fill(0);
    let mut q = SdmaQueue::create(client, gpu, 4096).map_err(|x| e("SDMA queue", &x))?;
    let (s, d) = (src.va().0, dst.va().0);
    q.submit_with(|v| sdma::copy_linear_split(v, s, d, FRESH_BO_BYTES))
        .map_err(|x| e("SDMA copy", &x))?;
    q.wait_idle(QUEUE_WAIT).map_err(|x| e("SDMA copy", &x))?;
    if let Some((off, got, want)) = check(&dst, seed) {
        return Err(format!(
            "GPU {}: SDMA copy between new BOs: offset {off:#x} holds {got:#010x}, expected {want:#010x}",
            gpu.get()
        ));
    }
    q.destroy().map_err(|x| e("SDMA queue destroyed", &x))?;
    src.free().map_err(|x| e("VRAM BO freed", &x))?;
    dst.free().map_err(|x| e("GTT BO freed", &x))
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn lock<'a, T>(m: &'a Mutex<T>) -> MutexGuard<'a, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Everything one process checks.
struct Proc<'c, 'w> {
    client: &'c KfdClient,
    index: usize,
    /// One counter per selected GPU (stepped by the main thread), then one per thread.
    works: &'w [Mutex<GpuWork<'c>>],
    main_works: usize,
    events: Option<EventCheck<'c>>,
    fresh: Option<u64>,
    children: Vec<libc::pid_t>,
    /// `--host-mib` of host memory.
    host: Vec<u32>,
    vmas: Option<Vmas>,
}

/// `--vmas N`: N one-page private anonymous mappings side by side, each a VMA of its own
/// (page `i` read-write for even `i`, read-only for odd: neighbours never merge), between
/// two inaccessible guard pages (nor do the ends merge with what the kernel put beside);
/// the read-write pages at multiples of [`VMAS_FILLED_EVERY`] hold the pattern of their
/// page number, the others are never written (they read as zeros and cost no memory).
struct Vmas {
    base: usize,
    n: usize,
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

impl Vmas {
    fn prot(i: usize) -> libc::c_int {
        if i.is_multiple_of(2) {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        }
    }

    fn new(proc: usize, n: usize) -> Result<Vmas, String> {
        let page = page_size();
        let len = (n + 2) * page;
        // SAFETY: a new private anonymous mapping at an address the kernel picks touches no
        // existing memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!(
                "--vmas {n}: mmap of {len} bytes: {}",
                std::io::Error::last_os_error()
            ));
        }
        let v = Vmas {
            base: base as usize + page,
            n,
        };
        let guards = [base as usize, v.base + n * page];
        for i in (0..n).step_by(VMAS_FILLED_EVERY) {
            let words = v.page_words(i);
            for (k, w) in words.iter_mut().enumerate() {
                *w = pattern(proc, VMAS_GPU, 0, (i * page / 4 + k) as u64);
            }
        }
        let pages = (1..n)
            .step_by(2)
            .map(|i| (v.base + i * page, Self::prot(i)))
            .chain(guards.map(|g| (g, libc::PROT_NONE)));
        for (at, prot) in pages {
            // SAFETY: the page at `at` lies inside the mapping made above, which this process
            // owns and into which no reference is held.
            if unsafe { libc::mprotect(at as *mut libc::c_void, page, prot) } != 0 {
                return Err(format!(
                    "--vmas {n}: mprotect of the page at {at:#x}: {} (vm.max_map_count?)",
                    std::io::Error::last_os_error()
                ));
            }
        }
        Ok(v)
    }

    /// Page `i` (read-write when written to: even `i`).
    #[allow(clippy::mut_from_ref)]
    fn page_words(&self, i: usize) -> &mut [u32] {
        let page = page_size();
        assert!(i < self.n);
        // SAFETY: page i lies inside the mapping this Vmas owns for the life of the process;
        // only the thread that made or verifies it touches it, one page at a time.
        unsafe { std::slice::from_raw_parts_mut((self.base + i * page) as *mut u32, page / 4) }
    }

    /// Errors: pages whose contents differ, and VMAs of the range that /proc/self/maps no
    /// longer shows one page each with their protection.
    fn check(&self, proc: usize) -> Vec<String> {
        let page = page_size();
        let mut errs = Vec::new();
        let bad = (0..self.n)
            .filter(|&i| {
                let filled = i.is_multiple_of(VMAS_FILLED_EVERY);
                self.page_words(i).iter().enumerate().any(|(k, &w)| {
                    let want = if filled {
                        pattern(proc, VMAS_GPU, 0, (i * page / 4 + k) as u64)
                    } else {
                        0
                    };
                    w != want
                })
            })
            .collect::<Vec<_>>();
        if let Some(first) = bad.first() {
            errs.push(format!(
                "--vmas: {} page(s) differ, the first page {first}",
                bad.len()
            ));
        }
        match std::fs::read_to_string("/proc/self/maps") {
            Ok(maps) => errs.extend(self.check_maps(&maps)),
            Err(e) => errs.push(format!("--vmas: reading /proc/self/maps: {e}")),
        }
        errs
    }

    /// The VMAs of `maps` (the text of /proc/self/maps) in the range: one a page, with
    /// page `i`'s protection.
    fn check_maps(&self, maps: &str) -> Option<String> {
        let page = page_size();
        let (lo, hi) = (self.base, self.base + self.n * page);
        let mut next = lo;
        for line in maps.lines() {
            let mut f = line.split_whitespace();
            let parsed = f.next().zip(f.next()).and_then(|(range, perms)| {
                let (s, e) = range.split_once('-')?;
                let s = usize::from_str_radix(s, 16).ok()?;
                Some((s, usize::from_str_radix(e, 16).ok()?, perms))
            });
            let Some((s, e, perms)) = parsed else {
                return Some(format!(
                    "--vmas: /proc/self/maps: cannot read the line {line:?}"
                ));
            };
            if e <= lo || s >= hi {
                continue;
            }
            let i = s.saturating_sub(lo) / page;
            let want = if Self::prot(i) & libc::PROT_WRITE != 0 {
                "rw-p"
            } else {
                "r--p"
            };
            if s != next || e != s + page || perms != want {
                return Some(format!(
                    "--vmas: /proc/self/maps shows {line:?} where page {i} ({next:#x}, {want}) \
                     was expected"
                ));
            }
            next = e;
        }
        (next != hi)
            .then(|| format!("--vmas: /proc/self/maps ends the range at {next:#x}, not {hi:#x}"))
    }
}

/// `mib` MiB of host memory holding process `proc`'s host pattern.
fn host_memory(proc: usize, mib: u64) -> Vec<u32> {
    (0..mib * (1 << 18))
        .map(|i| pattern(proc, HOST_GPU, 0, i))
        .collect()
}

impl Proc<'_, '_> {
    /// Verifies and prints one line; `extra` are errors found by the caller.
    fn report(&mut self, extra: Vec<String>) -> bool {
        let mut bytes = 0;
        let mut errs = Vec::new();
        let mut counters = Vec::new();
        // One time limit for all queues: a verification answers within it even when
        // every queue hangs.
        let deadline = Instant::now() + QUEUE_WAIT;
        for w in self.works {
            let mut w = lock(w);
            let (b, e) = w.verify(deadline);
            bytes += b;
            errs.extend(e);
            counters.push(w.done.to_string());
        }
        if let Some(ev) = self.events.as_mut() {
            let mut w = lock(&self.works[0]);
            ev.check(&mut w.queue, &mut errs);
        }
        if let Some(n) = self.fresh.as_mut() {
            for w in &self.works[..self.main_works] {
                let (index, gpu) = {
                    let w = lock(w);
                    (w.index, w.gpu)
                };
                match fresh_check(self.client, self.index, index, gpu) {
                    Ok(()) => *n += 1,
                    Err(e) => errs.push(e),
                }
            }
        }
        if let Some(v) = &self.vmas {
            errs.extend(v.check(self.index));
        }
        let bad = self
            .host
            .iter()
            .enumerate()
            .filter(|&(i, &v)| v != pattern(self.index, HOST_GPU, 0, i as u64))
            .map(|(i, _)| i)
            .collect::<Vec<_>>();
        if let Some(first) = bad.first() {
            errs.push(format!(
                "host memory: {} dword(s) differ, the first at byte {}",
                bad.len(),
                first * 4
            ));
        }
        errs.extend(extra);
        let ok = errs.is_empty();
        let mut more = String::new();
        if !self.children.is_empty() || self.index > 0 {
            more += &format!(",\"proc\":{}", self.index);
        }
        if let Some(ev) = &self.events {
            more += &format!(",\"events\":{}", ev.fired);
        }
        if let Some(n) = self.fresh {
            more += &format!(",\"fresh\":{n}");
        }
        if !self.host.is_empty() {
            more += &format!(",\"host_bytes\":{}", self.host.len() * 4);
        }
        if let Some(v) = &self.vmas {
            more += &format!(",\"vmas\":{}", v.n);
        }
        let errs: Vec<String> = errs.iter().map(|e| json_str(e)).collect();
        println!(
            "{{\"ok\":{ok},\"pid\":{},\"gpus\":{},\"bytes\":{bytes},\"counters\":[{}]{more},\"errors\":[{}]}}",
            std::process::id(),
            self.main_works,
            counters.join(","),
            errs.join(",")
        );
        ok
    }

    fn signal_children(&self, sig: libc::c_int) {
        for &c in &self.children {
            // SAFETY: kill with a pid and a signal number has no memory preconditions.
            unsafe { libc::kill(c, sig) };
        }
    }

    /// Children that ended although nobody told them to.
    fn reap_early(&mut self) -> Vec<String> {
        let mut errs = Vec::new();
        self.children.retain(|&c| {
            let mut st = 0;
            // SAFETY: waitpid on our own child, status into a local.
            let r = unsafe { libc::waitpid(c, &mut st, libc::WNOHANG) };
            if r == c {
                errs.push(format!("child {c} ended early ({})", describe_status(st)));
                false
            } else {
                true
            }
        });
        errs
    }

    /// SIGTERM: stops the children and collects their verdicts (exit status 0).
    fn stop_children(&mut self) -> Vec<String> {
        self.signal_children(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut errs = Vec::new();
        for &c in &self.children {
            let mut st = 0;
            loop {
                // SAFETY: waitpid on our own child, status into a local.
                let r = unsafe { libc::waitpid(c, &mut st, libc::WNOHANG) };
                if r == c {
                    if !(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0) {
                        errs.push(format!("child {c}: {}", describe_status(st)));
                    }
                    break;
                }
                if r < 0 {
                    errs.push(format!(
                        "child {c}: waitpid: {}",
                        std::io::Error::last_os_error()
                    ));
                    break;
                }
                if Instant::now() > deadline {
                    errs.push(format!("child {c} still runs 60 s after SIGTERM"));
                    // SAFETY: as in signal_children.
                    unsafe { libc::kill(c, libc::SIGKILL) };
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.children.clear();
        errs
    }
}

fn describe_status(st: libc::c_int) -> String {
    if libc::WIFEXITED(st) {
        format!("exit status {}", libc::WEXITSTATUS(st))
    } else if libc::WIFSIGNALED(st) {
        format!("killed by signal {}", libc::WTERMSIG(st))
    } else {
        format!("wait status {st:#x}")
    }
}

fn install_handlers() -> Result<(), String> {
    for sig in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGTERM] {
        // SAFETY: all-zero bytes are a valid sigaction ("no flags", empty mask, SIG_DFL).
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        // SAFETY: `sa` is a valid sigaction whose handler only stores atomics, which is
        // async-signal-safe; the old action is not requested.
        let rc = unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(format!(
                "sigaction({sig}): {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// Forks the children of `--procs` before anything opens /dev/kfd.  Returns this
/// process' index, its children and the pipe end it reports readiness on (children) or
/// reads it from (the first process).
fn fork_children(n: usize) -> Result<(usize, Vec<libc::pid_t>, Option<File>), String> {
    if n <= 1 {
        return Ok((0, Vec::new(), None));
    }
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: pipe2 just created this fd; nothing else owns it.
    let rd = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
    // SAFETY: as above.
    let wr = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) };
    let mut children = Vec::new();
    for k in 1..n {
        // SAFETY: no other thread exists yet, so the child may go on running Rust code.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            let e = std::io::Error::last_os_error();
            for &c in &children {
                // SAFETY: signalling our own child.
                unsafe { libc::kill(c, libc::SIGKILL) };
            }
            return Err(format!("fork: {e}"));
        }
        if pid == 0 {
            drop(rd);
            return Ok((k, Vec::new(), Some(wr)));
        }
        children.push(pid);
    }
    drop(wr);
    Ok((0, children, Some(rd)))
}

fn run(o: &Options) -> Result<bool, String> {
    install_handlers()?;
    let (index, children, ready_pipe) = fork_children(o.procs)?;
    let r = run_proc(o, index, children.clone(), ready_pipe);
    if r.is_err() && !children.is_empty() {
        for &c in &children {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c, libc::SIGKILL) };
        }
    }
    r
}

/// `,"skipped_gpus":[...]`: the topology's GPUs whose render node this process cannot
/// open (a container given some of the host's GPUs), left out as libhsakmt leaves them.
fn skipped_json(client: &KfdClient) -> String {
    let s = client.skipped_gpus();
    if s.is_empty() {
        return String::new();
    }
    format!(
        ",\"skipped_gpus\":[{}]",
        s.iter()
            .map(|g| format!(
                "{{\"gpu_id\":{},\"render_minor\":{},\"errno\":{}}}",
                g.gpu_id.0, g.minor.0, g.errno
            ))
            .collect::<Vec<_>>()
            .join(",")
    )
}

/// Opens every render node of /dev/dri once (read-write), as a graphics or video library
/// of the same process would; none of these files is given to ACQUIRE_VM.
fn other_render_opens() -> Result<Vec<File>, String> {
    let mut nodes: Vec<PathBuf> = std::fs::read_dir("/dev/dri")
        .map_err(|e| format!("/dev/dri: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("renderD"))
        })
        .collect();
    nodes.sort();
    if nodes.is_empty() {
        return Err("--other-render-opens: no render node in /dev/dri".to_owned());
    }
    nodes
        .iter()
        .map(|p| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .map_err(|e| format!("{}: {e}", p.display()))
        })
        .collect()
}

/// One process of the workload: its GPU memory and queues, announced ready, then stepped
/// until SIGTERM (the steps in the order they run).
fn run_proc(
    o: &Options,
    index: usize,
    children: Vec<libc::pid_t>,
    ready_pipe: Option<File>,
) -> Result<bool, String> {
    // Kept open for the life of the process (a checkpoint must carry them).
    let _other_opens = open_other_render_nodes(o)?;
    let client = KfdClient::open().map_err(|e| e.to_string())?;
    let (works, main_works) = alloc_works(o, &client, index)?;
    let events = event_check(o, &client, &works)?;
    let works: Vec<Mutex<GpuWork<'_>>> = works.into_iter().map(Mutex::new).collect();
    let mut me = Proc {
        client: &client,
        index,
        works: &works,
        main_works,
        events,
        fresh: o.fresh.then_some(0),
        children,
        host: host_memory(index, o.host_mib),
        vmas: match o.vmas {
            0 => None,
            n => Some(Vmas::new(index, n)?),
        },
    };
    announce_ready(&ready_line(o, &me), index, ready_pipe, me.children.len())?;
    Ok(serve(o, &mut me))
}

/// `--other-render-opens` (and `--gem-bo`, a GEM BO on the first of them).
fn open_other_render_nodes(o: &Options) -> Result<Vec<File>, String> {
    if o.gem_bo && !o.other_render_opens {
        return Err("--gem-bo needs --other-render-opens".to_owned());
    }
    if !o.other_render_opens {
        return Ok(Vec::new());
    }
    let opens = other_render_opens()?;
    if o.gem_bo {
        let first = &opens[0];
        let node = kfd_abi::handle::RenderNode::from_fd(first);
        let domain = u64::from(kfd_abi::sys::AMDGPU_GEM_DOMAIN_GTT);
        let h = node
            .gem_create(1 << 20, 4096, domain, 0)
            .map_err(|e| format!("--gem-bo: {e}"))?;
        // Bytes of its own (not zeros, which a dump leaves as holes), written
        // through the render file as a client does.
        let at = node.gem_mmap(h).map_err(|e| format!("--gem-bo: {e}"))?;
        let map = kfd_abi::handle::Mapping::shared(first.as_fd(), at, 1 << 20)
            .map_err(|e| format!("--gem-bo: mapping the BO: {e}"))?;
        let bytes: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + 0x5a) as u8).collect();
        map.as_volatile_slice().copy_from(&bytes);
    }
    Ok(opens)
}

/// The size and kind of every BO of one GPU: `--bos` alternating VRAM and GTT, then
/// `--small-bos` alternating GTT and VRAM, then the `--big-bo-mib` BO.
fn bo_sizes(o: &Options) -> Vec<(u64, MemKind)> {
    let alternate = |i: usize, even, odd| if i.is_multiple_of(2) { even } else { odd };
    let per_bo = (o.mib << 20).div_ceil(o.bos as u64);
    let mut sizes: Vec<(u64, MemKind)> = (0..o.bos)
        .map(|bi| (per_bo, alternate(bi, MemKind::Vram, MemKind::Gtt)))
        .collect();
    sizes.extend(
        (0..o.small_bos).map(|si| (SMALL_BO_BYTES, alternate(si, MemKind::Gtt, MemKind::Vram))),
    );
    if o.big_bo_mib > 0 {
        sizes.push((o.big_bo_mib << 20, MemKind::Vram));
    }
    sizes
}

/// Allocates and fills the BOs: one work per chosen GPU (stepped by the main thread), then
/// one per `--threads` thread; returns the works and how many are the main thread's.
fn alloc_works<'c>(
    o: &Options,
    client: &'c KfdClient,
    index: usize,
) -> Result<(Vec<GpuWork<'c>>, usize), String> {
    let all = client.gpus();
    let chosen: Vec<usize> = match &o.gpus {
        Some(l) => l.clone(),
        None => (0..all.len()).collect(),
    };
    let gpu_of = |gi: usize| {
        all.get(gi).map(|g| g.gpu_id).ok_or(format!(
            "--gpus: index {gi}, but this process can use {} GPUs of the topology",
            all.len()
        ))
    };
    let filled = |gi: usize, gpu: GpuId, bi: usize, size: u64, kind: MemKind| {
        let seed = Seed {
            proc: index,
            gpu: gi,
            bo: bi,
            gen: 0,
            every: o.change_every,
        };
        let mut bo = client.alloc(gpu, size, kind).map_err(|e| e.to_string())?;
        fill(&mut bo, seed);
        if let Some(dir) = &o.dump_expected {
            write_expected(dir, gpu, &bo, seed)?;
        }
        Ok::<_, String>((bi, bo))
    };
    let sizes = bo_sizes(o);
    let mut works = Vec::new();
    for &gi in &chosen {
        let gpu = gpu_of(gi)?;
        let mut bos = Vec::new();
        for (bi, &(size, kind)) in sizes.iter().enumerate() {
            let bi = if o.big_bo_mib > 0 && bi == sizes.len() - 1 {
                bi | o.big_bo_fill | BIG_BO
            } else {
                bi
            };
            bos.push(filled(gi, gpu, bi, size, kind)?);
        }
        works.push(GpuWork::new(client, index, gi, gpu, bos, o.change_every)?);
    }
    let main_works = works.len();
    for t in 0..o.threads {
        let gi = chosen[t % chosen.len()];
        let gpu = gpu_of(gi)?;
        let bo = filled(gi, gpu, THREAD_BO_BASE + t, THREAD_BO_BYTES, MemKind::Gtt)?;
        works.push(GpuWork::new(
            client,
            index,
            gi,
            gpu,
            vec![bo],
            o.change_every,
        )?);
    }
    Ok((works, main_works))
}

/// `--events`: an event on the first work's GPU that its SDMA jobs signal.
fn event_check<'c>(
    o: &Options,
    client: &'c KfdClient,
    works: &[GpuWork<'c>],
) -> Result<Option<EventCheck<'c>>, String> {
    if !o.events {
        return Ok(None);
    }
    let gpu = works
        .first()
        .map(|w| w.gpu)
        .ok_or("--events needs a GPU (--gpus is empty)")?;
    let mut events = Events::new(client, gpu).map_err(|e| e.to_string())?;
    let event = events.create().map_err(|e| e.to_string())?;
    Ok(Some(EventCheck {
        events,
        event,
        pending: false,
        fired: 0,
    }))
}

/// The JSON line that says the process is ready: its pid, GPUs and memory, the GPUs it
/// skipped, and with `--procs`, its index and children.
fn ready_line(o: &Options, me: &Proc<'_, '_>) -> String {
    let family = if o.procs > 1 {
        format!(
            ",\"proc\":{},\"children\":[{}]",
            me.index,
            me.children
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")
        )
    } else {
        String::new()
    };
    format!(
        "{{\"ready\":true,\"pid\":{},\"gpus\":[{}],\"mib_per_gpu\":{},\"bos_per_gpu\":{}{}{family}}}",
        std::process::id(),
        me.works[..me.main_works]
            .iter()
            .map(|w| lock(w).gpu.get().to_string())
            .collect::<Vec<_>>()
            .join(","),
        o.mib,
        o.bos,
        skipped_json(me.client),
    )
}

/// Prints the ready line: a child first tells the first process through the pipe, and the
/// first process prints only when every child has.
fn announce_ready(
    ready: &str,
    index: usize,
    ready_pipe: Option<File>,
    children: usize,
) -> Result<(), String> {
    match ready_pipe {
        Some(mut wr) if index > 0 => {
            println!("{ready}");
            wr.write_all(b"r")
                .map_err(|e| format!("telling the first process: {e}"))?;
        }
        Some(mut rd) => {
            let mut got = Vec::new();
            std::io::Read::read_to_end(&mut rd, &mut got)
                .map_err(|e| format!("waiting for the children: {e}"))?;
            if got.len() != children {
                return Err(format!(
                    "{} of {children} children failed to start",
                    children - got.len(),
                ));
            }
            println!("{ready}");
        }
        None => println!("{ready}"),
    }
    Ok(())
}

/// Steps the works every `--interval` (the thread works on threads of their own) and answers
/// the signals: SIGUSR2 changes memory, SIGUSR1 verifies, SIGTERM stops and reports.
fn serve(o: &Options, me: &mut Proc<'_, '_>) -> bool {
    let interval = o.interval;
    let works = me.works;
    let (main, threads) = works.split_at(me.main_works);
    std::thread::scope(|s| {
        for w in threads {
            s.spawn(move || {
                while !STOP.load(Ordering::SeqCst) {
                    lock(w).step_recording();
                    std::thread::sleep(interval);
                }
            });
        }
        loop {
            if STOP.load(Ordering::SeqCst) {
                let errs = me.stop_children();
                return me.report(errs);
            }
            if CHANGE.swap(false, Ordering::SeqCst) {
                let bytes: u64 = main.iter().map(|w| lock(w).change()).sum();
                println!(
                    "{{\"changed\":true,\"pid\":{},\"bytes\":{bytes}}}",
                    std::process::id()
                );
            }
            if VERIFY.swap(false, Ordering::SeqCst) {
                me.signal_children(libc::SIGUSR1);
                let errs = me.reap_early();
                me.report(errs);
            }
            for w in main {
                lock(w).step_recording();
            }
            std::thread::sleep(interval);
        }
    })
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("gpu-workload: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("gpu-workload: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{page_size, pattern, weight, Seed, Vmas, BIG_BO, CHANGE_DWORDS};

    #[test]
    fn vmas_are_checked_page_by_page_and_vma_by_vma() {
        let v = Vmas::new(3, 20).unwrap();
        assert_eq!(v.check(3), Vec::<String>::new());
        assert_eq!(v.check(4).len(), 1, "another process' pattern");
        let page = page_size();
        v.page_words(8)[5] ^= 1;
        assert!(v.check(3)[0].contains("1 page(s) differ, the first page 8"));
        v.page_words(8)[5] ^= 1;
        v.page_words(2)[0] = 1;
        assert!(
            v.check(3)[0].contains("the first page 2"),
            "an unfilled page written"
        );
        v.page_words(2)[0] = 0;
        // Page 5 made read-write: pages 4 to 6 become one VMA.
        // SAFETY: page 5 is inside v's mapping; no reference into it is held.
        let r = unsafe {
            libc::mprotect(
                (v.base + 5 * page) as *mut libc::c_void,
                page,
                Vmas::prot(4),
            )
        };
        assert_eq!(r, 0);
        let errs = v.check(3);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].contains("where page 4"), "{errs:?}");
    }

    #[test]
    fn pattern_differs_by_process_gpu_bo_and_offset() {
        assert_ne!(pattern(0, 0, 0, 0), pattern(0, 1, 0, 0));
        assert_ne!(pattern(0, 0, 0, 0), pattern(0, 0, 1, 0));
        assert_ne!(pattern(0, 0, 0, 0), pattern(0, 0, 0, 1));
        assert_ne!(pattern(0, 0, 0, 0), pattern(1, 0, 0, 0));
        assert_eq!(pattern(2, 3, 2, 77), pattern(2, 3, 2, 77));
        let distinct: std::collections::HashSet<u32> =
            (0..4096).map(|i| pattern(0, 0, 0, i)).collect();
        assert!(distinct.len() > 4000);
    }

    #[test]
    fn weights_are_fp16_of_magnitude_a_sixteenth_to_a_half() {
        for r in [0u16, 1, 0x3ff, 0x8000, 0xffff, 0x1234, 0xc00] {
            let w = weight(r) as u16;
            let exp = i32::from((w >> 10) & 0x1f) - 15;
            assert!((-4..=-1).contains(&exp), "{r:#x} -> {w:#x}");
            assert_eq!(w >> 15, r >> 15, "the sign is kept");
        }
    }

    /// Change `g` gives its generation to one block in `every` of the big BO, each block
    /// once per `every` changes, and to nothing else.
    #[test]
    fn a_change_rewrites_one_block_in_every() {
        for every in [10u32, 20] {
            let blocks = 3 * u64::from(every) + 7;
            let seed = |gen| Seed {
                proc: 0,
                gpu: 0,
                bo: BIG_BO,
                gen,
                every,
            };
            let mut times = vec![0u32; blocks as usize];
            for g in 1..=every {
                let changed: Vec<u64> = (0..blocks)
                    .filter(|&m| seed(g).gen_at(m * CHANGE_DWORDS) == g)
                    .collect();
                assert_eq!(
                    changed.len() as u64,
                    blocks / u64::from(every) + u64::from(g <= 7)
                );
                assert!(changed
                    .iter()
                    .all(|m| m % u64::from(every) == u64::from(g - 1)));
                for m in changed {
                    times[m as usize] += 1;
                    assert_eq!(seed(g).gen_at(m * CHANGE_DWORDS + CHANGE_DWORDS - 1), g);
                }
            }
            assert!(times.iter().all(|&t| t == 1), "{every}: {times:?}");
            let small = Seed { bo: 1, ..seed(3) };
            assert_eq!(small.gen_at(0), 0, "only the big BO changes");
        }
    }
}
