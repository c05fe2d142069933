//! The GEM, VM, context, BO list and CS ioctls of a render node
//! (`amdgpu_gem.c`, `amdgpu_vm.c`, `amdgpu_ctx.c`, `amdgpu_bo_list.c`,
//! `amdgpu_cs.c`, `drm_prime.c`): each one's arguments decoded (the CS
//! chunks and BO list entries read from the caller) and checked in the
//! kernel's order, the operation run on the render file the state keeps
//! (`state::gem`), the answer encoded.

use std::mem::offset_of;

use kfd_abi::layout::gem618;

use super::sdma::{self, IbWork};
use super::state::gem::{create_info, BoList, CreatePlan, Export, Ib, RenderFile};
use super::state::R;
use super::uapi::{self, sys};

/// `AMDGPU_HW_IP_NUM` of the uapi.
pub const AMDGPU_HW_IP_NUM: u32 = 9;
/// `amdgpu_ctx_num_entities`: rings a context may name per IP type.
const NUM_ENTITIES: [u32; 9] = [1, 4, 2, 1, 1, 1, 1, 1, 1];
const VALID_VA_FLAGS: u32 = gem618::AMDGPU_VM_MAP_FLAGS;
const PRT_FLAGS: u32 = sys::AMDGPU_VM_DELAY_UPDATE | sys::AMDGPU_VM_PAGE_PRT;
/// What the daemon copies in for one CS chunk or BO list at most; the
/// kernel's kvmalloc of a larger user array fails (ENOMEM) long before
/// anything of that size would be sensible.
const MAX_COPY_IN: u64 = 64 << 20;

/// `DRM_CLOEXEC` and `DRM_RDWR` of PRIME_HANDLE_TO_FD.
pub const DRM_CLOEXEC: u32 = libc::O_CLOEXEC as u32;
pub const DRM_RDWR: u32 = libc::O_RDWR as u32;

fn read_user<T: uapi::FromBytes>(tid: u32, addr: u64) -> R<T> {
    let mut b = vec![0u8; std::mem::size_of::<T>()];
    super::mem::user_read(tid, addr, &mut b)?;
    Ok(uapi::decode(&b))
}

/// Reads `n` BO list entries of `size` bytes each at `ptr`: their
/// handles.
fn entries(tid: u32, n: u32, size: u32, ptr: u64) -> R<Vec<u32>> {
    let stride = size as u64;
    let total = n as u64 * stride;
    if total > MAX_COPY_IN {
        return Err(libc::ENOMEM);
    }
    let mut raw = vec![0u8; total as usize];
    super::mem::user_read(tid, ptr, &mut raw)?;
    let mut handles = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        // An entry shorter than the uapi's is zero-extended.
        let mut b = [0u8; 4];
        let at = i * stride as usize;
        let take = (stride as usize).min(4);
        b[..take].copy_from_slice(&raw[at..at + take]);
        handles.push(u32::from_le_bytes(b));
    }
    Ok(handles)
}

/// Whether a context may name ring `ring` of IP `ip` (`has_ip`: whether
/// the GPU has rings of an IP type).
fn entity_ok(ip: u32, instance: u32, ring: u32, has_ip: impl Fn(u32) -> bool) -> R<()> {
    if ip >= AMDGPU_HW_IP_NUM || instance != 0 || ring >= NUM_ENTITIES[ip as usize] {
        return Err(libc::EINVAL);
    }
    if !has_ip(ip) {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// PRIME_HANDLE_TO_FD: what to install.
pub fn export(f: &RenderFile, a: &sys::drm_prime_handle) -> R<Export> {
    if a.flags & !(DRM_CLOEXEC | DRM_RDWR) != 0 {
        return Err(libc::EINVAL);
    }
    f.export(a.handle)
}

/// GEM_CREATE's checks in amdgpu_gem_create_ioctl's order (the emulated
/// GPUs have no TMZ); the flags the kernel adds (VRAM_CLEARED, and
/// VRAM_WIPE_ON_RELEASE in amdgpu_gem_object_create) are added, and
/// CPU_ACCESS_REQUIRED, which only steers the first placement, is dropped
/// as amdgpu_bo_create does for user BOs.
pub fn create_plan(a: &sys::drm_amdgpu_gem_create_in) -> R<CreatePlan> {
    let mut flags = a.domain_flags;
    if flags & !gem618::AMDGPU_GEM_CREATE_SETTABLE_MASK != 0 {
        return Err(libc::EINVAL);
    }
    if a.domains & !u64::from(gem618::AMDGPU_GEM_DOMAIN_MASK) != 0 {
        return Err(libc::EINVAL);
    }
    if flags & u64::from(sys::AMDGPU_GEM_CREATE_ENCRYPTED) != 0 {
        return Err(libc::EINVAL);
    }
    flags |= u64::from(sys::AMDGPU_GEM_CREATE_VRAM_CLEARED);
    if a.domains & u64::from(gem618::AMDGPU_GEM_DOMAIN_MMIO_REMAP) != 0 {
        return Err(libc::EINVAL);
    }
    let special = sys::AMDGPU_GEM_DOMAIN_GDS
        | sys::AMDGPU_GEM_DOMAIN_GWS
        | sys::AMDGPU_GEM_DOMAIN_OA
        | gem618::AMDGPU_GEM_DOMAIN_DOORBELL;
    if a.domains & u64::from(special) != 0 {
        log::warn!(
            "kfd-emu: GEM_CREATE in domains {:#x} (GDS, GWS, OA or doorbell): not modelled",
            a.domains
        );
        return Err(libc::EINVAL);
    }
    let size = super::state::page_align(a.bo_size).ok_or(libc::EINVAL)?;
    if size == 0 {
        return Err(libc::EINVAL);
    }
    let align = super::state::page_align(a.alignment).ok_or(libc::EINVAL)?;
    flags |= u64::from(sys::AMDGPU_GEM_CREATE_VRAM_WIPE_ON_RELEASE);
    flags &= !u64::from(sys::AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED);
    Ok(CreatePlan {
        size,
        align_pages: align / uapi::PAGE,
        domains: a.domains,
        flags,
    })
}

/// GEM_MMAP: the answer (`out.addr_ptr`).
pub fn gem_mmap(f: &RenderFile, input: &[u8], out_size: usize) -> R<Vec<u8>> {
    // union drm_amdgpu_gem_mmap: in.handle (u32), out.addr_ptr (u64).
    let handle: u32 = uapi::decode(input);
    let off = f.mmap_offset(handle)?;
    Ok(uapi::encode(&off, out_size))
}

/// GEM_WAIT_IDLE: every submission has finished by the time its CS
/// returns, so a BO is idle (status 0, the union zeroed).
pub fn wait_idle(f: &RenderFile, input: &[u8], out_size: usize) -> R<Vec<u8>> {
    let a: sys::drm_amdgpu_gem_wait_idle_in = uapi::decode(input);
    f.object(a.handle)?;
    Ok(vec![0; out_size])
}

/// `AMDGPU_GEM_METADATA` data bytes (`data.data`).
const METADATA_MAX: usize = 256;

/// GEM_METADATA GET or SET (amdgpu_gem_metadata_ioctl): the answer is the
/// caller's bytes with what GET reads patched in.
pub fn metadata(f: &RenderFile, input: &[u8], out_size: usize) -> R<Vec<u8>> {
    type M = sys::drm_amdgpu_gem_metadata;
    type D = sys::drm_amdgpu_gem_metadata__bindgen_ty_1;
    let a: M = uapi::decode(input);
    let obj = f.object(a.handle)?;
    let at = |field: usize| offset_of!(M, data) + field;
    let mut info = obj.info();
    match a.op {
        sys::AMDGPU_GEM_METADATA_OP_GET_METADATA => {
            let mut out = input.to_vec();
            out.resize(out_size.max(std::mem::size_of::<M>()), 0);
            uapi::put(&mut out, at(offset_of!(D, tiling_info)), &info.tiling);
            let bytes = &info.metadata;
            let data = at(offset_of!(D, data));
            out[data..data + bytes.len()].copy_from_slice(bytes);
            uapi::put(
                &mut out,
                at(offset_of!(D, data_size_bytes)),
                &(bytes.len() as u32),
            );
            uapi::put(&mut out, at(offset_of!(D, flags)), &info.meta_flags);
            out.truncate(out_size);
            Ok(out)
        }
        sys::AMDGPU_GEM_METADATA_OP_SET_METADATA => {
            let n = a.data.data_size_bytes as usize;
            if n > METADATA_MAX {
                return Err(libc::EINVAL);
            }
            info.tiling = a.data.tiling_info;
            // amdgpu_bo_set_metadata: no bytes clears them (and keeps the
            // flags).
            if n > 0 {
                let words = &a.data.data;
                info.metadata = words.iter().flat_map(|w| w.to_le_bytes()).take(n).collect();
                info.meta_flags = a.data.flags;
            } else {
                info.metadata.clear();
            }
            Ok(input[..out_size.min(input.len())].to_vec())
        }
        _ => Err(libc::EINVAL),
    }
}

/// The most entries GET_MAPPING_INFO takes room for.
const MAPPING_INFO_MAX: u32 = 65536;

/// GEM_OP (amdgpu_gem_op_ioctl, 6.18's 24-byte form; a 16-byte caller's
/// count and padding read as 0).  Answers are written to the caller
/// `tid`'s memory at `value`.
pub fn gem_op(f: &RenderFile, tid: u32, a: &mut gem618::drm_amdgpu_gem_op) -> R<()> {
    if a.padding != 0 {
        return Err(libc::EINVAL);
    }
    let obj = f.object(a.handle)?;
    match a.op {
        sys::AMDGPU_GEM_OP_GET_GEM_CREATE_INFO => {
            let info = create_info(obj);
            super::mem::user_write(tid, a.value, uapi::bytes(&info))
        }
        sys::AMDGPU_GEM_OP_SET_PLACEMENT => f.set_placement(a.handle, a.value),
        gem618::AMDGPU_GEM_OP_GET_MAPPING_INFO => {
            if a.num_entries > MAPPING_INFO_MAX {
                return Err(libc::EINVAL);
            }
            let maps = f.mappings_of(a.handle)?;
            let n = maps.len() as u32;
            if a.num_entries > 0 && n > 0 && n <= a.num_entries {
                let mut b = Vec::with_capacity(maps.len() * 32);
                for m in &maps {
                    uapi::push(&mut b, m);
                }
                super::mem::user_write(tid, a.value, &b)?;
            }
            a.num_entries = n;
            Ok(())
        }
        _ => Err(libc::EINVAL),
    }
}

/// GEM_LIST_HANDLES (amdgpu_gem_list_handles_ioctl): with no room, or too
/// little, only the count; else the entries, written to the caller
/// `tid`'s memory.
pub fn list_handles(
    f: &RenderFile,
    tid: u32,
    a: &mut gem618::drm_amdgpu_gem_list_handles,
) -> R<()> {
    let all = f.list_handles();
    let n = all.len() as u32;
    if a.num_entries == 0 || a.num_entries < n || n == 0 {
        a.num_entries = n;
        return Ok(());
    }
    let mut b = Vec::with_capacity(all.len() * 40);
    for e in &all {
        uapi::push(&mut b, e);
    }
    super::mem::user_write(tid, a.entries, &b)?;
    a.num_entries = n;
    Ok(())
}

/// GEM_USERPTR for process `pid`.
pub fn userptr(f: &mut RenderFile, pid: u32, a: &mut sys::drm_amdgpu_gem_userptr) -> R<()> {
    use sys::{
        AMDGPU_GEM_USERPTR_ANONONLY as ANONONLY, AMDGPU_GEM_USERPTR_READONLY as READONLY,
        AMDGPU_GEM_USERPTR_REGISTER as REGISTER, AMDGPU_GEM_USERPTR_VALIDATE as VALIDATE,
    };
    if (a.addr | a.size) & (uapi::PAGE - 1) != 0 {
        return Err(libc::EINVAL);
    }
    if a.flags & !(READONLY | ANONONLY | VALIDATE | REGISTER) != 0 {
        return Err(libc::EINVAL);
    }
    if a.flags & READONLY == 0 && a.flags & REGISTER == 0 {
        // Writable userptr needs the MMU notifier.
        return Err(libc::EACCES);
    }
    if a.size == 0 || a.addr.checked_add(a.size).is_none() {
        return Err(libc::EINVAL);
    }
    a.handle = f.userptr(
        pid,
        a.addr,
        a.size,
        a.flags & VALIDATE != 0,
        a.flags & ANONONLY != 0,
    )?;
    Ok(())
}

/// GEM_VA with amdgpu_gem_va_ioctl's and amdgpu_vm_bo_map's checks;
/// `va_top` is the VM size less the reserved top.
pub fn gem_va(f: &mut RenderFile, a: &sys::drm_amdgpu_gem_va, va_top: u64) -> R<()> {
    use super::asic::{GMC_HOLE_END, GMC_HOLE_START, VA_RESERVED_BOTTOM};
    if a.va_address < VA_RESERVED_BOTTOM {
        return Err(libc::EINVAL);
    }
    if (GMC_HOLE_START..GMC_HOLE_END).contains(&a.va_address) {
        return Err(libc::EINVAL);
    }
    let va = a.va_address & (GMC_HOLE_START * 2 - 1);
    if va.checked_add(a.map_size).is_none_or(|e| e > va_top) {
        return Err(libc::EINVAL);
    }
    if a.flags & !VALID_VA_FLAGS != 0 && a.flags & !PRT_FLAGS != 0 {
        return Err(libc::EINVAL);
    }
    let op = a.operation;
    if !(sys::AMDGPU_VA_OP_MAP..=sys::AMDGPU_VA_OP_REPLACE).contains(&op) {
        return Err(libc::EINVAL);
    }
    let prt = a.flags & sys::AMDGPU_VM_PAGE_PRT != 0;
    let obj_size = if op != sys::AMDGPU_VA_OP_CLEAR && !prt {
        Some(f.object_size(a.handle)?)
    } else {
        None
    };
    if prt && op != sys::AMDGPU_VA_OP_CLEAR && op != sys::AMDGPU_VA_OP_UNMAP {
        log::warn!("kfd-emu: GEM_VA of a PRT range (no BO): not modelled");
        return Err(libc::EINVAL);
    }
    let page = uapi::PAGE;
    let (off, size) = (a.offset_in_bo, a.map_size);
    let params = |obj_size: u64| -> R<()> {
        if (va | off | size) & (page - 1) != 0 {
            return Err(libc::EINVAL);
        }
        if va.checked_add(size).is_none_or(|e| e <= va)
            || off.checked_add(size).is_none_or(|e| e <= off)
        {
            return Err(libc::EINVAL);
        }
        if off + size > obj_size {
            return Err(libc::EINVAL);
        }
        Ok(())
    };
    match op {
        sys::AMDGPU_VA_OP_MAP | sys::AMDGPU_VA_OP_REPLACE => {
            params(obj_size.expect("looked up"))?;
            f.va_map(
                a.handle,
                (va, off, size),
                a.flags,
                op == sys::AMDGPU_VA_OP_REPLACE,
            )
        }
        sys::AMDGPU_VA_OP_UNMAP => f.va_unmap(a.handle, va & !(page - 1)),
        _ => {
            // CLEAR
            if (va | size) & (page - 1) != 0 || va.checked_add(size).is_none() {
                return Err(libc::EINVAL);
            }
            f.va_clear(va, size);
            Ok(())
        }
    }
}

/// AMDGPU_CTX; `resets` is the GPU's reset count.  Returns the answer's
/// bytes (the union's `out`).
pub fn ctx(f: &mut RenderFile, a: &sys::drm_amdgpu_ctx_in, resets: u64) -> R<[u8; 16]> {
    let mut out = [0u8; 16];
    match a.op {
        sys::AMDGPU_CTX_OP_ALLOC_CTX => {
            let id = f.ctx_alloc(resets)?;
            out[..4].copy_from_slice(&id.to_le_bytes());
        }
        sys::AMDGPU_CTX_OP_FREE_CTX => f.ctx_free(a.ctx_id)?,
        sys::AMDGPU_CTX_OP_QUERY_STATE => {
            let status = if f.ctx_reset_since_query(a.ctx_id, resets)? {
                sys::AMDGPU_CTX_UNKNOWN_RESET
            } else {
                sys::AMDGPU_CTX_NO_RESET
            };
            // flags (u64), hangs (u32), reset_status (u32).
            out[12..16].copy_from_slice(&status.to_le_bytes());
        }
        sys::AMDGPU_CTX_OP_QUERY_STATE2 => {
            let (reset, guilty) = f.ctx_state(a.ctx_id, resets)?;
            let mut flags = 0u64;
            if reset {
                flags |= sys::AMDGPU_CTX_QUERY2_FLAGS_RESET as u64;
            }
            if guilty {
                flags |= sys::AMDGPU_CTX_QUERY2_FLAGS_GUILTY as u64;
            }
            out[..8].copy_from_slice(&flags.to_le_bytes());
        }
        sys::AMDGPU_CTX_OP_GET_STABLE_PSTATE => {
            if a.flags != 0 {
                return Err(libc::EINVAL);
            }
            let pstate = f.ctx_stable_pstate(a.ctx_id)?;
            out[..4].copy_from_slice(&pstate.to_le_bytes());
        }
        sys::AMDGPU_CTX_OP_SET_STABLE_PSTATE => {
            // AMDGPU_CTX_STABLE_PSTATE_FLAGS_MASK: 0xf.
            if a.flags & !0xf != 0 {
                return Err(libc::EINVAL);
            }
            f.set_ctx_stable_pstate(a.ctx_id, a.flags)?;
        }
        _ => return Err(libc::EINVAL),
    }
    Ok(out)
}

/// AMDGPU_BO_LIST; returns the list handle to answer.
pub fn bo_list(f: &mut RenderFile, tid: u32, a: &sys::drm_amdgpu_bo_list_in) -> R<u32> {
    match a.operation {
        sys::AMDGPU_BO_LIST_OP_CREATE => {
            let handles = entries(tid, a.bo_number, a.bo_info_size, a.bo_info_ptr)?;
            f.list_create(&handles)
        }
        sys::AMDGPU_BO_LIST_OP_DESTROY => {
            f.list_destroy(a.list_handle);
            Ok(0)
        }
        sys::AMDGPU_BO_LIST_OP_UPDATE => {
            let handles = entries(tid, a.bo_number, a.bo_info_size, a.bo_info_ptr)?;
            f.list_update(a.list_handle, &handles)?;
            Ok(a.list_handle)
        }
        _ => Err(libc::EINVAL),
    }
}

/// A submission planned under the lock: what to run and the fence it
/// signals.
pub struct Job {
    pub ctx: u32,
    pub entity: (u32, u32),
    pub seq: u64,
    pub ibs: Vec<IbWork>,
}

/// AMDGPU_CS up to the execution (amdgpu_cs_parser_init, pass 1 and 2,
/// the BO list): the job to run.  The chunks are read from the caller
/// `tid`.  `ip` is the DMA IP's version; `has_ip` whether the
/// GPU has rings of an IP type.
pub fn cs(
    f: &mut RenderFile,
    tid: u32,
    a: &sys::drm_amdgpu_cs_in,
    ip: super::asic::IpVersion,
    has_ip: impl Fn(u32) -> bool,
) -> R<Job> {
    f.ctx_may_submit(a.ctx_id)?;
    if a.num_chunks == 0 {
        return Err(libc::EINVAL);
    }
    if a.num_chunks as u64 * 8 > MAX_COPY_IN {
        return Err(libc::ENOMEM);
    }
    let mut ibs = Vec::new();
    let mut in_cs_list: Option<BoList> = None;
    for i in 0..a.num_chunks as u64 {
        let at: u64 = read_user(tid, a.chunks + i * 8)?;
        let ch: sys::drm_amdgpu_cs_chunk = read_user(tid, at)?;
        let size = ch.length_dw as usize * 4;
        if size as u64 > MAX_COPY_IN {
            return Err(libc::ENOMEM);
        }
        let mut data = vec![0u8; size];
        super::mem::user_read(tid, ch.chunk_data, &mut data)?;
        match ch.chunk_id {
            sys::AMDGPU_CHUNK_ID_IB => {
                if size < std::mem::size_of::<sys::drm_amdgpu_cs_chunk_ib>() {
                    return Err(libc::EINVAL);
                }
                let ib: sys::drm_amdgpu_cs_chunk_ib = uapi::decode(&data);
                ibs.push(Ib {
                    va: ib.va_start,
                    bytes: ib.ib_bytes as u64,
                    ip: ib.ip_type,
                    ring: ib.ring,
                });
                entity_ok(ib.ip_type, ib.ip_instance, ib.ring, &has_ip)?;
            }
            sys::AMDGPU_CHUNK_ID_BO_HANDLES => {
                if size < std::mem::size_of::<sys::drm_amdgpu_bo_list_in>() {
                    return Err(libc::EINVAL);
                }
                let l: sys::drm_amdgpu_bo_list_in = uapi::decode(&data);
                let handles = entries(tid, l.bo_number, l.bo_info_size, l.bo_info_ptr)?;
                in_cs_list = Some(f.objects(&handles)?);
            }
            sys::AMDGPU_CHUNK_ID_FENCE => {
                log::warn!("kfd-emu: AMDGPU_CS user fence chunk: not modelled");
                return Err(libc::EINVAL);
            }
            // Every fence of the emulator is signalled by the time CS
            // returns: dependencies are met.
            sys::AMDGPU_CHUNK_ID_DEPENDENCIES
            | sys::AMDGPU_CHUNK_ID_SCHEDULED_DEPENDENCIES
            | sys::AMDGPU_CHUNK_ID_SYNCOBJ_IN
            | sys::AMDGPU_CHUNK_ID_SYNCOBJ_OUT
            | sys::AMDGPU_CHUNK_ID_SYNCOBJ_TIMELINE_WAIT
            | sys::AMDGPU_CHUNK_ID_SYNCOBJ_TIMELINE_SIGNAL => {}
            _ => return Err(libc::EINVAL),
        }
    }
    let fence = f.submit(a.ctx_id, &ibs, a.bo_list_handle, in_cs_list)?;
    let vm = |va: u64, n: u64| f.range(va, n);
    Ok(Job {
        ctx: fence.ctx,
        entity: fence.entity,
        seq: fence.seq,
        ibs: ibs
            .iter()
            .map(|ib| sdma::plan_ib(&vm, ip, ib.va, ib.bytes))
            .collect(),
    })
}

/// WAIT_CS: `Ok(errno of the fence or 0)`.
pub fn wait_cs(
    f: &RenderFile,
    a: &sys::drm_amdgpu_wait_cs_in,
    has_ip: impl Fn(u32) -> bool,
) -> R<i32> {
    f.ctx_exists(a.ctx_id)?;
    entity_ok(a.ip_type, a.ip_instance, a.ring, has_ip)?;
    f.fence(a.ctx_id, (a.ip_type, a.ring), a.handle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::device::asic::IpVersion;
    use crate::device::dmabuf::Registry;
    use crate::device::mem::Memfd;
    use crate::device::state::gem::AMDGPU_HW_IP_DMA;

    const TOP: u64 = 1 << 47;

    fn va(handle: u32, op: u32, at: u64, size: u64) -> sys::drm_amdgpu_gem_va {
        sys::drm_amdgpu_gem_va {
            handle,
            operation: op,
            flags: sys::AMDGPU_VM_PAGE_READABLE | sys::AMDGPU_VM_PAGE_WRITEABLE,
            va_address: at,
            offset_in_bo: 0,
            map_size: size,
            ..Default::default()
        }
    }

    /// A page-aligned buffer of this process, for userptr objects.
    fn pages(n: usize) -> Vec<u64> {
        vec![0u64; n * 512 + 512]
    }

    fn aligned(v: &mut [u64]) -> u64 {
        (v.as_mut_ptr() as u64).next_multiple_of(4096)
    }

    /// A render file importing a dma-buf of 8 KiB of 0xab: its handle (1),
    /// one however often imported.
    fn imported_dmabuf(f: &mut RenderFile) -> u32 {
        let mem = Memfd::new("t", 1 << 20).unwrap();
        let map = Arc::new(mem.map(0, 8192).unwrap());
        map.write(0, &[0xab; 8192]);
        let src = crate::device::dmabuf::Source {
            gpu: 1,
            offset: 0,
            domain: sys::AMDGPU_GEM_DOMAIN_VRAM,
        };
        let d = Registry::default()
            .export(src, 8192, &map, crate::device::dmabuf::Purpose::Checkpoint)
            .unwrap();
        let bo = f.import(d.clone()).unwrap();
        assert_eq!(bo, 1);
        assert_eq!(f.import(d).unwrap(), bo, "one handle per dma-buf");
        bo
    }

    /// The 3 pages at `base` registered as a userptr object (writable:
    /// REGISTER needed, page-aligned): its handle (2).
    fn registered_userptr(f: &mut RenderFile, pid: u32, base: u64) -> u32 {
        let mut u = sys::drm_amdgpu_gem_userptr {
            addr: base,
            size: 3 * 4096,
            flags: sys::AMDGPU_GEM_USERPTR_ANONONLY,
            handle: 0,
        };
        assert_eq!(
            userptr(f, pid, &mut u),
            Err(libc::EACCES),
            "writable needs REGISTER"
        );
        u.flags |= sys::AMDGPU_GEM_USERPTR_REGISTER | sys::AMDGPU_GEM_USERPTR_VALIDATE;
        u.addr += 1;
        assert_eq!(userptr(f, pid, &mut u), Err(libc::EINVAL));
        u.addr -= 1;
        userptr(f, pid, &mut u).unwrap();
        let up = u.handle;
        assert_eq!(up, 2);
        up
    }

    /// The dma-buf BO mapped at 1 MiB, the userptr (2 pages staging + 1
    /// page IB) at 2 MiB; overlaps, unknown handles and the reserved
    /// bottom refused.
    fn map_bo_and_userptr(f: &mut RenderFile, bo: u32, up: u32) {
        gem_va(f, &va(bo, sys::AMDGPU_VA_OP_MAP, 1 << 20, 8192), TOP).unwrap();
        assert_eq!(
            gem_va(
                f,
                &va(up, sys::AMDGPU_VA_OP_MAP, (1 << 20) + 4096, 4096),
                TOP
            ),
            Err(libc::EINVAL),
            "overlap"
        );
        assert_eq!(
            gem_va(f, &va(9, sys::AMDGPU_VA_OP_MAP, 2 << 20, 4096), TOP),
            Err(libc::ENOENT)
        );
        assert_eq!(
            gem_va(f, &va(up, sys::AMDGPU_VA_OP_MAP, 4096, 4096), TOP),
            Err(libc::EINVAL),
            "reserved bottom"
        );
        gem_va(f, &va(up, sys::AMDGPU_VA_OP_MAP, 2 << 20, 3 * 4096), TOP).unwrap();
    }

    /// A new context of the render file: its id (1).
    fn new_ctx(f: &mut RenderFile) -> u32 {
        let ctx = ctx(
            f,
            &sys::drm_amdgpu_ctx_in {
                op: sys::AMDGPU_CTX_OP_ALLOC_CTX,
                ..Default::default()
            },
            0,
        )
        .unwrap();
        let ctx = u32::from_le_bytes(ctx[..4].try_into().unwrap());
        assert_eq!(ctx, 1);
        ctx
    }

    /// `ib` into the third of the pages of `buf` at `base` (the IB page).
    fn write_ib(buf: &mut [u64], base: u64, ib: [u32; 8]) {
        let at = (base - buf.as_ptr() as u64) as usize / 8 + 2 * 512;
        for (k, w) in buf[at..at + 4].iter_mut().enumerate() {
            *w = u64::from(ib[2 * k]) | u64::from(ib[2 * k + 1]) << 32;
        }
    }

    #[test]
    fn sdma_ib_copies_between_a_dmabuf_and_userptr_memory() {
        let pid = std::process::id();
        let mut f = RenderFile::new(0);
        let bo = imported_dmabuf(&mut f);
        let mut buf = pages(3);
        let base = aligned(&mut buf);
        let up = registered_userptr(&mut f, pid, base);
        map_bo_and_userptr(&mut f, bo, up);
        // IB: COPY_LINEAR of 8 KiB from the BO to the staging, NOP-padded.
        write_ib(&mut buf, base, [1, 8191, 0, 1 << 20, 0, 2 << 20, 0, 0]);
        let ctx = new_ctx(&mut f);
        let chunk_ib = sys::drm_amdgpu_cs_chunk_ib {
            va_start: (2 << 20) + 2 * 4096,
            ib_bytes: 32,
            ip_type: AMDGPU_HW_IP_DMA,
            ..Default::default()
        };
        let chunk = sys::drm_amdgpu_cs_chunk {
            chunk_id: sys::AMDGPU_CHUNK_ID_IB,
            length_dw: 8,
            chunk_data: &chunk_ib as *const _ as u64,
        };
        let ptrs = [&chunk as *const _ as u64];
        let cs = sys::drm_amdgpu_cs_in {
            ctx_id: ctx,
            num_chunks: 1,
            chunks: ptrs.as_ptr() as u64,
            ..Default::default()
        };
        let all = |_: u32| true;
        let wait = |seq| sys::drm_amdgpu_wait_cs_in {
            handle: seq,
            ip_type: AMDGPU_HW_IP_DMA,
            ctx_id: ctx,
            ..Default::default()
        };
        assert_eq!(
            wait_cs(&f, &wait(1), all),
            Err(libc::EINVAL),
            "not issued yet"
        );
        let job = super::cs(&mut f, pid, &cs, IpVersion(4, 0, 0), all).unwrap();
        assert_eq!(job.seq, 1);
        for ib in job.ibs {
            crate::device::sdma::run_ib(ib).unwrap();
        }
        assert!(buf
            .iter()
            .skip((base - buf.as_ptr() as u64) as usize / 8)
            .take(1024)
            .all(|&w| w == 0xabab_abab_abab_abab));
        assert_eq!(wait_cs(&f, &wait(1), all), Ok(0));
        // An IB reading past the mapped BO hangs: ETIME, the context guilty.
        let past_the_bo = (1 << 20) + 8192;
        write_ib(&mut buf, base, [1, 4095, 0, past_the_bo, 0, 2 << 20, 0, 0]);
        let job = super::cs(&mut f, pid, &cs, IpVersion(4, 0, 0), all).unwrap();
        let hang = job
            .ibs
            .into_iter()
            .map(crate::device::sdma::run_ib)
            .find_map(Result::err)
            .expect("a GPU page fault");
        assert!(hang.what.contains("GPU page fault"), "{}", hang.what);
        f.fail(ctx, job.entity, job.seq, libc::ETIME);
        assert_eq!(wait_cs(&f, &wait(2), all), Ok(libc::ETIME));
        assert_eq!(
            super::cs(&mut f, pid, &cs, IpVersion(4, 0, 0), all).err(),
            Some(libc::ECANCELED)
        );
        // Closing the userptr object unmaps it; UNMAP of it is then ENOENT.
        f.close(up).unwrap();
        assert_eq!(f.close(up), Err(libc::EINVAL));
        assert_eq!(
            gem_va(&mut f, &va(bo, sys::AMDGPU_VA_OP_UNMAP, 2 << 20, 4096), TOP),
            Err(libc::ENOENT)
        );
        gem_va(&mut f, &va(bo, sys::AMDGPU_VA_OP_UNMAP, 1 << 20, 8192), TOP).unwrap();
    }

    /// A GEM_CREATE BO of `pages` pages on GPU 0 at render offset `off`,
    /// as `State::gem_create` makes one.
    fn bo(
        mem: &Memfd,
        off: u64,
        pages: u64,
        plan: &CreatePlan,
    ) -> Arc<crate::device::state::gem::GemObj> {
        use crate::device::state::gem::{BoInfo, GemKind, GemObj};
        let map = Arc::new(mem.map(off, pages * 4096).unwrap());
        let source = crate::device::dmabuf::Source {
            gpu: 0,
            offset: off,
            domain: sys::AMDGPU_GEM_DOMAIN_VRAM,
        };
        let info = BoInfo {
            domains: plan.domains,
            flags: plan.flags,
            align_pages: plan.align_pages,
            ..Default::default()
        };
        Arc::new(GemObj::new(GemKind::Bo { source, map }, plan.size, info))
    }

    fn create_in(size: u64, align: u64, domains: u32, flags: u32) -> sys::drm_amdgpu_gem_create_in {
        sys::drm_amdgpu_gem_create_in {
            bo_size: size,
            alignment: align,
            domains: domains.into(),
            domain_flags: flags.into(),
        }
    }

    /// GEM_CREATE's checks and the flags the kernel adds and drops.
    #[test]
    fn gem_create_checks_and_flags_as_amdgpu() {
        let vram = sys::AMDGPU_GEM_DOMAIN_VRAM;
        let p = create_plan(&create_in(
            5000,
            6000,
            vram,
            sys::AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED,
        ))
        .unwrap();
        assert_eq!((p.size, p.align_pages), (8192, 2), "page-rounded");
        let added = u64::from(
            sys::AMDGPU_GEM_CREATE_VRAM_CLEARED | sys::AMDGPU_GEM_CREATE_VRAM_WIPE_ON_RELEASE,
        );
        assert_eq!(
            p.flags, added,
            "CPU_ACCESS_REQUIRED dropped after placement"
        );
        assert!(p.wants_vram() && p.gtt_fallback());
        let both = create_plan(&create_in(4096, 0, vram | sys::AMDGPU_GEM_DOMAIN_CPU, 0)).unwrap();
        assert!(!both.gtt_fallback(), "VRAM|CPU does not fall back to GTT");
        let bad = [
            create_in(4096, 0, vram, 1 << 4),
            create_in(4096, 0, 0x100, 0),
            create_in(4096, 0, vram, sys::AMDGPU_GEM_CREATE_ENCRYPTED),
            create_in(4096, 0, gem618::AMDGPU_GEM_DOMAIN_MMIO_REMAP, 0),
            create_in(4096, 0, sys::AMDGPU_GEM_DOMAIN_GDS, 0),
            create_in(0, 0, vram, 0),
            create_in(u64::MAX, 0, vram, 0),
        ];
        for a in bad {
            assert_eq!(create_plan(&a), Err(libc::EINVAL), "{a:?}");
        }
    }

    /// LIST_HANDLES of the three BOs (1, 2, 3) of `plan`: the count to too
    /// small a buffer, nothing written; then the handles in order, with
    /// the settable flags and the alignment in pages.
    fn assert_list_handles(f: &RenderFile, pid: u32, plan: &CreatePlan) {
        let mut room = vec![gem618::drm_amdgpu_gem_list_handles_entry::default(); 3];
        let mut l = gem618::drm_amdgpu_gem_list_handles {
            entries: room.as_mut_ptr() as u64,
            num_entries: 2,
            padding: 0,
        };
        list_handles(f, pid, &mut l).unwrap();
        assert_eq!(l.num_entries, 3, "too small: the count");
        assert_eq!(room[0].gem_handle, 0, "nothing written");
        l.num_entries = 3;
        list_handles(f, pid, &mut l).unwrap();
        assert_eq!(
            room.iter().map(|e| e.gem_handle).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(room[0].size, 8192);
        assert_eq!(room[0].alignment, 16, "pages");
        assert_eq!(room[0].preferred_domains, 4);
        assert_eq!(room[0].flags, 0);
        assert_eq!(room[0].alloc_flags, plan.flags);
    }

    /// Handles are the lowest free from 1; LIST_HANDLES reports them with
    /// the settable flags and the alignment in pages; too small a buffer
    /// gets the count; CHANGE_HANDLE renames (6.18.0-6.18.35); GEM_OP
    /// answers create info, placement and mapping info (24-byte form).
    #[test]
    fn handles_list_rename_and_gem_op() {
        let pid = std::process::id();
        let mem = Memfd::new("t", 1 << 24).unwrap();
        let plan = create_plan(&create_in(8192, 65536, sys::AMDGPU_GEM_DOMAIN_VRAM, 0)).unwrap();
        let mut f = RenderFile::new(0);
        let a = f.create(bo(&mem, 0, 2, &plan)).unwrap();
        let b = f.create(bo(&mem, 1 << 20, 2, &plan)).unwrap();
        let c = f.create(bo(&mem, 2 << 20, 2, &plan)).unwrap();
        assert_eq!((a, b, c), (1, 2, 3));
        f.close(b).unwrap();
        let d = f.create(bo(&mem, 3 << 20, 2, &plan)).unwrap();
        assert_eq!(d, 2, "the lowest free handle");

        assert_list_handles(&f, pid, &plan);

        assert_eq!(f.change_handle(c, 2), Err(libc::ENOSPC));
        assert_eq!(f.change_handle(9, 10), Err(libc::ENOENT));
        assert_eq!(f.change_handle(c, 1 << 31), Err(libc::EINVAL));
        gem_va(&mut f, &va(c, sys::AMDGPU_VA_OP_MAP, 1 << 21, 8192), TOP).unwrap();
        f.change_handle(c, 7).unwrap();
        assert_eq!(f.object_size(c), Err(libc::ENOENT));
        assert_eq!(
            f.create(bo(&mem, 4 << 20, 2, &plan)).unwrap(),
            3,
            "3 is free again"
        );

        // GET_MAPPING_INFO follows the renamed handle.
        let mut ents = [gem618::drm_amdgpu_gem_vm_entry::default(); 2];
        let mut op = gem618::drm_amdgpu_gem_op {
            handle: 7,
            op: gem618::AMDGPU_GEM_OP_GET_MAPPING_INFO,
            value: ents.as_mut_ptr() as u64,
            num_entries: 0,
            padding: 0,
        };
        gem_op(&f, pid, &mut op).unwrap();
        assert_eq!(op.num_entries, 1, "no room: the count");
        assert_eq!(ents[0].size, 0);
        op.num_entries = 2;
        gem_op(&f, pid, &mut op).unwrap();
        let rw = u64::from(sys::AMDGPU_VM_PAGE_READABLE | sys::AMDGPU_VM_PAGE_WRITEABLE);
        assert_eq!(
            ents[0],
            gem618::drm_amdgpu_gem_vm_entry {
                addr: 1 << 21,
                size: 8192,
                offset: 0,
                flags: rw
            }
        );
        op.padding = 1;
        assert_eq!(gem_op(&f, pid, &mut op), Err(libc::EINVAL), "padding");
        op.padding = 0;
        op.num_entries = 65537;
        assert_eq!(gem_op(&f, pid, &mut op), Err(libc::EINVAL));

        // GET_GEM_CREATE_INFO (alignment in bytes), SET_PLACEMENT.
        let mut info = sys::drm_amdgpu_gem_create_in::default();
        let mut op = gem618::drm_amdgpu_gem_op {
            handle: 1,
            op: sys::AMDGPU_GEM_OP_SET_PLACEMENT,
            value: 0xff,
            ..Default::default()
        };
        gem_op(&f, pid, &mut op).unwrap();
        op.op = sys::AMDGPU_GEM_OP_GET_GEM_CREATE_INFO;
        op.value = &mut info as *mut _ as u64;
        gem_op(&f, pid, &mut op).unwrap();
        assert_eq!(
            (info.bo_size, info.alignment, info.domains),
            (8192, 65536, 7)
        );
        assert_eq!(info.domain_flags, plan.flags);
        op.op = 3;
        assert_eq!(gem_op(&f, pid, &mut op), Err(libc::EINVAL));
        op.handle = 99;
        assert_eq!(gem_op(&f, pid, &mut op), Err(libc::ENOENT));
    }

    /// GEM_METADATA keeps tiling, flags and bytes; no bytes clears them;
    /// more than 256 is EINVAL.  GEM_MMAP gives the BO's offset, EPERM
    /// without CPU access.  WAIT_IDLE: idle.
    #[test]
    fn metadata_mmap_and_wait_idle() {
        type M = sys::drm_amdgpu_gem_metadata;
        let mem = Memfd::new("t", 1 << 24).unwrap();
        let plan = create_plan(&create_in(4096, 0, sys::AMDGPU_GEM_DOMAIN_GTT, 0)).unwrap();
        let no_cpu = create_plan(&create_in(
            4096,
            0,
            sys::AMDGPU_GEM_DOMAIN_VRAM,
            sys::AMDGPU_GEM_CREATE_NO_CPU_ACCESS,
        ))
        .unwrap();
        let mut f = RenderFile::new(0);
        let h = f.create(bo(&mem, 1 << 20, 1, &plan)).unwrap();
        let n = f.create(bo(&mem, 2 << 20, 1, &no_cpu)).unwrap();
        let size = std::mem::size_of::<M>();
        let mut set = vec![0u8; size];
        set[0..4].copy_from_slice(&h.to_le_bytes());
        set[4..8].copy_from_slice(&sys::AMDGPU_GEM_METADATA_OP_SET_METADATA.to_le_bytes());
        set[8..16].copy_from_slice(&5u64.to_le_bytes());
        set[16..24].copy_from_slice(&0x1234u64.to_le_bytes());
        set[24..28].copy_from_slice(&6u32.to_le_bytes());
        set[28..34].copy_from_slice(b"abcdef");
        metadata(&f, &set, size).unwrap();
        let mut get = vec![0u8; size];
        get[0..4].copy_from_slice(&h.to_le_bytes());
        get[4..8].copy_from_slice(&sys::AMDGPU_GEM_METADATA_OP_GET_METADATA.to_le_bytes());
        let out = metadata(&f, &get, size).unwrap();
        assert_eq!(out[8..34], set[8..34]);
        set[24..28].copy_from_slice(&257u32.to_le_bytes());
        assert_eq!(metadata(&f, &set, size), Err(libc::EINVAL));
        set[24..28].copy_from_slice(&0u32.to_le_bytes());
        metadata(&f, &set, size).unwrap();
        let out = metadata(&f, &get, size).unwrap();
        assert_eq!(out[24..28], [0, 0, 0, 0]);
        assert_eq!(out[8..16], 5u64.to_le_bytes(), "flags kept");

        let m = gem_mmap(&f, &h.to_le_bytes(), 8).unwrap();
        assert_eq!(m, (1u64 << 20).to_le_bytes());
        assert_eq!(gem_mmap(&f, &n.to_le_bytes(), 8), Err(libc::EPERM));
        assert_eq!(gem_mmap(&f, &9u32.to_le_bytes(), 8), Err(libc::ENOENT));
        assert_eq!(wait_idle(&f, &h.to_le_bytes(), 16), Ok(vec![0; 16]));
        assert_eq!(wait_idle(&f, &9u32.to_le_bytes(), 16), Err(libc::ENOENT));
    }
}
