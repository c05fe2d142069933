//! `kfd-emu supervise --attach` (`reattach::attach_with`) on a stopped
//! process of four threads (python3), with a stand-in for the daemon that
//! counts the listeners handed to it: a thread failing part-way leaves
//! every listener undelivered, and a signal that reaches a thread while it
//! is seized is delivered once the process continues.  Needs root
//! (seccomp filters installed in another process).
#![cfg(target_arch = "x86_64")]

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kfd_emu::reattach::attach_with;

/// Four threads sleeping; SIGUSR1 leaves a file `usr1` in `dir`.
const TARGET: &str = r#"
import signal, sys, threading, time
out = sys.argv[1]
signal.signal(signal.SIGUSR1, lambda s, f: open(out + "/usr1", "w").close())
for _ in range(3):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
open(out + "/ready", "w").close()
while True:
    time.sleep(0.02)
"#;

struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn state(pid: i32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    rest.split_whitespace().next().unwrap().to_owned()
}

/// The target, started and stopped.
fn stopped_target(dir: &Path) -> Target {
    let child = Command::new("/usr/bin/python3")
        .args(["-c", TARGET, dir.to_str().unwrap()])
        .spawn()
        .expect("python3");
    let t = Target(child);
    wait_for("the target's threads", || dir.join("ready").exists());
    let pid = t.0.id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    wait_for("the target to stop", || state(pid) == "T");
    t
}

/// A daemon stand-in on `dir`'s socket: takes each listener (closing it)
/// and acknowledges it; returns the count of listeners taken.
fn daemon(dir: &Path) -> Arc<AtomicUsize> {
    let sock = UnixListener::bind(dir.join(kfd_emu::supervise::SOCKET)).unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    std::thread::spawn(move || {
        for mut c in sock.incoming().flatten() {
            let mut b = [0u8; 1];
            // The fd rides with the byte; not taking it closes it.
            if c.read(&mut b).unwrap_or(0) > 0 {
                n2.fetch_add(1, Ordering::SeqCst);
                let _ = c.write_all(b"+");
            }
        }
    });
    n
}

fn need_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests need root (seccomp in another process)"
    );
}

#[test]
fn a_failing_thread_leaves_every_listener_undelivered() {
    need_root();
    let dir = tempfile::tempdir().unwrap();
    let taken = daemon(dir.path());
    let t = stopped_target(dir.path());
    let pid = t.0.id() as i32;
    let err = attach_with(dir.path(), pid, &mut |i, _| {
        if i == 2 {
            Err(std::io::Error::other("injected failure"))
        } else {
            Ok(())
        }
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("injected failure") && err.contains("no thread was given a listener"),
        "{err}"
    );
    assert_eq!(
        taken.load(Ordering::SeqCst),
        0,
        "listeners handed over despite the failure"
    );
    assert_eq!(state(pid), "T", "the target no longer stopped");
    // Nothing half done: a second attach gives every thread one.
    let n = attach_with(dir.path(), pid, &mut |_, _| Ok(())).unwrap();
    assert_eq!(n, 4);
    assert_eq!(taken.load(Ordering::SeqCst), 4);
}

#[test]
fn a_signal_during_the_attach_is_delivered_after_it() {
    need_root();
    let dir = tempfile::tempdir().unwrap();
    let taken = daemon(dir.path());
    let t = stopped_target(dir.path());
    let pid = t.0.id() as i32;
    let n = attach_with(dir.path(), pid, &mut |i, tid| {
        if i == 0 {
            // SAFETY: tgkill takes integers; the thread is our child's.
            let r = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGUSR1) };
            assert_eq!(r, 0, "tgkill");
        }
        Ok(())
    })
    .unwrap();
    assert_eq!((n, taken.load(Ordering::SeqCst)), (4, 4));
    assert!(
        !dir.path().join("usr1").exists(),
        "SIGUSR1 handled while stopped"
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    wait_for("SIGUSR1's handler after SIGCONT", || {
        dir.path().join("usr1").exists()
    });
}
