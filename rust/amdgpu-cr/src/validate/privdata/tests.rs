//! Blobs as KFD writes them pass; each value KFD never writes is refused,
//! named by its object and field.

use super::*;
use crate::image::tests::{sample_kfd, tempdir};
use crate::proto::CriuKfd;

pub(super) const GPU: u32 = 0x1a2b;
/// In BO 0 (VRAM, 2 MiB at 0x7000_0000_0000).
const RING: u64 = 0x7000_0000_0000;

pub(super) fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// An SDMA queue record with its MQD, as KFD writes one.
pub(super) fn sdma_queue(id: u32) -> Vec<u8> {
    let mut q = vec![0u8; 120];
    put64(&mut q, offset_of!(QueueRec, q_address), RING);
    put64(&mut q, offset_of!(QueueRec, q_size), 0x1000);
    put64(&mut q, offset_of!(QueueRec, read_ptr_addr), RING + 0x1000);
    put64(&mut q, offset_of!(QueueRec, write_ptr_addr), RING + 0x1008);
    put32(&mut q, offset_of!(QueueRec, gpu_id), GPU);
    put32(&mut q, offset_of!(QueueRec, type_), queue_type::SDMA);
    put32(&mut q, offset_of!(QueueRec, q_id), id);
    put32(&mut q, offset_of!(QueueRec, doorbell_id), id);
    put32(&mut q, offset_of!(QueueRec, mqd_size), 512);
    q.resize(120 + 512, 0xab);
    q
}

/// A compute (AQL) queue with a context save area: sample GPUs have 256
/// SIMDs, 4 per CU (64 CUs), 1 array per engine: 2560 waves before Navi10.
pub(super) fn compute_queue(id: u32) -> Vec<u8> {
    let mut q = sdma_queue(id);
    q.truncate(120);
    put32(&mut q, offset_of!(QueueRec, type_), queue_type::COMPUTE);
    put32(&mut q, offset_of!(QueueRec, format), queue_format::AQL);
    put64(
        &mut q,
        offset_of!(QueueRec, ctx_save_restore_area_address),
        RING + 0x10_0000,
    );
    put32(
        &mut q,
        offset_of!(QueueRec, ctx_save_restore_area_size),
        0x8_0000,
    );
    put64(
        &mut q,
        offset_of!(QueueRec, eop_ring_buffer_address),
        RING + 0x2000,
    );
    put32(&mut q, offset_of!(QueueRec, eop_ring_buffer_size), 0x1000);
    // 2560 waves * 8 bytes + 48: 6 pages.
    put32(&mut q, offset_of!(QueueRec, ctl_stack_size), 0x6000);
    put32(&mut q, offset_of!(QueueRec, mqd_size), 2048);
    q.resize(120 + 2048 + 0x6000, 0);
    q
}

fn event(id: u32, ty: u32) -> Vec<u8> {
    let mut e = vec![0u8; 64];
    put32(&mut e, 0, 1);
    put32(&mut e, offset_of!(EventRec, event_id), id);
    put32(&mut e, offset_of!(EventRec, type_), ty);
    e
}

fn svm(start: u64, size: u64) -> Vec<u8> {
    let mut s = vec![0u8; 24 + 8 * (4 + 2)];
    put32(&mut s, 0, 2);
    put64(&mut s, 8, start);
    put64(&mut s, 16, size);
    s
}

/// `sample_kfd`'s process (2 GPUs, 3 BOs) with these objects.
pub(super) fn image(objects: &[Vec<u8>]) -> KfdImage {
    let mut m: CriuKfd = sample_kfd();
    for d in m.device_entries.iter_mut().filter(|d| d.gpu_id != 0) {
        d.simd_per_cu = 4;
        d.array_count = 8;
        d.simd_arrays_per_engine = 1;
        d.num_sdma_engines = 2;
        d.num_sdma_queues_per_engine = 8;
    }
    m.priv_bo_record_size = Some(272);
    let mut b = vec![0u8; 8 + 2 * 8 + 3 * 272];
    put32(&mut b, 0, 1);
    for o in objects {
        b.extend_from_slice(o);
    }
    m.priv_data = b;
    m.num_of_objects = objects.len() as u32;
    KfdImage { msg: m }
}

fn verdict(objects: &[Vec<u8>]) -> Result<(), String> {
    let dir = tempdir();
    check(&dir, "amdgpu-kfd-5.img", &image(objects)).map_err(|r| r.to_string())
}

fn refused(objects: &[Vec<u8>], want: &[&str]) {
    let e = verdict(objects).expect_err("accepted");
    for w in want {
        assert!(e.contains(w), "{e:?} lacks {w:?}");
    }
}

fn edited(mut q: Vec<u8>, f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    f(&mut q);
    q
}

#[test]
fn what_kfd_writes_passes() {
    let objects = [
        sdma_queue(0),
        compute_queue(1),
        event(1, 0),
        event(0x8000_0002, 8),
    ];
    assert_eq!(verdict(&objects), Ok(()));
    // A node of 8 XCCs (8 CUs each): 8 MQDs and 8 one-page control stacks.
    let q = edited(compute_queue(0), |q| {
        put32(q, offset_of!(QueueRec, mqd_size), 8 * 2048);
        put32(q, offset_of!(QueueRec, ctl_stack_size), 8 * 0x1000);
        q.resize(120 + 8 * 2048 + 8 * 0x1000, 0);
    });
    assert_eq!(verdict(&[q]), Ok(()));
}

#[test]
fn grown_sizes_are_refused_even_when_the_blob_holds_them() {
    // The control stack of the SDMA queue grown by 1 MiB, the bytes there.
    let q = edited(sdma_queue(0), |q| {
        put32(q, offset_of!(QueueRec, ctl_stack_size), 1 << 20);
        q.resize(q.len() + (1 << 20), 0);
    });
    refused(
        &[q],
        &["queues[0].ctl_stack_size", "no control stack", "GPU 0x1a2b"],
    );
    let q = edited(sdma_queue(0), |q| {
        put32(q, offset_of!(QueueRec, mqd_size), 512 + (64 << 10));
        q.resize(q.len() + (64 << 10), 0);
    });
    refused(&[q], &["queues[0].mqd_size", "512 bytes"]);
    let q = edited(compute_queue(0), |q| {
        put32(q, offset_of!(QueueRec, ctl_stack_size), 0x6000 + (1 << 20));
        q.resize(q.len() + (1 << 20), 0);
    });
    refused(&[q], &["queues[0].ctl_stack_size", "0x6000"]);
    let q = edited(compute_queue(0), |q| {
        put32(q, offset_of!(QueueRec, mqd_size), 2048 + (64 << 10));
        q.resize(q.len() + (64 << 10), 0);
    });
    refused(&[q], &["queues[0].mqd_size", "2048 bytes per XCC"]);
}

#[test]
fn queue_fields_kfd_never_writes_are_refused() {
    let set = |off: usize, v: u32| edited(sdma_queue(0), |q| put32(q, off, v));
    refused(
        &[set(offset_of!(QueueRec, type_), 2)],
        &["queues[0].type", "is 2"],
    );
    refused(
        &[set(offset_of!(QueueRec, format), 1)],
        &["queues[0].format"],
    );
    refused(
        &[set(offset_of!(QueueRec, sdma_id), 16)],
        &["queues[0].sdma_id", "16 SDMA"],
    );
    refused(
        &[set(offset_of!(QueueRec, doorbell_id), 1024)],
        &["queues[0].doorbell_id"],
    );
    refused(
        &[set(offset_of!(QueueRec, q_id), 5000)],
        &["queues[0].q_id"],
    );
    refused(
        &[set(offset_of!(QueueRec, gpu_id), 0x7777)],
        &["queues[0].gpu_id"],
    );
    refused(
        &[sdma_queue(0), edited(sdma_queue(0), |_| {})],
        &["queues[1].q_id", "queue 0"],
    );
    let q = edited(sdma_queue(0), |q| {
        put64(q, offset_of!(QueueRec, q_address), 0x1000)
    });
    refused(&[q], &["queues[0].q_address", "no BO or SVM range"]);
    let q = edited(sdma_queue(0), |q| {
        put64(q, offset_of!(QueueRec, q_size), 1 << 30)
    });
    refused(&[q], &["queues[0].q_address"]);
    let q = edited(sdma_queue(0), |q| {
        put64(q, offset_of!(QueueRec, write_ptr_addr), 8)
    });
    refused(&[q], &["queues[0].write_ptr_addr"]);
    let q = edited(compute_queue(0), |q| {
        put32(
            q,
            offset_of!(QueueRec, ctx_save_restore_area_size),
            u32::MAX,
        )
    });
    refused(&[q], &["queues[0].ctx_save_restore_area_address"]);
}

#[test]
fn events_and_svm_ranges_are_checked() {
    refused(&[event(4096, 0)], &["events[0].event_id"]);
    refused(&[event(5, 8)], &["events[0].event_id"]);
    refused(&[event(1, 9)], &["events[0].type"]);
    refused(
        &[event(1, 0), event(1, 0)],
        &["events[1].event_id", "earlier"],
    );
    assert_eq!(verdict(&[svm(0x10_0000, 0x1000)]), Ok(()));
    refused(
        &[svm(0x10_0001, 0x1000)],
        &["svm_ranges[0]", "page-aligned"],
    );
    refused(&[svm(u64::MAX - 0xfff, 0x1000)], &["svm_ranges[0]"]);
    refused(
        &[svm(0x10_0000, 0x2000), svm(0x10_1000, 0x1000)],
        &["svm_ranges[1]", "overlaps"],
    );
    // A ring in an SVM range passes.
    let q = edited(sdma_queue(0), |q| {
        put64(q, offset_of!(QueueRec, q_address), 0x10_0000)
    });
    assert_eq!(verdict(&[svm(0x10_0000, 0x1000), q]), Ok(()));
}

#[test]
fn the_version_is_the_kernels() {
    let mut img = image(&[]);
    img.msg.priv_data[0] = 2;
    let e = check(&tempdir(), "k.img", &img).unwrap_err().to_string();
    assert!(e.contains("priv_data.version"), "{e}");
}
