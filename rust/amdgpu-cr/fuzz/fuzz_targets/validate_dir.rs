//! Feeds arbitrary image directories (an archive of files, see
//! `fuzz/harness.rs`) to the validation path of a restore, as
//! `criu-rocm gpu-check` runs it, against a fixed emulated host.  Run
//! with a cap on single allocations, as `tests/validate_fuzz.rs` checks:
//!   cargo +nightly fuzz run validate_dir fuzz/corpus/validate_dir -- -malloc_limit_mb=8
#![no_main]

#[path = "../harness.rs"]
mod harness;
#[path = "../../../test-support/scratch.rs"]
mod scratch;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (host, dir) = harness::fuzz_host(|| scratch::scratch_dir("fuzz").keep());
    let _ = harness::validate_dir(host, data, dir);
});
