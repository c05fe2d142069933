//! The C header CRIU compiles against (`criu/include/criu-gpu.h`) must be exactly what
//! cbindgen generates from this crate: a drifted header would let C call with a stale
//! signature.

use std::path::Path;

#[path = "../../test-support/header.rs"]
mod header;

#[test]
fn committed_header_matches_the_crate() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    header::check_committed_header(crate_dir, &crate_dir.join("../../criu/include/criu-gpu.h"));
}
