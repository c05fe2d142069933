//! A hook for tests only: with `CRIU_ROCM_TEST_STOP_ON_LOG=TEXT` in its
//! environment, criu-rocm stops itself (SIGSTOP, the whole process) right
//! after the first log line that contains TEXT was produced, by any thread,
//! so that a test can kill it at a named point of a dump (`test/gpu/run.sh`
//! does, with SIGKILL, SIGTERM or SIGINT).  Without the variable nothing
//! happens: the check per line is one atomic load.  The GPU guardian turns
//! the hook off for itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The variable's name.
pub const ENV: &str = "CRIU_ROCM_TEST_STOP_ON_LOG";

static TEXT: OnceLock<Option<Vec<u8>>> = OnceLock::new();
static FIRED: AtomicBool = AtomicBool::new(false);

/// Reads the variable (at start-up, before any line is logged).
pub fn init() {
    TEXT.get_or_init(|| {
        std::env::var_os(ENV)
            .filter(|v| !v.is_empty())
            .map(std::os::unix::ffi::OsStringExt::into_vec)
    });
}

/// The name of the variable that overrides `vm.max_map_count`.
pub const MAX_MAP_COUNT_ENV: &str = "CRIU_ROCM_TEST_MAX_MAP_COUNT";

/// `vm.max_map_count` as the test sets it, `None` when it sets none.
pub fn max_map_count() -> Option<u64> {
    std::env::var(MAX_MAP_COUNT_ENV).ok()?.trim().parse().ok()
}

/// The name of the variable that makes every render-file context probe
/// worker end without a report, so that each file's dump probes it itself
/// (the fallback a worker that fails or is killed leads to).
pub const PROBE_WORKER_SILENT_ENV: &str = "CRIU_ROCM_TEST_PROBE_WORKER_SILENT";

/// Whether the test asks the context probe workers to report nothing.
pub fn probe_worker_silent() -> bool {
    std::env::var_os(PROBE_WORKER_SILENT_ENV).is_some_and(|v| !v.is_empty())
}

/// A log line was produced; async-signal-safe once [`init`] ran.
pub fn on_log_line(line: &[u8]) {
    let Some(Some(text)) = TEXT.get() else {
        return;
    };
    if FIRED.load(Ordering::Relaxed) || !line.windows(text.len()).any(|w| w == text.as_slice()) {
        return;
    }
    if !FIRED.swap(true, Ordering::AcqRel) {
        // SAFETY: raise has no preconditions.
        unsafe { libc::raise(libc::SIGSTOP) };
    }
}

/// No stop in this process from now on.
pub fn disarm() {
    FIRED.store(true, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a child: no stop for other lines, one stop after the first line
    /// holding the text, none after that.
    #[test]
    fn stops_once_at_the_first_matching_line() {
        let text = b"needle".to_vec();
        // SAFETY: the child only sets a OnceLock with a value made before the
        // fork, scans bytes, raises and exits: no allocation, no lock.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let _ = TEXT.set(Some(text));
            on_log_line(b"hay");
            on_log_line(b"a needle in the hay");
            on_log_line(b"another needle");
            // SAFETY: ends the child without running the harness' code.
            unsafe { libc::_exit(7) };
        }
        let mut st = 0;
        // SAFETY: waits for our own child, stopped or gone.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, libc::WUNTRACED) }, pid);
        assert!(libc::WIFSTOPPED(st), "status {st:#x}");
        // SAFETY: continues our own stopped child.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        // SAFETY: waits for our own child to end.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 7,
            "status {st:#x}"
        );
        // Not armed here: nothing happens.
        on_log_line(b"needle");
    }
}
