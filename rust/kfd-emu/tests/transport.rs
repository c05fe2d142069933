//! The FUSE transport through the real /dev/fuse path, with a device
//! double.  Needs root (mount, passthrough registration); each test body
//! runs in a child process in a private mount namespace.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use kfd_emu::fuse;

fn serve(dir: &Path, double: Arc<Double>) -> (fuse::Mount, std::os::fd::OwnedFd) {
    let target = dir.join("kfd");
    std::fs::write(&target, b"").unwrap();
    let backing = memfd(1 << 30);
    let m = fuse::serve_file("test", &target, backing.as_fd(), double, 2).unwrap();
    (m, backing)
}

fn open_rw(p: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(p)
        .unwrap()
}

#[test]
fn ioctl_round_trip_and_passthrough() {
    if role().is_none() {
        return run_in_ns("ioctl_round_trip_and_passthrough", "body");
    }
    let tmp = scratch_dir("rt");
    let dir = tmp.path();
    let double = Arc::new(Double::default());
    let (m, backing) = serve(dir, double.clone());
    let f = open_rw(m.target());

    // The node looks like the FUSE file we promised, not the memfd.
    let md = f.metadata().unwrap();
    assert!(md.file_type().is_file() && !md.file_type().is_char_device());
    assert_eq!(md.len(), 0);

    let mut buf = [0u8; 16];
    buf[8..].copy_from_slice(&41u64.to_ne_bytes());
    raw_ioctl(f.as_raw_fd(), ECHO, &mut buf).unwrap();
    let tgid = u32::from_ne_bytes(buf[0..4].try_into().unwrap());
    let tid = u32::from_ne_bytes(buf[4..8].try_into().unwrap());
    assert_eq!(tgid, std::process::id(), "caller tgid resolved");
    // SAFETY: gettid has no preconditions.
    assert_eq!(tid, unsafe { libc::gettid() } as u32);
    assert_eq!(u64::from_ne_bytes(buf[8..].try_into().unwrap()), 42);

    // From another thread: same tgid, other tid.
    let fd = f.as_raw_fd();
    let (t2, tid2) = std::thread::spawn(move || {
        let mut b = [0u8; 16];
        raw_ioctl(fd, ECHO, &mut b).unwrap();
        // SAFETY: gettid has no preconditions.
        (
            u32::from_ne_bytes(b[0..4].try_into().unwrap()),
            (
                u32::from_ne_bytes(b[4..8].try_into().unwrap()),
                unsafe { libc::gettid() } as u32,
            ),
        )
    })
    .join()
    .unwrap();
    assert_eq!(t2, std::process::id());
    assert_eq!(tid2.0, tid2.1);

    // fd arguments: pull the fd from the process, ask the transport its fh.
    let pulled = kfd_emu::device::pull_fd(std::process::id(), f.as_raw_fd()).unwrap();
    let fh = fuse::fh_of(pulled.as_fd()).unwrap();
    let opens = double.opens.lock().unwrap().clone();
    assert_eq!(opens.len(), 1);
    assert!(opens.contains_key(&fh), "fh {fh} not among {opens:?}");
    drop(pulled);
    let other = std::fs::File::open("/proc/self/status").unwrap();
    assert_eq!(
        fuse::fh_of(other.as_fd()).unwrap_err().raw_os_error(),
        Some(libc::ENOTTY)
    );

    let mut junk = [0u8; 8];
    assert_eq!(
        raw_ioctl(f.as_raw_fd(), common::ioc(3, 0xee, 8), &mut junk),
        Err(libc::ENOTTY)
    );

    // A parked WAIT answered by a POST from another open.
    let g = open_rw(m.target());
    let fd = f.as_raw_fd();
    let waiter = std::thread::spawn(move || {
        let mut b = [0u8; 8];
        raw_ioctl(fd, WAIT, &mut b).map(|_| u64::from_ne_bytes(b))
    });
    assert!(wait_for(5, || m.parked() == 1), "WAIT never parked");
    let mut post = 0x5eedu64.to_ne_bytes();
    raw_ioctl(g.as_raw_fd(), POST, &mut post).unwrap();
    assert_eq!(waiter.join().unwrap(), Ok(0x5eed));
    assert_eq!(m.parked(), 0);

    // Passthrough mmap: coherent with the backing memfd, shown as our path.
    let len = 2 << 20;
    let off = 1 << 29;
    // SAFETY: a fresh shared mapping of our FUSE file; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            off,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    let word = (p as *mut u64).wrapping_add(1);
    // SAFETY: `word` lies inside the `len` writable bytes `p` maps.
    unsafe { word.write(0xdead_beef_0001) };
    let mut back = [0u8; 8];
    // SAFETY: pread into a local buffer from the memfd we own.
    let n = unsafe { libc::pread(backing.as_raw_fd(), back.as_mut_ptr().cast(), 8, off + 8) };
    assert_eq!(n, 8);
    assert_eq!(u64::from_ne_bytes(back), 0xdead_beef_0001);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps
        .lines()
        .find(|l| l.starts_with(&format!("{:x}-", p as usize)))
        .unwrap();
    assert!(
        line.ends_with(m.target().to_str().unwrap()),
        "maps shows {line:?}"
    );
    // SAFETY: unmapping our own mapping.
    unsafe { libc::munmap(p, len) };

    drop(f);
    drop(g);
    assert!(wait_for(5, || double.released.lock().unwrap().len() == 2));
    m.unmount().unwrap();
    tmp.close().unwrap();
}

/// Writes a line straight to fd 1: the harness may buffer or capture
/// `println!` even with --nocapture.
fn say(line: &str) {
    let l = format!("{line}\n");
    // SAFETY: writing a live buffer to stdout.
    unsafe { libc::write(1, l.as_ptr().cast(), l.len()) };
}

/// Child role: blocks in WAIT on $KFD_EMU_TEST_PATH, reports its errno.
/// Not a test of its own: `spawn_waiter` runs it.
#[test]
#[ignore = "child role of the WAIT tests, run by spawn_waiter"]
fn waiter() {
    assert_eq!(
        role().as_deref(),
        Some("waiter"),
        "the waiter role runs only under spawn_waiter"
    );
    let f = open_rw(Path::new(&std::env::var("KFD_EMU_TEST_PATH").unwrap()));
    // SAFETY: gettid has no preconditions.
    say(&format!("waiting tid={}", unsafe { libc::gettid() }));
    let mut b = [0u8; 8];
    match raw_ioctl(f.as_raw_fd(), WAIT, &mut b) {
        Ok(()) => say("result=ok"),
        Err(e) => say(&format!("result=errno{e}")),
    }
}

struct Waiter {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
    /// The thread blocked in the ioctl.
    tid: u32,
}

fn spawn_waiter(path: &Path) -> Waiter {
    let mut child = helper(
        "waiter",
        "waiter",
        &[("KFD_EMU_TEST_PATH", path.display().to_string())],
        false,
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let tid = loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "waiter exited early");
        // The harness's "test waiter ... " precedes it on the same line.
        if let Some((_, t)) = line.trim().split_once("waiting tid=") {
            break t.parse().unwrap();
        }
    };
    Waiter { child, out, tid }
}

fn finish_waiter(mut w: Waiter) -> String {
    let mut s = String::new();
    w.out.read_to_string(&mut s).unwrap();
    assert!(w.child.wait().unwrap().success());
    s
}

#[test]
fn parked_wait_is_interruptible() {
    if role().is_none() {
        return run_in_ns("parked_wait_is_interruptible", "body");
    }
    let tmp = scratch_dir("intr");
    let dir = tmp.path();
    let double = Arc::new(Double::default());
    let (m, _backing) = serve(dir, double);

    // SIGSTOP: the task must stop (T), not hang in D.
    let w = spawn_waiter(m.target());
    let (pid, tid) = (w.child.id(), w.tid);
    assert!(wait_for(10, || m.parked() == 1), "WAIT never parked");
    assert_eq!(proc_state(tid), Some('S'), "blocked interruptibly");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    assert!(
        wait_for(5, || proc_state(tid) == Some('T')),
        "task did not stop: state {:?}",
        proc_state(tid)
    );
    assert_eq!(m.parked(), 0, "interrupt answered the parked request");
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    let out = finish_waiter(w);
    assert!(
        out.contains(&format!("result=errno{}", libc::EINTR)),
        "{out}"
    );

    // PTRACE_SEIZE + PTRACE_INTERRUPT of the blocked thread, as CRIU does
    // for every thread.
    let w = spawn_waiter(m.target());
    let tid = w.tid as i32;
    assert!(wait_for(10, || m.parked() == 1), "WAIT never parked");
    // SAFETY: ptrace request on our own child's thread, null arguments.
    assert_eq!(unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) }, 0);
    // SAFETY: as above.
    let r = unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) };
    assert_eq!(r, 0);
    let mut status = 0;
    // SAFETY: waitpid on our own tracee into a local.
    let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
    assert_eq!(r, tid);
    assert!(libc::WIFSTOPPED(status), "status {status:#x}");
    assert_eq!(proc_state(tid as u32), Some('t'));
    assert_eq!(m.parked(), 0, "interrupt answered the parked request");
    // SAFETY: detaching our tracee.
    unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
    let out = finish_waiter(w);
    assert!(
        out.contains(&format!("result=errno{}", libc::EINTR)),
        "{out}"
    );

    m.unmount().unwrap();
    tmp.close().unwrap();
}

extern "C" fn on_usr1(_: i32) {}

/// An empty SIGUSR1 handler, so the signal interrupts a call without
/// killing the process.
fn catch_usr1() {
    // SAFETY: installing a handler that does nothing.
    unsafe { libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t) };
}

/// SIGUSR1 to thread `tid` of this process.
fn usr1(tid: i32) {
    // SAFETY: signalling a thread of this process.
    unsafe { libc::syscall(libc::SYS_tgkill, std::process::id(), tid, libc::SIGUSR1) };
}

/// The 8-byte ioctl `cmd` on `fd`, made by a new thread: the thread
/// (whose result is the value read back) and its tid.
fn ioctl_in_thread(fd: i32, cmd: u32) -> (std::thread::JoinHandle<Result<u64, i32>>, i32) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() }).unwrap();
        let mut b = [0u8; 8];
        raw_ioctl(fd, cmd, &mut b).map(|_| u64::from_ne_bytes(b))
    });
    (t, rx.recv().unwrap())
}

#[test]
fn interrupt_during_the_call() {
    if role().is_none() {
        return run_in_ns("interrupt_during_the_call", "body");
    }
    let tmp = scratch_dir("incall");
    let dir = tmp.path();
    let (m, _backing) = serve(dir, Arc::new(Double::default()));
    let f = open_rw(m.target());
    catch_usr1();

    for (cmd, want) in [(SLOW, Ok(1u64)), (SLOW_PARK, Err(libc::EINTR))] {
        let (t, tid) = ioctl_in_thread(f.as_raw_fd(), cmd);
        std::thread::sleep(Duration::from_millis(100));
        usr1(tid);
        // A request the device completes in the call is not disturbed; one
        // it parks is answered EINTR as soon as the call returns.
        assert_eq!(t.join().unwrap(), want, "cmd {cmd:#x}");
        assert_eq!(m.parked(), 0);
    }
    drop(f);
    m.unmount().unwrap();
    tmp.close().unwrap();
}

/// The transport hands an interrupt of a parked request to the device
/// (`FileOps::interrupt`): a device that forgets the request answers it
/// EINTR itself, both when the request was parked before the interrupt and
/// when the interrupt came while the call was still running; a device that
/// says its answer is on the way is trusted, and that answer reaches the
/// caller.  (The device declining is `parked_wait_is_interruptible`.)
#[test]
fn interrupt_is_passed_to_the_device() {
    if role().is_none() {
        return run_in_ns("interrupt_is_passed_to_the_device", "body");
    }
    let tmp = scratch_dir("intrdev");
    let dir = tmp.path();
    let double = Arc::new(Double::default());
    let (m, _backing) = serve(dir, double.clone());
    let f = open_rw(m.target());
    let g = open_rw(m.target());
    catch_usr1();
    let start = |cmd: u32| ioctl_in_thread(f.as_raw_fd(), cmd);

    *double.on_interrupt.lock().unwrap() = OnInterrupt::Cancel;
    // Parked, then interrupted.
    let (t, tid) = start(WAIT);
    assert!(wait_for(5, || m.parked() == 1), "WAIT never parked");
    usr1(tid);
    assert_eq!(t.join().unwrap(), Err(libc::EINTR));
    assert_eq!(double.held(), 0, "the device forgot the request");
    assert_eq!(double.interrupted.lock().unwrap().len(), 1);
    // Interrupted inside the call, parked by it afterwards.
    let (t, tid) = start(SLOW_PARK);
    std::thread::sleep(Duration::from_millis(100));
    usr1(tid);
    assert_eq!(t.join().unwrap(), Err(libc::EINTR));
    assert_eq!(double.held(), 0, "the device forgot the request");
    assert_eq!(double.interrupted.lock().unwrap().len(), 2);
    assert_eq!(m.parked(), 0);

    // The device's answer is on the way: the transport must not answer
    // EINTR over it.
    *double.on_interrupt.lock().unwrap() = OnInterrupt::Keep;
    let (t, tid) = start(WAIT);
    assert!(wait_for(5, || m.parked() == 1), "WAIT never parked");
    usr1(tid);
    assert!(wait_for(5, || double.interrupted.lock().unwrap().len() == 3));
    std::thread::sleep(Duration::from_millis(100));
    assert!(!t.is_finished(), "the transport answered over the device");
    assert_eq!(m.parked(), 1);
    let mut post = 7u64.to_ne_bytes();
    raw_ioctl(g.as_raw_fd(), POST, &mut post).unwrap();
    assert_eq!(t.join().unwrap(), Ok(7));
    assert_eq!(m.parked(), 0);

    drop(f);
    drop(g);
    m.unmount().unwrap();
    tmp.close().unwrap();
}

/// Child role: serves $KFD_EMU_TEST_PATH until killed.  Not a test of its
/// own: `daemon_death_gives_econnaborted` runs it.
#[test]
#[ignore = "child role of daemon_death_gives_econnaborted, run by it"]
fn daemon() {
    assert_eq!(
        role().as_deref(),
        Some("daemon"),
        "the daemon role runs only under daemon_death_gives_econnaborted"
    );
    let target = std::path::PathBuf::from(std::env::var("KFD_EMU_TEST_PATH").unwrap());
    let backing = memfd(1 << 20);
    let _m = fuse::serve_file(
        "daemon",
        &target,
        backing.as_fd(),
        Arc::new(Double::default()),
        2,
    )
    .unwrap();
    say("ready");
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

#[test]
fn daemon_death_gives_econnaborted() {
    if role().is_none() {
        return run_in_ns("daemon_death_gives_econnaborted", "body");
    }
    let tmp = scratch_dir("death");
    let dir = tmp.path();
    let target = dir.join("kfd");
    std::fs::write(&target, b"").unwrap();
    let mut d = helper(
        "daemon",
        "daemon",
        &[("KFD_EMU_TEST_PATH", target.display().to_string())],
        false,
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(d.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.unwrap().ends_with("ready")),
        "daemon never ready"
    );

    let f = open_rw(&target);
    let fd = f.as_raw_fd();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut b = [0u8; 8];
        tx.send(raw_ioctl(fd, WAIT, &mut b)).unwrap();
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        rx.try_recv().is_err(),
        "WAIT returned before the daemon died"
    );
    d.kill().unwrap();
    d.wait().unwrap();
    let r = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("blocked ioctl hung after daemon death");
    assert_eq!(r, Err(libc::ECONNABORTED));
    drop(f);
    let c = std::ffi::CString::new(target.to_str().unwrap()).unwrap();
    // SAFETY: detaching the dead mount by a valid path.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    tmp.close().unwrap();
}

/// kfd-emu's dma-buf files look like the kernel's to the process: the fd
/// link reads `/dmabuf:`, no mount of theirs is visible, reads and
/// mappings reach the memfd behind them (and writes through a mapping
/// land there), each dma-buf is its own inode, lseek gives its size, a
/// reopen through /proc is refused, and one opened read-only refuses a
/// writable shared mapping (EACCES).
#[test]
fn dmabuf_files_read_dmabuf_and_reach_their_memfd() {
    if role().is_none() {
        return run_in_ns("dmabuf_files_read_dmabuf_and_reach_their_memfd", "body");
    }
    let fs = fuse::dmabuf::DmabufFs::mount().unwrap();
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::{FileExt, MetadataExt};
    let mem = std::fs::File::from(memfd(8192));
    mem.write_all_at(b"bo bytes", 4096).unwrap();
    let a = fs.open(mem.as_fd(), 8192, true).unwrap();
    let b = fs.open(memfd(4096).as_fd(), 4096, true).unwrap();
    let link = std::fs::read_link(format!("/proc/self/fd/{}", a.as_raw_fd())).unwrap();
    assert_eq!(link, Path::new("/dmabuf:"));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains("fuse.kfd-emu"),
        "the dma-buf fs is detached:\n{mounts}"
    );
    let (mut sa, sb) = (std::fs::File::from(a), std::fs::File::from(b));
    let (ma, mb) = (sa.metadata().unwrap(), sb.metadata().unwrap());
    assert_eq!(ma.dev(), mb.dev(), "one fs");
    assert_ne!(ma.ino(), mb.ino(), "one inode per dma-buf");
    assert_eq!((ma.len(), mb.len()), (8192, 4096));
    assert_eq!(sa.seek(SeekFrom::End(0)).unwrap(), 8192, "lseek: the size");
    let mut got = [0u8; 8];
    sa.read_exact_at(&mut got, 4096).unwrap();
    assert_eq!(&got, b"bo bytes");
    // SAFETY: a fresh shared mapping of a live fd, used only below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            sa.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        maps.lines()
            .any(|l| l.starts_with(&format!("{:x}-", p as usize)) && l.ends_with(" /dmabuf:")),
        "the mapping names the dma-buf:\n{maps}"
    );
    // SAFETY: inside the 8 KiB mapping.
    unsafe { p.cast::<u8>().write_volatile(0x5a) };
    let mut first = [0u8; 1];
    mem.read_exact_at(&mut first, 0).unwrap();
    assert_eq!(
        first[0], 0x5a,
        "a write through the mapping reaches the memfd"
    );
    // SAFETY: unmapping our mapping.
    unsafe { libc::munmap(p, 8192) };
    // A reopen is refused (it would not be the same dma-buf).
    let reopen = std::fs::File::open(format!("/proc/self/fd/{}", sa.as_raw_fd()));
    assert!(reopen.is_err(), "a reopen of a dma-buf file");
    drop(sb);
    let c = fs.open(mem.as_fd(), 8192, true).unwrap();
    let mc = std::fs::File::from(c).metadata().unwrap();
    assert_ne!(mc.ino(), ma.ino(), "a new dma-buf of the same memfd");
    // One made read-only (PRIME without DRM_RDWR): O_RDONLY, and a shared
    // writable mapping of it fails EACCES while a read-only one works.
    let r = fs.open(mem.as_fd(), 8192, false).unwrap();
    // SAFETY: F_GETFL on a live fd.
    let fl = unsafe { libc::fcntl(r.as_raw_fd(), libc::F_GETFL) };
    assert_eq!(fl & libc::O_ACCMODE, libc::O_RDONLY);
    for (prot, want) in [
        (libc::PROT_READ | libc::PROT_WRITE, Some(libc::EACCES)),
        (libc::PROT_READ, None),
    ] {
        // SAFETY: a fresh shared mapping of a live fd, unmapped at once.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                prot,
                libc::MAP_SHARED,
                r.as_raw_fd(),
                0,
            )
        };
        let err = (p == libc::MAP_FAILED)
            .then(|| std::io::Error::last_os_error().raw_os_error())
            .flatten();
        assert_eq!(err, want, "mmap with prot {prot:#x}");
        if p != libc::MAP_FAILED {
            // SAFETY: unmapping our mapping.
            unsafe { libc::munmap(p, 8192) };
        }
    }
}
