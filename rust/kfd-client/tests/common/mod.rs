//! What the emulator-backed tests share: finding kfd-emu and re-running one inner test of
//! this binary inside its namespace.

use std::path::PathBuf;
use std::process::Command;

/// The kfd-emu binary: `$KFD_EMU`, else the one built in the same target directory
/// (`<target>/<profile>/deps/<test>-HASH` → `<target>/<profile>/kfd-emu`). Missing → the
/// test fails rather than passing vacuously.
pub fn kfd_emu() -> PathBuf {
    if let Some(p) = std::env::var_os("KFD_EMU") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let p = exe
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("kfd-emu"));
    match p {
        Some(p) if p.is_file() => p,
        _ => panic!(
            "kfd-emu is not built next to {}: run `cargo build -p kfd-emu` (same \
             CARGO_TARGET_DIR) or set KFD_EMU=/path/to/kfd-emu",
            exe.display()
        ),
    }
}

/// Runs the ignored test `name` of this binary under `kfd-emu run --profile PROFILE`; it
/// must pass (and run: "1 passed"). Returns its output.
pub fn run_inner_under_emu(profile: &str, name: &str) -> String {
    let out = Command::new(kfd_emu())
        .args(["run", "--profile", profile, "--"])
        .arg(std::env::current_exe().unwrap())
        .args(self_args(name))
        .output()
        .expect("spawn kfd-emu");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} under kfd-emu failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "{name} did not run under kfd-emu:\n{text}"
    );
    text
}

/// libtest arguments that run exactly the ignored test `name` of this binary.
pub fn self_args(name: &str) -> [&str; 5] {
    [
        "--ignored",
        "--exact",
        name,
        "--nocapture",
        "--test-threads=1",
    ]
}
