//! Feeds arbitrary KFD private data (see `check_privdata` in
//! `fuzz/harness.rs`) to its validation, which runs before any KFD ioctl
//! of a restore and in `criu-rocm gpu-check`:
//!   cargo +nightly fuzz run validate_privdata fuzz/corpus/validate_privdata -- -malloc_limit_mb=8
#![no_main]

// The directory half of the harness is the other target's.
#[allow(dead_code)]
#[path = "../harness.rs"]
mod harness;

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

static HOST: OnceLock<(harness::Host, PathBuf)> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let (host, dir) = HOST.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("amdgpu-cr-fuzz-{}", std::process::id()));
        (harness::Host::new(&root), root.join("img"))
    });
    let _ = harness::check_privdata(host, data, dir);
});
