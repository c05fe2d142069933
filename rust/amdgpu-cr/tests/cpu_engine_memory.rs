//! The CPU engine's memory bound: dumping and restoring a BO much larger
//! than the memory budget (`KFD_MAX_BUFFER_SIZE`) raises the process' peak
//! RSS by at most the budget, not by the BO size.  A separate test binary,
//! so no other test disturbs the process-wide peak.  Prints the throughput it saw.

mod common;

use std::os::unix::fs::FileExt;

use amdgpu_cr::copy::{dump_contents, restore_contents};
use amdgpu_cr::env::staging_size;
use amdgpu_cr::image::FileId;
use common::scratch::scratch_dir;
use common::{device, one_bo_job, peak_rss_kib, BO_OFFSET};

#[test]
fn large_bo_costs_one_window() {
    const BO: u64 = 256 << 20;
    let window = staging_size(Some(8 << 20), BO);
    assert_eq!(window, 8 << 20);

    let dev = device(BO_OFFSET + BO);
    // Fill through write(2) so the test itself does not map the memfd.
    let chunk: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 + 3) as u8).collect();
    for i in 0..BO >> 20 {
        dev.write_all_at(&chunk, BO_OFFSET + (i << 20)).unwrap();
    }
    let tmp = scratch_dir("mem");
    let dir = tmp.path();

    let job = || one_bo_job(&dev, BO, window);

    let before = peak_rss_kib();
    let out = dump_contents(dir, FileId(1), vec![job()]).unwrap();
    let s = &out.stats[0];
    eprintln!(
        "dump: {} MiB in {:?} = {:.0} MB/s",
        s.bytes >> 20,
        s.elapsed,
        s.mb_per_s()
    );
    let stats = restore_contents(dir, FileId(1), vec![job()], &out.hashes).unwrap();
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
}
