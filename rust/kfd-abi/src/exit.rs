//! A process' exit as `/proc` shows it while it happens.
//!
//! KFD tears a process down once it exits; before that, its threads go one
//! by one.  A kill or `exit_group()` marks every thread (SIGKILL pending),
//! each then sets `PF_EXITING` on its way out and is released at the end,
//! the leader last.  A process whose leader alone exited (`pthread_exit`)
//! still runs in its other threads.  So a process exits once every thread
//! is gone or on its way: what the emulator asks of a process whose memory
//! an access could not reach, and what criu asks of a helper it is about to
//! stop (did it die on its own first?).

use std::time::{Duration, Instant};

/// `PF_EXITING` in a thread's `/proc` stat flags (field 9).
const PF_EXITING: u64 = 0x4;

/// How long [`seen_within`] callers usually look: a thread that has just
/// taken the SIGKILL another thread's `exit_group()` (or fatal fault) sent
/// it is for a moment neither signalled nor exiting (the signal is off its
/// pending set, `PF_EXITING` not yet set, and no kill in the process' set).
pub const EXIT_GRACE: Duration = Duration::from_millis(100);

/// Whether thread `tid` of process `tgid` is gone, exiting (`PF_EXITING` in
/// its stat flags) or has SIGKILL pending: its own (`SigPnd`) or the
/// process' (`ShdPnd`, where a kill stays after the thread took its copy
/// and before it set `PF_EXITING`).
pub fn thread_exiting(tgid: u32, tid: u32) -> bool {
    let task = format!("/proc/{tgid}/task/{tid}");
    let (Ok(stat), Ok(status)) = (
        std::fs::read_to_string(format!("{task}/stat")),
        std::fs::read_to_string(format!("{task}/status")),
    ) else {
        return true;
    };
    // Field 9, the flags: the 7th after the command's closing parenthesis.
    let flags = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split(' ').nth(6)?.parse::<u64>().ok());
    let kill_pending = |set: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(set))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|mask| mask & (1 << (libc::SIGKILL - 1)) != 0)
    };
    flags.is_some_and(|f| f & PF_EXITING != 0) || kill_pending("SigPnd:") || kill_pending("ShdPnd:")
}

/// Whether every thread of process `tgid` is `done` or [`thread_exiting`];
/// a process without `/proc` entry (reaped) is.
pub fn every_thread(tgid: u32, mut done: impl FnMut(u32) -> bool) -> bool {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{tgid}/task")) else {
        return true;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .all(|tid| done(tid) || thread_exiting(tgid, tid))
}

/// Whether process `tgid` exits: every thread gone or on its way out.
pub fn exiting(tgid: u32) -> bool {
    every_thread(tgid, |_| false)
}

/// Asks `now` every 2 ms for up to `grace`: whether it said yes once.
pub fn seen_within(grace: Duration, mut now: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + grace;
    loop {
        if now() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A running process does not exit; a killed one does at once (SIGKILL
    /// pending, then exiting), and once reaped.  (kfd-emu's memory_gone
    /// test watches the zombie in between.)
    #[test]
    fn a_killed_process_exits_before_it_is_reaped() {
        assert!(!exiting(std::process::id()), "this process runs");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep starts");
        let pid = child.id();
        assert!(!exiting(pid), "a running child");
        assert!(
            !seen_within(Duration::from_millis(20), || exiting(pid)),
            "a running child, looked at a while"
        );
        child.kill().expect("SIGKILL");
        assert!(exiting(pid), "killed, not reaped");
        child.wait().expect("reaped");
        assert!(exiting(pid), "reaped");
    }
}
