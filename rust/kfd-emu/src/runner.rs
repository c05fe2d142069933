//! `kfd-emu run`: a private mount namespace in which `/dev/kfd`,
//! `/dev/dri/renderD<minor>` and the KFD and DRM sysfs entries
//! ([`crate::sysfs`]) are the emulated ones, and a command running in it.
//!
//! Placement: the FUSE daemon is a set of threads in this (runner)
//! process, which is the command's parent and so outside any tree CRIU is
//! asked to dump, even when the command itself runs criu.  Everything
//! mounted lives only in the new namespace, which dies with its last
//! process; the runner is a child subreaper and kills every descendant
//! left when the command exits, so nothing outlives a run.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::fuse;
use crate::os_err;
use crate::profile::Profile;
use crate::serve::{Devices, NodeSpec};
use crate::sysfs::live;

/// Environment variables set for the command, for test scripts and
/// humans.  Product code must not look at them.
pub const ENV_PROFILE: &str = "KFD_EMU_PROFILE";
pub const ENV_STATE_DIR: &str = "KFD_EMU_STATE_DIR";

pub struct RunOptions {
    pub profile: Profile,
    pub state_dir: Option<PathBuf>,
    pub cmd: Vec<OsString>,
    /// FUSE worker threads per device node.
    pub threads: usize,
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

fn mount(
    src: Option<&Path>,
    dst: &Path,
    fstype: Option<&str>,
    flags: u64,
    data: Option<&str>,
) -> io::Result<()> {
    let src_c = src.map(cstr).transpose()?;
    let dst_c = cstr(dst)?;
    let fs_c = fstype.map(|s| CString::new(s).expect("no NUL"));
    let data_c = data.map(|s| CString::new(s).expect("no NUL"));
    // SAFETY: every pointer is null or a valid NUL-terminated string that
    // outlives the call.
    let r = unsafe {
        libc::mount(
            src_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            dst_c.as_ptr(),
            fs_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            flags,
            data_c
                .as_ref()
                .map_or(std::ptr::null(), |c| c.as_ptr().cast()),
        )
    };
    if r != 0 {
        return Err(os_err(format!(
            "mount {} on {}",
            src.map_or("-".into(), |s| s.display().to_string()),
            dst.display()
        )));
    }
    Ok(())
}

/// Enters a new mount namespace whose mounts do not propagate back.  Must
/// run before the process has other threads.
pub fn enter_private_mount_ns() -> io::Result<()> {
    // SAFETY: unshare has no memory preconditions.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(os_err("unshare(CLONE_NEWNS) (needs root, single-threaded)"));
    }
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
}

/// Covers `dir` with a tmpfs that re-exposes every original entry except
/// `replace` (directories and files bind-mounted from the original,
/// symlinks recreated), then lets `populate` add its own entries.
///
/// Needed because /dev is a devtmpfs shared with the host and sysfs takes
/// no mkdir: this is how a namespace gets extra entries there while
/// everything else (/dev/null, /dev/pts, /sys/class/net, ...) keeps
/// working.
pub fn overlay_dir(
    dir: &Path,
    replace: &[&str],
    populate: impl FnOnce(&Path) -> io::Result<()>,
) -> io::Result<()> {
    let orig = std::fs::File::open(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    let mode = orig.metadata()?.permissions().mode() & 0o7777;
    let mut entries = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        if replace.iter().any(|r| name.as_bytes() == r.as_bytes()) {
            continue;
        }
        entries.push(name);
    }
    mount(
        Some(Path::new("tmpfs")),
        dir,
        Some("tmpfs"),
        libc::MS_NOSUID,
        Some(&format!("mode={mode:o}")),
    )?;
    let via = PathBuf::from(format!("/proc/self/fd/{}", orig.as_raw_fd()));
    for name in entries {
        let src = via.join(&name);
        let dst = dir.join(&name);
        let r = (|| -> io::Result<()> {
            let md = std::fs::symlink_metadata(&src)?;
            let ft = md.file_type();
            if ft.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)
            } else if ft.is_dir() {
                std::fs::create_dir(&dst)?;
                std::fs::set_permissions(&dst, md.permissions())?;
                mount(Some(&src), &dst, None, libc::MS_BIND | libc::MS_REC, None)
            } else {
                std::fs::File::create(&dst)?;
                mount(Some(&src), &dst, None, libc::MS_BIND, None)
            }
        })();
        if let Err(e) = r {
            log::warn!("{}: not re-exposed: {e}", dst.display());
        }
    }
    populate(dir)
}

fn placeholder(path: &Path) -> io::Result<()> {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::File::create(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
}

/// Adds one sysfs entry below an overlay's `root`, files 0444.
fn add_entry(profile: &Profile, root: &Path, e: &crate::sysfs::Entry) -> io::Result<()> {
    use crate::sysfs::Entry;
    let parent_of = |p: &Path| -> io::Result<()> {
        match p.parent() {
            Some(d) => std::fs::create_dir_all(d),
            None => Ok(()),
        }
    };
    let ctx = |p: &Path, e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", p.display()));
    let write_file = |f: &str, bytes: &[u8]| -> io::Result<()> {
        let p = root.join(f);
        parent_of(&p)?;
        std::fs::write(&p, bytes).map_err(|e| ctx(&p, e))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444))
    };
    match e {
        Entry::Dir(d) => std::fs::create_dir_all(root.join(d)),
        Entry::File(f, text) => write_file(f, text.as_bytes()),
        Entry::Bytes(f, bytes) => write_file(f, bytes),
        Entry::Symlink(l, target) => {
            let p = root.join(l);
            parent_of(&p)?;
            std::os::unix::fs::symlink(target, &p).map_err(|e| ctx(&p, e))
        }
        Entry::Topology(d) => crate::topology::write_tree(profile, &root.join(d)),
    }
}

/// Builds the namespace's /dev and sysfs (see [`crate::sysfs`]), serves
/// `nodes` and gives `live` the writable clones of its live overlays.
fn build_namespace(
    profile: &Profile,
    nodes: Vec<NodeSpec>,
    threads: usize,
    live: Option<&crate::serve::LiveSysfs>,
) -> io::Result<Vec<fuse::Mount>> {
    dev_overlay(&nodes)?;
    let host = crate::sysfs::Host::probe();
    let backed = crate::sysfs::host_profile(profile, &host);
    let profile = &backed;
    let mut clones = std::collections::HashMap::new();
    for o in crate::sysfs::overlays(profile, &host) {
        let dir = Path::new(&o.dir);
        let replace: Vec<&str> = o.replace.iter().map(String::as_str).collect();
        overlay_dir(dir, &replace, |root| {
            for e in &o.entries {
                add_entry(profile, root, e)?;
            }
            Ok(())
        })?;
        if [live::DEVICES, live::VIRTUAL].contains(&o.dir.as_str()) {
            clones.insert(o.dir.clone(), live::clone_mount(&o.dir)?);
        }
        // Read-only like sysfs, this mount only (the clones stay
        // writable); the bind mounts in it keep their own flags.
        mount(
            None,
            dir,
            None,
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID,
            None,
        )?;
    }
    if let Some(l) = live {
        let mut take = |d: &str| {
            clones.remove(d).ok_or_else(|| {
                io::Error::other(format!("no overlay of {d} to write live files in"))
            })
        };
        l.attach(take(live::DEVICES)?, take(live::VIRTUAL)?)?;
    }
    let mut mounts = Vec::new();
    for n in nodes {
        let name = n
            .path
            .file_name()
            .map_or("node".into(), |s| s.to_string_lossy().into_owned());
        mounts.push(fuse::serve_file(
            &name,
            &n.path,
            n.backing.as_fd(),
            n.ops,
            threads,
        )?);
    }
    Ok(mounts)
}

/// `/dev` with a placeholder for each node to serve.
fn dev_overlay(nodes: &[NodeSpec]) -> io::Result<()> {
    let dev = Path::new("/dev");
    let mut top: Vec<String> = Vec::new();
    for n in nodes {
        let rel = n.path.strip_prefix(dev).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("device node {} is not under /dev", n.path.display()),
            )
        })?;
        let first = rel.components().next().expect("non-empty").as_os_str();
        top.push(first.to_string_lossy().into_owned());
    }
    let replace: Vec<&str> = top.iter().map(String::as_str).collect();
    overlay_dir(dev, &replace, |_| {
        for n in nodes {
            placeholder(&n.path)?;
        }
        Ok(())
    })
}

const FORWARDED: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

fn runner_sigset() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    for s in FORWARDED.iter().chain(&[libc::SIGCHLD]) {
        // SAFETY: as above; `s` is a valid signal number.
        unsafe { libc::sigaddset(&mut set, *s) };
    }
    set
}

/// The stdio fds to reopen by path inside the new namespace: they were
/// opened in the caller's mount namespace, and CRIU cannot dump a task
/// holding a file whose mount is not in the task's namespace.  Character
/// devices (/dev/null, terminals) and append-mode regular files qualify;
/// other regular files keep their fd, because a second open file
/// description would not share the caller's file offset.
fn stdio_to_reopen() -> Vec<(i32, CString, i32)> {
    let mut v = Vec::new();
    for fd in 0..3 {
        let Ok(path) = std::fs::read_link(format!("/proc/self/fd/{fd}")) else {
            continue;
        };
        let Ok(md) = std::fs::metadata(&path) else {
            continue;
        };
        // SAFETY: F_GETFL on a possibly-closed fd just fails.
        let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if fl < 0 {
            continue;
        }
        let append = fl & libc::O_APPEND != 0;
        if !(md.file_type().is_char_device() || (md.file_type().is_file() && append)) {
            continue;
        }
        let Ok(c) = cstr(&path) else { continue };
        v.push((
            fd,
            c,
            (fl & (libc::O_ACCMODE | libc::O_APPEND)) | libc::O_NOCTTY,
        ));
    }
    v
}

/// Kills every remaining descendant (they were reparented to us, the
/// subreaper) until none is left.
fn kill_descendants() {
    for round in 0..50 {
        let mut kids = Vec::new();
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for t in tasks.flatten() {
                if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                    kids.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
                }
            }
        }
        if kids.is_empty() {
            return;
        }
        let sig = if round == 0 {
            libc::SIGTERM
        } else {
            libc::SIGKILL
        };
        for k in &kids {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(*k, sig) };
        }
        if round == 0 {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        loop {
            let mut st = 0;
            // SAFETY: reaping any child into a local.
            let r = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG | libc::__WALL) };
            if r <= 0 {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    log::error!("descendants survive SIGKILL");
}

/// A state directory of this instance alone under the temporary directory,
/// removed when dropped. Not named by the pid: emulators in other pid
/// namespaces (test suites, `unshare --pid`) share /tmp and may have the
/// same pid, and one would take the other's supervisor socket or remove its
/// directory; `tempfile` picks a random name and creates it exclusively.
fn new_state_dir() -> io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("kfd-emu.")
        .tempdir()
        .map_err(|e| io::Error::new(e.kind(), format!("state directory: {e}")))
}

/// Runs `opts.cmd` in a namespace with the devices `make` creates.
/// Returns the exit code to pass on (128 + signal for a killed command).
pub fn run(
    opts: RunOptions,
    make: impl FnOnce(&Profile) -> io::Result<Devices>,
) -> io::Result<i32> {
    fuse::check_request_timeouts()?;
    if opts.cmd.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no command given after --",
        ));
    }
    enter_private_mount_ns()?;
    // Blocked before any thread exists, so every thread inherits the mask
    // and the signals are taken only by sigwaitinfo below.
    let set = runner_sigset();
    // SAFETY: `set` is initialised; no old mask wanted.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };

    let (state_dir, own_state_dir) = state_dir(&opts)?;
    std::fs::write(state_dir.join("profile.toml"), opts.profile.to_toml())?;
    let devices = make(&opts.profile)?;
    let mounts = build_namespace(
        &opts.profile,
        devices.nodes,
        opts.threads,
        devices.live.as_deref(),
    )?;
    if let Some(h) = devices.supervisor {
        crate::supervise::listen(&state_dir, h)?;
    }
    log::info!(
        "profile {}: {} device node(s) served",
        opts.profile.name,
        mounts.len()
    );

    let tty_fg = is_tty_foreground();
    let pid = spawn_command(&opts, &state_dir, tty_fg)?;
    let status = wait_child(pid, &set);
    if tty_fg {
        // SAFETY: as in spawn_command's hook; taking the terminal back for
        // our group.
        unsafe { libc::signal(libc::SIGTTOU, libc::SIG_IGN) };
        // SAFETY: getpgrp has no preconditions.
        let pgrp = unsafe { libc::getpgrp() };
        // SAFETY: fd 0 is the terminal.
        unsafe { libc::tcsetpgrp(0, pgrp) };
    }
    kill_descendants();
    (devices.shutdown)();
    drop(mounts);
    drop(own_state_dir);
    Ok(if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    })
}

/// The run's state directory: `--state-dir`'s, which outlives the run, or
/// our own, which goes with it (returned to be dropped at the end).
fn state_dir(opts: &RunOptions) -> io::Result<(PathBuf, Option<tempfile::TempDir>)> {
    match &opts.state_dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", d.display())))?;
            Ok((d.clone(), None))
        }
        None => {
            let dir = new_state_dir()?;
            Ok((dir.path().to_owned(), Some(dir)))
        }
    }
}

/// Starts the command in a process group of its own (the terminal's
/// foreground group when `tty_fg`), dying with us, with our stdio reopened
/// in the namespace and no other inherited fd; its pid.
fn spawn_command(opts: &RunOptions, state_dir: &Path, tty_fg: bool) -> io::Result<i32> {
    let reopen = stdio_to_reopen();
    let mut cmd = Command::new(&opts.cmd[0]);
    cmd.args(&opts.cmd[1..])
        .env(ENV_PROFILE, &opts.profile.name)
        .env(ENV_STATE_DIR, state_dir)
        .process_group(0);
    let hook = move || {
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
        for (fd, path, flags) in &reopen {
            // SAFETY: `path` is a valid C string; fds are ours.
            let nfd = unsafe { libc::open(path.as_ptr(), *flags) };
            if nfd >= 0 && nfd != *fd {
                // SAFETY: dup2/close on fds this process owns.
                unsafe { libc::dup2(nfd, *fd) };
                // SAFETY: as above.
                unsafe { libc::close(nfd) };
            }
        }
        // Inherited fds from the host namespace would make the command's
        // tree undumpable; std's own exec-error pipe is already CLOEXEC.
        // SAFETY: close_range with integer arguments.
        unsafe {
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            )
        };
        if tty_fg {
            // SAFETY: ignoring SIGTTOU so a background group may take the
            // terminal, then restoring the default for the command.
            unsafe {
                libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            }
            // SAFETY: getpid has no preconditions.
            let me = unsafe { libc::getpid() };
            // SAFETY: fd 0 is the terminal; our own process group.
            unsafe { libc::tcsetpgrp(0, me) };
            // SAFETY: restoring the default disposition.
            unsafe { libc::signal(libc::SIGTTOU, libc::SIG_DFL) };
        }
        let empty = runner_sigset_empty();
        // SAFETY: unblocking everything for the command.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) };
        Ok(())
    };
    // SAFETY: the hook makes only async-signal-safe calls after fork.
    unsafe { cmd.pre_exec(hook) };
    let child = cmd.spawn().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("starting {}: {e}", opts.cmd[0].to_string_lossy()),
        )
    })?;
    Ok(child.id() as i32)
}

fn is_tty_foreground() -> bool {
    // SAFETY: isatty on fd 0 has no memory preconditions.
    if unsafe { libc::isatty(0) } != 1 {
        return false;
    }
    // SAFETY: as above.
    let fg = unsafe { libc::tcgetpgrp(0) };
    // SAFETY: getpgrp has no preconditions.
    fg == unsafe { libc::getpgrp() }
}

fn runner_sigset_empty() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    set
}

/// Waits for the command, forwarding termination signals to its process
/// group (a repeated one escalates to SIGKILL) and reaping orphans.
fn wait_child(pid: i32, set: &libc::sigset_t) -> i32 {
    let mut forwarded = 0;
    loop {
        // Reap first: SIGCHLD may have arrived before we started waiting.
        loop {
            let mut st = 0;
            // SAFETY: reaping any child into a local.
            let r = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG | libc::__WALL) };
            if r == pid {
                return st;
            }
            if r <= 0 {
                break;
            }
        }
        // SAFETY: siginfo_t is plain data filled by the kernel.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` and `info` are valid for the call.
        let sig = unsafe { libc::sigwaitinfo(set, &mut info) };
        if sig > 0 && FORWARDED.contains(&sig) {
            forwarded += 1;
            let s = if forwarded > 1 { libc::SIGKILL } else { sig };
            // SAFETY: signalling the command's process group.
            unsafe { libc::kill(-pid, s) };
        }
    }
}
