//! Routes Rust `log` records into CRIU's own log through its `print_on_level()`.
//!
//! Every line carries one prefix, `amdgpu: `, so GPU messages are easy to find in
//! `dump.log` / `restore.log`, and Rust levels map onto CRIU's: error → LOG_ERROR,
//! warn → LOG_WARN, info → LOG_INFO, debug/trace → LOG_DEBUG.
//!
//! CRIU's printer is not thread safe, so only the thread that installed the bridge (CRIU's;
//! a forked task's only thread inherits the mark) prints.  Lines from other threads (GPU
//! copies running beside CRIU's restore) are held and printed, in order, before CRIU's
//! thread's next line or by `log::logger().flush()` there.

use std::cell::Cell;
use std::ffi::{c_int, c_uint};
use std::fs::File;
use std::io::Write;
use std::os::fd::{FromRawFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// CRIU's log levels (criu/include/log.h).
const LOG_ERROR: c_uint = 1;
const LOG_WARN: c_uint = 2;
const LOG_INFO: c_uint = 3;
const LOG_DEBUG: c_uint = 4;

/// The prefix of every GPU line in CRIU's log.
pub const PREFIX: &str = "amdgpu: ";

/// Where formatted lines go: CRIU's printer in the product, a capture in tests.
pub type Sink = fn(c_uint, &str);

#[cfg(not(test))]
fn criu_sink(level: c_uint, line: &str) {
    use std::ffi::{c_char, CString};
    extern "C" {
        fn print_on_level(loglevel: c_uint, format: *const c_char, ...);
    }
    let Ok(line) = CString::new(line.replace('\0', "\\0")) else {
        return;
    };
    // SAFETY: the format is a static "%s\n" consuming exactly one C-string argument, and `line`
    // is a valid NUL-terminated string alive for the duration of the call.
    unsafe { print_on_level(level, c"%s\n".as_ptr(), line.as_ptr()) };
}

#[cfg(test)]
fn criu_sink(level: c_uint, line: &str) {
    tests::capture(level, line);
}

struct CriuLogger {
    sink: Sink,
    /// The sink is safe from any thread (a helper's own write to CRIU's
    /// log fd): no line is held.
    direct: bool,
}

/// Maps a Rust level to CRIU's.
pub fn criu_level(level: log::Level) -> c_uint {
    match level {
        log::Level::Error => LOG_ERROR,
        log::Level::Warn => LOG_WARN,
        log::Level::Info => LOG_INFO,
        log::Level::Debug | log::Level::Trace => LOG_DEBUG,
    }
}

fn filter_for(criu_loglevel: c_int) -> log::LevelFilter {
    match criu_loglevel {
        i32::MIN..=0 => log::LevelFilter::Off,
        1 => log::LevelFilter::Error,
        2 => log::LevelFilter::Warn,
        3 => log::LevelFilter::Info,
        _ => log::LevelFilter::Debug,
    }
}

thread_local! {
    /// Set on the thread that may call CRIU's printer.
    static CRIU_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Lines of other threads, waiting for CRIU's thread.
static HELD: Mutex<Vec<(c_uint, String)>> = Mutex::new(Vec::new());

fn take_held() -> Vec<(c_uint, String)> {
    std::mem::take(&mut *HELD.lock().unwrap_or_else(|p| p.into_inner()))
}

impl CriuLogger {
    fn print_held(&self) {
        for (level, line) in take_held() {
            (self.sink)(level, &line);
        }
    }
}

impl log::Log for CriuLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let line = readable_paths(&format!("{PREFIX}{}", record.args()));
            let level = criu_level(record.level());
            if self.direct {
                (self.sink)(level, &line);
            } else if CRIU_THREAD.get() {
                self.print_held();
                (self.sink)(level, &line);
            } else {
                // CRIU's printer checks its own lines; a held line is
                // produced now, on this thread.
                amdgpu_cr::testhook::on_log_line(line.as_bytes());
                HELD.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((level, line));
            }
        }
    }

    fn flush(&self) {
        if CRIU_THREAD.get() {
            self.print_held();
        }
    }
}

/// The line with every `/proc/self/fd/<n>` path (how the GPU hooks reach
/// CRIU's image directory, whose path may not resolve in a restored task)
/// shown as the directory's own path, as the user named it.
pub fn readable_paths(line: &str) -> String {
    const FD_DIR: &str = "/proc/self/fd/";
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find(FD_DIR) {
        out.push_str(&rest[..at]);
        let tail = &rest[at + FD_DIR.len()..];
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        let link = &rest[at..at + FD_DIR.len() + digits];
        match std::fs::read_link(link) {
            Ok(real) if digits > 0 => out.push_str(&real.to_string_lossy()),
            _ => out.push_str(link),
        }
        rest = &tail[digits..];
    }
    out.push_str(rest);
    out
}

static LOGGER: OnceLock<CriuLogger> = OnceLock::new();
/// CRIU's verbosity, as [`install`] got it (for helpers started later).
static LEVEL: AtomicI32 = AtomicI32::new(0);

/// Installs the bridge (idempotent) and sets the level from CRIU's verbosity.
pub fn install(criu_loglevel: c_int) {
    CRIU_THREAD.set(true);
    LEVEL.store(criu_loglevel, Ordering::Relaxed);
    let logger = LOGGER.get_or_init(|| CriuLogger {
        sink: criu_sink,
        direct: false,
    });
    // A second call (or another logger set first) only updates the level.
    let _ = log::set_logger(logger);
    log::set_max_level(filter_for(criu_loglevel));
}

/// What a helper process (criu re-executed, such as the GPU memory writer)
/// needs to write to CRIU's log as CRIU does: its verbosity and when CRIU's
/// log started (`log_start_us`, µs since the epoch; 0 when CRIU prints no
/// timestamps).  Read back by [`install_helper`].
pub fn helper_args(log_start_us: u64) -> Vec<String> {
    vec![
        LEVEL.load(Ordering::Relaxed).to_string(),
        log_start_us.to_string(),
    ]
}

/// CRIU's log in a helper process.
struct HelperLog {
    file: File,
    start: Option<SystemTime>,
}

static HELPER_LOG: OnceLock<HelperLog> = OnceLock::new();

/// CRIU's timestamp of a line (`print_ts()` in criu/log.c): seconds and
/// microseconds since the log started, in 12 bytes.
fn timestamp(since: Duration) -> String {
    let full = format!("({:02}.{:06}", since.as_secs(), since.subsec_micros());
    // CRIU cuts the text to 10 bytes and ends it with ") ".
    format!("{}) ", &full[..full.len().min(10)])
}

fn helper_sink(_level: c_uint, line: &str) {
    let Some(log) = HELPER_LOG.get() else {
        return;
    };
    let mut out = String::with_capacity(line.len() + 14);
    if let Some(start) = log.start {
        out.push_str(&timestamp(
            SystemTime::now().duration_since(start).unwrap_or_default(),
        ));
    }
    out.push_str(line);
    out.push('\n');
    // One write per line on CRIU's O_APPEND log: lines stay whole beside
    // criu main's.
    let _ = (&log.file).write_all(out.as_bytes());
    amdgpu_cr::testhook::on_log_line(line.as_bytes());
}

/// In a helper process: routes `log` records to CRIU's log at `fd` (fd 2
/// when `None`) with the settings of [`helper_args`], from any thread.
pub fn install_helper(fd: Option<RawFd>, args: &[String]) -> Result<(), String> {
    let [level, start_us] = args else {
        return Err(format!("expected 2 log settings, got {}", args.len()));
    };
    let level: c_int = level
        .parse()
        .map_err(|_| format!("log level {level:?} is not a number"))?;
    let start_us: u64 = start_us
        .parse()
        .map_err(|_| format!("log start {start_us:?} is not a number"))?;
    let fd = fd.unwrap_or(libc::STDERR_FILENO);
    // SAFETY: CRIU's log fd, handed to this process for its log alone and
    // never closed by anything else.
    let file = unsafe { File::from_raw_fd(fd) };
    let start = (start_us != 0).then(|| UNIX_EPOCH + Duration::from_micros(start_us));
    let _ = HELPER_LOG.set(HelperLog { file, start });
    LEVEL.store(level, Ordering::Relaxed);
    let logger = LOGGER.get_or_init(|| CriuLogger {
        sink: helper_sink,
        direct: true,
    });
    let _ = log::set_logger(logger);
    log::set_max_level(filter_for(level));
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Mutex;

    static LINES: Mutex<Vec<(c_uint, String)>> = Mutex::new(Vec::new());
    /// Tests that log from a thread marked as CRIU's take turns: such a
    /// thread prints every held line.
    static CRIU_THREAD_TESTS: Mutex<()> = Mutex::new(());

    pub(crate) fn capture(level: c_uint, line: &str) {
        LINES.lock().unwrap().push((level, line.to_owned()));
    }

    /// A helper's lines carry CRIU's timestamps, 12 bytes, past 100 s too.
    #[test]
    fn helper_timestamps_are_criu_s() {
        assert_eq!(timestamp(Duration::from_micros(3_000_042)), "(03.000042) ");
        assert_eq!(
            timestamp(Duration::from_micros(123_456_789)),
            "(123.45678) "
        );
        let e = install_helper(None, &["4".into()]).unwrap_err();
        assert!(e.contains("expected 2"), "{e}");
    }

    #[test]
    fn records_reach_criu_with_prefix_and_mapped_level() {
        let _turn = CRIU_THREAD_TESTS.lock().unwrap();
        install(4);
        log::error!("gpu 0x{:04x} failed", 0x1a2b);
        log::debug!("detail");
        install(2);
        log::info!("dropped at -v2");
        let lines = LINES.lock().unwrap().clone();
        assert!(lines.contains(&(LOG_ERROR, "amdgpu: gpu 0x1a2b failed".into())));
        assert!(lines.contains(&(LOG_DEBUG, "amdgpu: detail".into())));
        assert!(!lines.iter().any(|(_, l)| l.contains("dropped")));
        assert_eq!(criu_level(log::Level::Warn), LOG_WARN);
        assert_eq!(criu_level(log::Level::Trace), LOG_DEBUG);
        assert_eq!(criu_level(log::Level::Info), LOG_INFO);
    }

    /// A line from another thread waits for CRIU's thread, then comes
    /// before that thread's own line.
    #[test]
    fn other_threads_lines_are_printed_by_criu_thread() {
        let _turn = CRIU_THREAD_TESTS.lock().unwrap();
        install(4);
        std::thread::spawn(|| log::warn!("from a copy thread"))
            .join()
            .unwrap();
        let seen = |what: &str| {
            LINES
                .lock()
                .unwrap()
                .iter()
                .position(|(_, l)| l.contains(what))
        };
        assert_eq!(
            seen("from a copy thread"),
            None,
            "printed off CRIU's thread"
        );
        log::info!("from criu's thread");
        let (held, own) = (seen("from a copy thread"), seen("from criu's thread"));
        assert!(held.is_some() && held < own, "{held:?} {own:?}");
        std::thread::spawn(|| log::warn!("second copy line"))
            .join()
            .unwrap();
        log::logger().flush();
        assert!(seen("second copy line").is_some());
    }

    #[test]
    fn image_dir_paths_read_as_the_directory() {
        use std::os::fd::AsRawFd;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let f = std::fs::File::open(dir).unwrap();
        let msg = format!(
            "pid 7: /proc/self/fd/{}/amdgpu-pages-3-1a2b.img: truncated",
            f.as_raw_fd()
        );
        let real = std::fs::canonicalize(dir).unwrap();
        assert_eq!(
            readable_paths(&msg),
            format!(
                "pid 7: {}/amdgpu-pages-3-1a2b.img: truncated",
                real.display()
            )
        );
        assert_eq!(readable_paths("no path here"), "no path here");
        assert_eq!(readable_paths("/proc/self/fd/x"), "/proc/self/fd/x");
    }
}
