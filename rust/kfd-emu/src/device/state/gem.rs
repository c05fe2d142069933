//! What a render-node file holds for amdgpu's SDMA path, with the
//! kernel's rules and the errnos of its state (`amdgpu_gem.c`,
//! `amdgpu_vm.c`, `amdgpu_ctx.c`, `amdgpu_bo_list.c`, `amdgpu_cs.c`,
//! `drm_prime.c`, `drm_gem.c`).  The ioctls are decoded, checked and
//! answered in `device::gem`; the operations here take plain values.
//!
//! * GEM objects: BOs of the render node's memory (GEM_CREATE, mapped by
//!   the CPU at their GEM_MMAP offset of the render file), imports of the
//!   emulator's dma-bufs (PRIME_FD_TO_HANDLE; one handle per object and
//!   file, as PRIME's lookup gives: a dma-buf of a BO of this GPU is that
//!   BO again, of another GPU an import), userptr registrations
//!   (GEM_USERPTR), GEM_CLOSE, GEM_OP, GEM_METADATA, GEM_LIST_HANDLES and
//!   GEM_CHANGE_HANDLE.  Handles are the lowest free from 1, as the
//!   file's idr hands them out (an [`IdrMap`]: a new handle is found
//!   without a walk of those taken); a PRIME import finds the file's
//!   handle of the object, a CPU mmap the object at its offset (or one
//!   showing a KFD BO's memory), and GEM_CLOSE the handle's VA mappings,
//!   by an index kept beside them (`index`), not by a walk.
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
use std::sync::{Arc, Mutex, MutexGuard};

use kfd_abi::layout::gem618;
use kfd_abi::sys;

use super::idr::{Idr, IdrMap};
use super::{Span, R};
use index::{Objects, VaMaps};

mod index;
use crate::device::dmabuf::{Dmabuf, Source};
use crate::device::mem::Mapping;

pub const AMDGPU_HW_IP_GFX: u32 = 0;
pub const AMDGPU_HW_IP_COMPUTE: u32 = 1;
pub const AMDGPU_HW_IP_DMA: u32 = 2;
/// `amdgpu_sched_jobs`: fences a context remembers per ring.
const SCHED_JOBS: u64 = 32;

/// What a GEM object is.
pub enum GemKind {
    /// An import of one of the emulator's dma-bufs: a KFD BO's, or another
    /// GPU's GEM BO's.
    Dmabuf(Arc<Dmabuf>),
    /// GEM_USERPTR memory of process `pid` at `addr`.
    Userptr { pid: u32, addr: u64 },
    /// GEM_CREATE: the BO's range of its GPU's render memfd.
    Bo { source: Source, map: Arc<Mapping> },
}

/// A GEM_CREATE request, checked: what to allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreatePlan {
    /// Bytes, a whole number of pages.
    pub size: u64,
    pub align_pages: u64,
    pub domains: u64,
    pub flags: u64,
}

impl CreatePlan {
    /// Whether the BO goes to VRAM first.
    pub fn wants_vram(&self) -> bool {
        self.domains & u64::from(sys::AMDGPU_GEM_DOMAIN_VRAM) != 0
    }

    /// Whether a VRAM BO that does not fit may go to GTT instead: the
    /// domains allow it, or they are VRAM alone (amdgpu_gem_create_ioctl
    /// retries with GTT added).
    pub fn gtt_fallback(&self) -> bool {
        let vram = u64::from(sys::AMDGPU_GEM_DOMAIN_VRAM);
        self.domains & u64::from(sys::AMDGPU_GEM_DOMAIN_GTT) != 0 || self.domains == vram
    }
}

/// What GEM_CREATE, GEM_OP and GEM_METADATA keep of an object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BoInfo {
    /// `preferred_domains` (SET_PLACEMENT changes it).
    pub domains: u64,
    /// The BO's `AMDGPU_GEM_CREATE_*` flags.
    pub flags: u64,
    /// `tbo.page_alignment`, in pages.
    pub align_pages: u64,
    /// GEM_METADATA: tiling flags, metadata flags and bytes.
    pub tiling: u64,
    pub meta_flags: u64,
    pub metadata: Vec<u8>,
}

pub struct GemObj {
    pub kind: GemKind,
    /// Bytes (a whole number of pages for GEM_CREATE's).
    pub size: u64,
    info: Mutex<BoInfo>,
    /// Where a GEM_CREATE BO notes its memory when its last reference
    /// goes ([`GemObj::noting_release`]).
    released: Option<Released>,
}

/// The GEM_CREATE BOs whose last reference went (as the last
/// drm_gem_object_put frees one), for the device to free their memory:
/// it looks at these, not at every BO.
pub type Released = Arc<Mutex<Vec<Source>>>;

impl GemObj {
    pub fn new(kind: GemKind, size: u64, info: BoInfo) -> GemObj {
        GemObj {
            kind,
            size,
            info: Mutex::new(info),
            released: None,
        }
    }

    /// The object, noting its BO's memory in `released` when it goes.
    pub fn noting_release(mut self, released: Released) -> GemObj {
        self.released = Some(released);
        self
    }

    /// The memory `off` bytes into the object.
    fn span(&self, off: u64) -> Span {
        match &self.kind {
            GemKind::Dmabuf(d) => Span::Map(d.map.clone(), off),
            GemKind::Userptr { pid, addr } => Span::User(*pid, addr + off),
            GemKind::Bo { map, .. } => Span::Map(map.clone(), off),
        }
    }

    pub fn info(&self) -> MutexGuard<'_, BoInfo> {
        self.info.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The BO whose memory this is (GPU, render-memfd offset), for the
    /// objects of the render node's memory.
    pub fn source(&self) -> Option<Source> {
        match &self.kind {
            GemKind::Dmabuf(d) => Some(d.source),
            GemKind::Bo { source, .. } => Some(*source),
            GemKind::Userptr { .. } => None,
        }
    }

    /// Whether the object is an import of another GPU's BO
    /// (`import_attach`: amdgpu imports a dma-buf of its own device as
    /// the BO itself).
    fn foreign(&self, gpu: usize) -> bool {
        matches!(&self.kind, GemKind::Dmabuf(d) if d.source.gpu != gpu)
    }
}

impl Drop for GemObj {
    fn drop(&mut self) {
        if let (Some(r), GemKind::Bo { source, .. }) = (&self.released, &self.kind) {
            r.lock().unwrap_or_else(|e| e.into_inner()).push(*source);
        }
    }
}

/// One GEM_VA mapping: `[va, va+size)` shows the object from `offset`,
/// with the `AMDGPU_VM_PAGE_*` flags of its GEM_VA.
struct VaMap {
    handle: u32,
    obj: Arc<GemObj>,
    size: u64,
    offset: u64,
    flags: u32,
}

/// What PRIME_HANDLE_TO_FD hands out for an object.
pub enum Export {
    /// The dma-buf it was imported from.
    Dmabuf(Arc<Dmabuf>),
    /// A GEM_CREATE BO: its dma-buf is made (or found) by the registry.
    Bo {
        source: Source,
        size: u64,
        map: Arc<Mapping>,
    },
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
    /// The GPU's index in the profile.
    gpu: usize,
    /// By GEM handle (`object_idr`, from 1).
    objects: Objects,
    maps: VaMaps,
    /// By context id (`ctx_handles`, 1 to `AMDGPU_VM_MAX_NUM_CTX - 1`).
    ctxs: IdrMap<Ctx>,
    /// By BO list handle (`bo_list_handles`, from 1).
    lists: IdrMap<Vec<Arc<GemObj>>>,
}

/// A submission accepted under the lock: the fence it signals.
pub struct Submitted {
    pub ctx: u32,
    pub entity: (u32, u32),
    pub seq: u64,
}

/// One IB of a CS, as its chunk names it.
pub struct Ib {
    pub va: u64,
    pub bytes: u64,
    pub ip: u32,
    pub ring: u32,
}

/// The objects of a BO list, in its order.
pub type BoList = Vec<Arc<GemObj>>;

/// Whether `[addr, addr+size)` of process `pid` is mapped, and whether
/// all of it is anonymous memory (no file behind it).
fn user_pages(pid: u32, addr: u64, size: u64) -> R<(bool, bool)> {
    let vmas = super::svm::vmas(pid).map_err(|_| libc::EFAULT)?;
    let page = crate::device::uapi::PAGE;
    let (mut cur, end, mut anon) = (addr, addr + size, true);
    while cur < end {
        match vmas
            .iter()
            .find(|v| v.start * page <= cur && cur < v.end * page)
        {
            Some(v) => {
                anon &= v.anon;
                cur = v.end * page;
            }
            None => return Ok((false, anon)),
        }
    }
    Ok((true, anon))
}

impl RenderFile {
    /// A new open of GPU `gpu`'s render node.
    pub fn new(gpu: usize) -> RenderFile {
        RenderFile {
            gpu,
            objects: Objects::new(),
            maps: VaMaps::default(),
            ctxs: IdrMap::new(Idr::new(1, gem618::AMDGPU_VM_MAX_NUM_CTX - 1)),
            lists: IdrMap::new(Idr::from(1)),
        }
    }

    /// `obj` at the lowest free handle (ENOSPC: none below INT_MAX).
    fn add_object(&mut self, obj: Arc<GemObj>) -> R<u32> {
        self.objects.insert_lowest(obj).ok_or(libc::ENOSPC)
    }

    /// The object of `handle` (ENOENT: none).
    pub fn object(&self, handle: u32) -> R<&Arc<GemObj>> {
        self.objects.get(&handle).ok_or(libc::ENOENT)
    }

    /// GEM_CREATE's object (made by the caller in the GPU's memory):
    /// its handle.
    pub fn create(&mut self, obj: Arc<GemObj>) -> R<u32> {
        self.add_object(obj)
    }

    /// `[va, va+len)` as the file's VM shows it: `(va, len, memory)` of
    /// the mappings in it, in VA order (`vm` makes its `GpuRange`).
    pub fn spans(&self, va: u64, len: u64) -> Vec<(u64, u64, Option<Span>)> {
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
        spans
    }

    /// Whether the file holds a GEM handle of the BO whose memory is `map`
    /// (an import of its dma-buf): `drm_gem_handle_create` admits the
    /// file to the object's mmap offset.
    pub fn holds(&self, map: &Arc<crate::device::mem::Mapping>) -> bool {
        self.objects.shows(map)
    }

    /// PRIME_FD_TO_HANDLE of dma-buf `d` (resolved by the caller) that is
    /// not a GEM BO of this GPU (see [`Self::import_object`]).
    pub fn import(&mut self, d: Arc<Dmabuf>) -> R<u32> {
        if let Some(h) = self.objects.import_of(d.id) {
            return Ok(h);
        }
        let size = d.size;
        // amdgpu_dma_buf_create_obj: another device's BO is a GTT BO here.
        let domains = if d.source.gpu == self.gpu {
            d.source.domain
        } else {
            sys::AMDGPU_GEM_DOMAIN_GTT
        };
        let info = BoInfo {
            domains: domains.into(),
            ..Default::default()
        };
        self.add_object(Arc::new(GemObj::new(GemKind::Dmabuf(d), size, info)))
    }

    /// PRIME_FD_TO_HANDLE of a dma-buf of `obj`, a GEM BO of this GPU:
    /// the object itself (drm_gem_prime_fd_to_handle finds the file's own
    /// handle; amdgpu_gem_prime_import gives its own BO back).
    pub fn import_object(&mut self, obj: Arc<GemObj>) -> R<u32> {
        match self.objects.handle_of(&obj) {
            Some(h) => Ok(h),
            None => self.add_object(obj),
        }
    }

    /// PRIME_HANDLE_TO_FD of object `handle`: what to install.
    pub fn export(&self, handle: u32) -> R<Export> {
        let obj = self.object(handle)?;
        match &obj.kind {
            GemKind::Dmabuf(d) => Ok(Export::Dmabuf(d.clone())),
            // amdgpu_gem_prime_export refuses userptr BOs and per-VM BOs.
            GemKind::Userptr { .. } => Err(libc::EPERM),
            GemKind::Bo { .. }
                if obj.info().flags & u64::from(sys::AMDGPU_GEM_CREATE_VM_ALWAYS_VALID) != 0 =>
            {
                Err(libc::EPERM)
            }
            GemKind::Bo { source, map } => Ok(Export::Bo {
                source: *source,
                size: obj.size,
                map: map.clone(),
            }),
        }
    }

    /// GEM_USERPTR of `[addr, addr+size)` of process `pid` (arguments
    /// checked): with `validate`, the pages must be mapped (EFAULT), and
    /// with `anon_only` all anonymous (EPERM).  Returns the handle.
    pub fn userptr(
        &mut self,
        pid: u32,
        addr: u64,
        size: u64,
        validate: bool,
        anon_only: bool,
    ) -> R<u32> {
        if validate {
            let (mapped, anon) = user_pages(pid, addr, size)?;
            if anon_only && !anon {
                return Err(libc::EPERM);
            }
            if !mapped {
                return Err(libc::EFAULT);
            }
        }
        // amdgpu_gem_userptr_ioctl: a GTT BO.
        let info = BoInfo {
            domains: sys::AMDGPU_GEM_DOMAIN_GTT.into(),
            ..Default::default()
        };
        self.add_object(Arc::new(GemObj::new(
            GemKind::Userptr { pid, addr },
            size,
            info,
        )))
    }

    /// GEM_CLOSE: the handle goes, and with it the object's mappings in
    /// this file's VM (amdgpu_gem_object_close).  BO lists keep the
    /// object.
    pub fn close(&mut self, handle: u32) -> R<()> {
        self.objects.remove(handle).ok_or(libc::EINVAL)?;
        self.maps.remove_handle(handle);
        Ok(())
    }

    /// The size of object `handle` (ENOENT: no such handle).
    pub fn object_size(&self, handle: u32) -> R<u64> {
        Ok(self.objects.get(&handle).ok_or(libc::ENOENT)?.size)
    }

    /// The objects of `handles`, in order (ENOENT for an unknown one).
    pub fn objects(&self, handles: &[u32]) -> R<BoList> {
        handles
            .iter()
            .map(|h| self.objects.get(h).cloned().ok_or(libc::ENOENT))
            .collect()
    }

    /// Removes every mapping inside `[va, va+size)`, trimming those that
    /// cross its ends (amdgpu_vm_bo_clear_mappings): GEM_VA CLEAR.
    pub fn va_clear(&mut self, va: u64, size: u64) {
        let end = va + size;
        let hit: Vec<u64> = self
            .maps
            .iter()
            .filter(|(&s, m)| s < end && va < s + m.size)
            .map(|(&s, _)| s)
            .collect();
        for s in hit {
            let m = self.maps.remove(s).expect("listed");
            if s < va {
                self.maps.insert(
                    s,
                    VaMap {
                        handle: m.handle,
                        obj: m.obj.clone(),
                        size: va - s,
                        offset: m.offset,
                        flags: m.flags,
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
                        flags: m.flags,
                    },
                );
            }
        }
    }

    /// GEM_VA MAP (or, with `replace`, REPLACE) of object `handle` from
    /// `offset` at `[va, va+size)` with `flags` (arguments checked): a MAP
    /// must not overlap a mapping (EINVAL), a REPLACE clears what it
    /// covers.
    pub fn va_map(
        &mut self,
        handle: u32,
        (va, offset, size): (u64, u64, u64),
        flags: u32,
        replace: bool,
    ) -> R<()> {
        let obj = self.objects.get(&handle).ok_or(libc::ENOENT)?.clone();
        if !replace {
            let overlap = self
                .maps
                .range(..va + size)
                .next_back()
                .is_some_and(|(&s, m)| s + m.size > va);
            if overlap {
                return Err(libc::EINVAL);
            }
        } else {
            self.va_clear(va, size);
        }
        self.maps.insert(
            va,
            VaMap {
                handle,
                obj,
                size,
                offset,
                flags,
            },
        );
        Ok(())
    }

    /// GEM_VA UNMAP of the mapping of object `handle` at `start` (ENOENT:
    /// none there).
    pub fn va_unmap(&mut self, handle: u32, start: u64) -> R<()> {
        match self.maps.get(&start) {
            Some(m) if m.handle == handle => {
                self.maps.remove(start);
                Ok(())
            }
            _ => Err(libc::ENOENT),
        }
    }

    /// CTX ALLOC_CTX; `resets` is the GPU's reset count.  Returns the id,
    /// below `AMDGPU_VM_MAX_NUM_CTX` (ENOSPC past it, as the idr's).
    pub fn ctx_alloc(&mut self, resets: u64) -> R<u32> {
        let ctx = Ctx {
            entities: HashMap::new(),
            guilty: false,
            resets,
            resets_queried: resets,
            stable_pstate: 0,
        };
        self.ctxs.insert_lowest(ctx).ok_or(libc::ENOSPC)
    }

    /// CTX FREE_CTX (EINVAL: no such context).
    pub fn ctx_free(&mut self, id: u32) -> R<()> {
        self.ctxs.remove(id).ok_or(libc::EINVAL)?;
        Ok(())
    }

    /// CTX QUERY_STATE: whether the GPU was reset since the context was
    /// made or last asked (`resets`: the GPU's reset count now).
    pub fn ctx_reset_since_query(&mut self, id: u32, resets: u64) -> R<bool> {
        let c = self.ctxs.get_mut(id).ok_or(libc::EINVAL)?;
        let reset = c.resets_queried != resets;
        c.resets_queried = resets;
        Ok(reset)
    }

    /// CTX QUERY_STATE2: (the GPU was reset since the context was made,
    /// the context is guilty).
    pub fn ctx_state(&self, id: u32, resets: u64) -> R<(bool, bool)> {
        let c = self.ctxs.get(&id).ok_or(libc::EINVAL)?;
        Ok((c.resets != resets, c.guilty))
    }

    /// CTX GET_STABLE_PSTATE.
    pub fn ctx_stable_pstate(&self, id: u32) -> R<u32> {
        Ok(self.ctxs.get(&id).ok_or(libc::EINVAL)?.stable_pstate)
    }

    /// CTX SET_STABLE_PSTATE (flags checked).
    pub fn set_ctx_stable_pstate(&mut self, id: u32, flags: u32) -> R<()> {
        self.ctxs.get_mut(id).ok_or(libc::EINVAL)?.stable_pstate = flags;
        Ok(())
    }

    /// Whether context `id` exists (EINVAL: no).
    pub fn ctx_exists(&self, id: u32) -> R<()> {
        self.ctxs.get(&id).map(|_| ()).ok_or(libc::EINVAL)
    }

    /// Whether context `id` may submit: it exists (EINVAL) and is not
    /// guilty of a reset (ECANCELED).
    pub fn ctx_may_submit(&self, id: u32) -> R<()> {
        let c = self.ctxs.get(&id).ok_or(libc::EINVAL)?;
        if c.guilty {
            return Err(libc::ECANCELED);
        }
        Ok(())
    }

    /// BO_LIST CREATE of `handles`; returns the list's handle.
    pub fn list_create(&mut self, handles: &[u32]) -> R<u32> {
        let objs = self.objects(handles)?;
        self.lists.insert_lowest(objs).ok_or(libc::ENOSPC)
    }

    /// BO_LIST DESTROY (an unknown list is no error).
    pub fn list_destroy(&mut self, id: u32) {
        self.lists.remove(id);
    }

    /// BO_LIST UPDATE of list `id` to `handles`.
    pub fn list_update(&mut self, id: u32, handles: &[u32]) -> R<()> {
        let objs = self.objects(handles)?;
        let l = self.lists.get_mut(id).ok_or(libc::ENOENT)?;
        *l = objs;
        Ok(())
    }

    /// AMDGPU_CS after the chunks (amdgpu_cs_parser_init, pass 1 and 2,
    /// the BO list): context `ctx` (checked with [`Self::ctx_may_submit`])
    /// submits `ibs` with BO list `list_handle` or the chunk's list
    /// `in_cs` (not both).  Returns the fence of the job (whose IBs the
    /// caller decodes).
    pub fn submit(
        &mut self,
        ctx: u32,
        ibs: &[Ib],
        list_handle: u32,
        in_cs: Option<BoList>,
    ) -> R<Submitted> {
        let Some(first) = ibs.first() else {
            return Err(libc::EINVAL);
        };
        let entity = (first.ip, first.ring);
        let list = match (list_handle, in_cs) {
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
        for ib in ibs {
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
        }
        let c = self.ctxs.get_mut(ctx).ok_or(libc::EINVAL)?;
        let e = c.entities.entry(entity).or_default();
        e.next = e.next.max(1);
        let seq = e.next;
        e.next += 1;
        Ok(Submitted { ctx, entity, seq })
    }

    /// The job's fence failed with `errno` (a hang: the context is
    /// guilty).
    pub fn fail(&mut self, ctx: u32, entity: (u32, u32), seq: u64, errno: i32) {
        if let Some(c) = self.ctxs.get_mut(ctx) {
            c.guilty = true;
            let e = c.entities.entry(entity).or_default();
            e.errors.insert(seq, errno);
            let keep = e.next.saturating_sub(SCHED_JOBS);
            e.errors.retain(|&s, _| s >= keep);
        }
    }

    /// WAIT_CS of fence `seq` of `entity` (ip type, ring) of context
    /// `ctx`: `Ok(errno of the fence or 0)`; EINVAL for a fence not
    /// issued yet.
    pub fn fence(&self, ctx: u32, entity: (u32, u32), seq: u64) -> R<i32> {
        let c = self.ctxs.get(&ctx).ok_or(libc::EINVAL)?;
        let e = c.entities.get(&entity);
        let next = e.map_or(1, |e| e.next.max(1));
        if seq >= next {
            return Err(libc::EINVAL);
        }
        Ok(e.and_then(|e| e.errors.get(&seq).copied()).unwrap_or(0))
    }

    /// Marks context `ctx` guilty of a GPU reset (fault injection).
    pub fn make_guilty(&mut self, ctx: u32) {
        if let Some(c) = self.ctxs.get_mut(ctx) {
            c.guilty = true;
        }
    }

    /// GEM_MMAP of object `handle` (amdgpu_mode_dumb_mmap): its mmap
    /// offset of the render file.  EPERM for userptr and NO_CPU_ACCESS
    /// objects.  An import of another GPU's BO has no offset here (the
    /// kernel gives it one of its own GTT BO): not modelled, ENODEV.
    pub fn mmap_offset(&self, handle: u32) -> R<u64> {
        let obj = self.object(handle)?;
        if obj.info().flags & u64::from(sys::AMDGPU_GEM_CREATE_NO_CPU_ACCESS) != 0 {
            return Err(libc::EPERM);
        }
        match obj.source() {
            None => Err(libc::EPERM),
            Some(s) if s.gpu != self.gpu => {
                log::warn!(
                    "kfd-emu: GEM_MMAP of handle {handle}, an import of another GPU's BO: \
                     not modelled"
                );
                Err(libc::ENODEV)
            }
            Some(s) => Ok(s.offset),
        }
    }

    /// Whether the file holds a handle of the object of the render node's
    /// memory at `offset` (its mmap offset), and that object.
    pub fn object_at(&self, offset: u64) -> Option<&Arc<GemObj>> {
        self.objects.at_offset(self.gpu, offset)
    }

    /// GEM_OP GET_MAPPING_INFO: the file's VM mappings of object
    /// `handle`, by address.
    pub fn mappings_of(&self, handle: u32) -> R<Vec<gem618::drm_amdgpu_gem_vm_entry>> {
        self.object(handle)?;
        Ok(self
            .maps
            .of_handle(handle)
            .map(|(va, m)| gem618::drm_amdgpu_gem_vm_entry {
                addr: va,
                size: m.size,
                offset: m.offset,
                flags: m.flags.into(),
            })
            .collect())
    }

    /// GEM_OP SET_PLACEMENT of object `handle` to `value`'s domains: EINVAL
    /// for VRAM for an import of another GPU's BO, EPERM for userptr.
    /// Where the BO is does not change until it moves; the emulator never
    /// moves BOs.
    pub fn set_placement(&self, handle: u32, value: u64) -> R<()> {
        let obj = self.object(handle)?;
        let vram = u64::from(sys::AMDGPU_GEM_DOMAIN_VRAM);
        if obj.foreign(self.gpu) && value & vram != 0 {
            return Err(libc::EINVAL);
        }
        if matches!(obj.kind, GemKind::Userptr { .. }) {
            return Err(libc::EPERM);
        }
        let keep = vram | u64::from(sys::AMDGPU_GEM_DOMAIN_GTT | sys::AMDGPU_GEM_DOMAIN_CPU);
        obj.info().domains = value & keep;
        Ok(())
    }

    /// GEM_LIST_HANDLES: every handle of the file, in handle order.
    pub fn list_handles(&self) -> Vec<gem618::drm_amdgpu_gem_list_handles_entry> {
        self.objects
            .iter()
            .map(|(&h, o)| {
                let info = o.info();
                gem618::drm_amdgpu_gem_list_handles_entry {
                    gem_handle: h,
                    flags: if o.foreign(self.gpu) {
                        gem618::AMDGPU_GEM_LIST_HANDLES_FLAG_IS_IMPORT
                    } else {
                        0
                    },
                    size: o.size,
                    preferred_domains: info.domains,
                    alloc_flags: info.flags & gem618::AMDGPU_GEM_CREATE_SETTABLE_MASK,
                    alignment: info.align_pages,
                }
            })
            .collect()
    }

    /// GEM_CHANGE_HANDLE with Linux 6.18.0-6.18.35's semantics
    /// (drm_gem_change_handle_ioctl): `handle` becomes `new` (EINVAL above
    /// INT_MAX, ENOENT for no object, ENOSPC for a taken handle or 0, which
    /// the idr from 1 does not hold); the object's VM mappings and PRIME
    /// lookup follow it, and `handle` is free again.
    pub fn change_handle(&mut self, handle: u32, new: u32) -> R<()> {
        if new > i32::MAX as u32 {
            return Err(libc::EINVAL);
        }
        self.object(handle)?;
        if handle == new {
            return Ok(());
        }
        if !self.objects.rename(handle, new) {
            return Err(libc::ENOSPC);
        }
        self.maps.rename(handle, new);
        Ok(())
    }
}

/// `drm_amdgpu_gem_create_in` as GEM_OP GET_GEM_CREATE_INFO answers it.
pub fn create_info(obj: &GemObj) -> sys::drm_amdgpu_gem_create_in {
    let info = obj.info();
    sys::drm_amdgpu_gem_create_in {
        bo_size: obj.size,
        alignment: info.align_pages * crate::device::uapi::PAGE,
        domains: info.domains,
        domain_flags: info.flags,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::idr::tests::{naive_lowest, Rng};
    use super::*;
    use crate::device::dmabuf::{Purpose, Registry};
    use crate::device::mem::Memfd;

    /// What a render file's handles name, as a test keeps it beside the
    /// file: by handle, the index of the object (below [`IMPORTED`]) or of
    /// the dma-buf (from it) the test made.
    #[derive(Default)]
    struct Model(BTreeMap<u32, usize>);

    const IMPORTED: usize = 1 << 20;

    impl Model {
        /// The handle a new object gets: the lowest free from 1, by a walk.
        fn lowest(&self) -> u32 {
            let held: BTreeSet<u32> = self.0.keys().copied().collect();
            naive_lowest(&held, 1, i32::MAX as u32).unwrap()
        }

        /// The handle of `what`: the one held, else a new one.
        fn handle_of(&mut self, what: usize) -> u32 {
            match self.0.iter().find(|(_, &w)| w == what) {
                Some((&h, _)) => h,
                None => {
                    let h = self.lowest();
                    self.0.insert(h, what);
                    h
                }
            }
        }

        /// GEM_CHANGE_HANDLE's answer, and the rename when it is one.
        fn change_handle(&mut self, handle: u32, new: u32) -> R<()> {
            let what = *self.0.get(&handle).ok_or(libc::ENOENT)?;
            if handle != new {
                if new == 0 || self.0.contains_key(&new) {
                    return Err(libc::ENOSPC);
                }
                self.0.remove(&handle);
                self.0.insert(new, what);
            }
            Ok(())
        }
    }

    /// Under a pseudo-random sequence of GEM_CREATE, PRIME imports (of
    /// another GPU's BOs, new or imported before, and of the file's own
    /// BOs), GEM_CLOSE, GEM_CHANGE_HANDLE and GEM_VA MAP and CLEAR, every
    /// new handle is the lowest free one a walk of the file's handles
    /// finds, every handle held names what it named, closes and renames
    /// answer as the handles held say, and each handle's VA mappings are
    /// those of its object, as a walk of every mapping finds them.
    #[test]
    fn handles_stay_lowest_free_under_any_sequence() {
        let mem = Memfd::new("t", 1 << 20).unwrap();
        let map = Arc::new(mem.map(0, 4096).unwrap());
        let unshown = Arc::new(mem.map(4096, 4096).unwrap());
        let reg = Registry::default();
        let (mut f, mut model, mut rng) = (RenderFile::new(0), Model::default(), Rng(0x5eed));
        let (mut bos, mut bufs) = (Vec::new(), Vec::new());
        for step in 0..4000 {
            let top = model.0.keys().next_back().map_or(2, |&h| h + 2);
            let (h, new) = (rng.below(top), rng.below(top));
            let source = |gpu, n: usize| Source {
                gpu,
                offset: n as u64 * 4096,
                domain: sys::AMDGPU_GEM_DOMAIN_GTT,
            };
            match rng.below(12) {
                0..=2 => {
                    let kind = GemKind::Bo {
                        source: source(0, bos.len()),
                        map: map.clone(),
                    };
                    bos.push(Arc::new(GemObj::new(kind, 4096, BoInfo::default())));
                    let want = model.handle_of(bos.len() - 1);
                    assert_eq!(f.create(bos[bos.len() - 1].clone()), Ok(want), "{step}");
                }
                3 => {
                    let i = rng.below(bos.len() as u32 + 1) as usize;
                    let Some(obj) = bos.get(i) else { continue };
                    assert_eq!(
                        f.import_object(obj.clone()),
                        Ok(model.handle_of(i)),
                        "{step}"
                    );
                }
                4 | 5 => {
                    let j = rng.below(bufs.len() as u32 + 2) as usize;
                    if j >= bufs.len() {
                        let d = reg.export(source(1, bufs.len()), 4096, &map, Purpose::Checkpoint);
                        bufs.push(d.unwrap());
                    }
                    let j = j.min(bufs.len() - 1);
                    let want = model.handle_of(IMPORTED + j);
                    assert_eq!(f.import(bufs[j].clone()), Ok(want), "{step}");
                }
                6 | 7 => {
                    let want = model.0.remove(&h).map(|_| ()).ok_or(libc::EINVAL);
                    assert_eq!(f.close(h), want, "{step}: close {h}");
                }
                8 | 9 => {
                    let want = model.change_handle(h, new);
                    assert_eq!(f.change_handle(h, new), want, "{step}: {h} to {new}");
                }
                10 => {
                    // Pages of 64 KiB of VA, some mapped over and trimmed
                    // by the CLEARs below.
                    let va = u64::from(rng.below(256)) << 16;
                    let r = f.va_map(h, (va, 0, 4096), 0, true);
                    assert_eq!(r.is_ok(), model.0.contains_key(&h), "{step}: map {h}");
                }
                _ => {
                    let va = u64::from(rng.below(256)) << 16;
                    f.va_clear(va + 2048, u64::from(rng.below(4) + 1) << 16);
                }
            }
            assert_named_as_modelled(&f, &model, &bos, &bufs);
            assert_mappings_follow_their_objects(&f);
            let n = bos.len().max(bufs.len()) as u32 + 1;
            let offsets = (0..4).map(|_| u64::from(rng.below(n)) * 4096);
            assert_lookups_as_walked(&f, offsets, &[&map, &unshown]);
        }
    }

    /// Every handle of `f` names what `model` says, and no other is held.
    fn assert_named_as_modelled(
        f: &RenderFile,
        model: &Model,
        bos: &[Arc<GemObj>],
        bufs: &[Arc<Dmabuf>],
    ) {
        assert!(f.objects.keys().eq(model.0.keys()));
        for (h, &what) in &model.0 {
            let o = f.object(*h).unwrap();
            match what.checked_sub(IMPORTED) {
                None => assert!(Arc::ptr_eq(o, &bos[what])),
                Some(j) => {
                    assert!(matches!(&o.kind, GemKind::Dmabuf(d) if Arc::ptr_eq(d, &bufs[j])))
                }
            }
        }
    }

    /// The object [`RenderFile::object_at`] must find at `offset`, by a
    /// walk of the file's objects in handle order.
    fn walk_object_at(f: &RenderFile, offset: u64) -> Option<&Arc<GemObj>> {
        f.objects.values().find(|o| {
            o.source()
                .is_some_and(|s| s.gpu == f.gpu && s.offset == offset)
        })
    }

    /// Whether [`RenderFile::holds`] must find `map`, by a walk.
    fn walk_holds(f: &RenderFile, map: &Arc<Mapping>) -> bool {
        f.objects.values().any(|o| match &o.kind {
            GemKind::Dmabuf(d) => Arc::ptr_eq(&d.map, map),
            GemKind::Bo { map: m, .. } => Arc::ptr_eq(m, map),
            GemKind::Userptr { .. } => false,
        })
    }

    /// The lookups of a CPU mmap find through the file's indexes what a
    /// walk of its objects finds: the object at each of `offsets`, and
    /// whether an object shows each of `maps`.
    fn assert_lookups_as_walked(
        f: &RenderFile,
        offsets: impl IntoIterator<Item = u64>,
        maps: &[&Arc<Mapping>],
    ) {
        for offset in offsets {
            let (found, walked) = (f.object_at(offset), walk_object_at(f, offset));
            let same = match (found, walked) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (a, b) => a.is_none() && b.is_none(),
            };
            assert!(same, "offset {offset:#x}");
        }
        for (i, map) in maps.iter().enumerate() {
            assert_eq!(f.holds(map), walk_holds(f, map), "mapping {i}");
        }
    }

    /// Eight BOs' worth of GPU 0's render-node memory, each on a mapping
    /// and at an mmap offset of its own (and a ninth offset no BO has),
    /// for the tests of a CPU mmap's lookups.
    struct MmapBos {
        _mem: Memfd,
        maps: Vec<Arc<Mapping>>,
    }

    impl MmapBos {
        fn new() -> MmapBos {
            let mem = Memfd::new("t", 1 << 20).unwrap();
            let maps = (0..8)
                .map(|i| Arc::new(mem.map(i * 4096, 4096).unwrap()))
                .collect();
            MmapBos { _mem: mem, maps }
        }

        /// BO `i`'s memory as GPU `gpu`'s.
        fn source(gpu: usize, i: usize) -> Source {
            Source {
                gpu,
                offset: 0x10_0000 + i as u64 * 4096,
                domain: sys::AMDGPU_GEM_DOMAIN_VRAM,
            }
        }

        /// A new GEM_CREATE object of BO `i`.
        fn bo(&self, i: usize) -> Arc<GemObj> {
            let kind = GemKind::Bo {
                source: Self::source(0, i),
                map: self.maps[i].clone(),
            };
            Arc::new(GemObj::new(kind, 4096, BoInfo::default()))
        }

        /// A dma-buf of BO `i`'s memory as GPU `gpu`'s, from `reg`.
        fn dmabuf(&self, reg: &Registry, gpu: usize, i: usize) -> Arc<Dmabuf> {
            let s = Self::source(gpu, i);
            reg.export(s, 4096, &self.maps[i], Purpose::Checkpoint)
                .unwrap()
        }

        /// `f` finds `want` at BO `i`'s offset and shows its memory; with
        /// `None`, neither.  Then both lookups agree with a walk at every
        /// offset and for every mapping.
        fn assert_found(&self, f: &RenderFile, i: usize, want: Option<&Arc<GemObj>>) {
            let found = f.object_at(Self::source(0, i).offset);
            match want {
                Some(o) => assert!(found.is_some_and(|x| Arc::ptr_eq(x, o)), "BO {i}"),
                None => assert!(found.is_none(), "BO {i}"),
            }
            assert_eq!(f.holds(&self.maps[i]), want.is_some(), "BO {i}");
            let offsets = (0..9).map(|i| Self::source(0, i).offset);
            assert_lookups_as_walked(f, offsets, &self.maps.iter().collect::<Vec<_>>());
        }
    }

    /// A CPU mmap's lookups (the object at an mmap offset, whether an
    /// object shows a BO's memory) follow objects made, mapped into the
    /// VM, closed, made again at the same offsets on the same memory (new
    /// objects, found in place of the old) and renamed.
    #[test]
    fn mmap_lookups_follow_objects_made_closed_and_made_again() {
        let bos = MmapBos::new();
        let mut f = RenderFile::new(0);
        let first: Vec<Arc<GemObj>> = (0..6).map(|i| bos.bo(i)).collect();
        for (i, o) in first.iter().enumerate() {
            let h = i as u32 + 1;
            assert_eq!(f.create(o.clone()), Ok(h));
            f.va_map(h, (i as u64 * 0x10000, 0, 4096), 0, false)
                .unwrap();
        }
        // A userptr object shows no render-node memory.
        assert_eq!(f.userptr(1, 0x7000_0000, 4096, false, false), Ok(7));
        for (i, o) in first.iter().enumerate() {
            bos.assert_found(&f, i, Some(o));
        }
        bos.assert_found(&f, 6, None);

        for h in [2, 4, 6] {
            f.close(h).unwrap();
        }
        for i in [1, 3, 5] {
            bos.assert_found(&f, i, None);
        }
        bos.assert_found(&f, 2, Some(&first[2]));

        let again: Vec<Arc<GemObj>> = [1, 3, 5].into_iter().map(|i| bos.bo(i)).collect();
        for (o, (i, h)) in again.iter().zip([(1, 2), (3, 4), (5, 6)]) {
            assert_eq!(f.create(o.clone()), Ok(h));
            bos.assert_found(&f, i, Some(o));
        }

        f.change_handle(1, 100).unwrap();
        bos.assert_found(&f, 0, Some(&first[0]));
        f.close(100).unwrap();
        bos.assert_found(&f, 0, None);
    }

    /// Of two objects on one BO (the BO, and an import of a dma-buf of
    /// it), the lowest handle's is found at its offset; another GPU's
    /// import at the same offset shows its memory but is not found there;
    /// once every object is closed, nothing is found and no index entry
    /// is left.
    #[test]
    fn mmap_lookups_find_the_lowest_handle_and_only_this_gpu() {
        let (bos, reg) = (MmapBos::new(), Registry::default());
        let mut f = RenderFile::new(0);
        let bo = bos.bo(0);
        assert_eq!(f.create(bos.bo(1)), Ok(1));
        assert_eq!(f.create(bo.clone()), Ok(2));
        f.close(1).unwrap();
        assert_eq!(f.import(bos.dmabuf(&reg, 0, 0)), Ok(1));
        let import = f.object(1).unwrap().clone();
        bos.assert_found(&f, 0, Some(&import));
        f.close(1).unwrap();
        bos.assert_found(&f, 0, Some(&bo));

        assert_eq!(f.import(bos.dmabuf(&reg, 1, 6)), Ok(1));
        assert!(f.object_at(MmapBos::source(0, 6).offset).is_none());
        assert!(f.holds(&bos.maps[6]));
        let offsets = (0..9).map(|i| MmapBos::source(0, i).offset);
        assert_lookups_as_walked(&f, offsets, &bos.maps.iter().collect::<Vec<_>>());

        for h in [1, 2] {
            f.close(h).unwrap();
        }
        assert!(f.objects.is_empty());
        for i in 0..8 {
            bos.assert_found(&f, i, None);
        }
        assert!(f.objects.offsets_and_memories_unindexed());
    }

    /// Every VA mapping's handle is held and names the mapping's object,
    /// and GET_MAPPING_INFO of each handle lists what a walk of every
    /// mapping finds of its object.
    fn assert_mappings_follow_their_objects(f: &RenderFile) {
        for (va, m) in f.maps.iter() {
            let o = f.object(m.handle);
            assert!(o.is_ok_and(|o| Arc::ptr_eq(o, &m.obj)), "{va:#x}");
        }
        for (&h, o) in f.objects.iter() {
            let walk: Vec<(u64, u64, u64)> = f
                .maps
                .iter()
                .filter(|(_, m)| Arc::ptr_eq(&m.obj, o))
                .map(|(&va, m)| (va, m.size, m.offset))
                .collect();
            let listed: Vec<(u64, u64, u64)> = f
                .mappings_of(h)
                .unwrap()
                .iter()
                .map(|e| (e.addr, e.size, e.offset))
                .collect();
            assert_eq!(listed, walk, "handle {h}");
        }
    }

    /// A file holding a GEM handle of a BO (a PRIME import of its dma-buf)
    /// is admitted to the BO's mmap offset; closing the handle ends that.
    #[test]
    fn an_import_admits_the_file_to_that_bo_only() {
        let mem = Memfd::new("t", 1 << 20).unwrap();
        let map = Arc::new(mem.map(0, 8192).unwrap());
        let other = Arc::new(mem.map(8192, 8192).unwrap());
        let src = crate::device::dmabuf::Source {
            gpu: 0,
            offset: 0,
            domain: sys::AMDGPU_GEM_DOMAIN_VRAM,
        };
        let d = Registry::default()
            .export(src, 8192, &map, Purpose::Checkpoint)
            .unwrap();
        let mut f = RenderFile::new(0);
        assert!(!f.holds(&map));
        let h = f.import(d).unwrap();
        assert!(f.holds(&map) && !f.holds(&other));
        f.close(h).unwrap();
        assert!(!f.holds(&map));
    }
}
