//! The client through the real ioctl/mmap path, against kfd-emu.
//!
//! The outer tests start `kfd-emu run --profile mi100x2 -- <this binary> --ignored --exact
//! <inner>`; the inner tests (`inner_*`, ignored, because they need /dev/kfd) then run in
//! the emulator's namespace. kfd-emu must be built in the same target directory (`cargo test
//! --workspace` does that; otherwise `cargo build -p kfd-emu`) or named by `KFD_EMU`; if it
//! is missing the outer tests fail rather than pass vacuously.

mod common;

use common::{kfd_emu, run_inner_under_emu};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use kfd_client::events::{Events, WaitResult};
use kfd_client::queue::{SdmaQueue, DOORBELL_RANGE};
use kfd_client::{
    sdma, DeviceBo, KfdClient, MemKind, DOORBELL_ALLOC_FLAGS, MMIO_REMAP_ALLOC_FLAGS,
    MMIO_REMAP_SIZE,
};

const PROFILE: &str = "mi100x2";

fn run_inner(name: &str) {
    run_inner_under_emu(PROFILE, name);
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
fn doorbell_and_mmio_bos_under_emulator() {
    run_inner("inner_doorbell_and_mmio_bos");
}

#[test]
fn alloc_write_read_free_under_emulator() {
    run_inner("inner_alloc_write_read_free");
}

#[test]
fn abi_version_apertures_and_render_info_under_emulator() {
    run_inner("inner_abi_version_apertures_and_render_info");
}

/// kfd-abi's handles straight on the devices: the version, a render node's driver and
/// device info, the apertures.
#[test]
#[ignore = "needs /dev/kfd (run through the outer test or `kfd-emu run`)"]
fn inner_abi_version_apertures_and_render_info() {
    use kfd_abi::handle::{Kfd, RenderNode};
    use kfd_abi::ids::RenderMinor;

    let kfd = Kfd::open().unwrap();
    let (major, minor) = kfd.get_version().unwrap();
    assert_eq!(major, 1);
    assert!(minor >= 8, "KFD 1.{minor}");
    let r = RenderNode::open(RenderMinor(128)).unwrap();
    assert_eq!(r.drm_version().unwrap(), "amdgpu");
    let info = r.amdgpu_info_dev_info().unwrap();
    assert!(info.virtual_address_max > info.virtual_address_offset);
    let ap = kfd.get_process_apertures_new(64).unwrap();
    assert!(!ap.is_empty());
    assert!(ap
        .iter()
        .all(|a| a.gpu_id != 0 && a.gpuvm_base < a.gpuvm_limit));
}

/// BOs of both kinds on every GPU: written through the client's mapping, seen through a
/// second mapping of the render node; freed BOs' ranges are reused.
#[test]
#[ignore = "needs /dev/kfd (run through the outer test or `kfd-emu run`)"]
fn inner_alloc_write_read_free() {
    let c = KfdClient::open().unwrap();
    let gpu_nodes = kfd_client::topology::read_nodes(c.topology_root())
        .unwrap()
        .into_iter()
        .filter(|n| n.gpu_id.is_some())
        .count();
    assert_eq!(c.gpus().len(), gpu_nodes);
    for g in c.gpus() {
        assert!(g.gpuvm_base < g.gpuvm_limit, "GPU {}", g.gpu_id.get());
        for (i, kind) in [MemKind::Gtt, MemKind::Vram].into_iter().enumerate() {
            let bo = c.alloc(g.gpu_id, 10_000, kind).unwrap();
            assert_eq!(bo.size(), 12288);
            assert_eq!(bo.handle().gpu_id(), g.gpu_id);
            assert!(bo.va().0 >= g.gpuvm_base);
            let tag = [b'k', b'f', b'd', i as u8];
            bo.volatile().copy_from(&tag);
            bo.volatile().subslice(8191, 1).unwrap().copy_from(&[0xa5]);
            // A second mapping of the render node at the returned offset sees the same
            // bytes: the CPU VA really is the BO, not private memory.
            let view =
                kfd_abi::handle::Mapping::shared(g.render().as_fd(), bo.mmap_offset(), 12288)
                    .unwrap();
            let mut seen = vec![0u8; 12288];
            view.as_volatile_slice().copy_to(&mut seen);
            assert_eq!(&seen[..4], &tag);
            assert_eq!(seen[8191], 0xa5);
            drop(view);
            bo.free().unwrap();
        }
    }
    // Freed BOs leave no CPU mapping behind and their GPU range can be reused.
    let a = c.alloc(c.gpus()[0].gpu_id, 4096, MemKind::Gtt).unwrap();
    let b = c.alloc(c.gpus()[0].gpu_id, 4096, MemKind::Gtt).unwrap();
    assert_ne!(a.va(), b.va());
    assert_ne!(a.handle(), b.handle());
}

/// The line of /proc/self/maps that starts at `va`: (end, offset, path).
fn mapping_at(va: u64) -> Option<(u64, u64, String)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (start, end) = f.next()?.split_once('-')?;
        if u64::from_str_radix(start, 16).ok()? != va {
            return None;
        }
        let _perms = f.next()?;
        let off = u64::from_str_radix(f.next()?, 16).ok()?;
        let path = f.nth(2).unwrap_or("").to_owned();
        Some((u64::from_str_radix(end, 16).ok()?, off, path))
    })
}

/// A doorbell or MMIO BO is a /dev/kfd mapping of its whole size at its VA.
fn assert_kfd_mapping(what: &str, b: &DeviceBo) {
    let (end, off, path) =
        mapping_at(b.va.0).unwrap_or_else(|| panic!("{what}: no mapping at {:?}", b.va));
    assert_eq!(path, "/dev/kfd", "{what}");
    assert_eq!(end - b.va.0, b.size, "{what}");
    assert_eq!(off, b.cpu_offset.0, "{what}");
}

#[test]
#[ignore = "needs /dev/kfd (run through the outer test or `kfd-emu run`)"]
fn inner_doorbell_and_mmio_bos() {
    let c = KfdClient::open().unwrap();
    let n = c.gpus().len();
    assert_eq!(n, 2, "profile {PROFILE} has two GPUs");
    for g in c.gpus() {
        // Every GPU of the profile is GFX9+: an MMIO remap page from open on.
        let m = g
            .mmio_bo()
            .unwrap_or_else(|| panic!("GPU {}: {:?}", g.gpu_id.get(), g.mmio_unavailable()));
        assert_eq!(g.mmio_unavailable(), None);
        assert_eq!((m.size, m.flags), (MMIO_REMAP_SIZE, MMIO_REMAP_ALLOC_FLAGS));
        assert_eq!(m.handle.gpu_id(), g.gpu_id);
        assert!(m.va.0 >= g.gpuvm_base && m.va.0 + m.size - 1 <= g.gpuvm_limit);
        assert_eq!(
            m.cpu_offset, m.alloc_offset,
            "MMIO is mapped where KFD said"
        );
        assert_kfd_mapping("MMIO page", &m);
        g.hdp_flush();
        let reg = g.mmio().expect("an MMIO page").read_u32(0);
        assert_eq!(reg, 1, "HDP_MEM_FLUSH_CNTL written");
        // No queue yet, so no doorbell BO.
        assert_eq!(g.doorbell_bo(), None);
    }
    let (g0, g1) = (&c.gpus()[0], &c.gpus()[1]);
    let mut q1 = SdmaQueue::create(&c, g0.gpu_id, 4096).unwrap();
    let d = g0
        .doorbell_bo()
        .expect("the first queue allocates the doorbell BO");
    assert_eq!((d.size, d.flags), (DOORBELL_RANGE, DOORBELL_ALLOC_FLAGS));
    assert_eq!(d.handle.gpu_id(), g0.gpu_id);
    // kfd-emu hands out the slice's /dev/kfd offset as the BO's offset (a real KFD gives
    // no /dev/kfd offset there); the client maps CREATE_QUEUE's slice offset, the same one.
    assert_eq!(d.cpu_offset, d.alloc_offset);
    assert_kfd_mapping("doorbell slice", &d);
    assert_eq!(g1.doorbell_bo(), None, "only the GPU with a queue has one");
    let mut q2 = SdmaQueue::create(&c, g0.gpu_id, 4096).unwrap();
    assert_eq!(
        g0.doorbell_bo(),
        Some(d),
        "one doorbell BO for all queues of a GPU"
    );
    let inside = |q: &SdmaQueue<'_>| {
        let a = q.doorbell_va().0;
        assert!(
            a >= d.va.0 && a + 8 <= d.va.0 + d.size && a.is_multiple_of(8),
            "{a:#x}"
        );
        a
    };
    assert_ne!(inside(&q1), inside(&q2));
    // Each queue runs through its own doorbell in the BO, which holds its write pointer.
    let flag = c.alloc(g0.gpu_id, 4096, MemKind::Gtt).unwrap();
    for (i, q) in [&mut q1, &mut q2].into_iter().enumerate() {
        q.submit_with(|v| sdma::fence(v, flag.va().0 + 8 * i as u64, 40 + i as u32))
            .unwrap();
        q.wait_idle(Duration::from_secs(10)).unwrap();
        let db = q.doorbell().read_u64(0);
        assert_eq!(db, q.submitted());
        let v = flag.volatile().read_u32(8 * i);
        assert_eq!(v, 40 + i as u32);
    }
    // KFD counts both kinds among the process' BOs: the ring and pointer BOs of two
    // queues, the flag BO, the doorbell BO and one MMIO BO per GPU.
    let info = c.kfd().criu_process_info().unwrap();
    c.kfd().criu_unpause().unwrap();
    assert_eq!(info.num_bos as usize, 2 * 2 + 1 + 1 + n);
    // Destroying the queues keeps the doorbell BO; a new queue reuses it.
    q1.destroy().unwrap();
    q2.destroy().unwrap();
    assert_eq!(g0.doorbell_bo(), Some(d));
    let q3 = SdmaQueue::create(&c, g0.gpu_id, 4096).unwrap();
    inside(&q3);
    q3.destroy().unwrap();
    flag.free().unwrap();
    let mut own: Vec<DeviceBo> = c.gpus().iter().filter_map(|g| g.mmio_bo()).collect();
    own.push(d);
    // Closing frees them and removes their mappings.
    c.close().unwrap();
    for b in own {
        let gone = mapping_at(b.va.0).is_none_or(|(_, _, path)| path != "/dev/kfd");
        assert!(gone, "{b:?} still mapped");
    }
}

#[test]
#[ignore = "needs /dev/kfd (run through the outer test or `kfd-emu run`)"]
fn inner_sdma_copy_fill_and_fence() {
    let c = KfdClient::open().unwrap();
    assert_eq!(c.gpus().len(), 2, "profile {PROFILE} has two GPUs");
    const SZ: u64 = 64 << 10;
    const TAIL: u64 = 4096;
    for g in c.gpus() {
        let src = c.alloc(g.gpu_id, SZ, MemKind::Vram).unwrap();
        let dst = c.alloc(g.gpu_id, SZ, MemKind::Gtt).unwrap();
        let flag = c.alloc(g.gpu_id, 4096, MemKind::Gtt).unwrap();
        let bytes: Vec<u8> = (0..SZ as usize).map(|i| (i * 7 + 3) as u8).collect();
        src.volatile().copy_from(&bytes);
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
        let out = dst.to_vec();
        let n = (SZ - TAIL) as usize;
        assert_eq!(&out[..n], &src.to_vec()[..n]);
        for w in out[n..].chunks_exact(4) {
            assert_eq!(u32::from_le_bytes(w.try_into().unwrap()), 0xc0ff_eec8);
        }
        let word = |o: usize| flag.volatile().read_u32(o);
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

/// A container given two of mi210x4's four render nodes: the client skips the GPUs whose
/// render node is not there (ENOENT), as libhsakmt does, and works on the other two.
#[test]
fn gpus_without_a_render_node_are_skipped() {
    // /dev/dri as a container has it: a tmpfs with two of the emulator's nodes bound in
    // (--rbind: each node is a mount of its own).
    let script = format!(
        "mkdir -p /run/dri-all && mount --rbind /dev/dri /run/dri-all && \
         mount -t tmpfs dri /dev/dri && for m in 128 131; do touch /dev/dri/renderD$m && \
         mount --bind /run/dri-all/renderD$m /dev/dri/renderD$m || exit 1; done; \
         {wl} --mib 2 --bos 2 & p=$!; sleep 2; kill -TERM $p; wait $p",
        wl = env!("CARGO_BIN_EXE_gpu-workload")
    );
    let out = Command::new(kfd_emu())
        .args([
            "run",
            "--profile",
            "mi210x4",
            "--",
            "unshare",
            "-m",
            "sh",
            "-c",
        ])
        .arg(&script)
        .output()
        .expect("spawn kfd-emu");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "gpu-workload failed: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    // mi210x4: 0x1e8f@renderD128 0x6c52@renderD129 0xb407@renderD130 0xf3a9@renderD131.
    assert!(
        lines[0].contains("\"gpus\":[7823,62377]")
            && lines[0].contains(
                "\"skipped_gpus\":[{\"gpu_id\":27730,\"render_minor\":129,\"errno\":2},\
                 {\"gpu_id\":46087,\"render_minor\":130,\"errno\":2}]"
            ),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with("{\"ok\":true") && lines[1].contains("\"gpus\":2"),
        "{}",
        lines[1]
    );
}
