//! The core's dump and restore paths composed the way the hook layer uses
//! them, with the kernel's part played by the test: CHECKPOINT buckets in,
//! images and pages files out; then images in, a GPU map onto a different
//! host, RESTORE buckets (new offsets on new "render nodes"), contents back,
//! VMA fix-ups.  Render nodes are memfds, as in the emulator.

#[path = "../../test-support/scratch.rs"]
mod scratch;

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

use amdgpu_cr::bo;
use amdgpu_cr::copy::{dump_contents, restore_contents, Engines, GpuJob};
use amdgpu_cr::env::{staging_size, Checks, EnginePolicy};
use amdgpu_cr::ids::{GpuId, GpuVa, MmapOffset, RenderMinor};
use amdgpu_cr::image::{FileId, KfdImage, RenderImage};
use amdgpu_cr::plan::{
    plan_dump, plan_restore, render_image, BoBucket, CheckpointData, DeviceBucket, DeviceKind,
    SharedMem, VmaFixups,
};
use scratch::scratch_dir;

fn memfd() -> fs::File {
    // SAFETY: valid C string; no other preconditions.
    let fd = unsafe { libc::memfd_create(c"render".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fresh fd owned by nobody else.
    let f = fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    f.set_len(1 << 30).unwrap();
    f
}

/// Writes a KFD sysfs tree: one CPU, GPUs `(node, gpu_id, minor)`.
/// The engines of a GPU whose largest BO is `largest` bytes: chosen as
/// `Auto` does, with a 64 KiB staging request and no SDMA engine.
fn auto_engines(largest: u64) -> Engines<'static> {
    Engines::new(
        EnginePolicy::Auto,
        staging_size(Some(64 << 10), largest),
        None,
    )
}

fn sysfs(root: &Path, gpus: &[(u32, u32, u32)]) {
    let node = |n: u32, gpu_id: u32, props: String, links: &[u32]| {
        let d = root.join(n.to_string());
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("gpu_id"), gpu_id.to_string()).unwrap();
        fs::write(d.join("properties"), props).unwrap();
        for (i, to) in links.iter().enumerate() {
            let l = d.join(format!("io_links/{i}"));
            fs::create_dir_all(&l).unwrap();
            fs::write(
                l.join("properties"),
                format!("type 2\nnode_from {n}\nnode_to {to}\n"),
            )
            .unwrap();
        }
        if gpu_id != 0 {
            let b = d.join("mem_banks/0");
            fs::create_dir_all(&b).unwrap();
            fs::write(
                b.join("properties"),
                "heap_type 1\nsize_in_bytes 17179869184\n",
            )
            .unwrap();
        }
    };
    let ids: Vec<u32> = gpus.iter().map(|g| g.0).collect();
    node(0, 0, "cpu_cores_count 16\n".into(), &ids);
    for &(n, id, minor) in gpus {
        let props = format!(
            "simd_count 120\nvendor_id 4098\ndevice_id 29631\nfw_version 100\nnum_gws 64\ndrm_render_minor {minor}\n"
        );
        node(n, id, props, &[0]);
    }
}

#[test]
fn checkpoint_then_restore_on_other_gpus() {
    let tmp = scratch_dir("flow");
    let (dump_sys, restore_sys, images) = (
        tmp.path().join("sys-a"),
        tmp.path().join("sys-b"),
        tmp.path().join("img"),
    );
    fs::create_dir_all(&images).unwrap();
    sysfs(&dump_sys, &[(1, 0x1111, 128), (2, 0x2222, 129)]);
    // The restore host: other ids, other minors, listed in the other order.
    sysfs(&restore_sys, &[(1, 0xbbbb, 130), (2, 0xaaaa, 131)]);

    // --- dump -------------------------------------------------------------
    let old_nodes = [memfd(), memfd()];
    let vram = bo::ALLOC_VRAM | bo::ALLOC_WRITABLE;
    let buckets = [
        (0x10_0000u64, 3 * 4096u64, 0x1000_0000u64, 0x1111u32, vram),
        (
            0x20_0000,
            2 * 4096,
            0xc000_4444_0000_0000,
            0x1111,
            bo::ALLOC_DOORBELL,
        ),
        (0x30_0000, 70 * 4096, 0x2000_0000, 0x2222, bo::ALLOC_GTT),
        (0x40_0000, 4096, 0x1000_8000, 0x1111, vram),
    ];
    let ckpt = CheckpointData {
        pid: 4242,
        devices: vec![
            DeviceBucket {
                user: GpuId(0x1111),
                actual: GpuId(0x1111),
            },
            DeviceBucket {
                user: GpuId(0x2222),
                actual: GpuId(0x2222),
            },
        ],
        bos: buckets
            .iter()
            .map(|&(addr, size, offset, gpu, flags)| BoBucket {
                addr: GpuVa(addr),
                size,
                offset: MmapOffset(offset),
                restored_offset: MmapOffset(0),
                gpu_id: GpuId(gpu),
                alloc_flags: flags,
                dmabuf_fd: bo::KFD_INVALID_FD,
            })
            .collect(),
        num_objects: 0,
        priv_data: vec![1, 0, 0, 0, 0, 0, 0, 0],
    };
    let node_of = |gpu: GpuId| usize::from(gpu == GpuId(0x2222));
    let mut originals = BTreeMap::new();
    for (i, b) in ckpt.bos.iter().enumerate() {
        if bo::has_contents(b.alloc_flags) {
            let data: Vec<u8> = (0..b.size)
                .map(|x| (x as u8) ^ (i as u8).wrapping_mul(53))
                .collect();
            old_nodes[node_of(b.gpu_id)]
                .write_all_at(&data, b.offset.0)
                .unwrap();
            originals.insert(i, data);
        }
    }
    let topo = amdgpu_cr::topology::Topology::parse_sysfs(&dump_sys).unwrap();
    let plan = plan_dump(&topo, &ckpt, SharedMem::default()).unwrap();
    let jobs: Vec<GpuJob<'_>> = plan
        .gpus
        .iter()
        .map(|w| GpuJob {
            user: w.user,
            actual: w.actual,
            bos: w.bo_refs(
                &ckpt.bos,
                Some(old_nodes[node_of(w.actual)].as_fd()),
                &[],
                false,
            ),
            engines: auto_engines(w.largest),
        })
        .collect();
    let out = dump_contents(&images, FileId(5), jobs).unwrap();
    assert_eq!(
        out.stats.iter().map(|s| s.bytes).sum::<u64>(),
        (3 + 70 + 1) * 4096
    );
    plan.finish_image(&out.hashes, amdgpu_cr::pages::Encoding::Raw)
        .unwrap()
        .write(&images, FileId(5))
        .unwrap();
    render_image(&topo, &plan.actual_to_user, RenderMinor(129), FileId(6))
        .unwrap()
        .write(&images, FileId(6))
        .unwrap();

    // --- restore ----------------------------------------------------------
    let img = KfdImage::read(&images, FileId(5)).unwrap();
    let (map, host) =
        amdgpu_cr::match_image_to_host(&img, &restore_sys, &Checks::default()).unwrap();
    let rplan = plan_restore(&img, &host, &map).unwrap();
    assert_eq!(
        RenderImage::read(&images, FileId(6)).unwrap().gpu_id(),
        GpuId(0x2222)
    );
    // Play the kernel: new offsets for every BO.
    let new_nodes = [memfd(), memfd()];
    let mut restored = rplan.bos.clone();
    for (i, b) in restored.iter_mut().enumerate() {
        b.restored_offset = if bo::has_contents(b.alloc_flags) {
            MmapOffset(0x4000_0000 - (i as u64 + 1) * 0x40_0000)
        } else {
            MmapOffset(b.offset.0 ^ 0x0000_1111_0000_0000)
        };
    }
    let new_node = |user: GpuId| -> BorrowedFd<'_> {
        let actual = map.get(user).unwrap();
        new_nodes[usize::from(actual == GpuId(0xaaaa))].as_fd()
    };
    let jobs: Vec<GpuJob<'_>> = rplan
        .gpus
        .iter()
        .map(|w| GpuJob {
            user: w.user,
            actual: w.actual,
            bos: w.bo_refs(&restored, Some(new_node(w.user)), &[], true),
            engines: auto_engines(w.largest),
        })
        .collect();
    restore_contents(
        &images,
        FileId(5),
        jobs,
        &amdgpu_cr::pages::content_hashes(&img),
    )
    .unwrap();
    for (i, data) in &originals {
        let b = &restored[*i];
        let mut back = vec![0; b.size as usize];
        let idx = usize::from(map.get(b.gpu_id).unwrap() == GpuId(0xaaaa));
        new_nodes[idx]
            .read_exact_at(&mut back, b.restored_offset.0)
            .unwrap();
        assert_eq!(&back, data, "BO {i}");
    }

    // VMAs recorded by CRIU at dump time (path, pgoff, length).
    let fx = VmaFixups::from_restored(&rplan, &restored).unwrap();
    let vram0 = fx
        .lookup(
            DeviceKind::from_path("/dev/dri/renderD128").unwrap(),
            0x1000_0000,
            3 * 4096,
        )
        .unwrap();
    assert_eq!(vram0.offset, restored[0].restored_offset);
    let minor = host
        .gpu(map.get(GpuId(0x1111)).unwrap())
        .unwrap()
        .render_minor();
    assert_eq!(vram0.device, DeviceKind::Render(minor));
    let db = fx
        .lookup(
            DeviceKind::from_path("//dev/kfd").unwrap(),
            0xc000_4444_0000_0000,
            8192,
        )
        .unwrap();
    assert_eq!(db.offset, restored[1].restored_offset);
    assert!(
        fx.lookup(DeviceKind::Render(RenderMinor(128)), 0x2000_0000, 4096)
            .is_none(),
        "GTT BO is on renderD129"
    );
}
