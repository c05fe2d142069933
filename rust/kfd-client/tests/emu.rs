//! The client through the real ioctl/mmap path, against kfd-emu.
//!
//! The outer tests start `kfd-emu run --profile mi100x2 -- <this binary> --ignored --exact
//! <inner>`; the inner tests (`inner_*`, ignored, because they need /dev/kfd) then run in
//! the emulator's namespace. kfd-emu must be built in the same target directory (`cargo test
//! --workspace` does that; otherwise `cargo build -p kfd-emu`) or named by `KFD_EMU`; if it
//! is missing the outer tests fail rather than pass vacuously.

mod common;

use common::{kfd_emu, self_args};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use kfd_client::events::{Events, WaitResult};
use kfd_client::queue::SdmaQueue;
use kfd_client::{sdma, KfdClient, MemKind};

const PROFILE: &str = "mi100x2";

fn run_inner(name: &str) {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(kfd_emu())
        .args(["run", "--profile", PROFILE, "--"])
        .arg(&exe)
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
}

#[test]
fn sdma_copy_fill_and_fence_under_emulator() {
    run_inner("inner_sdma_copy_fill_and_fence");
}

#[test]
fn trap_signals_event_under_emulator() {
    run_inner("inner_trap_signals_event");
}

#[test]
#[ignore = "needs /dev/kfd (run through the outer test or `kfd-emu run`)"]
fn inner_sdma_copy_fill_and_fence() {
    let c = KfdClient::open().unwrap();
    assert_eq!(c.gpus().len(), 2, "profile {PROFILE} has two GPUs");
    const SZ: u64 = 64 << 10;
    const TAIL: u64 = 4096;
    for g in c.gpus() {
        let mut src = c.alloc(g.gpu_id, SZ, MemKind::Vram).unwrap();
        let dst = c.alloc(g.gpu_id, SZ, MemKind::Gtt).unwrap();
        let flag = c.alloc(g.gpu_id, 4096, MemKind::Gtt).unwrap();
        for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let mut q = SdmaQueue::create(&c, g.gpu_id, 4096).unwrap();
        let (s, d, f) = (src.va().0, dst.va().0, flag.va().0);
        // Copy all but the tail, fill the tail with a constant, write a round number and
        // fence: 21 dwords a round, which does not divide the 4 KiB ring, so 200 rounds wrap
        // it several times and exercise the NOP padding at its end.
        for round in 1..=200u32 {
            q.submit_with(|v| {
                sdma::copy_linear_split(v, s, d, SZ - TAIL)?;
                sdma::constant_fill(v, d + SZ - TAIL, 0xc0ff_ee00 | round, TAIL)?;
                sdma::write_linear(v, f + 8, &[round])?;
                sdma::fence(v, f, round)
            })
            .unwrap();
        }
        q.wait_idle(Duration::from_secs(20)).unwrap();
        assert_eq!(q.rptr(), q.submitted());
        assert!(q.submitted() > 3 * 4096, "the ring wrapped");
        let out = dst.as_slice();
        let n = (SZ - TAIL) as usize;
        assert_eq!(&out[..n], &src.as_slice()[..n]);
        for w in out[n..].chunks_exact(4) {
            assert_eq!(u32::from_le_bytes(w.try_into().unwrap()), 0xc0ff_eec8);
        }
        let word = |o: usize| u32::from_le_bytes(flag.as_slice()[o..o + 4].try_into().unwrap());
        assert_eq!((word(0), word(8)), (200, 200));
        q.destroy().unwrap();
    }
}

#[test]
#[ignore = "needs /dev/kfd (run through the outer test or `kfd-emu run`)"]
fn inner_trap_signals_event() {
    let c = KfdClient::open().unwrap();
    let g = c.gpus()[0].gpu_id;
    let mut ev = Events::new(&c, g).unwrap();
    let e = ev.create().unwrap();
    assert_eq!(
        ev.wait(e, Duration::from_millis(50)).unwrap(),
        WaitResult::TimedOut
    );
    let mut q = SdmaQueue::create(&c, g, 4096).unwrap();
    q.submit_with(|v| {
        sdma::fence(v, e.slot_va.0, 0)?;
        sdma::trap(v, e.id.0)
    })
    .unwrap();
    assert_eq!(
        ev.wait(e, Duration::from_secs(10)).unwrap(),
        WaitResult::Signaled
    );
    // Auto-reset: the next wait times out again; SET_EVENT from the CPU fires it.
    assert_eq!(
        ev.wait(e, Duration::from_millis(50)).unwrap(),
        WaitResult::TimedOut
    );
    ev.set(e).unwrap();
    assert_eq!(
        ev.wait(e, Duration::from_secs(10)).unwrap(),
        WaitResult::Signaled
    );
    ev.destroy(e).unwrap();
}

/// The demo workload: ready line, SIGUSR1 verification while running, SIGTERM exit 0.
#[test]
fn gpu_workload_verifies_under_emulator() {
    let script = format!(
        "{wl} --mib 4 --bos 3 & p=$!; sleep 2; kill -USR1 $p; sleep 1; kill -TERM $p; wait $p",
        wl = env!("CARGO_BIN_EXE_gpu-workload")
    );
    let mut child = Command::new(kfd_emu())
        .args(["run", "--profile", PROFILE, "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn kfd-emu");
    let lines: Vec<String> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| l.unwrap())
        .collect();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "gpu-workload failed: {status}\n{lines:#?}"
    );
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(lines[0].starts_with("{\"ready\":true"), "{}", lines[0]);
    for l in &lines[1..] {
        assert!(l.starts_with("{\"ok\":true"), "{l}");
        assert!(
            l.contains("\"bytes\":8404992"),
            "two GPUs x 3 BOs of 4 MiB/3: {l}"
        );
        assert!(l.contains("\"errors\":[]"), "{l}");
    }
    // The counters moved between the two verifications.
    let counter = |l: &str| -> u64 {
        let s = &l[l.find("\"counters\":[").unwrap() + 12..];
        s[..s.find(|c: char| !c.is_ascii_digit()).unwrap()]
            .parse()
            .unwrap()
    };
    assert!(counter(&lines[2]) > counter(&lines[1]), "{lines:#?}");
}
