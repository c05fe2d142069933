//! The check that a crate's committed C header is what cbindgen generates from
//! it, shared by the crates with a C interface through `#[path]`: a drifted
//! header would let C call with a stale signature.

use std::path::Path;

/// Generates the header of the crate in `crate_dir` (with its `cbindgen.toml`)
/// and fails unless `header` holds exactly that; with `UPDATE_HEADER` set,
/// writes it first.
pub fn check_committed_header(crate_dir: &Path, header: &Path) {
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not read the crate")
        .write(&mut generated);
    let generated = String::from_utf8(generated).unwrap();
    if std::env::var_os("UPDATE_HEADER").is_some() {
        std::fs::write(header, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(header).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date; regenerate it with UPDATE_HEADER=1 cargo test -p {} --test header",
        header.display(),
        env!("CARGO_PKG_NAME")
    );
}
