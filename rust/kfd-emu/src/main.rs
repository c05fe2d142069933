//! `kfd-emu` command line.

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use kfd_emu::profile::{self, Profile};

const USAGE: &str = "\
usage: kfd-emu profiles
       kfd-emu topology --profile NAME [--profile-file F]
       kfd-emu run --profile NAME [--profile-file F] [--state-dir D] [--threads N]
                   [--fail OP[:ERRNO[:SKIP[:COUNT]]]]... [--hold OP:PATH]...
                   -- CMD [ARG...]
       kfd-emu bench-ioctl [--device PATH] [--count N] [--cmd HEX]
       kfd-emu supervise -- CMD [ARG...]
       kfd-emu supervise --attach PID

--profile-file F alone is a complete profile; with --profile it is a partial
override merged over the named one.  `run` sets KFD_EMU_PROFILE and
KFD_EMU_STATE_DIR for CMD.  Log level: KFD_EMU_LOG=error|warn|info|debug.

--fail (tests only) makes the CRIU op OP (PROCESS_INFO, CHECKPOINT, UNPAUSE,
RESTORE, RESUME) or render-node ioctl OP (PRIME_FD_TO_HANDLE,
PRIME_HANDLE_TO_FD, GEM_USERPTR, GEM_VA, GEM_CLOSE, CTX, BO_LIST, CS, WAIT_CS)
fail with ERRNO (a name or number, default EIO): the first SKIP calls
succeed, then COUNT calls fail (default: all later calls).  CS:ECANCELED and
WAIT_CS:ECANCELED are GPU resets, WAIT_CS:ETIME a wait that times out.
--hold (tests only) makes the CRIU op OP wait, before it does anything, until
the file PATH exists; while a call waits, PATH.held holds its caller's pid.
OP SAVE_WAVES holds PROCESS_INFO after the pause, before the waves are saved.

`supervise` (under `kfd-emu run`) runs CMD under a seccomp filter whose
listener the emulator holds, so that the emulated KFD and render nodes can
hand out file descriptors (dma-bufs of CRIU CHECKPOINT/RESTORE, PRIME
HANDLE_TO_FD) and the render nodes answer the stat family as character
devices.  CMD and its children keep the filter.  `supervise --attach PID`
gives a process CRIU restored with that filter (stopped: `criu restore
--leave-stopped`) a listener again; send it SIGCONT after.";

/// AMDKFD_IOC_GET_VERSION: cheap, answered by every KFD.
const DEFAULT_BENCH_CMD: u32 = 0x8008_4b01;

struct StderrLog(log::LevelFilter);

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= self.0
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!(
                "kfd-emu[{}]: {}: {}",
                std::process::id(),
                r.level(),
                r.args()
            );
        }
    }
    fn flush(&self) {}
}

fn init_log() {
    let level = match std::env::var("KFD_EMU_LOG").as_deref() {
        Ok("error") => log::LevelFilter::Error,
        Ok("info") => log::LevelFilter::Info,
        Ok("debug") => log::LevelFilter::Debug,
        Ok("trace") => log::LevelFilter::Trace,
        _ => log::LevelFilter::Warn,
    };
    let logger: &'static StderrLog = Box::leak(Box::new(StderrLog(level)));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
    }
}

#[derive(Default)]
struct Args {
    profile: Option<String>,
    profile_file: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    threads: Option<usize>,
    device: Option<PathBuf>,
    count: Option<usize>,
    cmd_hex: Option<u32>,
    faults: Vec<kfd_emu::fault::Fault>,
    holds: Vec<kfd_emu::fault::Hold>,
    attach: Option<i32>,
    rest: Vec<OsString>,
}

fn parse(args: &[OsString]) -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let s = arg.to_string_lossy();
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match s.as_ref() {
            "--profile" => a.profile = Some(val("--profile")?.to_string_lossy().into_owned()),
            "--profile-file" => a.profile_file = Some(val("--profile-file")?.into()),
            "--state-dir" => a.state_dir = Some(val("--state-dir")?.into()),
            "--device" => a.device = Some(val("--device")?.into()),
            "--fail" => a.faults.push(kfd_emu::fault::Fault::parse(
                &val("--fail")?.to_string_lossy(),
            )?),
            "--hold" => a.holds.push(kfd_emu::fault::Hold::parse(
                &val("--hold")?.to_string_lossy(),
            )?),
            "--threads" | "--count" => {
                let v = val(&s)?;
                let n: usize = v
                    .to_string_lossy()
                    .parse()
                    .map_err(|_| format!("{s}: {v:?} is not a number"))?;
                if s == "--threads" {
                    a.threads = Some(n);
                } else {
                    a.count = Some(n);
                }
            }
            "--attach" => {
                let v = val("--attach")?;
                a.attach = Some(
                    v.to_string_lossy()
                        .parse()
                        .map_err(|_| format!("--attach: {v:?} is not a pid"))?,
                );
            }
            "--cmd" => {
                let v = val("--cmd")?.to_string_lossy().into_owned();
                a.cmd_hex = Some(
                    u32::from_str_radix(v.trim_start_matches("0x"), 16)
                        .map_err(|_| format!("--cmd: {v:?} is not a hex ioctl number"))?,
                );
            }
            "--" => {
                a.rest = it.cloned().collect();
                break;
            }
            _ => return Err(format!("unknown argument {s:?}")),
        }
    }
    Ok(a)
}

fn load_profile(a: &Args) -> Result<Profile, String> {
    Profile::load(a.profile.as_deref(), a.profile_file.as_deref()).map_err(|e| e.to_string())
}

fn cmd_profiles() -> Result<i32, String> {
    for n in profile::builtin_names() {
        let p = Profile::builtin(n).map_err(|e| e.to_string())?;
        let gpus: Vec<String> = p
            .gpus()
            .iter()
            .map(|g| format!("{}@renderD{}", g.gpu_id, g.drm_render_minor))
            .collect();
        println!(
            "{n:10} {}\n{:10} gpus: {}",
            p.description,
            "",
            gpus.join(" ")
        );
    }
    Ok(0)
}

fn cmd_run(a: Args) -> Result<i32, String> {
    let profile = load_profile(&a)?;
    kfd_emu::fault::install(a.faults);
    kfd_emu::fault::install_holds(a.holds);
    let opts = kfd_emu::runner::RunOptions {
        profile,
        state_dir: a.state_dir,
        cmd: a.rest,
        threads: a.threads.unwrap_or(2),
    };
    kfd_emu::runner::run(opts, kfd_emu::serve::devices).map_err(|e| e.to_string())
}

fn cmd_supervise(a: Args) -> Result<i32, String> {
    let dir = std::env::var_os(kfd_emu::runner::ENV_STATE_DIR).ok_or_else(|| {
        format!(
            "{} is not set: run me under `kfd-emu run`",
            kfd_emu::runner::ENV_STATE_DIR
        )
    })?;
    let dir = std::path::Path::new(&dir);
    if let Some(pid) = a.attach {
        let n = kfd_emu::reattach::attach(dir, pid).map_err(|e| e.to_string())?;
        log::info!("supervise --attach: {n} thread(s) of {pid} have a listener again");
        return Ok(0);
    }
    Err(kfd_emu::supervise::supervise(dir, &a.rest).to_string())
}

/// The daemon's helper (not in the usage): `kfd-emu inject-mmap PID TID
/// ADDR LEN PROT FLAGS FD OFFSET` makes that mmap in thread TID of PID in
/// place of the trapped one it waits in (`kfd_emu::inject::mmap_instead`)
/// and prints its result.  A process of its own, so that the tracer's
/// stops do not reach the daemon's reaper of orphans.
const INJECT_MMAP: &str = "inject-mmap";

#[cfg(target_arch = "x86_64")]
fn cmd_inject_mmap(args: &[OsString]) -> ExitCode {
    let n: Vec<u64> = args
        .iter()
        .filter_map(|a| a.to_str().and_then(|s| s.parse().ok()))
        .collect();
    let [pid, tid, addr, len, prot, flags, fd, offset] = n[..] else {
        eprintln!("kfd-emu {INJECT_MMAP}: PID TID ADDR LEN PROT FLAGS FD OFFSET");
        return ExitCode::from(2);
    };
    let map = kfd_emu::inject::Mmap {
        addr,
        len,
        prot,
        flags,
        fd: fd as i32,
        offset,
    };
    match kfd_emu::inject::mmap_instead(pid as i32, tid as i32, map) {
        Ok(r) => {
            println!("{r}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kfd-emu {INJECT_MMAP}: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn cmd_inject_mmap(_args: &[OsString]) -> ExitCode {
    eprintln!("kfd-emu {INJECT_MMAP}: x86_64 only");
    ExitCode::FAILURE
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn cmd_bench(a: Args) -> Result<i32, String> {
    let dev = a.device.unwrap_or_else(|| PathBuf::from("/dev/kfd"));
    let count = a.count.unwrap_or(20_000).max(1);
    let cmd = a.cmd_hex.unwrap_or(DEFAULT_BENCH_CMD);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev)
        .map_err(|e| format!("{}: {e}", dev.display()))?;
    let size = ((cmd >> 16) & 0x3fff) as usize;
    let mut buf = vec![0u8; size.max(8)];
    let call = |buf: &mut [u8]| -> Result<(), String> {
        // SAFETY: `buf` is live and at least `_IOC_SIZE(cmd)` bytes long.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, buf.as_mut_ptr()) };
        if r < 0 {
            return Err(format!(
                "{}: ioctl {cmd:#x}: {}",
                dev.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    };
    for _ in 0..count.min(1000) {
        call(&mut buf)?;
    }
    let mut us = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        call(&mut buf)?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mean = us.iter().sum::<f64>() / us.len() as f64;
    us.sort_by(f64::total_cmp);
    println!(
        "{} ioctl {cmd:#010x} x{count}: p50 {:.1} us  p90 {:.1} us  p99 {:.1} us  min {:.1} us  max {:.1} us  mean {:.1} us",
        dev.display(),
        percentile(&us, 0.5),
        percentile(&us, 0.9),
        percentile(&us, 0.99),
        us[0],
        us[us.len() - 1],
        mean
    );
    if cmd == DEFAULT_BENCH_CMD {
        let major = u32::from_ne_bytes(buf[0..4].try_into().expect("8 bytes"));
        let minor = u32::from_ne_bytes(buf[4..8].try_into().expect("8 bytes"));
        println!("KFD version {major}.{minor}");
    }
    Ok(0)
}

fn main() -> ExitCode {
    init_log();
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let Some(sub) = args.first().map(|s| s.to_string_lossy().into_owned()) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    if sub == INJECT_MMAP {
        return cmd_inject_mmap(&args[1..]);
    }
    let parsed = match parse(&args[1..]) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kfd-emu {sub}: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let r = match sub.as_str() {
        "profiles" => cmd_profiles(),
        "topology" => load_profile(&parsed).map(|p| {
            print!("{}", kfd_emu::topology::render(&p));
            0
        }),
        "run" => cmd_run(parsed),
        "bench-ioctl" => cmd_bench(parsed),
        "supervise" => cmd_supervise(parsed),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(0)
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match r {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("kfd-emu {sub}: {e}");
            ExitCode::FAILURE
        }
    }
}
