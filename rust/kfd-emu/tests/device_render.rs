//! In-process tests of the render node's DRM model: the core ioctls libdrm
//! issues on a render fd and every AMDGPU_INFO query, with the kernel's
//! answers (values, errnos, copies clipped to `return_size`), for the GPUs
//! of every built-in profile.  Arguments and answers use kfd-abi's types.

use std::mem::{offset_of, size_of};
use std::sync::Arc;

use kfd_abi::{ioctl, sys};
use kfd_emu::device::uapi::{self, alloc, AsBytes};
use kfd_emu::device::{Caller, Emulator, NodeKind};
use kfd_emu::profile::{builtin_names, Profile};

mod model;
use model::{cap_eff, me, Table};

/// Ioctl `cmd` answered in its own size.
fn call(emu: &Emulator, fh: u64, c: &Caller, cmd: u32, input: &[u8]) -> Result<Vec<u8>, i32> {
    model::call(emu, fh, c, cmd, input, ioctl::size(cmd))
}

/// A DRM ioctl number: direction, core nr, argument size.
fn drm(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (0x64 << 8) | nr
}

/// GPU `i` of profile `name`, its render node open.
struct Node {
    emu: Emulator,
    fds: Table,
    p: Profile,
    i: usize,
    fh: u64,
}

impl Node {
    fn new(name: &str, i: usize) -> Node {
        let p = Profile::builtin(name).unwrap();
        let fds = Table::default();
        let emu = Emulator::new(&p, Box::new(fds.clone())).unwrap();
        let minor = p.gpus()[i].drm_render_minor.0;
        let fh = emu.open(&NodeKind::Render { minor }, &me()).unwrap();
        Node { emu, fds, p, i, fh }
    }

    fn gpu(&self) -> &kfd_emu::profile::Gpu {
        &self.p.gpus()[self.i]
    }

    /// AMDGPU_INFO `query` with the union words `w` into a buffer of
    /// `size` bytes pre-filled with 0xa5: the buffer as the caller sees it
    /// afterwards.
    fn info_sized(&self, query: u32, w: [u32; 4], size: usize) -> Result<Vec<u8>, i32> {
        let mut buf = vec![0xa5u8; size.max(1)];
        let mut q = vec![0u8; size_of::<sys::drm_amdgpu_info>()];
        q[0..8].copy_from_slice(&(buf.as_mut_ptr() as u64).to_le_bytes());
        q[8..12].copy_from_slice(&(size as u32).to_le_bytes());
        q[12..16].copy_from_slice(&query.to_le_bytes());
        for (k, v) in w.iter().enumerate() {
            q[16 + 4 * k..20 + 4 * k].copy_from_slice(&v.to_le_bytes());
        }
        call(&self.emu, self.fh, &me(), ioctl::DRM_IOCTL_AMDGPU_INFO, &q)?;
        buf.truncate(size);
        Ok(buf)
    }

    fn info<T: AsBytes>(&self, query: u32, w: [u32; 4]) -> Result<T, i32> {
        self.info_sized(query, w, size_of::<T>())
            .map(|b| uapi::decode(&b))
    }
}

fn u32_of(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().unwrap())
}

/// Every GPU of every built-in profile (one per distinct kind is enough
/// for the values; all are checked for the ids).
fn each_gpu(mut f: impl FnMut(&Node)) {
    for name in builtin_names() {
        let n = Profile::builtin(name).unwrap().gpus().len();
        for i in 0..n {
            f(&Node::new(name, i));
        }
    }
}

/// What amdgpu's soc15 code derives per gfx target: external revision
/// base, GC and SDMA IP discovery versions, SDMA block major.minor.
fn chip(gfx_target_version: u32) -> (u32, u32, u32, (u32, u32)) {
    match gfx_target_version {
        90008 => (0x32, 0x090401, 0x040202, (4, 0)),
        90010 => (0x3c, 0x090402, 0x040400, (4, 0)),
        90402 => (0x46, 0x090403, 0x040402, (4, 4)),
        // soc24.c: external_rev_id = rev_id + 0x50; SDMA 7.0.1 (sdma_v7_0).
        120001 => (0x50, 0x0c0001, 0x070001, (7, 0)),
        t => panic!("no expectation for gfx target {t}"),
    }
}

#[test]
fn accel_working_and_the_copy_rules() {
    let n = Node::new("mi100", 0);
    let b = n
        .info_sized(sys::AMDGPU_INFO_ACCEL_WORKING, [0; 4], 4)
        .unwrap();
    assert_eq!(u32_of(&b), 1);
    // Copied up to return_size, the rest of the caller's buffer untouched.
    let b = n
        .info_sized(sys::AMDGPU_INFO_ACCEL_WORKING, [0; 4], 2)
        .unwrap();
    assert_eq!(b, [1, 0]);
    let b = n
        .info_sized(sys::AMDGPU_INFO_ACCEL_WORKING, [0; 4], 8)
        .unwrap();
    assert_eq!(&b[4..], [0xa5; 4]);
    // No size or no pointer: EINVAL; a bad pointer: EFAULT.
    assert_eq!(
        n.info_sized(sys::AMDGPU_INFO_ACCEL_WORKING, [0; 4], 0),
        Err(libc::EINVAL)
    );
    let mut q = vec![0u8; 32];
    q[8..12].copy_from_slice(&4u32.to_le_bytes());
    assert_eq!(
        call(&n.emu, n.fh, &me(), ioctl::DRM_IOCTL_AMDGPU_INFO, &q),
        Err(libc::EINVAL)
    );
    q[0..8].copy_from_slice(&8u64.to_le_bytes());
    assert_eq!(
        call(&n.emu, n.fh, &me(), ioctl::DRM_IOCTL_AMDGPU_INFO, &q),
        Err(libc::EFAULT)
    );
    // Unknown queries, and the ones not modelled (VBIOS, RAS, video).
    for query in [0x04, 0x12, 0x1b, 0x20, 0x21, 0x7777] {
        assert_eq!(
            n.info_sized(query, [0; 4], 64),
            Err(libc::EINVAL),
            "query {query:#x}"
        );
    }
}

#[test]
fn dev_info_describes_the_profile_gpu() {
    each_gpu(|n| {
        let g = n.gpu();
        let d: sys::drm_amdgpu_info_device = n.info(sys::AMDGPU_INFO_DEV_INFO, [0; 4]).unwrap();
        let (ext_base, ..) = chip(g.gfx_target_version);
        assert_eq!(d.device_id, g.device_id);
        assert_eq!(d.pci_rev, g.pci_revision);
        assert_eq!((d.chip_rev, d.external_rev), (0, ext_base));
        let family = match g.gfx_target_version / 10000 {
            9 => sys::AMDGPU_FAMILY_AI,
            12 => 152, // AMDGPU_FAMILY_GC_12_0_0, newer than the header
            t => panic!("no family expectation for gfx{t}"),
        };
        assert_eq!(d.family, family, "{}", g.name);
        let se = g.array_count / g.simd_arrays_per_engine / g.num_xcc;
        assert_eq!(d.num_shader_engines, se);
        assert_eq!(d.num_shader_arrays_per_engine, g.simd_arrays_per_engine);
        assert_eq!(d.cu_active_number, g.cu_count);
        assert_eq!(d.num_cu_per_sh, g.cu_per_simd_array);
        // The CU bitmap is XCC 0's: its CUs, spread over its arrays.
        let bits: u32 = d.cu_bitmap.iter().flatten().map(|w| w.count_ones()).sum();
        assert_eq!(bits, g.cu_count / g.num_xcc);
        assert_eq!(d.cu_ao_bitmap, d.cu_bitmap);
        assert_eq!(d.cu_ao_mask & 0xff, d.cu_bitmap[0][0] & 0xff);
        assert_eq!(
            d.max_engine_clock,
            u64::from(g.max_engine_clk_fcompute) * 1000
        );
        assert_eq!(d.max_memory_clock, u64::from(g.vram_clk_max) * 1000);
        assert_eq!(d.gpu_counter_freq, 1_000_000, "the counter counts ns");
        // HBM on the Instinct parts, GDDR6 on RDNA cards.
        let vram_type = if g.gfx_target_version >= 100000 { 9 } else { 6 };
        assert_eq!((d.vram_type, d.vram_bit_width), (vram_type, g.vram_width));
        assert_eq!(d.wave_front_size, g.wave_front_size);
        // 48-bit GPUVM around the hole: 64 KiB reserved at the bottom,
        // trap, seq64 and CSA areas at the top.
        assert_eq!(d.virtual_address_offset, 1 << 16);
        assert_eq!(d.virtual_address_max, 1 << 47);
        assert_eq!(d.high_va_offset, 0xffff_8000_0000_0000);
        assert_eq!(d.high_va_max, 0xffff_ffff_ffbf_e000);
        assert_eq!(
            (d.virtual_address_alignment, d.gart_page_size),
            (4096, 4096)
        );
        assert_eq!(d.pte_fragment_size, 2 << 20);
        assert_eq!(d.num_hw_gfx_contexts, 8);
    });
    // A short return_size gets the start of the record only.
    let n = Node::new("mi210x4", 1);
    let b = n.info_sized(sys::AMDGPU_INFO_DEV_INFO, [0; 4], 6).unwrap();
    assert_eq!(u32_of(&b), 0x740f);
    assert_eq!(&b[4..6], [0, 0], "chip_rev's low bytes");
}

#[test]
fn hw_ip_info_and_count() {
    for name in ["mi100", "mi210x4", "mi250x8", "mi300x8", "rx9070xt"] {
        let n = Node::new(name, 0);
        let g = n.gpu();
        let (_, gc, sdma, sdma_block) = chip(g.gfx_target_version);
        let rdna = g.gfx_target_version >= 100000;
        let engines = g.num_sdma_engines + g.num_sdma_xgmi_engines;
        let ip = |t: u32, inst: u32| {
            n.info::<sys::drm_amdgpu_info_hw_ip>(sys::AMDGPU_INFO_HW_IP_INFO, [t, inst, 0, 0])
        };
        // No graphics rings on CDNA, one on RDNA; compute and SDMA rings
        // up to the context entity limits (4 and 2).
        let gfx = ip(sys::AMDGPU_HW_IP_GFX, 0).unwrap();
        assert_eq!(gfx.available_rings, u32::from(rdna), "{name}");
        assert_eq!(gfx.hw_ip_version_major, g.gfx_target_version / 10000);
        assert_eq!(gfx._pad, gc, "{name}: ip_discovery_version");
        assert_eq!((gfx.ib_start_alignment, gfx.ib_size_alignment), (32, 32));
        let comp = ip(sys::AMDGPU_HW_IP_COMPUTE, 0).unwrap();
        assert_eq!(comp.available_rings, 0xf);
        assert_eq!(comp._pad, gc);
        let dma = ip(sys::AMDGPU_HW_IP_DMA, 0).unwrap();
        assert_eq!(dma.available_rings, 0x3);
        assert_eq!(
            (dma.hw_ip_version_major, dma.hw_ip_version_minor),
            sdma_block
        );
        assert_eq!(dma._pad, sdma, "{name}");
        assert_eq!((dma.ib_start_alignment, dma.ib_size_alignment), (256, 4));
        // Multimedia blocks are absent: all zeros.
        for t in [
            sys::AMDGPU_HW_IP_UVD,
            sys::AMDGPU_HW_IP_VCE,
            sys::AMDGPU_HW_IP_VCN_DEC,
            sys::AMDGPU_HW_IP_VCN_JPEG,
            9,
        ] {
            let z = ip(t, 0).unwrap();
            assert!(uapi::bytes(&z).iter().all(|&b| b == 0), "type {t}");
        }
        assert_eq!(ip(10, 0).map(|_| ()), Err(libc::EINVAL), "no such type");
        assert_eq!(
            ip(sys::AMDGPU_HW_IP_DMA, 1).map(|_| ()),
            Err(libc::EINVAL),
            "instance"
        );

        let count = |t: u32| n.info::<u32>(sys::AMDGPU_INFO_HW_IP_COUNT, [t, 0, 0, 0]);
        assert_eq!(count(sys::AMDGPU_HW_IP_GFX), Ok(1));
        assert_eq!(count(sys::AMDGPU_HW_IP_COMPUTE), Ok(1));
        assert_eq!(count(sys::AMDGPU_HW_IP_DMA), Ok(engines), "{name}");
        for t in [sys::AMDGPU_HW_IP_VCE, sys::AMDGPU_HW_IP_VCN_ENC, 9, 10] {
            assert_eq!(count(t), Err(libc::EINVAL), "type {t}");
        }
    }
}

/// A GPU whose DMA rings are `no_user_submission` (amdgpu.disable_kq=1,
/// or SDMA 7.1): HW_IP_INFO(DMA) counts no ring, as `amdgpu_hw_ip_info`
/// does; the instances are still there.
#[test]
fn dma_rings_without_user_submission_are_not_counted() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../test/gpu/hosts/rx9070xt-no-user-sdma.toml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let p = Profile::with_override("rx9070xt", path, &text).unwrap();
    assert!(!p.gpus()[0].dma_user_submission);
    let fds = Table::default();
    let emu = Emulator::new(&p, Box::new(fds.clone())).unwrap();
    let minor = p.gpus()[0].drm_render_minor.0;
    let fh = emu.open(&NodeKind::Render { minor }, &me()).unwrap();
    let n = Node {
        emu,
        fds,
        p,
        i: 0,
        fh,
    };
    let dma: sys::drm_amdgpu_info_hw_ip = n
        .info(
            sys::AMDGPU_INFO_HW_IP_INFO,
            [sys::AMDGPU_HW_IP_DMA, 0, 0, 0],
        )
        .unwrap();
    assert_eq!(dma.available_rings, 0);
    assert_eq!((dma.hw_ip_version_major, dma._pad), (7, 0x070001));
    let count = n.info::<u32>(
        sys::AMDGPU_INFO_HW_IP_COUNT,
        [sys::AMDGPU_HW_IP_DMA, 0, 0, 0],
    );
    assert_eq!(count, Ok(2));
    let comp: sys::drm_amdgpu_info_hw_ip = n
        .info(
            sys::AMDGPU_INFO_HW_IP_INFO,
            [sys::AMDGPU_HW_IP_COMPUTE, 0, 0, 0],
        )
        .unwrap();
    assert_eq!(comp.available_rings, 0xf, "only the DMA rings");
}

#[test]
fn firmware_versions() {
    for name in ["mi100", "mi210x4", "mi300x8"] {
        let n = Node::new(name, 0);
        let g = n.gpu();
        let engines = g.num_sdma_engines + g.num_sdma_xgmi_engines;
        let fw = |ty: u32, inst: u32, idx: u32| {
            n.info::<sys::drm_amdgpu_info_firmware>(sys::AMDGPU_INFO_FW_VERSION, [ty, inst, idx, 0])
                .map(|f| (f.ver, f.feature))
        };
        assert_eq!(fw(sys::AMDGPU_INFO_FW_GFX_MEC, 0, 0), Ok((g.fw_version, 0)));
        assert_eq!(fw(sys::AMDGPU_INFO_FW_GFX_MEC, 0, 1), Ok((g.fw_version, 0)));
        assert_eq!(fw(sys::AMDGPU_INFO_FW_GFX_MEC, 0, 2), Err(libc::EINVAL));
        for e in 0..engines {
            assert_eq!(
                fw(sys::AMDGPU_INFO_FW_SDMA, 0, e),
                Ok((g.sdma_fw_version, 0))
            );
        }
        assert_eq!(fw(sys::AMDGPU_INFO_FW_SDMA, 0, engines), Err(libc::EINVAL));
        // Only instance 0 of each block.
        assert_eq!(fw(sys::AMDGPU_INFO_FW_GFX_MEC, 1, 0), Err(libc::EINVAL));
        // Firmware the profile does not describe reads as version 0.
        assert_eq!(fw(sys::AMDGPU_INFO_FW_GFX_RLC, 0, 0), Ok((0, 0)));
        assert_eq!(fw(sys::AMDGPU_INFO_FW_SMC, 0, 0), Ok((0, 0)));
        assert_eq!(fw(sys::AMDGPU_INFO_FW_TA, 0, 2), Ok((0, 0)), "XGMI TA");
        assert_eq!(fw(sys::AMDGPU_INFO_FW_TA, 0, 0), Err(libc::EINVAL));
        assert_eq!(fw(sys::AMDGPU_INFO_FW_TA, 0, 8), Err(libc::EINVAL));
        for ty in [0, 9, 0x1d, 0x100] {
            assert_eq!(fw(ty, 0, 0), Err(libc::EINVAL), "type {ty:#x}");
        }
    }
}

/// Opens /dev/kfd, binds GPU 0's VM to `n`'s render open and allocates
/// a BO of `size` bytes with `flags`; returns the KFD fh.
fn alloc_bo(n: &Node, kfd: Option<u64>, va: u64, size: u64, flags: u32) -> u64 {
    let kfd = kfd.unwrap_or_else(|| {
        let kfd = n.emu.open(&NodeKind::Kfd, &me()).unwrap();
        n.fds.insert(900, n.fh);
        let a = sys::kfd_ioctl_acquire_vm_args {
            drm_fd: 900,
            gpu_id: n.gpu().gpu_id.0,
        };
        call(
            &n.emu,
            kfd,
            &me(),
            ioctl::AMDKFD_IOC_ACQUIRE_VM,
            uapi::bytes(&a),
        )
        .unwrap();
        kfd
    });
    let a = sys::kfd_ioctl_alloc_memory_of_gpu_args {
        va_addr: va,
        size,
        gpu_id: n.gpu().gpu_id.0,
        flags,
        ..Default::default()
    };
    call(
        &n.emu,
        kfd,
        &me(),
        ioctl::AMDKFD_IOC_ALLOC_MEMORY_OF_GPU,
        uapi::bytes(&a),
    )
    .unwrap();
    kfd
}

#[test]
fn memory_sizes_and_usage() {
    let n = Node::new("mi100", 0);
    let g = n.gpu().clone();
    let ram: u64 = n.p.cpus.iter().map(|c| c.mem_size).sum();
    let reserved = 8 << 20;
    let vg: sys::drm_amdgpu_info_vram_gtt = n.info(sys::AMDGPU_INFO_VRAM_GTT, [0; 4]).unwrap();
    assert_eq!(vg.vram_size, g.vram_size - reserved);
    assert_eq!(
        vg.vram_cpu_accessible_size,
        g.vram_size - reserved,
        "large BAR"
    );
    assert_eq!(vg.gtt_size, ram / 2, "TTM's limit: half the RAM");
    let usage = |q| n.info::<u64>(q, [0; 4]).unwrap();
    assert_eq!(usage(sys::AMDGPU_INFO_VRAM_USAGE), 0);
    assert_eq!(usage(sys::AMDGPU_INFO_GTT_USAGE), 0);

    // KFD allocations are what the render node counts.
    let kfd = alloc_bo(&n, None, 1 << 32, 4 << 20, alloc::VRAM);
    alloc_bo(&n, Some(kfd), 1 << 33, 2 << 20, alloc::GTT);
    assert_eq!(usage(sys::AMDGPU_INFO_VRAM_USAGE), 4 << 20);
    assert_eq!(usage(sys::AMDGPU_INFO_VIS_VRAM_USAGE), 4 << 20);
    assert_eq!(usage(sys::AMDGPU_INFO_GTT_USAGE), 2 << 20);

    let m: sys::drm_amdgpu_memory_info = n.info(sys::AMDGPU_INFO_MEMORY, [0; 4]).unwrap();
    assert_eq!(m.vram.total_heap_size, g.vram_size);
    assert_eq!(m.vram.usable_heap_size, g.vram_size - reserved);
    assert_eq!(m.vram.heap_usage, 4 << 20);
    assert_eq!(m.vram.max_allocation, (g.vram_size - reserved) * 3 / 4);
    assert_eq!(m.cpu_accessible_vram.total_heap_size, g.vram_size);
    assert_eq!(m.cpu_accessible_vram.heap_usage, 4 << 20);
    assert_eq!(m.gtt.total_heap_size, ram / 2);
    assert_eq!(m.gtt.heap_usage, 2 << 20);

    // Small BAR: 256 MiB visible, nothing of KFD's VRAM in it.
    let p = Profile::with_override("mi100", "t", "[gpu_defaults]\nvram_public = false\n").unwrap();
    let emu = Emulator::new(&p, Box::new(Table::default())).unwrap();
    let fh = emu
        .open(
            &NodeKind::Render {
                minor: p.gpus()[0].drm_render_minor.0,
            },
            &me(),
        )
        .unwrap();
    let small = Node {
        emu,
        fds: Table::default(),
        p,
        i: 0,
        fh,
    };
    let vg: sys::drm_amdgpu_info_vram_gtt = small.info(sys::AMDGPU_INFO_VRAM_GTT, [0; 4]).unwrap();
    assert_eq!(vg.vram_cpu_accessible_size, 256 << 20);

    // GDS, GWS and OA of the compute partition.
    let gds: sys::drm_amdgpu_info_gds = n.info(sys::AMDGPU_INFO_GDS_CONFIG, [0; 4]).unwrap();
    assert_eq!(gds.gds_total_size, g.gds_size_in_kb * 1024);
    assert_eq!(gds.gws_per_compute_partition, g.num_gws);
    assert_eq!(gds.oa_per_compute_partition, 16);
    assert_eq!(gds.gds_gfx_partition_size, 0);
}

/// GEM_CREATE's GTT BOs count in the GPU's GTT use while a handle keeps
/// them, and stop counting when the last goes (the emulator keeps the sum
/// as they come and go); a VRAM BO's memory is freed then too.
#[test]
fn gem_gtt_bos_count_while_they_live() {
    let n = Node::new("mi210x4", 1);
    let gtt = || n.info::<u64>(sys::AMDGPU_INFO_GTT_USAGE, [0; 4]).unwrap();
    let create = |size: u64, domain: u32| {
        let mut c = [0u8; 32];
        c[..8].copy_from_slice(&size.to_le_bytes());
        c[16..24].copy_from_slice(&u64::from(domain).to_le_bytes());
        let out = call(&n.emu, n.fh, &me(), ioctl::DRM_IOCTL_AMDGPU_GEM_CREATE, &c).unwrap();
        u32_of(&out)
    };
    let close = |h: u32| {
        let c = [h.to_le_bytes(), [0; 4]].concat();
        call(&n.emu, n.fh, &me(), ioctl::DRM_IOCTL_GEM_CLOSE, &c).unwrap();
    };
    assert_eq!(gtt(), 0);
    let a = create(1 << 20, sys::AMDGPU_GEM_DOMAIN_GTT);
    let b = create(2 << 20, sys::AMDGPU_GEM_DOMAIN_GTT);
    let v = create(4 << 20, sys::AMDGPU_GEM_DOMAIN_VRAM);
    let vram = || n.info::<u64>(sys::AMDGPU_INFO_VRAM_USAGE, [0; 4]).unwrap();
    assert_eq!(gtt(), 3 << 20);
    assert_eq!(vram(), 4 << 20);
    close(a);
    assert_eq!(gtt(), 2 << 20);
    close(v);
    assert_eq!(gtt(), 2 << 20, "a VRAM BO is not GTT");
    assert_eq!(vram(), 0, "the last handle's close frees a VRAM BO");
    close(b);
    assert_eq!(gtt(), 0);
}

#[test]
fn read_mmr_reg_gives_gb_addr_config_only() {
    let read = |n: &Node, off: u32, count: u32, instance: u32, size: usize| {
        n.info_sized(
            sys::AMDGPU_INFO_READ_MMR_REG,
            [off, count, instance, 0],
            size,
        )
    };
    for (name, se_log2) in [("mi100", 3), ("mi250x8", 3), ("mi300x8", 2)] {
        let n = Node::new(name, 0);
        let b = read(&n, 0x263e, 1, 0xffff_ffff, 4).unwrap();
        assert_eq!(u32_of(&b), 0x2201_4042 | se_log2 << 19, "{name}");
    }
    let n = Node::new("mi100", 0);
    // Indexed by a valid shader engine and array: the same register.
    assert!(read(&n, 0x263e, 1, 0x0003, 4).is_ok());
    // Any register off the model fails the whole read.
    assert_eq!(read(&n, 0x263e, 2, 0xffff_ffff, 8), Err(libc::EFAULT));
    assert_eq!(read(&n, 0x9d8, 1, 0xffff_ffff, 4), Err(libc::EFAULT));
    // Out-of-range indices and counts.
    assert_eq!(read(&n, 0x263e, 1, 0x0004, 4), Err(libc::EINVAL), "SE 4");
    assert_eq!(read(&n, 0x263e, 1, 0x0200, 4), Err(libc::EINVAL), "SH 2");
    assert_eq!(read(&n, 0x263e, 129, 0xffff_ffff, 4), Err(libc::EINVAL));
    // No registers: nothing written.
    assert_eq!(read(&n, 0x263e, 0, 0xffff_ffff, 4), Ok(vec![0xa5; 4]));
    // Clipped to return_size.
    let b = read(&n, 0x263e, 1, 0xffff_ffff, 2).unwrap();
    assert_eq!(b, [0x42, 0x40]);
}

#[test]
fn counters_sensors_and_absent_blocks() {
    let n = Node::new("mi210x4", 2);
    let ts = |n: &Node| n.info::<u64>(sys::AMDGPU_INFO_TIMESTAMP, [0; 4]).unwrap();
    let (a, b) = (ts(&n), ts(&n));
    assert!(a > 0 && b >= a);
    for q in [
        sys::AMDGPU_INFO_NUM_BYTES_MOVED,
        sys::AMDGPU_INFO_NUM_EVICTIONS,
        sys::AMDGPU_INFO_NUM_VRAM_CPU_PAGE_FAULTS,
    ] {
        assert_eq!(n.info::<u64>(q, [0; 4]), Ok(0));
    }
    assert_eq!(
        n.info::<u32>(sys::AMDGPU_INFO_VRAM_LOST_COUNTER, [0; 4]),
        Ok(0)
    );
    let vce = n
        .info_sized(
            sys::AMDGPU_INFO_VCE_CLOCK_TABLE,
            [0; 4],
            size_of::<sys::drm_amdgpu_info_vce_clock_table>(),
        )
        .unwrap();
    assert!(vce.iter().all(|&b| b == 0), "no VCE clock states");
    // No power management, no display, handles only for old UVD.
    assert_eq!(
        n.info::<u32>(
            sys::AMDGPU_INFO_SENSOR,
            [sys::AMDGPU_INFO_SENSOR_GFX_SCLK, 0, 0, 0]
        ),
        Err(libc::ENOENT)
    );
    assert_eq!(
        n.info::<u32>(sys::AMDGPU_INFO_CRTC_FROM_ID, [1, 0, 0, 0]),
        Err(libc::EINVAL)
    );
    assert_eq!(
        n.info::<u64>(
            sys::AMDGPU_INFO_NUM_HANDLES,
            [sys::AMDGPU_HW_IP_UVD, 0, 0, 0]
        ),
        Err(libc::ENODATA)
    );
    assert_eq!(
        n.info::<u64>(
            sys::AMDGPU_INFO_NUM_HANDLES,
            [sys::AMDGPU_HW_IP_VCE, 0, 0, 0]
        ),
        Err(libc::EINVAL)
    );
}

fn get_client(n: &Node, c: &Caller, idx: i32) -> Result<sys::drm_client, i32> {
    let a = sys::drm_client {
        idx,
        auth: 7,
        pid: 1,
        uid: 2,
        magic: 3,
        iocs: 4,
    };
    call(
        &n.emu,
        n.fh,
        c,
        ioctl::DRM_IOCTL_GET_CLIENT,
        uapi::bytes(&a),
    )
    .map(|o| uapi::decode(&o))
}

#[test]
fn core_drm_ioctls_on_a_render_node() {
    let n = Node::new("mi100x2", 1);
    // GET_CLIENT as drm_getclient() answers: index 0 is this file.
    let c = get_client(&n, &me(), 0).unwrap();
    let root = cap_eff(me().tid) & (1 << 21) != 0;
    assert_eq!(c.idx, 0);
    assert_eq!(
        c.auth,
        i32::from(root),
        "authenticated: opened with CAP_SYS_ADMIN"
    );
    assert_eq!(c.pid, u64::from(std::process::id()));
    assert_eq!((c.uid, c.magic, c.iocs), (65534, 0, 0));
    assert_eq!(get_client(&n, &me(), 1).map(|_| ()), Err(libc::EINVAL));
    assert_eq!(offset_of!(sys::drm_client, pid), 8);

    // A file opened without CAP_SYS_ADMIN is not authenticated.
    // Capabilities are per thread: drop it from one thread's effective set.
    let e = Arc::new(n);
    let n2 = e.clone();
    let (auth, opened_root) = std::thread::spawn(move || {
        let mut hdr = [0x2008_0522u32, 0]; // _LINUX_CAPABILITY_VERSION_3, this thread
        let mut data = [0u32; 6]; // {effective, permitted, inheritable} x 2
                                  // SAFETY: capget reads the header and fills the two data records.
        let rc = unsafe { libc::syscall(libc::SYS_capget, hdr.as_mut_ptr(), data.as_mut_ptr()) };
        assert_eq!(rc, 0);
        data[0] &= !(1 << 21);
        // SAFETY: capset reads the header and the two data records.
        let rc = unsafe { libc::syscall(libc::SYS_capset, hdr.as_mut_ptr(), data.as_ptr()) };
        assert_eq!(rc, 0);
        let c = me();
        let minor = n2.gpu().drm_render_minor.0;
        let fh = n2.emu.open(&NodeKind::Render { minor }, &c).unwrap();
        let a = sys::drm_client::default();
        let out = call(
            &n2.emu,
            fh,
            &c,
            ioctl::DRM_IOCTL_GET_CLIENT,
            uapi::bytes(&a),
        )
        .unwrap();
        let got: sys::drm_client = uapi::decode(&out);
        (got.auth, cap_eff(c.tid) & (1 << 21) != 0)
    })
    .join()
    .unwrap();
    assert!(!opened_root);
    assert_eq!(auth, 0);

    // Refused on render nodes (no DRM_RENDER_ALLOW): EACCES.
    for (dir, nr, size) in [
        (3, 0x01, 16), // GET_UNIQUE
        (2, 0x02, 4),  // GET_MAGIC
        (2, 0x06, 8),  // GET_STATS (size irrelevant)
        (3, 0x07, 16), // SET_VERSION
        (3, 0x0a, 8),  // GEM_FLINK
        (3, 0x0b, 16), // GEM_OPEN
        (1, 0x0d, 16), // SET_CLIENT_CAP
        (1, 0x11, 4),  // AUTH_MAGIC
        (0, 0x1e, 0),  // SET_MASTER
        (0, 0x1f, 0),  // DROP_MASTER
    ] {
        assert_eq!(
            call(&e.emu, e.fh, &me(), drm(dir, nr, size), &vec![0; size]),
            Err(libc::EACCES),
            "core ioctl {nr:#x}"
        );
    }
    // The SDMA path's GEM ioctls: no handle 0; PRIME import of a file
    // that is not one of the emulator's dma-bufs is dma_buf_get's EINVAL,
    // of a closed fd EBADF.
    assert_eq!(
        call(&e.emu, e.fh, &me(), ioctl::DRM_IOCTL_GEM_CLOSE, &[0; 8]),
        Err(libc::EINVAL)
    );
    let prime_import = |fd: i32| {
        let mut prime = [0u8; 12];
        prime[8..].copy_from_slice(&fd.to_le_bytes());
        let cmd = ioctl::DRM_IOCTL_PRIME_FD_TO_HANDLE;
        call(&e.emu, e.fh, &me(), cmd, &prime)
    };
    assert_eq!(prime_import(0), Err(libc::EINVAL));
    assert_eq!(prime_import(999_999), Err(libc::EBADF));
    // Render-allowed but not modelled: GET_CAP; PRIME export returns an
    // fd, which only `kfd-emu supervise` can hand out.
    for cmd in [drm(3, 0x0c, 16), ioctl::DRM_IOCTL_PRIME_HANDLE_TO_FD] {
        let size = ioctl::size(cmd);
        assert_eq!(
            call(&e.emu, e.fh, &me(), cmd, &vec![0; size]),
            Err(libc::ENOTTY),
            "{cmd:#x}"
        );
    }
}
