//! Generates `sys.rs` from the system's `linux/kfd_ioctl.h` and libdrm's `amdgpu_drm.h`.
//!
//! `linux/kfd_ioctl.h` includes `<drm/drm.h>`, which Debian ships only as libdrm's
//! `drm.h` (in /usr/include/libdrm): a one-line forwarding header in OUT_DIR provides it.

use std::env;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

fn libdrm_include() -> String {
    let out = Command::new("pkg-config")
        .args(["--cflags-only-I", "libdrm"])
        .output();
    let flags = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        _ => panic!("pkg-config cannot find libdrm: install libdrm-dev (scripts/install-deps.sh)"),
    };
    flags
        .split_whitespace()
        .find_map(|f| f.strip_prefix("-I"))
        .unwrap_or("/usr/include/libdrm")
        .to_owned()
}

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let drm = libdrm_include();
    let shim = out.join("include");
    fs::create_dir_all(shim.join("drm")).unwrap();
    fs::write(
        shim.join("drm/drm.h"),
        format!("#include \"{drm}/drm.h\"\n"),
    )
    .unwrap();
    fs::write(
        out.join("wrapper.h"),
        "#include <linux/kfd_ioctl.h>\n#include <amdgpu_drm.h>\n",
    )
    .unwrap();
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=/usr/include/linux/kfd_ioctl.h");
    println!("cargo:rerun-if-changed={drm}/amdgpu_drm.h");

    let bindings = bindgen::Builder::default()
        .header(out.join("wrapper.h").to_string_lossy())
        .clang_arg(format!("-I{}", shim.display()))
        .clang_arg(format!("-I{drm}"))
        .allowlist_type("kfd_.*")
        .allowlist_type("drm_amdgpu_.*")
        .allowlist_type("drm_version|drm_client|drm_prime_handle|drm_gem_close")
        .allowlist_var("KFD_.*|AMDGPU_.*|DRM_AMDGPU_.*")
        .derive_default(true)
        .derive_debug(true)
        .layout_tests(true)
        .generate()
        .expect("bindgen failed on linux/kfd_ioctl.h + amdgpu_drm.h");
    bindings.write_to_file(out.join("sys.rs")).unwrap();
}
