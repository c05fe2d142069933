//! The seed corpus check of the mutation tests, shared through `#[path]`
//! as `scratch.rs` is.

use std::path::Path;

/// Each seed must be in `dir` as `NAME.EXT`, byte for byte;
/// `AMDGPU_CR_WRITE_SEEDS=1` (re)writes them first.
pub fn check_seed_corpus(dir: &Path, ext: &str, seeds: Vec<(&'static str, Vec<u8>)>) {
    let write = std::env::var_os("AMDGPU_CR_WRITE_SEEDS").is_some();
    for (name, bytes) in seeds {
        let path = dir.join(format!("{name}.{ext}"));
        if write {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (AMDGPU_CR_WRITE_SEEDS=1 writes it)",
                path.display()
            )
        });
        assert_eq!(on_disk, bytes, "{} is stale", path.display());
    }
}
