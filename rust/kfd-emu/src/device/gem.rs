//! The GEM, VM, context, BO list and CS ioctls of a render node
//! (`amdgpu_gem.c`, `amdgpu_vm.c`, `amdgpu_ctx.c`, `amdgpu_bo_list.c`,
//! `amdgpu_cs.c`, `drm_prime.c`): each one's arguments decoded (the CS
//! chunks and BO list entries read from the caller) and checked in the
//! kernel's order, the operation run on the render file the state keeps
//! (`state::gem`), the answer encoded.

use std::sync::Arc;

use super::dmabuf::Dmabuf;
use super::state::gem::{BoList, Ib, Job, RenderFile};
use super::state::R;
use super::uapi::{self, sys};

/// `AMDGPU_HW_IP_NUM` of the uapi.
pub const AMDGPU_HW_IP_NUM: u32 = 9;
/// `amdgpu_ctx_num_entities`: rings a context may name per IP type.
const NUM_ENTITIES: [u32; 9] = [1, 4, 2, 1, 1, 1, 1, 1, 1];
/// `AMDGPU_VM_PAGE_NOALLOC`.
const VM_PAGE_NOALLOC: u32 = 1 << 9;
const VALID_VA_FLAGS: u32 = sys::AMDGPU_VM_DELAY_UPDATE
    | sys::AMDGPU_VM_PAGE_READABLE
    | sys::AMDGPU_VM_PAGE_WRITEABLE
    | sys::AMDGPU_VM_PAGE_EXECUTABLE
    | sys::AMDGPU_VM_MTYPE_MASK
    | VM_PAGE_NOALLOC;
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

/// PRIME_HANDLE_TO_FD: the dma-buf to install.
pub fn export(f: &RenderFile, a: &sys::drm_prime_handle) -> R<Arc<Dmabuf>> {
    if a.flags & !(DRM_CLOEXEC | DRM_RDWR) != 0 {
        return Err(libc::EINVAL);
    }
    f.export(a.handle)
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
            f.va_map(a.handle, va, off, size, op == sys::AMDGPU_VA_OP_REPLACE)
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
            let id = f.ctx_alloc(resets);
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

/// AMDGPU_CS up to the execution (amdgpu_cs_parser_init, pass 1 and 2,
/// the BO list): the job to run.  The chunks are read from the caller
/// `tid`.  `major` is the DMA IP's major version; `has_ip` whether the
/// GPU has rings of an IP type.
pub fn cs(
    f: &mut RenderFile,
    tid: u32,
    a: &sys::drm_amdgpu_cs_in,
    major: u32,
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
    f.submit(a.ctx_id, &ibs, a.bo_list_handle, in_cs_list, major)
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

    #[test]
    fn sdma_ib_copies_between_a_dmabuf_and_userptr_memory() {
        let pid = std::process::id();
        let mem = Memfd::new("t", 1 << 20).unwrap();
        let map = Arc::new(mem.map(0, 8192).unwrap());
        map.write(0, &[0xab; 8192]);
        let d = Registry::default()
            .export(0, 0, 8192, &map, crate::device::dmabuf::Purpose::Checkpoint)
            .unwrap();
        let mut f = RenderFile::new();
        let bo = f.import(d.clone());
        assert_eq!(bo, 1);
        assert_eq!(f.import(d), bo, "one handle per dma-buf");
        let mut buf = pages(3);
        let base = aligned(&mut buf);
        let mut u = sys::drm_amdgpu_gem_userptr {
            addr: base,
            size: 3 * 4096,
            flags: sys::AMDGPU_GEM_USERPTR_ANONONLY,
            handle: 0,
        };
        assert_eq!(
            userptr(&mut f, pid, &mut u),
            Err(libc::EACCES),
            "writable needs REGISTER"
        );
        u.flags |= sys::AMDGPU_GEM_USERPTR_REGISTER | sys::AMDGPU_GEM_USERPTR_VALIDATE;
        u.addr += 1;
        assert_eq!(userptr(&mut f, pid, &mut u), Err(libc::EINVAL));
        u.addr -= 1;
        userptr(&mut f, pid, &mut u).unwrap();
        let up = u.handle;
        assert_eq!(up, 2);
        // The BO at 1 MiB, the userptr (2 pages staging + 1 page IB) at 2 MiB.
        gem_va(&mut f, &va(bo, sys::AMDGPU_VA_OP_MAP, 1 << 20, 8192), TOP).unwrap();
        assert_eq!(
            gem_va(
                &mut f,
                &va(up, sys::AMDGPU_VA_OP_MAP, (1 << 20) + 4096, 4096),
                TOP
            ),
            Err(libc::EINVAL),
            "overlap"
        );
        assert_eq!(
            gem_va(&mut f, &va(9, sys::AMDGPU_VA_OP_MAP, 2 << 20, 4096), TOP),
            Err(libc::ENOENT)
        );
        assert_eq!(
            gem_va(&mut f, &va(up, sys::AMDGPU_VA_OP_MAP, 4096, 4096), TOP),
            Err(libc::EINVAL),
            "reserved bottom"
        );
        gem_va(
            &mut f,
            &va(up, sys::AMDGPU_VA_OP_MAP, 2 << 20, 3 * 4096),
            TOP,
        )
        .unwrap();
        // IB: COPY_LINEAR of 8 KiB from the BO to the staging, NOP-padded.
        let ib: [u32; 8] = [1, 8191, 0, 1 << 20, 0, 2 << 20, 0, 0];
        // SAFETY: the third page of `buf` is ours; 32 bytes fit.
        unsafe {
            std::ptr::copy_nonoverlapping(ib.as_ptr(), (base + 2 * 4096) as *mut u32, ib.len())
        };
        let ctx = ctx(
            &mut f,
            &sys::drm_amdgpu_ctx_in {
                op: sys::AMDGPU_CTX_OP_ALLOC_CTX,
                ..Default::default()
            },
            0,
        )
        .unwrap();
        let ctx = u32::from_le_bytes(ctx[..4].try_into().unwrap());
        assert_eq!(ctx, 1);
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
        let job = super::cs(&mut f, pid, &cs, 4, all).unwrap();
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
        let bad: [u32; 8] = [1, 4095, 0, (1 << 20) + 8192, 0, 2 << 20, 0, 0];
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(bad.as_ptr(), (base + 2 * 4096) as *mut u32, 8) };
        let job = super::cs(&mut f, pid, &cs, 4, all).unwrap();
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
            super::cs(&mut f, pid, &cs, 4, all).err(),
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
}
