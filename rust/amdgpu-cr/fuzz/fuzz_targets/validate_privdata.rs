//! Feeds arbitrary KFD private data (see `check_privdata` in
//! `fuzz/harness.rs`) to its validation, which runs before any KFD ioctl
//! of a restore and in `criu-rocm gpu-check`:
//!   cargo +nightly fuzz run validate_privdata fuzz/corpus/validate_privdata -- -malloc_limit_mb=8
#![no_main]

// The directory half of the harness is the other target's.
#[allow(dead_code)]
#[path = "../harness.rs"]
mod harness;
#[path = "../../../test-support/scratch.rs"]
mod scratch;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (host, dir) = harness::fuzz_host(|| scratch::scratch_dir("fuzz").keep());
    let _ = harness::check_privdata(host, data, dir);
});
