//! The GPU hooks CRIU calls, one `extern "C"` entry each: arguments in,
//! a call into `amdgpu_cr::session`, `0`/`-errno` out.  The session state
//! lives in statics here; after `fork` every restored task has its own copy.

use std::ffi::{c_char, c_int, CStr, OsStr};
use std::os::fd::{AsRawFd, BorrowedFd, IntoRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

use amdgpu_cr::image::FileId;
use amdgpu_cr::plan::{DeviceIdentities, DeviceKind};
use amdgpu_cr::session::dump::{DumpOptions, DumpSession, Dumped};
use amdgpu_cr::session::restore::{self, RestoreOptions, RestoreSession};
use amdgpu_cr::session::writer::{Writer, SLOTS};
use amdgpu_cr::session::xproc::Exchange;
use amdgpu_cr::session::HelperLog;
use amdgpu_cr::session::SessionError;
use amdgpu_cr::session::{gpu_check, incomplete};
use amdgpu_cr::validate;

use crate::ffi_boundary;

static DUMP: Mutex<Option<DumpSession>> = Mutex::new(None);
static RESTORE: Mutex<Option<RestoreSession>> = Mutex::new(None);
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

/// `--stream`: the GPU image files of this dump or restore go through
/// CRIU's image streamer, each opened once with `open` (see
/// `amdgpu_cr::stream`): given a NUL-terminated file name, it returns this
/// process' end of the file's pipe (the write end at dump, the read end at
/// restore; the caller owns it), `-ENOENT` when the streamer has no such
/// file (restore), or another negative value when it failed (CRIU logged
/// why).  Returns a new fd of the staging directory, the
/// GPU metadata files in memory, which the caller keeps (restored tasks
/// inherit it) and passes as the image directory fd to every other hook;
/// `-errno` when it cannot be made.
#[no_mangle]
pub extern "C" fn criu_gpu_stream_start(
    open: Option<unsafe extern "C" fn(name: *const c_char) -> c_int>,
) -> c_int {
    ffi_boundary("criu_gpu_stream_start", || {
        let Some(open) = open else {
            return -libc::EINVAL;
        };
        let opener: amdgpu_cr::stream::Opener = Box::new(move |name: &str| {
            let c = std::ffi::CString::new(name)
                .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
            // SAFETY: `open` is CRIU's function of the type above; `c` is
            // NUL-terminated and outlives the call.
            let fd = unsafe { open(c.as_ptr()) };
            match fd {
                // SAFETY: a non-negative result is a new fd the caller owns.
                0.. => Ok(Some(unsafe {
                    <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd)
                })),
                e if e == -libc::ENOENT => Ok(None),
                _ => Err(std::io::Error::other(format!(
                    "the image streamer could not open {name} (see CRIU's log)"
                ))),
            }
        });
        let stall = match amdgpu_cr::env::stream_timeout_from_env() {
            Ok(t) => t,
            Err(e) => {
                log::error!("{e}");
                return -libc::EINVAL;
            }
        };
        let made = amdgpu_cr::stream::start(opener, stall)
            .and_then(|s| s.staging_fd().try_clone_to_owned());
        match made {
            Ok(fd) => fd.into_raw_fd(),
            Err(e) => {
                log::error!(
                    "--stream: the staging directory of the GPU metadata (a tmpfs mounted \
                     nowhere) could not be made: {e}"
                );
                -e.raw_os_error().unwrap_or(libc::EIO)
            }
        }
    })
}

/// Restore with `--stream` of images whose inventory names the AMD GPU
/// plugin: fetches the GPU metadata files from the image streamer into the
/// staging directory, before [`criu_gpu_restore_init`] validates them.
/// `0`; `-EINVAL` when the stream cannot be restored (logged).
#[no_mangle]
pub extern "C" fn criu_gpu_stream_fetch() -> c_int {
    ffi_boundary("criu_gpu_stream_fetch", || {
        let Some(streamer) = amdgpu_cr::stream::active() else {
            return -libc::EINVAL;
        };
        match amdgpu_cr::session::streamed::fetch_metadata(&streamer) {
            Ok(_) => 0,
            Err(why) => {
                log::error!("{why}");
                -libc::EINVAL
            }
        }
    })
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

/// Says in the log which GPU knobs are set, and from where.
fn log_knobs() {
    for k in amdgpu_cr::env::knobs_in_effect() {
        log::info!("GPU knob {k}");
    }
}

/// Starts the GPU part of a dump (reads `KFD_MAX_BUFFER_SIZE`,
/// `CRIU_ROCM_COPY_ENGINE` and the key `CRIU_ROCM_SIGN_KEY`, which a
/// streamed dump refuses; a bad value fails the dump before anything is
/// frozen) and marks the image directory `imgdir_fd` as holding an
/// incomplete dump until [`criu_gpu_dump_complete`] (`-1`: no directory,
/// the images are streamed).  `log_fd` is CRIU's log (-1: none), where the
/// GPU guardian and the signal handler write should criu-rocm die; it stays
/// open for the whole dump.  The guardian's lines carry timestamps counted
/// from `log_start_us` (µs since the epoch, CRIU's `log_get_logstart()`; 0
/// when CRIU prints none).
#[no_mangle]
pub extern "C" fn criu_gpu_dump_init(imgdir_fd: c_int, log_fd: c_int, log_start_us: u64) -> c_int {
    ffi_boundary("criu_gpu_dump_init", || {
        log_knobs();
        let mut o = match DumpOptions::from_env() {
            Ok(o) => o,
            Err(e) => {
                log::error!("{e}");
                return -e.errno();
            }
        };
        o.log_fd = (log_fd >= 0).then_some(log_fd);
        o.log_args = crate::logging::helper_args(log_start_us);
        if imgdir_fd < 0 && o.sign_key.is_some() {
            log::error!(
                "{}: a dump without an image directory (--stream) cannot be signed",
                amdgpu_cr::env::SIGN_KEY_VAR
            );
            return -libc::EINVAL;
        }
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

/// Every image of the dump is written, CRIU's flushed (before CRIU's
/// post-dump scripts, and before the tree is killed or resumed): the
/// digests of the GPU image files go into the image directory
/// `imgdir_fd`, the directory is validated as its restore will validate
/// it, signed when `CRIU_ROCM_SIGN_KEY` names a key, and then it loses its
/// incomplete-dump mark.  `-EINVAL` when the validation or the signing
/// fails: the dump fails, the tree keeps running with its GPU
/// unpaused, and the mark stays with the reasons.
#[no_mangle]
pub extern "C" fn criu_gpu_dump_complete(imgdir_fd: c_int) -> c_int {
    ffi_boundary("criu_gpu_dump_complete", || {
        let dir = image_dir(imgdir_fd);
        let session = lock(&DUMP);
        if session.is_none() && amdgpu_cr::env::knob(amdgpu_cr::env::SIGN_KEY_VAR).is_some() {
            log::error!("{}: no dump session to sign the images of", dir.display());
            return -libc::EINVAL;
        }
        if let Some(s) = session.as_ref() {
            if let Err(e) = s.write_digests(&dir) {
                log::error!("{e}");
                return -e.raw_os_error().unwrap_or(libc::EIO);
            }
            if let Err(why) = s.verify_images(&dir).and_then(|()| s.sign_images(&dir)) {
                for line in why.lines() {
                    log::error!("{line}");
                }
                log::error!(
                    "{}: the restore would refuse these images (above); the dump fails and the \
                     process keeps running",
                    dir.display()
                );
                if amdgpu_cr::stream::active().is_some() {
                    // Nothing of it reaches the stream: no digests file.
                    return -libc::EINVAL;
                }
                if let Err(e) = incomplete::refused(&dir, &why) {
                    log::error!(
                        "{}: adding the reasons to {}: {e}",
                        dir.display(),
                        incomplete::MARKER
                    );
                }
                return -libc::EINVAL;
            }
        }
        if let Some(streamer) = amdgpu_cr::stream::active() {
            // The metadata files go last, the digests file at the very end.
            return match amdgpu_cr::session::streamed::send_staging(&streamer) {
                Ok(()) => 0,
                Err(why) => {
                    log::error!("{why}");
                    -libc::EIO
                }
            };
        }
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

/// Pre-dump, task `pid` (real pid) frozen and seized by the calling
/// thread: the GPU queues of each KFD process it holds are paused only to
/// take its buffer list, then unpaused.  Returns the number of KFD
/// processes met.
#[no_mangle]
pub extern "C" fn criu_gpu_pre_dump_task(pid: c_int) -> c_int {
    ffi_boundary("criu_gpu_pre_dump_task", || {
        let mut g = lock(&DUMP);
        let Some(s) = g.as_mut() else { return 0 };
        match s.pre_dump_task(pid) {
            Ok(n) => n as c_int,
            Err(e) => fail(e),
        }
    })
}

/// Pre-dump, the tree running again: saves the GPU memory of every KFD
/// process [`criu_gpu_pre_dump_task`] met into the image directory
/// `imgdir_fd`.
#[no_mangle]
pub extern "C" fn criu_gpu_pre_dump_memory(imgdir_fd: c_int) -> c_int {
    ffi_boundary("criu_gpu_pre_dump_memory", || {
        let mut g = lock(&DUMP);
        let Some(s) = g.as_mut() else { return 0 };
        match s.pre_dump_memory(&image_dir(imgdir_fd)) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// Dumps device file or dma-buf `fd` (CRIU's copy of file `id`, fd
/// `task_fd` of task `pid`) into the image directory `imgdir_fd`; a device
/// file's task is found by the open file.  `1`: a KFD file, `2`: a render
/// node, `3`: a dma-buf, `-ENOTSUP`: not a GPU file.
#[no_mangle]
pub extern "C" fn criu_gpu_dump_file(
    fd: c_int,
    id: u32,
    pid: c_int,
    task_fd: c_int,
    imgdir_fd: c_int,
) -> c_int {
    ffi_boundary("criu_gpu_dump_file", || {
        let mut g = lock(&DUMP);
        let Some(s) = g.as_mut() else {
            return -libc::ENOTSUP;
        };
        // SAFETY: CRIU keeps `fd` open for the duration of the hook.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        match s.dump_file(fd, FileId(id), (pid, task_fd), &image_dir(imgdir_fd)) {
            Ok(None) => -libc::ENOTSUP,
            Ok(Some(Dumped::Kfd)) => 1,
            Ok(Some(Dumped::Render(_))) => 2,
            Ok(Some(Dumped::Dmabuf)) => 3,
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
/// image directory `imgdir_fd` holds a dump that did not complete, or,
/// with `CRIU_ROCM_VERIFY_KEY`, images that are not the signed ones.
#[no_mangle]
pub extern "C" fn criu_gpu_restore_check(imgdir_fd: c_int) -> c_int {
    ffi_boundary("criu_gpu_restore_check", || {
        let dir = image_dir(imgdir_fd);
        if let Err(why) = incomplete::check(&dir) {
            log::error!("{why}");
            return -libc::EINVAL;
        }
        check_signature(&dir)
    })
}

/// With `CRIU_ROCM_VERIFY_KEY`, the images' signature, before CRIU reads
/// any of them: `-EINVAL` with every refusal logged.
fn check_signature(dir: &std::path::Path) -> c_int {
    let req = match validate::signature::verify_key_from_env() {
        Ok(Some(r)) => r,
        Ok(None) => return 0,
        Err(e) => {
            log::error!("{e}");
            return -libc::EINVAL;
        }
    };
    let refusals = validate::signature::verify_required(dir, &req);
    if refusals.is_empty() {
        return 0;
    }
    log::error!("the GPU images cannot be restored (no task was created, no GPU device opened):");
    for r in &refusals {
        log::error!("{r}");
    }
    -libc::EINVAL
}

/// Whether a restore must verify the images' signature
/// (`CRIU_ROCM_VERIFY_KEY` or `CRIU_ROCM_VERIFY_SIGNATURE` is set, by the
/// environment or `--gpu-knob`): 1 or 0.  CRIU refuses `--stream` and
/// `--lazy-pages` restores then, whose images it reads from elsewhere or
/// later than the check.
#[no_mangle]
pub extern "C" fn criu_gpu_signature_required() -> c_int {
    ffi_boundary("criu_gpu_signature_required", || {
        use amdgpu_cr::env::{knob, VERIFY_KEY_VAR, VERIFY_SIGNATURE_VAR};
        c_int::from(
            [VERIFY_KEY_VAR, VERIFY_SIGNATURE_VAR]
                .iter()
                .any(|v| knob(v).is_some() || std::env::var_os(v).is_some()),
        )
    })
}

/// Starts the GPU part of a restore in criu main (reads the `KFD_*_CHECK`,
/// `KFD_MAX_BUFFER_SIZE` and `CRIU_ROCM_COPY_ENGINE` knobs) and validates
/// the images in `imgdir_fd` as `gpu-check` does, before any task exists:
/// `-EINVAL` with every refusal logged.  Returns `1` when the images hold
/// GPU state (a KFD process or a render file; CRIU then ties every restored
/// task to its own life until the hand-off, patches 0016 and 0024), and
/// when they hold a KFD process also starts the GPU memory writer; `0`: no
/// GPU state to restore.  The writer logs to CRIU's log, `log_fd` (-1: none),
/// with timestamps counted from `log_start_us` (µs since the epoch, CRIU's
/// `log_get_logstart()`; 0 when CRIU prints none).
#[no_mangle]
pub extern "C" fn criu_gpu_restore_init(
    imgdir_fd: c_int,
    log_fd: c_int,
    log_start_us: u64,
) -> c_int {
    ffi_boundary("criu_gpu_restore_init", || {
        log_knobs();
        let o = match RestoreOptions::from_env() {
            Ok(o) => o,
            Err(e) => {
                log::error!("{e}");
                return -e.errno();
            }
        };
        let mut session = RestoreSession::new(o.clone());
        let (kfd_images, has_gpu_state) = match check_images(imgdir_fd, &o) {
            Ok(found) => found,
            Err(rc) => return rc,
        };
        match Exchange::create(&image_dir(imgdir_fd)) {
            Ok(Some(ex)) => session.use_exchange(ex),
            Ok(None) => {}
            Err(why) => {
                log::error!("the GPU images cannot be restored: {why}");
                return -libc::EINVAL;
            }
        }
        let writer = if kfd_images > 0 {
            match start_writer(&o, log_fd, log_start_us) {
                Ok(w) => {
                    session.use_writer(w.mailbox());
                    Some(w)
                }
                Err(rc) => return rc,
            }
        } else {
            None
        };
        *lock(&WRITER) = writer;
        *lock(&RESTORE) = Some(session);
        c_int::from(has_gpu_state)
    })
}

/// The same validation of the images in `imgdir_fd` as gpu-check's, before
/// any task or device, every refusal logged; the number of KFD images and
/// whether there is any GPU state (render-node images too), or the C
/// return value of the refusal.
fn check_images(imgdir_fd: c_int, o: &RestoreOptions) -> Result<(usize, bool), c_int> {
    let depth = match amdgpu_cr::stream::active() {
        Some(_) => validate::Depth::Streamed,
        None => validate::Depth::Metadata,
    };
    let dir = image_dir(imgdir_fd);
    let mut report = validate::check_dir(&dir, depth).map_err(|e| {
        log::error!("listing the image directory: {e}");
        -e.raw_os_error().unwrap_or(libc::EIO)
    })?;
    // A required signature was verified in criu_gpu_restore_check.
    report
        .notes
        .extend(validate::signature::note(&dir, o.verify_key.as_ref()));
    if let Some(w) = &report.warning {
        log::warn!("{w}");
    }
    for n in &report.notes {
        log::info!("{n}");
    }
    if !report.is_ok() {
        log::error!(
            "the GPU images cannot be restored (no task was created, no GPU device opened):"
        );
        for r in report.refusals() {
            log::error!("{r}");
        }
        return Err(-libc::EINVAL);
    }
    let kfd_images = report.kfd.len();
    if kfd_images > SLOTS {
        log::error!(
            "the images hold {kfd_images} KFD files; one restore brings back at most {SLOTS}"
        );
        return Err(-libc::E2BIG);
    }
    Ok((kfd_images, report.has_gpu_state))
}

/// Starts the GPU memory writer, logging to CRIU's log `log_fd` (-1: none)
/// with CRIU's timestamps; on failure the C return value.
fn start_writer(o: &RestoreOptions, log_fd: c_int, log_start_us: u64) -> Result<Writer, c_int> {
    // SAFETY: CRIU's log fd stays open for this call (-1: none).
    let fd = (log_fd >= 0).then(|| unsafe { BorrowedFd::borrow_raw(log_fd) });
    let log = HelperLog {
        fd,
        args: &crate::logging::helper_args(log_start_us),
    };
    Writer::start(o.policy, o.staging_cap, log).map_err(|e| {
        log::error!("the GPU memory writer could not start: {e}");
        -e.raw_os_error().unwrap_or(libc::EIO)
    })
}

/// In criu main, once every task passed its restorer's GPU gate (CRIU's
/// `CR_STATE_RESTORE` done) and before any task may run: collects every
/// job's outcome from the GPU memory writer, stops it, and checks that
/// every KFD image in `imgdir_fd` was restored exactly once, in the task
/// of its pid (`vpids`: the restore's live tasks, `n` of them), with its
/// memory confirmed and its queues resumed.  Returns how many processes
/// were; `-errno` when the restore must fail.
///
/// # Safety
/// `vpids` points to `n` readable ints.
#[no_mangle]
pub unsafe extern "C" fn criu_gpu_restore_settle(
    imgdir_fd: c_int,
    vpids: *const c_int,
    n: c_int,
) -> c_int {
    let tasks = if vpids.is_null() || n <= 0 {
        Vec::new()
    } else {
        // SAFETY: the caller passes `n` ints at `vpids` (see # Safety).
        unsafe { std::slice::from_raw_parts(vpids, n as usize) }.to_vec()
    };
    ffi_boundary("criu_gpu_restore_settle", move || {
        let Some(w) = lock(&WRITER).take() else {
            return 0;
        };
        let outcomes = match w.settle() {
            Ok(o) => o,
            Err(e) => return fail(e),
        };
        match restore::check_outcomes(&image_dir(imgdir_fd), &tasks, &outcomes) {
            Ok(n) => n as c_int,
            Err(e) => fail(e),
        }
    })
}

/// In criu main at the end of a restore: a GPU memory writer still running
/// (the restore failed before every task passed its gate) is killed and
/// reaped; one that died is reported with how it died.
#[no_mangle]
pub extern "C" fn criu_gpu_restore_fini() -> c_int {
    ffi_boundary("criu_gpu_restore_fini", || {
        if let Some(w) = lock(&WRITER).take() {
            w.abort();
        }
        *lock(&RESTORE) = None;
        0
    })
}

/// In a restored task (pid `vpid` in its namespace, `real_pid` in criu
/// main's): restores GPU file `id` and returns its fd, or `-ENOTSUP` when
/// `id` is no GPU file.  Fds kept for later hooks are numbered `fd_floor` or
/// above.  `-EAGAIN`: the file (a dma-buf) waits for GPU file `*wait_for`,
/// which the task has not restored yet.
///
/// # Safety
/// `wait_for` points to a writable `u32`.
#[no_mangle]
pub unsafe extern "C" fn criu_gpu_restore_file(
    vpid: c_int,
    real_pid: c_int,
    id: u32,
    fd_floor: c_int,
    imgdir_fd: c_int,
    wait_for: *mut u32,
) -> c_int {
    if wait_for.is_null() {
        log::error!("criu_gpu_restore_file: a NULL wait_for");
        return -libc::EINVAL;
    }
    ffi_boundary("criu_gpu_restore_file", move || {
        let mut g = lock(&RESTORE);
        let Some(s) = g.as_mut() else {
            return -libc::ENOTSUP;
        };
        s.set_task(real_pid, imgdir_fd);
        match s.restore_file(vpid, FileId(id), fd_floor, &image_dir(imgdir_fd)) {
            Ok(Some(fd)) => fd.into_raw_fd(),
            Ok(None) => -libc::ENOTSUP,
            Err(SessionError::Waits { file, what, .. }) => {
                log::info!("{what}: retried after the task's other files");
                // SAFETY: not NULL (checked above), and the caller passes a
                // writable u32.
                unsafe { *wait_for = file.0 };
                -libc::EAGAIN
            }
            Err(e) => fail(e),
        }
    })
}

/// In a restored task, before CRIU opens a regular file by its name
/// `path` (relative to the task's root) for an fd or a mapping: an fd of
/// the file the GPU hooks checked or recreated under that name
/// (libhsakmt's shared memory and semaphore), for CRIU to open the file
/// through (`/proc/self/fd/N`), whatever became of the name since.  The fd
/// stays the hooks' (closed by `criu_gpu_restore_task_done`).  `-ENOENT`
/// when the hooks hold no file of that name.
///
/// A NULL pointer is refused with `-EINVAL`.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn criu_gpu_restore_held_file(path: *const c_char) -> c_int {
    if path.is_null() {
        log::error!("criu_gpu_restore_held_file: a NULL path");
        return -libc::EINVAL;
    }
    // SAFETY: not NULL, and the caller passes a valid C string (CRIU's
    // reg-file name).
    let Ok(path) = unsafe { CStr::from_ptr(path) }.to_str().map(str::to_owned) else {
        return -libc::ENOENT;
    };
    ffi_boundary("criu_gpu_restore_held_file", move || {
        let g = lock(&RESTORE);
        g.as_ref()
            .and_then(|s| s.held_file(&path))
            .map_or(-libc::ENOENT, |fd| fd.as_raw_fd())
    })
}

/// In a restored task: the new offset (`*new_pgoff`, bytes) and an fd to
/// map from (`*map_fd`, CRIU's to close) for a device mapping recorded as
/// `path` at `pgoff`, `len` bytes at `addr`.  Returns `1` when the mapping
/// is a GPU one, `0` when it is not ours.
///
/// A NULL pointer is refused with `-EINVAL`; a path that is not UTF-8
/// names no GPU node, so its mapping is not ours (`0`).
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `new_pgoff` and `map_fd` are
/// NULL or point to writable memory.
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
    if path.is_null() || new_pgoff.is_null() || map_fd.is_null() {
        log::error!("criu_gpu_update_vma: a NULL argument (pid {vpid}, mapping at {addr:#x})");
        return -libc::EINVAL;
    }
    // SAFETY: not NULL, and the caller passes a valid C string (CRIU's
    // reg-file name).
    let Ok(path) = unsafe { CStr::from_ptr(path) }.to_str().map(str::to_owned) else {
        return 0;
    };
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

/// In a restored task, once CRIU opened all its mappings: waits until the
/// GPU memory writer holds the task's job (watching it through criu's
/// `/proc`, `proc_fd`), then closes the fds the GPU hooks kept, so the
/// task's fd table is as it was at dump — except the gate's: `*gate_chan`
/// (the task's end of its channel to the writer) and `*gate_kfd` (its
/// `/dev/kfd`, for its own RESUME) are left for the task's restorer, with
/// the KFD image in `*gate_image`; `-1` when the task has no KFD process.
///
/// A NULL pointer is refused with `-EINVAL`.
///
/// # Safety
/// The three pointers are NULL or point to writable memory.
#[no_mangle]
pub unsafe extern "C" fn criu_gpu_restore_task_done(
    vpid: c_int,
    proc_fd: c_int,
    gate_chan: *mut c_int,
    gate_kfd: *mut c_int,
    gate_image: *mut u32,
) -> c_int {
    if gate_chan.is_null() || gate_kfd.is_null() || gate_image.is_null() {
        log::error!("criu_gpu_restore_task_done: a NULL out-pointer (pid {vpid})");
        return -libc::EINVAL;
    }
    let out = (gate_chan as usize, gate_kfd as usize, gate_image as usize);
    ffi_boundary("criu_gpu_restore_task_done", move || {
        let (chan, kfd, image) = out;
        let put = |at: usize, v: c_int| {
            // SAFETY: a writable out-param (see # Safety).
            unsafe { *(at as *mut c_int) = v };
        };
        put(chan, -1);
        put(kfd, -1);
        let proc = (proc_fd >= 0).then(|| {
            // SAFETY: CRIU's /proc service fd stays open for the hook.
            unsafe { BorrowedFd::borrow_raw(proc_fd) }
        });
        let mut g = lock(&RESTORE);
        let Some(s) = g.as_mut() else { return 0 };
        match s.task_done(vpid, proc) {
            Ok(Some(gate)) => {
                put(chan, gate.chan);
                put(kfd, gate.kfd);
                // SAFETY: a writable out-param (see # Safety).
                unsafe { *(image as *mut u32) = gate.image.0 };
                0
            }
            Ok(None) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `criu-rocm gpu-check`: prints whether the images in `dir` can be
/// restored on this host and onto which GPUs, touching no device: the
/// restore's own validation (its refusals, its warning), then the host.
/// `0`: they can; `-ENODEV`: some cannot (each reason printed); other
/// `-errno`: the directory could not be read.
///
/// The path is taken as bytes, as the kernel does (a non-UTF-8 name is
/// not changed); NULL is refused with `-EINVAL`.
///
/// # Safety
/// `dir` is NULL or a NUL-terminated path.
#[no_mangle]
pub unsafe extern "C" fn criu_gpu_dry_run(dir: *const c_char) -> c_int {
    if dir.is_null() {
        eprintln!("criu-rocm gpu-check: no image directory given");
        return -libc::EINVAL;
    }
    // SAFETY: not NULL, and the caller passes a valid C string.
    let dir = PathBuf::from(OsStr::from_bytes(unsafe { CStr::from_ptr(dir) }.to_bytes()));
    ffi_boundary("criu_gpu_dry_run", move || {
        let check = gpu_check::gpu_check(&dir);
        for (stream, line) in &check.lines {
            match stream {
                gpu_check::Stream::Out => println!("{line}"),
                gpu_check::Stream::Err => eprintln!("{line}"),
            }
        }
        -check.errno
    })
}
