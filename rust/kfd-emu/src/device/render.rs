//! Render-node ioctls.  Modelled: DRM_IOCTL_VERSION and AMDGPU_INFO with
//! the DEV_INFO query (what a client needs to pick its copy engine).
//! Other amdgpu driver ioctls (0x40..0x5f: GEM_CREATE, CS, ...) answer
//! EOPNOTSUPP: the emulator's GPU memory is managed through KFD only.
//! Other numbers answer EINVAL like the DRM dispatcher does for numbers it
//! does not know.
//!
//! `drm_amdgpu_info_device` fields filled (byte offsets): device_id@0,
//! family@16, max_engine_clock@32 (kHz), cu_active_number@48,
//! virtual_address_offset@144, virtual_address_max@152,
//! virtual_address_alignment@160, gart_page_size@168, vram_bit_width@180.

use super::mem::user_write;
use super::state::{Gpu, R};
use super::uapi::{drm, put_u32, put_u64, Args};
use super::Caller;

pub const DRM_VERSION_SIZE: usize = 64;
pub const AMDGPU_INFO_SIZE: usize = 32;

const NAME: &[u8] = b"amdgpu";
const DATE: &[u8] = b"20150101";
const DESC: &[u8] = b"AMD GPU (kfd-emu)";

/// DRM_IOCTL_VERSION: {major@0, minor@4, patch@8, name_len@16, name@24,
/// date_len@32, date@40, desc_len@48, desc@56}.
pub fn version(caller: &Caller, a: &mut Args) -> R<()> {
    a.set_u32(0, 3);
    a.set_u32(4, 64);
    a.set_u32(8, 0);
    for (i, s) in [NAME, DATE, DESC].iter().enumerate() {
        let (len_off, ptr_off) = (16 + i * 16, 24 + i * 16);
        let n = (a.u64(len_off) as usize).min(s.len());
        if n > 0 {
            user_write(caller.tid, a.u64(ptr_off), &s[..n])?;
        }
        a.set_u64(len_off, s.len() as u64);
    }
    Ok(())
}

pub fn family(gfx_target_version: u32) -> u32 {
    match gfx_target_version / 10000 {
        10 => drm::AMDGPU_FAMILY_NV,
        11 => drm::AMDGPU_FAMILY_GC_11_0_0,
        _ => drm::AMDGPU_FAMILY_AI,
    }
}

/// AMDGPU_INFO {return_pointer@0, return_size@8, query@12}.
pub fn info(gpu: &Gpu, caller: &Caller, a: &Args) -> R<()> {
    if a.u32(12) != drm::AMDGPU_INFO_DEV_INFO {
        return Err(libc::EINVAL);
    }
    let size = a.u32(8) as usize;
    if size == 0 || a.u64(0) == 0 {
        return Err(libc::EINVAL);
    }
    let mut d = vec![0u8; drm::DEV_INFO_SIZE];
    put_u32(&mut d, 0, gpu.device_id);
    put_u32(&mut d, 16, family(gpu.gfx_target_version));
    put_u64(&mut d, 32, gpu.max_engine_clk as u64 * 1000);
    put_u32(&mut d, 48, gpu.cu_count);
    put_u64(&mut d, 144, 2 << 20);
    put_u64(&mut d, 152, 1 << 47);
    put_u32(&mut d, 160, 4096);
    put_u32(&mut d, 168, 4096);
    put_u32(&mut d, 180, gpu.vram_width);
    let mut out = d;
    out.resize(size, 0);
    user_write(caller.tid, a.u64(0), &out)
}
