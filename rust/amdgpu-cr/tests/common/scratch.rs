//! Scratch directories of the test binaries.

/// A fresh directory named `amdgpu-cr-TAG-` and random characters under
/// the temporary directory (`tempfile`: made exclusively, so no other test
/// run, in this pid namespace or another, can take it), removed when
/// dropped; kept, and named on stderr, when `CRIU_ROCM_TEST_KEEP=1`.
pub fn scratch_dir(tag: &str) -> tempfile::TempDir {
    let keep = std::env::var_os("CRIU_ROCM_TEST_KEEP").is_some_and(|v| v == "1");
    let dir = tempfile::Builder::new()
        .prefix(&format!("amdgpu-cr-{tag}-"))
        .disable_cleanup(keep)
        .tempdir()
        .unwrap();
    if keep {
        eprintln!("keeping {}", dir.path().display());
    }
    dir
}
