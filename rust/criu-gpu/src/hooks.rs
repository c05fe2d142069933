//! The GPU hooks CRIU calls, one `extern "C"` entry each: arguments in,
//! a call into `amdgpu_cr::session`, `0`/`-errno` out.  The session state
//! lives in statics here; after `fork` every restored task has its own copy.

use std::ffi::{c_char, c_int, CStr};
use std::os::fd::{BorrowedFd, IntoRawFd};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

use amdgpu_cr::image::FileId;
use amdgpu_cr::plan::{DeviceIdentities, DeviceKind};
use amdgpu_cr::session::dump::{DumpOptions, DumpSession, Dumped};
use amdgpu_cr::session::incomplete;
use amdgpu_cr::session::restore::{self, RestoreOptions, RestoreSession, ResumeSet};
use amdgpu_cr::session::writer::Writer;
use amdgpu_cr::session::{kfd_image_ids, SessionError};

use crate::ffi_boundary;

static DUMP: Mutex<Option<DumpSession>> = Mutex::new(None);
static RESTORE: Mutex<Option<RestoreSession>> = Mutex::new(None);
static RESUME: Mutex<Option<ResumeSet>> = Mutex::new(None);
/// criu main's GPU memory writer (a restore with GPU images only).
static WRITER: Mutex<Option<Writer>> = Mutex::new(None);
static DEVICES: OnceLock<DeviceIdentities> = OnceLock::new();

/// This host's GPU device files, probed once: the mappings CRIU classifies
/// and the files the dump session pauses are recognised by the same set.
fn devices() -> &'static DeviceIdentities {
    DEVICES.get_or_init(|| DeviceIdentities::probe(std::path::Path::new("/dev")))
}

/// A lock that a panic in an earlier hook did not make unusable.
fn lock<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn fail(e: SessionError) -> c_int {
    log::error!("{e}");
    -e.errno()
}

/// The image directory CRIU holds open as `fd`.
fn image_dir(fd: c_int) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

/// What a `stat` describes: `0` not a GPU device file, `1` `/dev/kfd`,
/// `2` a render node of this host (emulated nodes: regular files compared
/// by device and inode; real ones: character devices compared by rdev).
#[no_mangle]
pub extern "C" fn criu_gpu_device_kind(mode: u32, dev: u64, ino: u64, rdev: u64) -> c_int {
    ffi_boundary("criu_gpu_device_kind", || {
        // SAFETY: libc::stat is plain old data; all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        st.st_mode = mode;
        st.st_dev = dev;
        st.st_ino = ino;
        st.st_rdev = rdev;
        let devices = devices();
        match devices.classify(&st) {
            None => 0,
            Some(DeviceKind::Kfd) => 1,
            Some(DeviceKind::Render(_)) => 2,
        }
    })
}

/// Starts the GPU part of a dump (reads `KFD_MAX_BUFFER_SIZE` and
/// `CRIU_ROCM_COPY_ENGINE`; a bad value fails the dump before anything is
/// frozen) and marks the image directory `imgdir_fd` as holding an
/// incomplete dump until [`criu_gpu_dump_complete`] (`-1`: no directory,
/// the images are streamed).  `log_fd` is CRIU's log, where the GPU
/// guardian and the signal handler write should criu-rocm die.
#[no_mangle]
pub extern "C" fn criu_gpu_dump_init(imgdir_fd: c_int, log_fd: c_int) -> c_int {
    ffi_boundary("criu_gpu_dump_init", || {
        let mut o = match DumpOptions::from_env() {
            Ok(o) => o,
            Err(e) => {
                log::error!("{e}");
                return -e.errno();
            }
        };
        o.log_fd = (log_fd >= 0).then_some(log_fd);
        if imgdir_fd >= 0 {
            let dir = image_dir(imgdir_fd);
            if let Err(e) = incomplete::mark(&dir, std::process::id()) {
                log::error!(
                    "{}: {e} (writing {}, which marks the images incomplete until the dump completes)",
                    dir.display(),
                    incomplete::MARKER
                );
                return -e.raw_os_error().unwrap_or(libc::EIO);
            }
        }
        *lock(&DUMP) = Some(DumpSession::new(o, devices().clone()));
        0
    })
}

/// Every image of the dump is written (before CRIU's post-dump scripts):
/// the image directory `imgdir_fd` loses its incomplete-dump mark.
#[no_mangle]
pub extern "C" fn criu_gpu_dump_complete(imgdir_fd: c_int) -> c_int {
    ffi_boundary("criu_gpu_dump_complete", || {
        let dir = image_dir(imgdir_fd);
        match incomplete::clear(&dir) {
            Ok(()) => 0,
            Err(e) => {
                log::error!("{}: removing {}: {e}", dir.display(), incomplete::MARKER);
                -e.raw_os_error().unwrap_or(libc::EIO)
            }
        }
    })
}

/// Pauses the GPU queues of task `pid` (real pid, frozen and seized by
/// the calling thread).  Returns the number of KFD processes paused.
#[no_mangle]
pub extern "C" fn criu_gpu_pause_task(pid: c_int) -> c_int {
    ffi_boundary("criu_gpu_pause_task", || {
        let mut g = lock(&DUMP);
        let Some(s) = g.as_mut() else { return 0 };
        match s.pause_task(pid) {
            Ok(n) => n as c_int,
            Err(e) => fail(e),
        }
    })
}

/// Dumps device file `fd` (CRIU's copy of a task's file `id`) into the
/// image directory `imgdir_fd`; the task is found by the open file.  `1`: a
/// KFD file, `2`: a render node, `-ENOTSUP`: not a GPU file.
#[no_mangle]
pub extern "C" fn criu_gpu_dump_file(fd: c_int, id: u32, imgdir_fd: c_int) -> c_int {
    ffi_boundary("criu_gpu_dump_file", || {
        let mut g = lock(&DUMP);
        let Some(s) = g.as_mut() else {
            return -libc::ENOTSUP;
        };
        // SAFETY: CRIU keeps `fd` open for the duration of the hook.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        match s.dump_file(fd, FileId(id), &image_dir(imgdir_fd)) {
            Ok(None) => -libc::ENOTSUP,
            Ok(Some(Dumped::Kfd)) => 1,
            Ok(Some(Dumped::Render(_))) => 2,
            Err(e) => fail(e),
        }
    })
}

/// After every task's memory is dumped: every paused KFD process must have
/// been saved.
#[no_mangle]
pub extern "C" fn criu_gpu_dump_late() -> c_int {
    ffi_boundary("criu_gpu_dump_late", || {
        let g = lock(&DUMP);
        match g.as_ref().map(|s| s.check_complete()) {
            Some(Err(e)) => fail(e),
            _ => 0,
        }
    })
}

/// Ends the dump; `resume` non-zero when the tree will run again, so its
/// GPU queues are unpaused.  `-EIO` if any could not be.
#[no_mangle]
pub extern "C" fn criu_gpu_dump_finish(resume: c_int) -> c_int {
    ffi_boundary("criu_gpu_dump_finish", || {
        let Some(mut s) = lock(&DUMP).take() else {
            return 0;
        };
        if s.finish(resume != 0) == 0 {
            0
        } else {
            -libc::EIO
        }
    })
}

/// First thing of a restore: `-EINVAL` (and the reason logged) when the
/// image directory `imgdir_fd` holds a dump that did not complete.
#[no_mangle]
pub extern "C" fn criu_gpu_restore_check(imgdir_fd: c_int) -> c_int {
    ffi_boundary("criu_gpu_restore_check", || {
        match incomplete::check(&image_dir(imgdir_fd)) {
            Ok(()) => 0,
            Err(why) => {
                log::error!("{why}");
                -libc::EINVAL
            }
        }
    })
}

/// Starts the GPU part of a restore in criu main (reads the `KFD_*_CHECK`,
/// `KFD_MAX_BUFFER_SIZE` and `CRIU_ROCM_COPY_ENGINE` knobs).  When the
/// images in `imgdir_fd` hold a KFD process, also starts the GPU memory
/// writer; without one (it could not start) the tasks copy by themselves.
#[no_mangle]
pub extern "C" fn criu_gpu_restore_init(imgdir_fd: c_int) -> c_int {
    ffi_boundary("criu_gpu_restore_init", || {
        let o = match RestoreOptions::from_env() {
            Ok(o) => o,
            Err(e) => {
                log::error!("{e}");
                return -e.errno();
            }
        };
        let mut session = RestoreSession::new(o.clone());
        let has_gpu = kfd_image_ids(&image_dir(imgdir_fd)).is_ok_and(|ids| !ids.is_empty());
        let writer = if has_gpu {
            match Writer::start(o.policy, o.staging_cap) {
                Ok(w) => {
                    session.use_writer(w.mailbox());
                    Some(w)
                }
                Err(e) => {
                    log::warn!("no GPU memory writer ({e}); each task copies its own");
                    None
                }
            }
        } else {
            None
        };
        *lock(&WRITER) = writer;
        *lock(&RESTORE) = Some(session);
        *lock(&RESUME) = None;
        0
    })
}

/// In criu main, once every task sits at its final sigreturn and before
/// any GPU is resumed: waits until the GPU memory writer has written every
/// task's BO contents back, then stops it.  `-errno` when a copy failed.
#[no_mangle]
pub extern "C" fn criu_gpu_restore_contents_wait() -> c_int {
    ffi_boundary("criu_gpu_restore_contents_wait", || {
        let Some(w) = lock(&WRITER).take() else {
            return 0;
        };
        match w.finish() {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// In criu main at the end of a restore: a GPU memory writer still running
/// (the restore failed before its copies were awaited) is killed and reaped.
#[no_mangle]
pub extern "C" fn criu_gpu_restore_fini() -> c_int {
    ffi_boundary("criu_gpu_restore_fini", || {
        if let Some(w) = lock(&WRITER).take() {
            w.abort();
        }
        *lock(&RESTORE) = None;
        *lock(&RESUME) = None;
        0
    })
}

/// In a restored task (pid `vpid` in its namespace, `real_pid` in criu
/// main's): restores GPU file `id` and returns its fd, or `-ENOTSUP` when
/// `id` is no GPU file.  Fds kept for later hooks are numbered `fd_floor` or
/// above.
#[no_mangle]
pub extern "C" fn criu_gpu_restore_file(
    vpid: c_int,
    real_pid: c_int,
    id: u32,
    fd_floor: c_int,
    imgdir_fd: c_int,
) -> c_int {
    ffi_boundary("criu_gpu_restore_file", || {
        let mut g = lock(&RESTORE);
        let Some(s) = g.as_mut() else {
            return -libc::ENOTSUP;
        };
        s.set_task(real_pid, imgdir_fd);
        match s.restore_file(vpid, FileId(id), fd_floor, &image_dir(imgdir_fd)) {
            Ok(Some(fd)) => fd.into_raw_fd(),
            Ok(None) => -libc::ENOTSUP,
            Err(e) => fail(e),
        }
    })
}

/// In a restored task: the new offset (`*new_pgoff`, bytes) and an fd to
/// map from (`*map_fd`, CRIU's to close) for a device mapping recorded as
/// `path` at `pgoff`, `len` bytes at `addr`.  Returns `1` when the mapping
/// is a GPU one, `0` when it is not ours.
///
/// # Safety
/// `path` is a NUL-terminated string; `new_pgoff` and `map_fd` point to
/// writable memory.
#[no_mangle]
pub unsafe extern "C" fn criu_gpu_update_vma(
    vpid: c_int,
    path: *const c_char,
    addr: u64,
    len: u64,
    pgoff: u64,
    new_pgoff: *mut u64,
    map_fd: *mut c_int,
) -> c_int {
    // SAFETY: the caller passes a valid C string (CRIU's reg-file name).
    let path = unsafe { CStr::from_ptr(path) }
        .to_string_lossy()
        .into_owned();
    let out_pgoff = new_pgoff as usize;
    let out_fd = map_fd as usize;
    ffi_boundary("criu_gpu_update_vma", move || {
        let g = lock(&RESTORE);
        let Some(s) = g.as_ref() else { return 0 };
        match s.update_vma(vpid, &path, addr, pgoff, len) {
            Ok(None) => 0,
            Ok(Some((off, fd))) => {
                // SAFETY: the caller gave writable out-params (see # Safety).
                unsafe {
                    *(out_pgoff as *mut u64) = off;
                }
                // SAFETY: as above.
                unsafe {
                    *(out_fd as *mut c_int) = fd.into_raw_fd();
                }
                1
            }
            Err(e) => fail(e),
        }
    })
}

/// In a restored task, once CRIU opened all its mappings: closes the fds
/// the GPU hooks kept, so the task's fd table is as it was at dump.
#[no_mangle]
pub extern "C" fn criu_gpu_restore_task_done(vpid: c_int) -> c_int {
    ffi_boundary("criu_gpu_restore_task_done", || {
        let mut g = lock(&RESTORE);
        match g.as_mut().map(|s| s.task_done(vpid)) {
            Some(Err(e)) => fail(e),
            _ => 0,
        }
    })
}

/// In criu main, after every restored task stopped at its final sigreturn:
/// restarts the GPU queues of task `real_pid` (`vpid` in its namespace).
/// `1` resumed, `0` the task has no GPU state, `-errno` the restore must
/// fail.
#[no_mangle]
pub extern "C" fn criu_gpu_resume(imgdir_fd: c_int, real_pid: c_int, vpid: c_int) -> c_int {
    ffi_boundary("criu_gpu_resume", || {
        let mut g = lock(&RESUME);
        if g.is_none() {
            match ResumeSet::load(&image_dir(imgdir_fd)) {
                Ok(set) => *g = Some(set),
                Err(e) => return fail(e),
            }
        }
        match g.as_ref().expect("loaded above").resume(real_pid, vpid) {
            Ok(true) => 1,
            Ok(false) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `criu-rocm gpu-check`: prints whether the images in `dir` can be
/// restored on this host and onto which GPUs, touching no device.  `0`:
/// they can; `-ENODEV`: some cannot (each reason printed); other `-errno`:
/// the directory could not be read.
///
/// # Safety
/// `dir` is a NUL-terminated path.
#[no_mangle]
pub unsafe extern "C" fn criu_gpu_dry_run(dir: *const c_char) -> c_int {
    // SAFETY: the caller passes a valid C string.
    let dir = PathBuf::from(
        unsafe { CStr::from_ptr(dir) }
            .to_string_lossy()
            .into_owned(),
    );
    ffi_boundary("criu_gpu_dry_run", move || {
        let opts = match RestoreOptions::from_env() {
            Ok(o) => o,
            Err(e) => {
                eprintln!("criu-rocm gpu-check: {e}");
                return -e.errno();
            }
        };
        if let Err(why) = incomplete::check(&dir) {
            println!("{}: NOT restorable: {why}", dir.display());
            return -libc::EINVAL;
        }
        let entries = match restore::dry_run(&dir, &opts) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("criu-rocm gpu-check: {}: {e}", dir.display());
                return -e.errno();
            }
        };
        if entries.is_empty() {
            println!(
                "{}: no GPU state in these images; nothing GPU-specific to check",
                dir.display()
            );
            return 0;
        }
        let mut bad = 0;
        for e in &entries {
            match &e.verdict {
                Ok(map) => println!("pid {} (KFD image {}): restorable: {map}", e.pid, e.id),
                Err(why) => {
                    bad += 1;
                    println!(
                        "pid {} (KFD image {}): NOT restorable here: {why}",
                        e.pid, e.id
                    );
                }
            }
        }
        if bad == 0 {
            println!(
                "{}: all {} GPU process(es) can be restored on this host",
                dir.display(),
                entries.len()
            );
            0
        } else {
            println!(
                "{}: {bad} of {} GPU process(es) cannot be restored on this host",
                dir.display(),
                entries.len()
            );
            -libc::ENODEV
        }
    })
}
