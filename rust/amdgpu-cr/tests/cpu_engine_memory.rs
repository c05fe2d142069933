//! The CPU engine's memory bound: dumping and restoring a BO much larger
//! than the memory budget (`KFD_MAX_BUFFER_SIZE`) raises the process' peak
//! RSS by at most the budget, not by the BO size.  A separate test binary,
//! so no other test disturbs the process-wide peak.  Prints the throughput it saw.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use amdgpu_cr::bo;
use amdgpu_cr::copy::{dump_contents, restore_contents, BoRef, Engines, GpuJob};
use amdgpu_cr::env::{staging_size, EnginePolicy};
use amdgpu_cr::ids::{GpuId, GpuVa, MmapOffset};
use amdgpu_cr::image::FileId;

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn large_bo_costs_one_window() {
    const BO: u64 = 256 << 20;
    let window = staging_size(Some(8 << 20), BO);
    assert_eq!(window, 8 << 20);

    // SAFETY: valid C string; memfd_create has no other preconditions.
    let fd = unsafe { libc::memfd_create(c"vram".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fd was just created and is owned by nothing else.
    let dev = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    dev.set_len(BO + (1 << 20)).unwrap();
    // Fill through write(2) so the test itself does not map the memfd.
    let chunk: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 + 3) as u8).collect();
    for i in 0..BO >> 20 {
        dev.write_all_at(&chunk, (1 << 20) + (i << 20)).unwrap();
    }
    let dir = std::env::temp_dir().join(format!("amdgpu-cr-mem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let job = || GpuJob {
        user: GpuId(0x1a2b),
        actual: GpuId(0x1a2b),
        bos: vec![BoRef {
            index: 0,
            gpu: GpuId(0x1a2b),
            addr: GpuVa(0x7000_0000_0000),
            size: BO,
            alloc_flags: bo::ALLOC_VRAM,
            cpu_map: Some((dev.as_fd(), MmapOffset(1 << 20))),
            dmabuf: None,
        }],
        engines: Engines::new(EnginePolicy::Auto, window, None),
    };

    let before = peak_rss_kib();
    let out = dump_contents(&dir, FileId(1), vec![job()]).unwrap();
    let s = &out.stats[0];
    eprintln!(
        "dump: {} MiB in {:?} = {:.0} MB/s",
        s.bytes >> 20,
        s.elapsed,
        s.mb_per_s()
    );
    let stats = restore_contents(&dir, FileId(1), vec![job()], &out.hashes).unwrap();
    eprintln!(
        "restore: {} MiB in {:?} = {:.0} MB/s",
        stats[0].bytes >> 20,
        stats[0].elapsed,
        stats[0].mb_per_s()
    );
    let grown = peak_rss_kib().saturating_sub(before);
    eprintln!("peak RSS grew by {grown} KiB (window {} KiB)", window >> 10);
    // The budget (windows and file buffers of every lane) and 2 MiB of
    // allocator noise and thread stacks (measured: 4 KiB); far below the
    // 256 MiB a whole-BO staging buffer would cost.
    assert!(
        grown < (window >> 10) + 2 * 1024,
        "peak RSS grew by {grown} KiB"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
