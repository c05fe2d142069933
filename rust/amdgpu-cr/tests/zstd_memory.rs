//! The memory bound with compression on: a compressed dump (in lanes, each
//! with its own zstd compressor), an incremental compressed dump against
//! it, and the restore of the first raise the process' peak RSS by at
//! most the memory budget (`KFD_MAX_BUFFER_SIZE`) and 8 MiB, the
//! compressors and a restore's decompressors included.  (The restore of
//! the incremental dump, whose lanes also decode the parent's frames, is
//! byte-checked by the chain tests in the library, not measured here.)  A separate test binary, so no other test
//! disturbs the process-wide peak (VmHWM: memory, not time, so a loaded
//! machine does not change the verdict).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use amdgpu_cr::bo;
use amdgpu_cr::copy::{dump_contents_encoded, restore_contents_encoded, BoRef, Engines, GpuJob};
use amdgpu_cr::env::EnginePolicy;
use amdgpu_cr::ids::{GpuId, GpuVa, MmapOffset};
use amdgpu_cr::image::FileId;

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn compressed_dumps_stay_within_the_budget() {
    const BO: u64 = 128 << 20;
    const BUDGET: u64 = 16 << 20;
    // SAFETY: valid C string; memfd_create has no other preconditions.
    let fd = unsafe { libc::memfd_create(c"vram".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fd was just created and is owned by nothing else.
    let dev = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    dev.set_len(BO + (1 << 20)).unwrap();
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
        dev.write_all_at(&chunk, (1 << 20) + (i << 20)).unwrap();
    }
    let dir = std::env::temp_dir().join(format!("amdgpu-cr-zmem-{}", std::process::id()));
    let (full, incr) = (dir.join("full"), dir.join("incr"));
    std::fs::create_dir_all(&full).unwrap();
    std::fs::create_dir_all(&incr).unwrap();
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
        engines: Engines::new(EnginePolicy::Auto, BUDGET, None),
    };

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
        dev.write_all_at(&[0xa5; 64], (1 << 20) + k * (2 << 20))
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
    std::fs::remove_dir_all(&dir).unwrap();
}
