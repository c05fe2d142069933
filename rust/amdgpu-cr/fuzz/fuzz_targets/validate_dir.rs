//! Feeds arbitrary image directories (an archive of files, see
//! `fuzz/harness.rs`) to the validation path of a restore, as
//! `criu-rocm gpu-check` runs it, against a fixed emulated host.  Run
//! with a cap on single allocations, as `tests/validate_fuzz.rs` checks:
//!   cargo +nightly fuzz run validate_dir fuzz/corpus/validate_dir -- -malloc_limit_mb=8
#![no_main]

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
    let _ = harness::validate_dir(host, data, dir);
});
