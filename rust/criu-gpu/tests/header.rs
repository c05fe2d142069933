//! The C header CRIU compiles against (`criu/include/criu-gpu.h`) must be exactly what
//! cbindgen generates from this crate: a drifted header would let C call with a stale
//! signature.

use std::path::Path;

#[test]
fn committed_header_matches_the_crate() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = crate_dir.join("../../criu/include/criu-gpu.h");
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
        std::fs::write(&header, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&header).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date; regenerate it with UPDATE_HEADER=1 cargo test -p criu-gpu --test header",
        header.display()
    );
}
