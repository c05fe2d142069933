//! Render-node ioctls: decoding the arguments and encoding the answers of
//! what amdgpu and the DRM core answer on a render node.  The device
//! facts come from [`Asic`]; usage counters from the state (`Usage`).
//!
//! * Core DRM: VERSION; GET_CLIENT (see [`get_client`]); EACCES for the
//!   core ioctls the kernel refuses on render nodes ([`refused`]).
//! * AMDGPU_INFO: every query of the kernel's amdgpu_info_ioctl except
//!   VBIOS, RAS_ENABLED_FEATURES, VIDEO_CAPS and the ones newer than the
//!   installed amdgpu_drm.h, which answer EINVAL like an unknown query.
//!
//! The GEM, VM, context, BO list and CS ioctls are `gem`'s; every other
//! request (syncobj, GET_CAP, SCHED, user queues, ...) answers ENOTTY, so
//! clients do not get a half-working DRM path.

use std::mem::offset_of;

use super::asic::{self, Asic};
use super::mem::user_write;
use super::state::{Usage, R};
use super::uapi::{self, sys};
use super::Caller;

const NAME: &[u8] = b"amdgpu";
const DATE: &[u8] = b"20150101";
const DESC: &[u8] = b"AMD GPU (kfd-emu)";

/// The core ioctls drm_ioctl_permit() refuses on a render node (EACCES):
/// those without DRM_RENDER_ALLOW (client and master state, legacy
/// authentication, flink names).  GET_CLIENT is one of them, but see
/// [`get_client`].
pub fn refused(n: u32) -> bool {
    use uapi::drm as nr;
    matches!(
        n,
        nr::GET_UNIQUE
            | nr::GET_MAGIC
            | nr::GET_STATS
            | nr::SET_VERSION
            | nr::GEM_FLINK
            | nr::GEM_OPEN
            | nr::SET_CLIENT_CAP
            | nr::SET_UNIQUE
            | nr::AUTH_MAGIC
            | nr::BLOCK
            | nr::UNBLOCK
            | nr::SET_MASTER
            | nr::DROP_MASTER
    )
}

/// DRM_IOCTL_VERSION: copies each string up to the caller's buffer length
/// and reports the full lengths, like drm_copy_field.
pub fn version(caller: &Caller, input: &[u8], out_size: usize) -> R<Vec<u8>> {
    let a: sys::drm_version = uapi::decode(input);
    let fields = [
        (
            NAME,
            a.name_len,
            a.name as u64,
            offset_of!(sys::drm_version, name_len),
        ),
        (
            DATE,
            a.date_len,
            a.date as u64,
            offset_of!(sys::drm_version, date_len),
        ),
        (
            DESC,
            a.desc_len,
            a.desc as u64,
            offset_of!(sys::drm_version, desc_len),
        ),
    ];
    // drm_version has implicit padding: answer from the caller's bytes
    // with the fields the kernel writes patched in.
    let mut out = input.to_vec();
    out.resize(out_size, 0);
    uapi::put(&mut out, offset_of!(sys::drm_version, version_major), &3u32);
    uapi::put(
        &mut out,
        offset_of!(sys::drm_version, version_minor),
        &64u32,
    );
    uapi::put(
        &mut out,
        offset_of!(sys::drm_version, version_patchlevel),
        &0u32,
    );
    for (s, cap, ptr, len_off) in fields {
        let n = (cap as usize).min(s.len());
        if n > 0 {
            user_write(caller.tid, ptr, &s[..n])?;
        }
        uapi::put(&mut out, len_off, &(s.len() as u64));
    }
    Ok(out)
}

/// The kernel's `overflowuid`, which GET_CLIENT reports for every client.
const OVERFLOW_UID: u64 = 65534;

/// DRM_IOCTL_GET_CLIENT as drm_getclient() answers it: index 0 is the
/// caller's own file (`authenticated`: its opener had CAP_SYS_ADMIN, as
/// drm_file_alloc() decides), any other index EINVAL.
///
/// The kernel refuses GET_CLIENT on a render node (EACCES) and libdrm
/// never asks there: it recognises render nodes as character devices of
/// DRM's major.  Outside `kfd-emu supervise` (which answers the stat
/// family for them as for character devices, `crate::chardev`) the
/// emulated nodes are regular files, so libdrm takes them for primary
/// nodes and asks whether the file is authenticated
/// (`amdgpu_device_initialize`); answering as drm_getclient() does keeps
/// it working.
pub fn get_client(
    caller: &Caller,
    authenticated: bool,
    input: &[u8],
    out_size: usize,
) -> R<Vec<u8>> {
    let mut c: sys::drm_client = uapi::decode(input);
    if c.idx != 0 {
        return Err(libc::EINVAL);
    }
    c.auth = i32::from(authenticated);
    c.pid = u64::from(caller.tgid);
    c.uid = OVERFLOW_UID;
    c.magic = 0;
    c.iocs = 0;
    Ok(uapi::encode(&c, out_size))
}

/// A decoded `drm_amdgpu_info`: the header and the four words of its
/// union (whose meaning depends on the query).
struct Query {
    ptr: u64,
    size: u32,
    query: u32,
    w: [u32; 4],
}

fn decode_query(input: &[u8]) -> Query {
    let a: sys::drm_amdgpu_info = uapi::decode(input);
    let mut b = [0u8; 32];
    let n = input.len().min(32);
    b[..n].copy_from_slice(&input[..n]);
    let w = |i: usize| u32::from_le_bytes(b[16 + 4 * i..20 + 4 * i].try_into().unwrap());
    Query {
        ptr: a.return_pointer,
        size: a.return_size,
        query: a.query,
        w: [w(0), w(1), w(2), w(3)],
    }
}

/// AMDGPU_INFO: the answer to the query, copied to `return_pointer` up
/// to `return_size` bytes like the kernel does.  `usage` is called only
/// by the queries that report memory use.
pub fn info(asic: &Asic, caller: &Caller, input: &[u8], usage: impl FnOnce() -> Usage) -> R<()> {
    let q = decode_query(input);
    if q.size == 0 || q.ptr == 0 {
        return Err(libc::EINVAL);
    }
    let answer = answer(asic, &q, usage)?;
    let n = (q.size as usize).min(answer.len());
    user_write(caller.tid, q.ptr, &answer[..n])
}

fn u32_bytes(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn u64_bytes(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn answer(asic: &Asic, q: &Query, usage: impl FnOnce() -> Usage) -> R<Vec<u8>> {
    Ok(match q.query {
        sys::AMDGPU_INFO_ACCEL_WORKING => u32_bytes(1),
        // No display: no CRTC has the id.
        sys::AMDGPU_INFO_CRTC_FROM_ID => return Err(libc::EINVAL),
        sys::AMDGPU_INFO_HW_IP_INFO => uapi::bytes(&hw_ip_info(asic, q.w[0], q.w[1])?).to_vec(),
        sys::AMDGPU_INFO_HW_IP_COUNT => u32_bytes(hw_ip_count(asic, q.w[0])?),
        sys::AMDGPU_INFO_TIMESTAMP => u64_bytes(asic::gpu_clock_counter()),
        sys::AMDGPU_INFO_FW_VERSION => {
            uapi::bytes(&firmware(asic, q.w[0], q.w[1], q.w[2])?).to_vec()
        }
        // Nothing is ever moved or evicted, and VRAM is never lost.
        sys::AMDGPU_INFO_NUM_BYTES_MOVED
        | sys::AMDGPU_INFO_NUM_EVICTIONS
        | sys::AMDGPU_INFO_NUM_VRAM_CPU_PAGE_FAULTS => u64_bytes(0),
        sys::AMDGPU_INFO_VRAM_LOST_COUNTER => u32_bytes(0),
        sys::AMDGPU_INFO_VRAM_USAGE => u64_bytes(usage().vram),
        sys::AMDGPU_INFO_VIS_VRAM_USAGE => u64_bytes(usage().visible_vram),
        sys::AMDGPU_INFO_GTT_USAGE => u64_bytes(usage().gtt),
        sys::AMDGPU_INFO_GDS_CONFIG => uapi::bytes(&sys::drm_amdgpu_info_gds {
            compute_partition_size: asic.gds_size,
            gds_total_size: asic.gds_size,
            gws_per_compute_partition: asic.gws_size,
            oa_per_compute_partition: asic.oa_size,
            ..Default::default()
        })
        .to_vec(),
        sys::AMDGPU_INFO_VRAM_GTT => {
            let vram = usable_vram(asic);
            uapi::bytes(&sys::drm_amdgpu_info_vram_gtt {
                vram_size: vram,
                vram_cpu_accessible_size: asic.visible_vram_size.min(vram),
                gtt_size: asic.gtt_size,
            })
            .to_vec()
        }
        sys::AMDGPU_INFO_MEMORY => uapi::bytes(&memory(asic, usage())).to_vec(),
        sys::AMDGPU_INFO_READ_MMR_REG => read_registers(asic, q.w[0], q.w[1], q.w[2])?,
        sys::AMDGPU_INFO_DEV_INFO => uapi::bytes(&dev_info(asic)).to_vec(),
        // No VCE: no clock states.
        sys::AMDGPU_INFO_VCE_CLOCK_TABLE => {
            uapi::bytes(&sys::drm_amdgpu_info_vce_clock_table::default()).to_vec()
        }
        // Handle counts exist for UVD before Polaris only.
        sys::AMDGPU_INFO_NUM_HANDLES => {
            return Err(if q.w[0] == sys::AMDGPU_HW_IP_UVD {
                libc::ENODATA
            } else {
                libc::EINVAL
            })
        }
        // No power management: the kernel's answer with dpm disabled.
        sys::AMDGPU_INFO_SENSOR => return Err(libc::ENOENT),
        _ => return Err(libc::EINVAL),
    })
}

/// VRAM user space may allocate: amdgpu keeps `VM_RESERVED_VRAM` for
/// itself (nothing is pinned).
fn usable_vram(asic: &Asic) -> u64 {
    asic.vram_size.saturating_sub(asic::VM_RESERVED_VRAM)
}

fn memory(asic: &Asic, u: Usage) -> sys::drm_amdgpu_memory_info {
    let heap = |total: u64, usable: u64, used: u64| sys::drm_amdgpu_heap_info {
        total_heap_size: total,
        usable_heap_size: usable,
        heap_usage: used,
        max_allocation: usable * 3 / 4,
    };
    let vram = usable_vram(asic);
    sys::drm_amdgpu_memory_info {
        vram: heap(asic.vram_size, vram, u.vram),
        cpu_accessible_vram: heap(
            asic.visible_vram_size,
            asic.visible_vram_size.min(vram),
            u.visible_vram,
        ),
        gtt: heap(asic.gtt_size, asic.gtt_size, u.gtt),
    }
}

/// amdgpu's IP block types, as HW_IP_INFO/COUNT map `AMDGPU_HW_IP_*`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Gfx,
    Sdma,
    /// UVD, VCE, VCN, JPEG, VPE: multimedia blocks the emulated GPUs do
    /// not have.
    Absent,
}

/// `AMDGPU_HW_IP_VPE` (newer than the installed header); the IP types
/// are 0..=VPE.
const HW_IP_VPE: u32 = 9;

fn block_of(ip_type: u32) -> Option<Block> {
    match ip_type {
        sys::AMDGPU_HW_IP_GFX | sys::AMDGPU_HW_IP_COMPUTE => Some(Block::Gfx),
        sys::AMDGPU_HW_IP_DMA => Some(Block::Sdma),
        t if t <= HW_IP_VPE => Some(Block::Absent),
        _ => None,
    }
}

/// `amdgpu_ctx_num_entities`: at most this many rings of a type are
/// reported.
fn ctx_entities(ip_type: u32) -> u32 {
    match ip_type {
        sys::AMDGPU_HW_IP_COMPUTE => 4,
        sys::AMDGPU_HW_IP_DMA => 2,
        _ => 1,
    }
}

fn hw_ip_info(asic: &Asic, ip_type: u32, instance: u32) -> R<sys::drm_amdgpu_info_hw_ip> {
    if instance >= sys::AMDGPU_HW_IP_INSTANCE_MAX_COUNT {
        return Err(libc::EINVAL);
    }
    let (ip, rings, start, size) = match block_of(ip_type).ok_or(libc::EINVAL)? {
        // A type without a block answers all zeros.
        Block::Absent => return Ok(Default::default()),
        Block::Gfx if ip_type == sys::AMDGPU_HW_IP_GFX => (asic.gfx, asic.gfx_rings, 32, 32),
        Block::Gfx => (asic.gfx, asic.compute_rings, 32, 32),
        // `amdgpu_hw_ip_info` counts only rings that take user
        // submissions: none when they are all `no_user_submission`.
        Block::Sdma if !asic.dma_user_submission => (asic.sdma, 0, 256, 4),
        Block::Sdma => (asic.sdma, asic.sdma_instances, 256, 4),
    };
    let rings = rings.min(ctx_entities(ip_type));
    Ok(sys::drm_amdgpu_info_hw_ip {
        hw_ip_version_major: ip.block.0,
        hw_ip_version_minor: ip.block.1,
        capabilities_flags: 0,
        ib_start_alignment: start,
        ib_size_alignment: size,
        available_rings: (1u32 << rings) - 1,
        // `ip_discovery_version` in newer headers.
        _pad: ip.hw.packed(),
    })
}

fn hw_ip_count(asic: &Asic, ip_type: u32) -> R<u32> {
    match block_of(ip_type) {
        Some(Block::Gfx) => Ok(1),
        Some(Block::Sdma) => Ok(asic.sdma_instances),
        // No such block on this GPU, or no such type.
        Some(Block::Absent) | None => Err(libc::EINVAL),
    }
}

/// `AMDGPU_INFO_FW_*` types the kernel knows, up to VPE (0x1c).
const FW_TYPE_LAST: u32 = 0x1c;
/// TA firmware indices (XGMI .. SECUREDISPLAY of `enum ta_fw_type`).
const TA_FW_TYPES: std::ops::RangeInclusive<u32> = 2..=7;

/// FW_VERSION: MEC (both MECs run one image) and SDMA (every engine)
/// versions come from the profile; the firmware the profile does not
/// describe (and the graphics and multimedia firmware these GPUs do not
/// load) reads as version 0.  Feature versions are 0.
fn firmware(
    asic: &Asic,
    fw_type: u32,
    instance: u32,
    index: u32,
) -> R<sys::drm_amdgpu_info_firmware> {
    if instance != 0 {
        return Err(libc::EINVAL);
    }
    let ver = match fw_type {
        sys::AMDGPU_INFO_FW_GFX_MEC if index <= 1 => asic.mec_fw,
        sys::AMDGPU_INFO_FW_GFX_MEC => return Err(libc::EINVAL),
        sys::AMDGPU_INFO_FW_SDMA if index < asic.sdma_instances => asic.sdma_fw,
        sys::AMDGPU_INFO_FW_SDMA => return Err(libc::EINVAL),
        sys::AMDGPU_INFO_FW_TA if TA_FW_TYPES.contains(&index) => 0,
        sys::AMDGPU_INFO_FW_TA => return Err(libc::EINVAL),
        // 0x09 was never assigned.
        1..=8 | 0x0a..=FW_TYPE_LAST => 0,
        _ => return Err(libc::EINVAL),
    };
    Ok(sys::drm_amdgpu_info_firmware { ver, feature: 0 })
}

/// `AMDGPU_GFX_MAX_SE` and `AMDGPU_GFX_MAX_SH_PER_SE`.
const GFX_MAX_SE: u32 = 4;
const GFX_MAX_SH_PER_SE: u32 = 2;
/// GB_ADDR_CONFIG's dword offset, as libdrm and Mesa read it.
pub const MM_GB_ADDR_CONFIG: u32 = 0x263e;

/// READ_MMR_REG: reads `count` registers from `offset`.  Of the soc15
/// read allow-list only GB_ADDR_CONFIG is modelled; any other register
/// fails the whole read with EFAULT, as a register off the list does.
fn read_registers(asic: &Asic, offset: u32, count: u32, instance: u32) -> R<Vec<u8>> {
    let se = instance & 0xff;
    let sh = (instance >> 8) & 0xff;
    if (se != 0xff && se >= GFX_MAX_SE) || (sh != 0xff && sh >= GFX_MAX_SH_PER_SE) {
        return Err(libc::EINVAL);
    }
    if count > 128 {
        return Err(libc::EINVAL);
    }
    let mut out = Vec::with_capacity(count as usize * 4);
    for i in 0..count {
        let value = match offset.wrapping_add(i) {
            MM_GB_ADDR_CONFIG => asic.gb_addr_config,
            _ => return Err(libc::EFAULT),
        };
        out.extend_from_slice(&value.to_le_bytes());
    }
    Ok(out)
}

fn dev_info(asic: &Asic) -> sys::drm_amdgpu_info_device {
    let ((va_lo, va_hi), (high_lo, high_hi)) = asic.va_ranges();
    let bitmap = asic.cu_bitmap();
    sys::drm_amdgpu_info_device {
        device_id: asic.device_id,
        chip_rev: asic.chip_rev,
        external_rev: asic.external_rev,
        pci_rev: asic.pci_rev,
        family: asic.family,
        num_shader_engines: asic.shader_engines,
        num_shader_arrays_per_engine: asic.sh_per_se,
        gpu_counter_freq: asic.gpu_counter_freq,
        max_engine_clock: asic.max_engine_clock,
        max_memory_clock: asic.max_memory_clock,
        cu_active_number: asic.cu_active,
        cu_ao_mask: asic.cu_ao_mask(),
        cu_bitmap: bitmap,
        num_hw_gfx_contexts: asic.max_hw_contexts,
        virtual_address_offset: va_lo,
        virtual_address_max: va_hi,
        virtual_address_alignment: 4096,
        // 2 MiB fragments (amdgpu_vm_fragment_size 9).
        pte_fragment_size: (1 << 9) * 4096,
        gart_page_size: 4096,
        ce_ram_size: asic.ce_ram_size,
        vram_type: asic.vram_type,
        vram_bit_width: asic.vram_bit_width,
        wave_front_size: asic.wave_front_size,
        num_shader_visible_vgprs: asic.max_gprs,
        num_cu_per_sh: asic.cu_per_sh,
        cu_ao_bitmap: bitmap,
        high_va_offset: high_lo,
        high_va_max: high_hi,
        ..Default::default()
    }
}
