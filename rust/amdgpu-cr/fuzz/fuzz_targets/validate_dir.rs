//! Feeds arbitrary image directories (an archive of files, see
//! `fuzz/harness.rs`) to the validation path of a restore, as
//! `criu-rocm gpu-check` runs it, against a fixed emulated host.  Run
//! with a cap on single allocations, as `tests/validate_fuzz.rs` checks:
//!   cargo +nightly fuzz run validate_dir fuzz/corpus/validate_dir -- -malloc_limit_mb=8
#![no_main]

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
    let _ = harness::validate_dir(host, data, dir);
});
