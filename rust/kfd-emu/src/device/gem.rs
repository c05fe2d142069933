//! What a render-node file holds for amdgpu's SDMA path, with the
//! kernel's checks and errnos (`amdgpu_gem.c`, `amdgpu_vm.c`,
//! `amdgpu_ctx.c`, `amdgpu_bo_list.c`, `amdgpu_cs.c`, `drm_prime.c`,
//! `drm_gem.c`):
//!
//! * GEM objects: imports of the emulator's dma-bufs (PRIME_FD_TO_HANDLE;
//!   one handle per dma-buf and file, as PRIME's lookup gives), userptr
//!   registrations (GEM_USERPTR) and GEM_CLOSE.  Handles count from 1.
//! * A GPU VM per file (GEM_VA MAP, UNMAP, CLEAR, REPLACE) that the SDMA
//!   engine reaches IB operands through.  It is the file's own: a file
//!   whose VM KFD adopted (ACQUIRE_VM) does not see KFD's BOs in it.
//! * Contexts, BO lists, and AMDGPU_CS of SDMA IBs, executed by the SDMA
//!   engine's packet decoder for the GPU's DMA IP version; fences and
//!   WAIT_CS.  A submission runs to its end before CS returns, so its
//!   fence is signalled (or failed) by the time WAIT_CS asks.
//!
//! A hung IB (a GPU page fault, a packet the engine cannot run, a wait
//! past amdgpu's lockup timeout) is what amdgpu ends with a job timeout and
//! a GPU reset: the fence fails with ETIME, the context becomes guilty
//! (its later CS are ECANCELED) and every context of the GPU sees the
//! reset (CTX QUERY_STATE2).  The emulator does that at once instead of
//! after the timeout.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::dmabuf::Dmabuf;
use super::state::{Span, R};
use super::uapi::{self, sys};
use super::vm::GpuRange;

pub const AMDGPU_HW_IP_GFX: u32 = 0;
pub const AMDGPU_HW_IP_COMPUTE: u32 = 1;
pub const AMDGPU_HW_IP_DMA: u32 = 2;
/// `AMDGPU_HW_IP_NUM` of the uapi.
pub const AMDGPU_HW_IP_NUM: u32 = 9;
/// `amdgpu_ctx_num_entities`: rings a context may name per IP type.
const NUM_ENTITIES: [u32; 9] = [1, 4, 2, 1, 1, 1, 1, 1, 1];
/// `amdgpu_sched_jobs`: fences a context remembers per ring.
const SCHED_JOBS: u64 = 32;
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

/// What a GEM object is.
pub enum GemKind {
    /// An import of one of the emulator's dma-bufs.
    Dmabuf(Arc<Dmabuf>),
    /// GEM_USERPTR memory of process `pid` at `addr`.
    Userptr { pid: u32, addr: u64 },
}

pub struct GemObj {
    pub kind: GemKind,
    pub size: u64,
}

impl GemObj {
    /// The memory `off` bytes into the object.
    fn span(&self, off: u64) -> Span {
        match &self.kind {
            GemKind::Dmabuf(d) => Span::Map(d.map.clone(), off),
            GemKind::Userptr { pid, addr } => Span::User(*pid, addr + off),
        }
    }
}

/// One GEM_VA mapping: `[va, va+size)` shows the object from `offset`.
struct VaMap {
    handle: u32,
    obj: Arc<GemObj>,
    size: u64,
    offset: u64,
}

/// A scheduler entity of a context (one ring of one IP type).
#[derive(Default)]
struct Entity {
    /// The next fence's sequence number (the first is 1).
    next: u64,
    /// Fences that failed, by sequence number, and their errno.
    errors: BTreeMap<u64, i32>,
}

pub struct Ctx {
    entities: HashMap<(u32, u32), Entity>,
    /// A job of this context hung (or a reset was injected on it): its
    /// CS are refused with ECANCELED.
    guilty: bool,
    /// The GPU's reset count when the context was made / last queried.
    resets: u64,
    resets_queried: u64,
    stable_pstate: u32,
}

/// One open of a render node.
pub struct RenderFile {
    objects: BTreeMap<u32, Arc<GemObj>>,
    /// PRIME imports: dma-buf identity → handle.
    imports: HashMap<(u64, u64), u32>,
    maps: BTreeMap<u64, VaMap>,
    ctxs: BTreeMap<u32, Ctx>,
    lists: BTreeMap<u32, Vec<Arc<GemObj>>>,
}

/// The lowest free id from 1 (`idr_alloc(..., 1, 0)`).
fn lowest_free<T>(m: &BTreeMap<u32, T>) -> u32 {
    let mut id = 1;
    for &k in m.keys() {
        if k != id {
            break;
        }
        id += 1;
    }
    id
}

/// A submission planned under the lock: what to run and the fence it
/// signals.
pub struct Job {
    pub ctx: u32,
    pub entity: (u32, u32),
    pub seq: u64,
    pub ibs: Vec<super::sdma::IbWork>,
}

/// One IB chunk of a CS.
struct Ib {
    va: u64,
    bytes: u64,
    ip: u32,
    ring: u32,
}

fn read_user<T: uapi::FromBytes>(tid: u32, addr: u64) -> R<T> {
    let mut b = vec![0u8; std::mem::size_of::<T>()];
    super::mem::user_read(tid, addr, &mut b)?;
    Ok(uapi::decode(&b))
}

/// Whether `[addr, addr+size)` of process `pid` is mapped, and whether
/// all of it is anonymous memory (no file behind it).
fn user_pages(pid: u32, addr: u64, size: u64) -> R<(bool, bool)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|_| libc::EFAULT)?;
    let mut vmas: Vec<(u64, u64, bool)> = Vec::new();
    for l in maps.lines() {
        let mut it = l.split_whitespace();
        let Some((s, e)) = it.next().and_then(|r| r.split_once('-')) else {
            continue;
        };
        let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) else {
            continue;
        };
        let path = it.nth(4).unwrap_or("");
        let anon = path.is_empty() || (path.starts_with('[') && !path.starts_with("[vdso"));
        vmas.push((s, e, anon));
    }
    let (mut cur, end, mut anon) = (addr, addr + size, true);
    while cur < end {
        match vmas.iter().find(|v| v.0 <= cur && cur < v.1) {
            Some(v) => {
                anon &= v.2;
                cur = v.1;
            }
            None => return Ok((false, anon)),
        }
    }
    Ok((true, anon))
}

impl RenderFile {
    pub fn new() -> RenderFile {
        RenderFile {
            objects: BTreeMap::new(),
            imports: HashMap::new(),
            maps: BTreeMap::new(),
            ctxs: BTreeMap::new(),
            lists: BTreeMap::new(),
        }
    }

    fn add_object(&mut self, obj: GemObj) -> u32 {
        let h = lowest_free(&self.objects);
        self.objects.insert(h, Arc::new(obj));
        h
    }

    /// `[va, va+len)` as the file's VM shows it.
    pub fn range(&self, va: u64, len: u64) -> GpuRange {
        let end = va.saturating_add(len);
        let mut spans = Vec::new();
        // Mappings do not overlap: the one starting at or before `va`,
        // then those starting inside the range.
        let first = self.maps.range(..=va).next_back().map(|(&k, _)| k);
        let starts = first
            .into_iter()
            .chain(self.maps.range(va.saturating_add(1)..end).map(|(&k, _)| k));
        for s in starts {
            let m = &self.maps[&s];
            let (a, b) = (s.max(va), (s + m.size).min(end));
            if a >= b {
                continue;
            }
            spans.push((a, b - a, Some(m.obj.span(m.offset + (a - s)))));
        }
        GpuRange::from_spans(va, len, spans)
    }

    /// Whether the file holds a GEM handle of the BO whose memory is `map`
    /// (an import of its dma-buf): `drm_gem_handle_create` admits the
    /// file to the object's mmap offset.
    pub fn holds(&self, map: &Arc<super::mem::Mapping>) -> bool {
        self.objects.values().any(|o| match &o.kind {
            GemKind::Dmabuf(d) => Arc::ptr_eq(&d.map, map),
            GemKind::Userptr { .. } => false,
        })
    }

    /// PRIME_FD_TO_HANDLE of dma-buf `d` (resolved by the caller).
    pub fn import(&mut self, d: Arc<Dmabuf>) -> u32 {
        if let Some(&h) = self.imports.get(&d.id) {
            if self.objects.contains_key(&h) {
                return h;
            }
        }
        let (id, size) = (d.id, d.size);
        let h = self.add_object(GemObj {
            kind: GemKind::Dmabuf(d),
            size,
        });
        self.imports.insert(id, h);
        h
    }

    /// PRIME_HANDLE_TO_FD: the dma-buf to install.
    pub fn export(&self, a: &sys::drm_prime_handle) -> R<Arc<Dmabuf>> {
        if a.flags & !(DRM_CLOEXEC | DRM_RDWR) != 0 {
            return Err(libc::EINVAL);
        }
        let obj = self.objects.get(&a.handle).ok_or(libc::ENOENT)?;
        match &obj.kind {
            GemKind::Dmabuf(d) => Ok(d.clone()),
            // amdgpu_gem_prime_export refuses userptr BOs.
            GemKind::Userptr { .. } => Err(libc::EPERM),
        }
    }

    /// GEM_USERPTR for process `pid`.
    pub fn userptr(&mut self, pid: u32, a: &mut sys::drm_amdgpu_gem_userptr) -> R<()> {
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
        if a.flags & VALIDATE != 0 {
            let (mapped, anon) = user_pages(pid, a.addr, a.size)?;
            if a.flags & ANONONLY != 0 && !anon {
                return Err(libc::EPERM);
            }
            if !mapped {
                return Err(libc::EFAULT);
            }
        }
        a.handle = self.add_object(GemObj {
            kind: GemKind::Userptr { pid, addr: a.addr },
            size: a.size,
        });
        Ok(())
    }

    /// GEM_CLOSE: the handle goes, and with it the object's mappings in
    /// this file's VM (amdgpu_gem_object_close).  BO lists keep the
    /// object.
    pub fn close(&mut self, handle: u32) -> R<()> {
        self.objects.remove(&handle).ok_or(libc::EINVAL)?;
        self.maps.retain(|_, m| m.handle != handle);
        self.imports.retain(|_, h| *h != handle);
        Ok(())
    }

    /// Removes every mapping inside `[va, va+size)`, trimming those that
    /// cross its ends (amdgpu_vm_bo_clear_mappings).
    fn clear(&mut self, va: u64, size: u64) {
        let end = va + size;
        let hit: Vec<u64> = self
            .maps
            .iter()
            .filter(|(&s, m)| s < end && va < s + m.size)
            .map(|(&s, _)| s)
            .collect();
        for s in hit {
            let m = self.maps.remove(&s).expect("listed");
            if s < va {
                self.maps.insert(
                    s,
                    VaMap {
                        handle: m.handle,
                        obj: m.obj.clone(),
                        size: va - s,
                        offset: m.offset,
                    },
                );
            }
            if s + m.size > end {
                self.maps.insert(
                    end,
                    VaMap {
                        handle: m.handle,
                        obj: m.obj.clone(),
                        size: s + m.size - end,
                        offset: m.offset + (end - s),
                    },
                );
            }
        }
    }

    /// GEM_VA with amdgpu_gem_va_ioctl's and amdgpu_vm_bo_map's checks;
    /// `va_top` is the VM size less the reserved top.
    pub fn gem_va(&mut self, a: &sys::drm_amdgpu_gem_va, va_top: u64) -> R<()> {
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
        let obj = if op != sys::AMDGPU_VA_OP_CLEAR && !prt {
            Some(self.objects.get(&a.handle).ok_or(libc::ENOENT)?.clone())
        } else {
            None
        };
        if prt && op != sys::AMDGPU_VA_OP_CLEAR && op != sys::AMDGPU_VA_OP_UNMAP {
            log::warn!("kfd-emu: GEM_VA of a PRT range (no BO): not modelled");
            return Err(libc::EINVAL);
        }
        let page = uapi::PAGE;
        let (off, size) = (a.offset_in_bo, a.map_size);
        let params = |obj: &GemObj| -> R<()> {
            if (va | off | size) & (page - 1) != 0 {
                return Err(libc::EINVAL);
            }
            if va.checked_add(size).is_none_or(|e| e <= va)
                || off.checked_add(size).is_none_or(|e| e <= off)
            {
                return Err(libc::EINVAL);
            }
            if off + size > obj.size {
                return Err(libc::EINVAL);
            }
            Ok(())
        };
        match op {
            sys::AMDGPU_VA_OP_MAP | sys::AMDGPU_VA_OP_REPLACE => {
                let obj = obj.expect("looked up");
                params(&obj)?;
                if op == sys::AMDGPU_VA_OP_MAP {
                    let overlap = self
                        .maps
                        .range(..va + size)
                        .next_back()
                        .is_some_and(|(&s, m)| s + m.size > va);
                    if overlap {
                        return Err(libc::EINVAL);
                    }
                } else {
                    self.clear(va, size);
                }
                self.maps.insert(
                    va,
                    VaMap {
                        handle: a.handle,
                        obj,
                        size,
                        offset: off,
                    },
                );
                Ok(())
            }
            sys::AMDGPU_VA_OP_UNMAP => {
                let start = va & !(page - 1);
                match self.maps.get(&start) {
                    Some(m) if m.handle == a.handle => {
                        self.maps.remove(&start);
                        Ok(())
                    }
                    _ => Err(libc::ENOENT),
                }
            }
            _ => {
                // CLEAR
                if (va | size) & (page - 1) != 0 || va.checked_add(size).is_none() {
                    return Err(libc::EINVAL);
                }
                self.clear(va, size);
                Ok(())
            }
        }
    }

    /// AMDGPU_CTX; `resets` is the GPU's reset count.  Returns the
    /// answer's bytes (the union's `out`).
    pub fn ctx(&mut self, a: &sys::drm_amdgpu_ctx_in, resets: u64) -> R<[u8; 16]> {
        let mut out = [0u8; 16];
        match a.op {
            sys::AMDGPU_CTX_OP_ALLOC_CTX => {
                let id = lowest_free(&self.ctxs);
                self.ctxs.insert(
                    id,
                    Ctx {
                        entities: HashMap::new(),
                        guilty: false,
                        resets,
                        resets_queried: resets,
                        stable_pstate: 0,
                    },
                );
                out[..4].copy_from_slice(&id.to_le_bytes());
            }
            sys::AMDGPU_CTX_OP_FREE_CTX => {
                self.ctxs.remove(&a.ctx_id).ok_or(libc::EINVAL)?;
            }
            sys::AMDGPU_CTX_OP_QUERY_STATE => {
                let c = self.ctxs.get_mut(&a.ctx_id).ok_or(libc::EINVAL)?;
                let status = if c.resets_queried == resets {
                    sys::AMDGPU_CTX_NO_RESET
                } else {
                    sys::AMDGPU_CTX_UNKNOWN_RESET
                };
                c.resets_queried = resets;
                // flags (u64), hangs (u32), reset_status (u32).
                out[12..16].copy_from_slice(&status.to_le_bytes());
            }
            sys::AMDGPU_CTX_OP_QUERY_STATE2 => {
                let c = self.ctxs.get(&a.ctx_id).ok_or(libc::EINVAL)?;
                let mut flags = 0u64;
                if c.resets != resets {
                    flags |= sys::AMDGPU_CTX_QUERY2_FLAGS_RESET as u64;
                }
                if c.guilty {
                    flags |= sys::AMDGPU_CTX_QUERY2_FLAGS_GUILTY as u64;
                }
                out[..8].copy_from_slice(&flags.to_le_bytes());
            }
            sys::AMDGPU_CTX_OP_GET_STABLE_PSTATE => {
                if a.flags != 0 {
                    return Err(libc::EINVAL);
                }
                let c = self.ctxs.get(&a.ctx_id).ok_or(libc::EINVAL)?;
                out[..4].copy_from_slice(&c.stable_pstate.to_le_bytes());
            }
            sys::AMDGPU_CTX_OP_SET_STABLE_PSTATE => {
                // AMDGPU_CTX_STABLE_PSTATE_FLAGS_MASK: 0xf.
                if a.flags & !0xf != 0 {
                    return Err(libc::EINVAL);
                }
                let c = self.ctxs.get_mut(&a.ctx_id).ok_or(libc::EINVAL)?;
                c.stable_pstate = a.flags;
            }
            _ => return Err(libc::EINVAL),
        }
        Ok(out)
    }

    /// Reads `n` BO list entries of `size` bytes each at `ptr` and looks
    /// their handles up (ENOENT for an unknown one).
    fn entries(&self, tid: u32, n: u32, size: u32, ptr: u64) -> R<Vec<Arc<GemObj>>> {
        let stride = size as u64;
        let total = n as u64 * stride;
        if total > MAX_COPY_IN {
            return Err(libc::ENOMEM);
        }
        let mut raw = vec![0u8; total as usize];
        super::mem::user_read(tid, ptr, &mut raw)?;
        let mut objs = Vec::with_capacity(n as usize);
        for i in 0..n as usize {
            // An entry shorter than the uapi's is zero-extended.
            let mut b = [0u8; 4];
            let at = i * stride as usize;
            let take = (stride as usize).min(4);
            b[..take].copy_from_slice(&raw[at..at + take]);
            let h = u32::from_le_bytes(b);
            objs.push(self.objects.get(&h).ok_or(libc::ENOENT)?.clone());
        }
        Ok(objs)
    }

    /// AMDGPU_BO_LIST; returns the list handle to answer.
    pub fn bo_list(&mut self, tid: u32, a: &sys::drm_amdgpu_bo_list_in) -> R<u32> {
        match a.operation {
            sys::AMDGPU_BO_LIST_OP_CREATE => {
                let objs = self.entries(tid, a.bo_number, a.bo_info_size, a.bo_info_ptr)?;
                let id = lowest_free(&self.lists);
                self.lists.insert(id, objs);
                Ok(id)
            }
            sys::AMDGPU_BO_LIST_OP_DESTROY => {
                self.lists.remove(&a.list_handle);
                Ok(0)
            }
            sys::AMDGPU_BO_LIST_OP_UPDATE => {
                let objs = self.entries(tid, a.bo_number, a.bo_info_size, a.bo_info_ptr)?;
                let l = self.lists.get_mut(&a.list_handle).ok_or(libc::ENOENT)?;
                *l = objs;
                Ok(a.list_handle)
            }
            _ => Err(libc::EINVAL),
        }
    }

    fn entity_ok(ip: u32, instance: u32, ring: u32, has_ip: impl Fn(u32) -> bool) -> R<()> {
        if ip >= AMDGPU_HW_IP_NUM || instance != 0 || ring >= NUM_ENTITIES[ip as usize] {
            return Err(libc::EINVAL);
        }
        if !has_ip(ip) {
            return Err(libc::EINVAL);
        }
        Ok(())
    }

    /// AMDGPU_CS up to the execution (amdgpu_cs_parser_init, pass 1 and
    /// 2, the BO list): the job to run.  `major` is the DMA IP's major
    /// version; `has_ip` whether the GPU has rings of an IP type.
    pub fn cs(
        &mut self,
        tid: u32,
        a: &sys::drm_amdgpu_cs_in,
        major: u32,
        has_ip: impl Fn(u32) -> bool,
    ) -> R<Job> {
        let c = self.ctxs.get(&a.ctx_id).ok_or(libc::EINVAL)?;
        if c.guilty {
            return Err(libc::ECANCELED);
        }
        if a.num_chunks == 0 {
            return Err(libc::EINVAL);
        }
        if a.num_chunks as u64 * 8 > MAX_COPY_IN {
            return Err(libc::ENOMEM);
        }
        let mut ibs = Vec::new();
        let mut in_cs_list: Option<Vec<Arc<GemObj>>> = None;
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
                    Self::entity_ok(ib.ip_type, ib.ip_instance, ib.ring, &has_ip)?;
                }
                sys::AMDGPU_CHUNK_ID_BO_HANDLES => {
                    if size < std::mem::size_of::<sys::drm_amdgpu_bo_list_in>() {
                        return Err(libc::EINVAL);
                    }
                    let l: sys::drm_amdgpu_bo_list_in = uapi::decode(&data);
                    in_cs_list =
                        Some(self.entries(tid, l.bo_number, l.bo_info_size, l.bo_info_ptr)?);
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
        let Some(first) = ibs.first() else {
            return Err(libc::EINVAL);
        };
        let entity = (first.ip, first.ring);
        let list = match (a.bo_list_handle, in_cs_list) {
            (0, l) => l.unwrap_or_default(),
            (_, Some(_)) => return Err(libc::EINVAL),
            (h, None) => self.lists.get(&h).ok_or(libc::ENOENT)?.clone(),
        };
        // amdgpu_cs_parser_bos: userptr BOs get their pages again.
        for o in &list {
            if let GemKind::Userptr { pid, addr } = o.kind {
                if !user_pages(pid, addr, o.size)?.0 {
                    return Err(libc::EFAULT);
                }
            }
        }
        let mut work = Vec::with_capacity(ibs.len());
        for ib in &ibs {
            if ib.ip != AMDGPU_HW_IP_DMA {
                log::warn!(
                    "kfd-emu: AMDGPU_CS of an IB for IP type {}: the emulated GPU runs only \
                     SDMA IBs",
                    ib.ip
                );
                return Err(libc::EINVAL);
            }
            if ib.bytes == 0 || ib.bytes % 4 != 0 {
                return Err(libc::EINVAL);
            }
            let vm = |va: u64, n: u64| self.range(va, n);
            work.push(super::sdma::plan_ib(&vm, major, ib.va, ib.bytes));
        }
        let c = self.ctxs.get_mut(&a.ctx_id).expect("looked up above");
        let e = c.entities.entry(entity).or_default();
        e.next = e.next.max(1);
        let seq = e.next;
        e.next += 1;
        Ok(Job {
            ctx: a.ctx_id,
            entity,
            seq,
            ibs: work,
        })
    }

    /// The job's fence failed with `errno` (a hang: the context is
    /// guilty).
    pub fn fail(&mut self, ctx: u32, entity: (u32, u32), seq: u64, errno: i32) {
        if let Some(c) = self.ctxs.get_mut(&ctx) {
            c.guilty = true;
            let e = c.entities.entry(entity).or_default();
            e.errors.insert(seq, errno);
            let keep = e.next.saturating_sub(SCHED_JOBS);
            e.errors.retain(|&s, _| s >= keep);
        }
    }

    /// WAIT_CS: `Ok(errno of the fence or 0)`.
    pub fn wait_cs(&self, a: &sys::drm_amdgpu_wait_cs_in, has_ip: impl Fn(u32) -> bool) -> R<i32> {
        let c = self.ctxs.get(&a.ctx_id).ok_or(libc::EINVAL)?;
        Self::entity_ok(a.ip_type, a.ip_instance, a.ring, has_ip)?;
        let e = c.entities.get(&(a.ip_type, a.ring));
        let next = e.map_or(1, |e| e.next.max(1));
        if a.handle >= next {
            return Err(libc::EINVAL);
        }
        Ok(e.and_then(|e| e.errors.get(&a.handle).copied())
            .unwrap_or(0))
    }

    /// Marks context `ctx` guilty of a GPU reset (fault injection).
    pub fn make_guilty(&mut self, ctx: u32) {
        if let Some(c) = self.ctxs.get_mut(&ctx) {
            c.guilty = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::dmabuf::Registry;
    use crate::device::mem::Memfd;

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

    /// A file holding a GEM handle of a BO (a PRIME import of its dma-buf)
    /// is admitted to the BO's mmap offset; closing the handle ends that.
    #[test]
    fn an_import_admits_the_file_to_that_bo_only() {
        let mem = Memfd::new("t", 1 << 20).unwrap();
        let map = Arc::new(mem.map(0, 8192).unwrap());
        let other = Arc::new(mem.map(8192, 8192).unwrap());
        let d = Registry::default()
            .export(0, 0, 8192, &map, crate::device::dmabuf::Purpose::Checkpoint)
            .unwrap();
        let mut f = RenderFile::new();
        assert!(!f.holds(&map));
        let h = f.import(d);
        assert!(f.holds(&map) && !f.holds(&other));
        f.close(h).unwrap();
        assert!(!f.holds(&map));
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
            f.userptr(pid, &mut u),
            Err(libc::EACCES),
            "writable needs REGISTER"
        );
        u.flags |= sys::AMDGPU_GEM_USERPTR_REGISTER | sys::AMDGPU_GEM_USERPTR_VALIDATE;
        u.addr += 1;
        assert_eq!(f.userptr(pid, &mut u), Err(libc::EINVAL));
        u.addr -= 1;
        f.userptr(pid, &mut u).unwrap();
        let up = u.handle;
        assert_eq!(up, 2);
        // The BO at 1 MiB, the userptr (2 pages staging + 1 page IB) at 2 MiB.
        f.gem_va(&va(bo, sys::AMDGPU_VA_OP_MAP, 1 << 20, 8192), TOP)
            .unwrap();
        assert_eq!(
            f.gem_va(&va(up, sys::AMDGPU_VA_OP_MAP, (1 << 20) + 4096, 4096), TOP),
            Err(libc::EINVAL),
            "overlap"
        );
        assert_eq!(
            f.gem_va(&va(9, sys::AMDGPU_VA_OP_MAP, 2 << 20, 4096), TOP),
            Err(libc::ENOENT)
        );
        assert_eq!(
            f.gem_va(&va(up, sys::AMDGPU_VA_OP_MAP, 4096, 4096), TOP),
            Err(libc::EINVAL),
            "reserved bottom"
        );
        f.gem_va(&va(up, sys::AMDGPU_VA_OP_MAP, 2 << 20, 3 * 4096), TOP)
            .unwrap();
        // IB: COPY_LINEAR of 8 KiB from the BO to the staging, NOP-padded.
        let ib: [u32; 8] = [1, 8191, 0, 1 << 20, 0, 2 << 20, 0, 0];
        // SAFETY: the third page of `buf` is ours; 32 bytes fit.
        unsafe {
            std::ptr::copy_nonoverlapping(ib.as_ptr(), (base + 2 * 4096) as *mut u32, ib.len())
        };
        let ctx = f
            .ctx(
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
            f.wait_cs(&wait(1), all),
            Err(libc::EINVAL),
            "not issued yet"
        );
        let job = f.cs(pid, &cs, 4, all).unwrap();
        assert_eq!(job.seq, 1);
        for ib in job.ibs {
            crate::device::sdma::run_ib(ib).unwrap();
        }
        assert!(buf
            .iter()
            .skip((base - buf.as_ptr() as u64) as usize / 8)
            .take(1024)
            .all(|&w| w == 0xabab_abab_abab_abab));
        assert_eq!(f.wait_cs(&wait(1), all), Ok(0));
        // An IB reading past the mapped BO hangs: ETIME, the context guilty.
        let bad: [u32; 8] = [1, 4095, 0, (1 << 20) + 8192, 0, 2 << 20, 0, 0];
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(bad.as_ptr(), (base + 2 * 4096) as *mut u32, 8) };
        let job = f.cs(pid, &cs, 4, all).unwrap();
        let hang = job
            .ibs
            .into_iter()
            .map(crate::device::sdma::run_ib)
            .find_map(Result::err)
            .expect("a GPU page fault");
        assert!(hang.what.contains("GPU page fault"), "{}", hang.what);
        f.fail(ctx, job.entity, job.seq, libc::ETIME);
        assert_eq!(f.wait_cs(&wait(2), all), Ok(libc::ETIME));
        assert_eq!(f.cs(pid, &cs, 4, all).err(), Some(libc::ECANCELED));
        // Closing the userptr object unmaps it; UNMAP of it is then ENOENT.
        f.close(up).unwrap();
        assert_eq!(f.close(up), Err(libc::EINVAL));
        assert_eq!(
            f.gem_va(&va(bo, sys::AMDGPU_VA_OP_UNMAP, 2 << 20, 4096), TOP),
            Err(libc::ENOENT)
        );
        f.gem_va(&va(bo, sys::AMDGPU_VA_OP_UNMAP, 1 << 20, 8192), TOP)
            .unwrap();
    }
}
