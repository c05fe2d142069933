//! `runner::run` end to end with the device double: the namespace view,
//! exit status, cleanup of mounts and processes, side-by-side instances.
//! Needs root.  Has its own `main` (see Cargo.toml).

mod common;

use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{memfd, Double, ROLE_ENV};
use kfd_emu::profile::Profile;
use kfd_emu::runner::{self, RunOptions};
use kfd_emu::serve::{Devices, NodeSpec};

const CMD_ENV: &str = "KFD_EMU_TEST_CMD";
const PROFILE_ENV: &str = "KFD_EMU_TEST_PROFILE";

/// Role "run": `kfd-emu run` with the double behind every node.
fn run_role() -> ! {
    let profile = Profile::builtin(&std::env::var(PROFILE_ENV).unwrap()).unwrap();
    let cmd = std::env::var(CMD_ENV).unwrap();
    let opts = RunOptions {
        profile,
        state_dir: None,
        cmd: cmd.split('\x1f').map(Into::into).collect(),
        threads: std::env::var("KFD_EMU_TEST_THREADS").map_or(2, |t| t.parse().unwrap()),
    };
    let code = runner::run(opts, |p| {
        let mut nodes = Vec::new();
        let mut paths = vec!["/dev/kfd".to_string()];
        for g in p.gpus() {
            paths.push(format!("/dev/dri/renderD{}", g.drm_render_minor));
        }
        for path in paths {
            nodes.push(NodeSpec {
                path: path.into(),
                backing: memfd(1 << 20).as_fd().try_clone_to_owned()?,
                ops: Arc::new(Double::default()),
            });
        }
        Ok(Devices {
            nodes,
            shutdown: Box::new(|| {}),
            supervisor: None,
            live: None,
        })
    })
    .unwrap_or_else(|e| {
        eprintln!("run: {e}");
        99
    });
    std::process::exit(code)
}

fn runner_cmd(profile: &str, argv: &[&str]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.env(ROLE_ENV, "run")
        .env(PROFILE_ENV, profile)
        .env(CMD_ENV, argv.join("\x1f"));
    c
}

fn mountinfo() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap()
}

fn check(cond: bool, what: &str) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what.to_owned())
    }
}

fn run_true_leaves_nothing() -> Result<(), String> {
    let before = mountinfo();
    let out = runner_cmd("mi100x2", &["true"]).output().unwrap();
    check(
        out.status.code() == Some(0),
        &format!(
            "exit {:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    )?;
    check(before == mountinfo(), "host mountinfo changed")?;
    let out = runner_cmd("mi100", &["sh", "-c", "exit 7"])
        .output()
        .unwrap();
    check(
        out.status.code() == Some(7),
        &format!("exit status not forwarded: {:?}", out.status),
    )
}

const VIEW_SCRIPT: &str = r#"
set -e
test "$(cat /sys/class/kfd/kfd/topology/nodes/1/gpu_id)" = 16172
test "$(cat /sys/class/kfd/kfd/topology/nodes/2/gpu_id)" = 55729
grep -q '^drm_render_minor 129$' /sys/class/kfd/kfd/topology/nodes/2/properties
# Where the kernel puts the topology (the only path libhsakmt reads), and the class link.
test "$(readlink /sys/class/kfd/kfd)" = ../../devices/virtual/kfd/kfd
test "$(cat /sys/devices/virtual/kfd/kfd/topology/nodes/1/gpu_id)" = 16172
test -e /sys/devices/virtual/bdi
# Render minors: class and char-dev links to a PCI function with the GPU's ids.
test "$(cat /sys/class/drm/renderD129/dev)" = 226:129
test "$(cat /sys/dev/char/226:128/device/vendor)" = 0x1002
test "$(cat /sys/class/drm/renderD128/device/device)" = "$(printf '%#06x' "$(sed -n 's/^device_id //p' /sys/class/kfd/kfd/topology/nodes/1/properties)")"
test "$(readlink -f /sys/class/drm/renderD128/subsystem)" = /sys/class/drm
test -e /sys/dev/char/1:3
test -d /sys/devices/system/cpu
# One CPU node in the profile: the host's node directory as it is, not covered.
if grep -q ' /sys/devices/system/node ' /proc/self/mountinfo; then echo node-covered; exit 1; fi
test "$(stat -c %F /dev/kfd)" = "regular empty file"
test "$(stat -c %F /dev/dri/renderD128)" = "regular empty file"
test -e /dev/dri/renderD129
test ! -e /dev/dri/renderD130
grep -q ' /dev/kfd .* fuse.kfd-emu ' /proc/self/mountinfo
echo x > /dev/null
test -c /dev/fuse
test -d /dev/pts
test -e /sys/class/net/lo
test "$KFD_EMU_PROFILE" = mi100x2
test -f "$KFD_EMU_STATE_DIR/profile.toml"
if touch /sys/class/kfd/x 2>/dev/null; then echo sysfs-writable; exit 1; fi
# stdin is the caller's /dev/null: reopened on a mount of this namespace.
m=$(awk '/^mnt_id:/ {print $2}' /proc/self/fdinfo/0)
awk -v m="$m" '$1 == m {found = 1} END {exit !found}' /proc/self/mountinfo
echo view-ok
"#;

/// `script` run by `sh` in the runner on `profile` succeeds and prints
/// `ok`; else an error that starts with `what` and shows its output.
fn script_passes(profile: &str, script: &str, ok: &str, what: &str) -> Result<(), String> {
    let out = runner_cmd(profile, &["sh", "-c", script]).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    check(
        out.status.success() && text.contains(ok),
        &format!("{what} ({:?}):\n{text}", out.status),
    )
}

fn namespace_view() -> Result<(), String> {
    script_passes("mi100x2", VIEW_SCRIPT, "view-ok", "namespace view wrong")
}

fn side_by_side() -> Result<(), String> {
    let before = mountinfo();
    let script = "cat /sys/class/kfd/kfd/topology/nodes/1/gpu_id; sleep 1; \
                  cat /sys/class/kfd/kfd/topology/nodes/1/gpu_id";
    let a = runner_cmd("mi100", &["sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let b = runner_cmd("mi100x2", &["sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let a = a.wait_with_output().unwrap();
    let b = b.wait_with_output().unwrap();
    check(
        a.status.success() && b.status.success(),
        "an instance failed",
    )?;
    check(
        String::from_utf8_lossy(&a.stdout) == "41443\n41443\n",
        &format!("instance a saw {:?}", String::from_utf8_lossy(&a.stdout)),
    )?;
    check(
        String::from_utf8_lossy(&b.stdout) == "16172\n16172\n",
        &format!("instance b saw {:?}", String::from_utf8_lossy(&b.stdout)),
    )?;
    check(before == mountinfo(), "host mountinfo changed")
}

/// Two instances that are both pid 1 of their own pid namespace (as test
/// suites run them) keep state directories of their own: the one that ends
/// first does not remove the other's (nor its supervisor socket).
fn same_pid_other_namespaces() -> Result<(), String> {
    let spawn = |secs: &str| {
        let script = format!(
            "d=$KFD_EMU_STATE_DIR; sleep {secs}; test -f \"$d/profile.toml\" && echo \"$d\""
        );
        let inner = runner_cmd("mi100", &["sh", "-c", &script]);
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--kill-child"])
            .arg(inner.get_program())
            .envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .stdout(Stdio::piped());
        c.spawn().unwrap()
    };
    let a = spawn("0.2");
    let b = spawn("1.5");
    let a = a.wait_with_output().unwrap();
    let b = b.wait_with_output().unwrap();
    let (da, db) = (
        String::from_utf8_lossy(&a.stdout),
        String::from_utf8_lossy(&b.stdout),
    );
    check(
        a.status.success() && b.status.success(),
        &format!("an instance lost its state directory: {da:?} {db:?}"),
    )?;
    check(da != db, &format!("both used {da:?}"))
}

fn pids_with_arg(marker: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if c.split(|b| *b == 0).any(|a| a == marker.as_bytes()) {
                v.push(pid);
            }
        }
    }
    v
}

// The child is reaped by the try_wait loop, which the lint does not follow.
#[allow(clippy::zombie_processes)]
fn sigterm_cleans_up() -> Result<(), String> {
    let before = mountinfo();
    // A marker of this run only: sleepers another run left behind (or runs
    // side by side) must not count.
    let marker = format!("1001.{}", std::process::id());
    // A background job, a setsid escapee and a foreground sleeper.
    let script = format!("sleep {marker} & setsid sleep {marker} & sleep {marker}");
    let mut r = runner_cmd("mi100", &["sh", "-c", &script]).spawn().unwrap();
    let t0 = Instant::now();
    while pids_with_arg(&marker).len() < 3 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = pids_with_arg(&marker).len();
    if started != 3 {
        let _ = r.kill();
        let _ = r.wait();
        return Err(format!("{started} of 3 sleepers started"));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(r.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = r.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = r.kill();
            let _ = r.wait();
            return Err("runner did not exit after SIGTERM".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    check(
        status.code() == Some(128 + libc::SIGTERM),
        &format!("status {status:?}"),
    )?;
    check(pids_with_arg(&marker).is_empty(), "processes left behind")?;
    check(before == mountinfo(), "host mountinfo changed")
}

// CRIU inside the namespace the runner builds (no fds or mounts from
// another namespace, restored tasks cleaned up with the run) is tested
// where a CRIU exists: every case of test/gpu/run.sh, test/smoke and the
// zdtm suites run criu-rocm inside `kfd-emu run`, which is `runner::run`.

/// A profile with two CPU nodes shows two NUMA nodes, each with host CPUs
/// that have caches (libhsakmt reads `nodeN/cpu*/cache` for every CPU node).
const NUMA_SCRIPT: &str = r#"
set -e
test "$(cat /sys/devices/system/node/possible)" = 0-1
test "$(cat /sys/devices/system/node/online)" = 0-1
for n in 0 1; do
    ls -d /sys/devices/system/node/node$n/cpu[0-9]* >/dev/null
    c=$(ls -d /sys/devices/system/node/node$n/cpu[0-9]* | head -n1)
    test -d "$c/cache/index0"
    grep -q "^Node $n MemTotal:" /sys/devices/system/node/node$n/meminfo
done
test "$(cat /sys/devices/system/node/node0/distance)" = "10 32"
test "$(cat /sys/class/drm/renderD130/device/numa_node)" = 1
echo numa-ok
"#;

fn numa_view() -> Result<(), String> {
    script_passes("mi210x4", NUMA_SCRIPT, "numa-ok", "NUMA node view wrong")
}

fn main() {
    if std::env::var(ROLE_ENV).as_deref() == Ok("run") {
        run_role();
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    type Case = (&'static str, fn() -> Result<(), String>);
    let cases: [Case; 6] = [
        ("run_true_leaves_nothing", run_true_leaves_nothing),
        ("namespace_view", namespace_view),
        ("numa_view", numa_view),
        ("side_by_side", side_by_side),
        ("same_pid_other_namespaces", same_pid_other_namespaces),
        ("sigterm_cleans_up", sigterm_cleans_up),
    ];
    let mut failed = 0;
    for (name, f) in cases {
        if !filter.is_empty() && !filter.iter().any(|p| name.contains(p.as_str())) {
            continue;
        }
        match f() {
            Ok(()) => println!("test {name} ... ok"),
            Err(e) => {
                println!("test {name} ... FAILED\n{e}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        std::process::exit(1);
    }
}
