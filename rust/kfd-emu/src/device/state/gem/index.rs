//! A render file's GEM objects and VM mappings, each with the index its
//! lookups by object and by handle need, kept in step as they change:
//! PRIME's lookup of the file's handle of an object (or of a dma-buf it
//! imported), a CPU mmap's of the object at an mmap offset and of one
//! whose memory a KFD BO's mapping is, and GEM_CLOSE's and
//! GEM_CHANGE_HANDLE's of a handle's mappings, without a walk of every
//! handle or mapping.  A file holds an object under one handle at most
//! (PRIME_FD_TO_HANDLE gives the handle it has), so the indexes by object
//! and by dma-buf name one handle; several objects may show the same
//! memory (imports of the same BO through dma-bufs of their own), so
//! those by mmap offset and by memory name a set of handles.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Deref;
use std::sync::Arc;

use super::{GemKind, GemObj, VaMap};
use crate::device::mem::Mapping;
use crate::device::state::idr::{Idr, IdrMap};

/// The key of an object the file holds: its address, unique while the
/// file's `Arc` keeps it alive.
fn key(obj: &Arc<GemObj>) -> usize {
    Arc::as_ptr(obj) as usize
}

/// The id of the dma-buf `obj` imports, if it is an import.
fn dmabuf_id(obj: &GemObj) -> Option<(u64, u64)> {
    match &obj.kind {
        GemKind::Dmabuf(d) => Some(d.id),
        _ => None,
    }
}

/// The key of the memory mapping `map`: its address, unique while an
/// object the file holds keeps it alive.
fn mapping_key(map: &Arc<Mapping>) -> usize {
    Arc::as_ptr(map) as usize
}

/// The mapping of the memory `obj` shows, for a BO or an import.
fn mapping_of(obj: &GemObj) -> Option<&Arc<Mapping>> {
    match &obj.kind {
        GemKind::Dmabuf(d) => Some(&d.map),
        GemKind::Bo { map, .. } => Some(map),
        GemKind::Userptr { .. } => None,
    }
}

/// `handle` out of the set of `key`, and the set out once empty.
fn unlink<K: Ord>(sets: &mut BTreeMap<K, BTreeSet<u32>>, key: K, handle: u32) {
    if let Some(handles) = sets.get_mut(&key) {
        handles.remove(&handle);
        if handles.is_empty() {
            sets.remove(&key);
        }
    }
}

/// The objects by GEM handle (`object_idr`, from 1); reads as the
/// [`IdrMap`].
pub(super) struct Objects {
    idr: IdrMap<Arc<GemObj>>,
    /// By [`key`].
    by_obj: HashMap<usize, u32>,
    /// The imports, by dma-buf id.
    by_dmabuf: HashMap<(u64, u64), u32>,
    /// The objects of the render nodes' memory, by (GPU, mmap offset).
    by_offset: BTreeMap<(usize, u64), BTreeSet<u32>>,
    /// The BOs and imports, by [`mapping_key`] of their memory.
    by_mapping: BTreeMap<usize, BTreeSet<u32>>,
}

impl Objects {
    pub(super) fn new() -> Objects {
        Objects {
            idr: IdrMap::new(Idr::from(1)),
            by_obj: HashMap::new(),
            by_dmabuf: HashMap::new(),
            by_offset: BTreeMap::new(),
            by_mapping: BTreeMap::new(),
        }
    }

    /// The object of `handle` into every index.
    fn index(&mut self, handle: u32) {
        let obj = &self.idr[&handle];
        self.by_obj.insert(key(obj), handle);
        if let Some(id) = dmabuf_id(obj) {
            self.by_dmabuf.insert(id, handle);
        }
        if let Some(s) = obj.source() {
            let at = self.by_offset.entry((s.gpu, s.offset)).or_default();
            at.insert(handle);
        }
        if let Some(map) = mapping_of(obj) {
            let of = self.by_mapping.entry(mapping_key(map)).or_default();
            of.insert(handle);
        }
    }

    /// `obj`, held as `handle` until now, out of every index.
    fn unindex(&mut self, handle: u32, obj: &Arc<GemObj>) {
        self.by_obj.remove(&key(obj));
        if let Some(id) = dmabuf_id(obj) {
            self.by_dmabuf.remove(&id);
        }
        if let Some(s) = obj.source() {
            unlink(&mut self.by_offset, (s.gpu, s.offset), handle);
        }
        if let Some(map) = mapping_of(obj) {
            unlink(&mut self.by_mapping, mapping_key(map), handle);
        }
    }

    /// `obj` at the lowest free handle, which it returns (None: none).
    pub(super) fn insert_lowest(&mut self, obj: Arc<GemObj>) -> Option<u32> {
        let h = self.idr.insert_lowest(obj)?;
        self.index(h);
        Some(h)
    }

    /// The object of `handle` goes, and the handle is free again.
    pub(super) fn remove(&mut self, handle: u32) -> Option<Arc<GemObj>> {
        let obj = self.idr.remove(handle)?;
        self.unindex(handle, &obj);
        Some(obj)
    }

    /// The object of `old` moves to handle `new` (see [`IdrMap::rename`]).
    pub(super) fn rename(&mut self, old: u32, new: u32) -> bool {
        if !self.idr.rename(old, new) {
            return false;
        }
        let obj = self.idr[&new].clone();
        self.unindex(old, &obj);
        self.index(new);
        true
    }

    /// The handle of `obj`, if the file holds it.
    pub(super) fn handle_of(&self, obj: &Arc<GemObj>) -> Option<u32> {
        self.by_obj.get(&key(obj)).copied()
    }

    /// The handle of the file's import of dma-buf `id`, if it has one.
    pub(super) fn import_of(&self, id: (u64, u64)) -> Option<u32> {
        self.by_dmabuf.get(&id).copied()
    }

    /// The object of GPU `gpu`'s render-node memory at mmap `offset`: of
    /// several, the one of the lowest handle.
    pub(super) fn at_offset(&self, gpu: usize, offset: u64) -> Option<&Arc<GemObj>> {
        let handle = self.by_offset.get(&(gpu, offset))?.first()?;
        self.idr.get(handle)
    }

    /// Whether an object held shows the memory of `map`.
    pub(super) fn shows(&self, map: &Arc<Mapping>) -> bool {
        self.by_mapping.contains_key(&mapping_key(map))
    }

    /// Whether the indexes by mmap offset and by memory hold nothing (for
    /// a test that every object closed left none behind).
    #[cfg(test)]
    pub(super) fn offsets_and_memories_unindexed(&self) -> bool {
        self.by_offset.is_empty() && self.by_mapping.is_empty()
    }
}

impl Deref for Objects {
    type Target = IdrMap<Arc<GemObj>>;

    fn deref(&self) -> &IdrMap<Arc<GemObj>> {
        &self.idr
    }
}

/// The file's VM mappings by start address (they do not overlap), and
/// each handle's starts; reads as the map by address.
#[derive(Default)]
pub(super) struct VaMaps {
    by_va: BTreeMap<u64, VaMap>,
    by_handle: HashMap<u32, BTreeSet<u64>>,
}

impl VaMaps {
    /// `m` at `va` (in place of one that started there).
    pub(super) fn insert(&mut self, va: u64, m: VaMap) {
        self.remove(va);
        self.by_handle.entry(m.handle).or_default().insert(va);
        self.by_va.insert(va, m);
    }

    /// The mapping at `va` goes.
    pub(super) fn remove(&mut self, va: u64) -> Option<VaMap> {
        let m = self.by_va.remove(&va)?;
        self.unlink(m.handle, va);
        Some(m)
    }

    fn unlink(&mut self, handle: u32, va: u64) {
        if let Some(vas) = self.by_handle.get_mut(&handle) {
            vas.remove(&va);
            if vas.is_empty() {
                self.by_handle.remove(&handle);
            }
        }
    }

    /// The starts of `handle`'s mappings, in address order.
    pub(super) fn of_handle(&self, handle: u32) -> impl Iterator<Item = (u64, &VaMap)> + '_ {
        self.by_handle
            .get(&handle)
            .into_iter()
            .flatten()
            .map(|va| (*va, &self.by_va[va]))
    }

    /// Every mapping of `handle` goes (GEM_CLOSE).
    pub(super) fn remove_handle(&mut self, handle: u32) {
        for va in self.by_handle.remove(&handle).unwrap_or_default() {
            self.by_va.remove(&va);
        }
    }

    /// `handle`'s mappings become `new`'s (GEM_CHANGE_HANDLE; `new` has
    /// none).
    pub(super) fn rename(&mut self, handle: u32, new: u32) {
        let Some(vas) = self.by_handle.remove(&handle) else {
            return;
        };
        for va in &vas {
            if let Some(m) = self.by_va.get_mut(va) {
                m.handle = new;
            }
        }
        self.by_handle.entry(new).or_default().extend(vas);
    }
}

impl Deref for VaMaps {
    type Target = BTreeMap<u64, VaMap>;

    fn deref(&self) -> &BTreeMap<u64, VaMap> {
        &self.by_va
    }
}
