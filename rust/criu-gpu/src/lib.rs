//! `criu-gpu`: the C boundary between criu-rocm's patched CRIU and the Rust GPU code.
//!
//! Every `extern "C"` entry point follows the same contract: it never unwinds into C (panics
//! are caught and turned into `-EIO`), it returns `0` or a negative errno, and `-ENOTSUP`
//! means "not a GPU object, let CRIU handle it". The C declarations live in
//! `criu/include/criu-gpu.h`, generated from this crate and checked for drift by the tests.

use std::ffi::{c_char, c_int};
use std::panic::{catch_unwind, UnwindSafe};

use amdgpu_cr::session::HelperMode;

pub mod hooks;
pub mod logging;

/// The criu-rocm release, shown by `criu-rocm --version`.
pub const CRIU_ROCM_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// Runs `f` behind a panic boundary: a panic is logged and reported as `-EIO`.
pub fn ffi_boundary<F>(entry: &'static str, f: F) -> c_int
where
    F: FnOnce() -> c_int + UnwindSafe,
{
    match catch_unwind(f) {
        Ok(ret) => ret,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            log::error!("{entry}: internal error: {what}");
            -libc::EIO
        }
    }
}

/// Returns the criu-rocm version as a NUL-terminated static string.
#[no_mangle]
pub extern "C" fn criu_gpu_version() -> *const c_char {
    CRIU_ROCM_VERSION.as_ptr().cast()
}

/// Called once by CRIU after its log is set up: routes Rust `log` records into CRIU's log.
///
/// `loglevel` is CRIU's verbosity (`-v` level, 0..4); records above it are dropped early.
#[no_mangle]
pub extern "C" fn criu_gpu_init(loglevel: c_int) -> c_int {
    ffi_boundary("criu_gpu_init", || {
        amdgpu_cr::testhook::init();
        logging::install(loglevel);
        0
    })
}

/// Called first thing in CRIU's `main()`: when `argv[1]` names a helper mode
/// of criu-rocm (`amdgpu_cr::session::HelperMode`: the GPU memory writer of
/// a restore, the GPU guardian of a dump, which criu main starts by
/// re-executing itself), runs that helper and returns its exit status;
/// `-ENOTSUP` when criu runs as itself.
///
/// # Safety
/// `argv` is NULL or points to `argc` NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn criu_gpu_helper_main(argc: c_int, argv: *const *const c_char) -> c_int {
    if argv.is_null() || argc < 2 {
        return -libc::ENOTSUP;
    }
    // SAFETY: the caller passes `argc` pointers at `argv` (see # Safety).
    let argv = unsafe { std::slice::from_raw_parts(argv, argc as usize) };
    if argv.iter().any(|a| a.is_null()) {
        return -libc::ENOTSUP;
    }
    let args: Vec<&[u8]> = argv
        .iter()
        // SAFETY: each is a valid C string (see # Safety), checked non-NULL.
        .map(|&a| unsafe { std::ffi::CStr::from_ptr(a) }.to_bytes())
        .collect();
    let Some(parsed) = HelperMode::parse(&args) else {
        return -libc::ENOTSUP;
    };
    ffi_boundary("criu_gpu_helper_main", move || {
        amdgpu_cr::testhook::init();
        let mode = match parsed {
            Ok(m) => m,
            Err(e) => {
                eprintln!("criu-rocm: helper mode: {e}");
                return 2;
            }
        };
        let (fd, settings) = mode.log();
        if let Err(e) = logging::install_helper(fd, settings) {
            eprintln!("criu-rocm: {}: log settings: {e}", mode.name());
            return 2;
        }
        mode.run()
    })
}

/// For tests only (`CRIU_ROCM_TEST_STOP_ON_LOG`, see `amdgpu_cr::testhook`):
/// CRIU's printer calls this with every line it wrote; the process stops
/// itself after the first line holding the variable's text.
///
/// # Safety
/// `line` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn criu_gpu_test_log_line(line: *const c_char) {
    if line.is_null() {
        return;
    }
    // SAFETY: the caller passes a valid C string.
    let line = unsafe { std::ffi::CStr::from_ptr(line) };
    amdgpu_cr::testhook::on_log_line(line.to_bytes());
}

/// CRIU's `--gpu-knob NAME=VALUE` option (command line or any CRIU
/// configuration file): sets a GPU knob (`KFD_*_CHECK`, `KFD_MAX_BUFFER_SIZE`,
/// `CRIU_ROCM_COPY_ENGINE`) for this criu, in place of the environment
/// variable of that name.  On `-EINVAL` (not NAME=VALUE, an unknown knob or a
/// value the knob does not take, NULL or a setting that is not UTF-8) the
/// reason is written, NUL-terminated and cut to fit, into `why` (`why_len`
/// bytes).
///
/// # Safety
/// `arg` is NULL or a NUL-terminated string; `why` is NULL or points to
/// `why_len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn criu_gpu_set_knob(
    arg: *const c_char,
    why: *mut c_char,
    why_len: usize,
) -> c_int {
    let err = if arg.is_null() {
        "no NAME=VALUE given".to_owned()
    } else {
        // SAFETY: not NULL, and the caller passes a valid C string.
        match unsafe { std::ffi::CStr::from_ptr(arg) }.to_str() {
            Ok(arg) => match amdgpu_cr::env::set_knob(arg) {
                Ok(_) => return 0,
                Err(e) => e.to_string(),
            },
            Err(_) => "a GPU knob setting must be UTF-8 text".to_owned(),
        }
    };
    if !why.is_null() && why_len > 0 {
        let n = err.len().min(why_len - 1);
        // SAFETY: the caller gave why_len writable bytes at why; n + 1 <= why_len.
        let out = unsafe { std::slice::from_raw_parts_mut(why.cast::<u8>(), n + 1) };
        out[..n].copy_from_slice(&err.as_bytes()[..n]);
        out[n] = 0;
    }
    -libc::EINVAL
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn set_knob_reports_why() {
        let mut why = [0 as c_char; 24];
        // SAFETY: a C string literal and a buffer of why.len() bytes.
        let r = unsafe { criu_gpu_set_knob(c"KFD_BOGUS=1".as_ptr(), why.as_mut_ptr(), why.len()) };
        assert_eq!(r, -libc::EINVAL);
        // SAFETY: criu_gpu_set_knob NUL-terminated the buffer.
        let w = unsafe { CStr::from_ptr(why.as_ptr()) }.to_str().unwrap();
        assert_eq!(w, "\"KFD_BOGUS\" is not a GP"); // cut to 23 bytes and the NUL
                                                    // SAFETY: a C string literal; no buffer.
        let r =
            unsafe { criu_gpu_set_knob(c"KFD_FW_VER_CHECK=1".as_ptr(), std::ptr::null_mut(), 0) };
        assert_eq!(r, 0);
    }

    #[test]
    fn null_and_non_utf8_arguments_are_refused_not_followed() {
        let mut why = [0 as c_char; 64];
        // SAFETY: NULL is allowed; a buffer of why.len() bytes.
        let r = unsafe { criu_gpu_set_knob(std::ptr::null(), why.as_mut_ptr(), why.len()) };
        assert_eq!(r, -libc::EINVAL);
        // SAFETY: a C string literal (not UTF-8) and a buffer of why.len() bytes.
        let r = unsafe { criu_gpu_set_knob(c"KFD_\xff=1".as_ptr(), why.as_mut_ptr(), why.len()) };
        assert_eq!(r, -libc::EINVAL);
        // SAFETY: criu_gpu_set_knob NUL-terminated the buffer.
        let w = unsafe { CStr::from_ptr(why.as_ptr()) }.to_str().unwrap();
        assert!(w.contains("UTF-8"), "{w}");
        // SAFETY: NULL is allowed (refused) for the directory.
        let r = unsafe { hooks::criu_gpu_dry_run(std::ptr::null()) };
        assert_eq!(r, -libc::EINVAL);
        let (mut off, mut fd) = (0u64, 0 as c_int);
        let p = c"/dev/kfd".as_ptr();
        // SAFETY: a C string literal, NULL (refused) and a writable int.
        let r =
            unsafe { hooks::criu_gpu_update_vma(1, p, 0, 4096, 0, std::ptr::null_mut(), &mut fd) };
        assert_eq!(r, -libc::EINVAL);
        // SAFETY: NULL (refused) and two writable out-params.
        let r = unsafe {
            hooks::criu_gpu_update_vma(1, std::ptr::null(), 0, 4096, 0, &mut off, &mut fd)
        };
        assert_eq!(r, -libc::EINVAL);
        let (mut chan, mut image) = (0 as c_int, 0u32);
        let none = std::ptr::null_mut();
        // SAFETY: two writable out-params and NULL (refused).
        let r = unsafe { hooks::criu_gpu_restore_task_done(1, -1, &mut chan, none, &mut image) };
        assert_eq!(r, -libc::EINVAL);
    }

    #[test]
    fn version_is_the_crate_version() {
        // SAFETY: criu_gpu_version returns a pointer to a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(criu_gpu_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn panics_become_eio() {
        assert_eq!(ffi_boundary("t", || panic!("boom")), -libc::EIO);
        assert_eq!(ffi_boundary("t", || -libc::ENOTSUP), -libc::ENOTSUP);
    }
}
