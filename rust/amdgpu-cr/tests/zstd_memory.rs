//! The memory bound with compression on: a compressed dump (in lanes, each
//! with its own zstd compressor), an incremental compressed dump against
//! it, and the restore of the first raise the process' peak RSS by at
//! most the memory budget (`KFD_MAX_BUFFER_SIZE`) and 8 MiB, the
//! compressors and a restore's decompressors included.  (The restore of
//! the incremental dump, whose lanes also decode the parent's frames, is
//! byte-checked by the chain tests in the library, not measured here.)  A
//! separate test binary, so no other test disturbs the process-wide peak
//! (VmHWM: memory, not time, so a loaded machine does not change the
//! verdict).

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;

use amdgpu_cr::copy::{dump_contents_encoded, restore_contents_encoded};
use amdgpu_cr::image::FileId;
use common::scratch::scratch_dir;
use common::{device, one_bo_job, peak_rss_kib, BO_OFFSET};

#[test]
fn compressed_dumps_stay_within_the_budget() {
    const BO: u64 = 128 << 20;
    const BUDGET: u64 = 16 << 20;
    let dev = device(BO_OFFSET + BO);
    // fp16-like values (they compress some), written through write(2) so
    // the test itself does not map the memfd.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut chunk = vec![0u8; 1 << 20];
    for i in 0..BO >> 20 {
        for w in chunk.chunks_exact_mut(2) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&(0x3c00 | (x as u16 & 0x01ff)).to_le_bytes());
        }
        dev.write_all_at(&chunk, BO_OFFSET + (i << 20)).unwrap();
    }
    let dir = scratch_dir("zmem");
    let (full, incr) = (dir.path().join("full"), dir.path().join("incr"));
    std::fs::create_dir_all(&full).unwrap();
    std::fs::create_dir_all(&incr).unwrap();
    let job = || one_bo_job(&dev, BO, BUDGET);

    let before = peak_rss_kib();
    let z = Some((3, None));
    let out = dump_contents_encoded(&full, FileId(1), vec![job()], z, &BTreeMap::new()).unwrap();
    let s = &out.stats[0];
    eprintln!(
        "compressed dump: {} MiB in {:?} = {:.0} MB/s",
        s.bytes >> 20,
        s.elapsed,
        s.mb_per_s()
    );
    // A twentieth of the extents change; the dump hashes each chunk in
    // its lane's window and compresses only the changed ones.
    for k in (0..BO / (2 << 20)).step_by(20) {
        dev.write_all_at(&[0xa5; 64], BO_OFFSET + k * (2 << 20))
            .unwrap();
    }
    let parent = out.extents.clone();
    let out2 = dump_contents_encoded(&incr, FileId(1), vec![job()], z, &parent).unwrap();
    assert!(!out2.inherited.is_empty());
    // Only the changed chunks (one in 20 of 64) were compressed.
    assert_eq!(out2.written, 4 * (2 << 20), "bytes compressed");
    let no_overlay = BTreeMap::new();
    restore_contents_encoded(
        &full,
        FileId(1),
        vec![job()],
        &out.hashes,
        out.encoding,
        &no_overlay,
    )
    .unwrap();
    let grown = peak_rss_kib().saturating_sub(before);
    let bound = (BUDGET >> 10) + 8 * 1024;
    eprintln!(
        "peak RSS grew by {grown} KiB (budget {} KiB, bound {bound} KiB)",
        BUDGET >> 10
    );
    assert!(grown <= bound, "peak RSS grew by {grown} KiB, over {bound}");
}
