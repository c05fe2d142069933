//! Feeds arbitrary KFD private data (see `check_privdata` in
//! `fuzz/harness.rs`) to its validation, which runs before any KFD ioctl
//! of a restore and in `criu-rocm gpu-check`:
//!   cargo +nightly fuzz run validate_privdata fuzz/corpus/validate_privdata -- -malloc_limit_mb=8
#![no_main]

// The directory half of the harness is the other target's.
#[allow(dead_code)]
#[path = "../harness.rs"]
mod harness;
#[path = "../../tests/common/scratch.rs"]
mod scratch;

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

static HOST: OnceLock<(harness::Host, PathBuf)> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let (host, dir) = HOST.get_or_init(|| {
        // The host lives as long as the fuzzing process, which exits
        // without running destructors: its directory stays.
        let root = scratch::scratch_dir("fuzz").keep();
        (harness::Host::new(&root), root.join("img"))
    });
    let _ = harness::check_privdata(host, data, dir);
});
