//! Scratch directories of the test binaries, shared by the crates' tests
//! through `#[path]` (a crate of its own for one function would cost more
//! than it saves).

/// A fresh directory named `CRATE-TAG-` (the crate whose test includes
/// this file) and random characters under the temporary directory
/// (`tempfile`: made exclusively, so no other test run, in this pid
/// namespace or another, can take it), removed when dropped; kept, and named on stderr, when `CRIU_ROCM_TEST_KEEP=1`.
pub fn scratch_dir(tag: &str) -> tempfile::TempDir {
    let keep = std::env::var_os("CRIU_ROCM_TEST_KEEP").is_some_and(|v| v == "1");
    let dir = tempfile::Builder::new()
        .prefix(&format!("{}-{tag}-", env!("CARGO_PKG_NAME")))
        .disable_cleanup(keep)
        .tempdir()
        .unwrap();
    if keep {
        eprintln!("keeping {}", dir.path().display());
    }
    dir
}
