//! Compiles `proto/criu-amdgpu.proto` (the GPU image messages) with prost.
//!
//! prost-build runs `protoc`; Debian's `protobuf-compiler` provides it at
//! /usr/bin/protoc, which we use when `PROTOC` is not set.

use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let proto_dir = manifest.join("../../proto");
    let proto = proto_dir.join("criu-amdgpu.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    println!("cargo:rerun-if-env-changed=PROTOC");

    if std::env::var_os("PROTOC").is_none() && Path::new("/usr/bin/protoc").exists() {
        // Build scripts are single threaded; edition 2021 keeps set_var safe.
        std::env::set_var("PROTOC", "/usr/bin/protoc");
    }

    if let Err(e) = prost_build::Config::new().compile_protos(&[&proto], &[&proto_dir]) {
        panic!(
            "compiling {}: {e} (install protobuf-compiler or set PROTOC)",
            proto.display()
        );
    }
}
