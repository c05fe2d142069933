//! Render-node ioctls.  Modelled: DRM_IOCTL_VERSION and AMDGPU_INFO with
//! the DEV_INFO query (what a client needs to pick its copy engine).
//! Every other request (core DRM, GEM_CREATE, CS, prime, ...) answers
//! ENOTTY: the emulator's GPU memory is managed through KFD only.

use std::mem::{offset_of, size_of};

use super::mem::user_write;
use super::state::{Gpu, R};
use super::uapi::{self, drm, sys};
use super::Caller;

const NAME: &[u8] = b"amdgpu";
const DATE: &[u8] = b"20150101";
const DESC: &[u8] = b"AMD GPU (kfd-emu)";

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

pub fn family(gfx_target_version: u32) -> u32 {
    match gfx_target_version / 10000 {
        10 => drm::AMDGPU_FAMILY_NV,
        11 => drm::AMDGPU_FAMILY_GC_11_0_0,
        _ => drm::AMDGPU_FAMILY_AI,
    }
}

/// AMDGPU_INFO: only the DEV_INFO query; the answer is copied up to
/// `return_size` bytes like the kernel does.
pub fn info(gpu: &Gpu, caller: &Caller, a: &sys::drm_amdgpu_info) -> R<()> {
    if a.query != drm::AMDGPU_INFO_DEV_INFO {
        return Err(libc::EINVAL);
    }
    if a.return_size == 0 || a.return_pointer == 0 {
        return Err(libc::EINVAL);
    }
    let mut d: sys::drm_amdgpu_info_device = uapi::decode(&[]);
    d.device_id = gpu.device_id;
    d.family = family(gpu.gfx_target_version);
    d.max_engine_clock = gpu.max_engine_clk as u64 * 1000;
    d.cu_active_number = gpu.cu_count;
    d.virtual_address_offset = 2 << 20;
    d.virtual_address_max = 1 << 47;
    d.virtual_address_alignment = 4096;
    d.gart_page_size = 4096;
    d.vram_bit_width = gpu.vram_width;
    let n = (a.return_size as usize).min(size_of::<sys::drm_amdgpu_info_device>());
    user_write(caller.tid, a.return_pointer, &uapi::bytes(&d)[..n])
}
