//! The `kfd-emu` binary with the real device model: `run` leaves nothing
//! behind, two instances run side by side, GET_VERSION answers through
//! the namespace's /dev/kfd.  Needs root.  Built once the device model
//! is in the crate (see build.rs).

use std::process::{Command, Stdio};

fn kfd_emu() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kfd-emu"))
}

fn mountinfo() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap()
}

#[test]
fn run_true_leaves_no_mounts() {
    let before = mountinfo();
    let st = kfd_emu()
        .args(["run", "--profile", "mi100", "--", "true"])
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(before, mountinfo());
}

#[test]
fn two_instances_side_by_side() {
    let before = mountinfo();
    let a = kfd_emu()
        .args([
            "run",
            "--profile",
            "mi100",
            "--",
            "sh",
            "-c",
            "cat /sys/class/kfd/kfd/topology/nodes/1/gpu_id; sleep 1",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let b = kfd_emu()
        .args([
            "run",
            "--profile",
            "mi300x8",
            "--",
            "sh",
            "-c",
            "cat /sys/class/kfd/kfd/topology/nodes/2/gpu_id; sleep 1",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let a = a.wait_with_output().unwrap();
    let b = b.wait_with_output().unwrap();
    assert!(a.status.success() && b.status.success());
    assert_eq!(String::from_utf8_lossy(&a.stdout), "41443\n");
    assert_eq!(String::from_utf8_lossy(&b.stdout), format!("{}\n", 0x6f3e));
    assert_eq!(before, mountinfo());
}

#[test]
fn get_version_through_the_namespace() {
    let out = kfd_emu()
        .args([
            "run",
            "--profile",
            "mi100x2",
            "--",
            env!("CARGO_BIN_EXE_kfd-emu"),
            "bench-ioctl",
            "--count",
            "2000",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("KFD version 1."), "{text}");
}

#[test]
fn fault_injection_specs_are_checked_before_running() {
    let bad = kfd_emu()
        .args([
            "run",
            "--profile",
            "mi100",
            "--fail",
            "CHECKPOINT:EWHAT",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--fail \"CHECKPOINT:EWHAT\""), "{err}");
    let good = kfd_emu()
        .args([
            "run",
            "--profile",
            "mi100",
            "--fail",
            "RESUME:EIO:1:2",
            "--fail",
            "unpause",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    let err = String::from_utf8_lossy(&good.stderr);
    assert!(
        err.contains(
            "fault injection: CRIU_OP RESUME fails with EIO after 1 good call(s), 2 time(s)"
        ),
        "{err}"
    );
}

#[test]
fn supervise_runs_its_command_under_the_emulators_listener() {
    // Outside `kfd-emu run` there is no emulator to hand the listener to.
    let out = kfd_emu()
        .args(["supervise", "--", "true"])
        .env_remove("KFD_EMU_STATE_DIR")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("KFD_EMU_STATE_DIR"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Under it: the command runs with the filter, and a trapped request on
    // a file that is not an emulated device is the kernel's to answer
    // (CONTINUE: /dev/null says ENOTTY), not parked.
    let script = "grep '^Seccomp:' /proc/self/status; /usr/bin/python3 -c \"\
import errno, fcntl
try:
    fcntl.ioctl(open('/dev/null', 'rb'), 0xc00c642d, bytes(12))
except OSError as e:
    print(errno.errorcode[e.errno])\"";
    let out = kfd_emu()
        .args(["run", "--profile", "mi100", "--"])
        .arg(env!("CARGO_BIN_EXE_kfd-emu"))
        .args(["supervise", "--", "sh", "-c", script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text, "Seccomp:\t2\nENOTTY\n");
}
