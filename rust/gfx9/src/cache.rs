//! A direct-mapped cache of decoded instructions keyed by code address.
//!
//! Sized once; a lookup or fill never allocates. Colliding addresses evict each other, so a
//! kernel larger than the cache decodes some instructions again, never wrongly: every entry
//! carries its full address. Code in memory can change (ROCr uploads code objects, the CP's
//! cache invalidation after it): the owner calls [`ICache::invalidate`] where the hardware
//! invalidates its instruction cache.

/// Decoded values of type `T` by code address.
#[derive(Clone, Debug)]
pub struct ICache<T> {
    slots: Vec<Option<(u64, T)>>,
    mask: usize,
    /// Lookups that missed (for benches and statistics).
    pub misses: u64,
}

impl<T: Copy> ICache<T> {
    /// A cache of `2^bits` entries.
    pub fn new(bits: u32) -> ICache<T> {
        let n = 1usize << bits;
        ICache {
            slots: vec![None; n],
            mask: n - 1,
            misses: 0,
        }
    }

    fn slot(&self, addr: u64) -> usize {
        (addr >> 2) as usize & self.mask
    }

    /// The entry for `addr`, or the result of `fill(addr)` stored for next time.
    pub fn get_or_fill<E>(
        &mut self,
        addr: u64,
        fill: impl FnOnce(u64) -> Result<T, E>,
    ) -> Result<&T, E> {
        let s = self.slot(addr);
        let slot = &mut self.slots[s];
        if !matches!(slot, Some((a, _)) if *a == addr) {
            self.misses += 1;
            *slot = None;
        }
        let (_, v) = match slot {
            Some(entry) => entry,
            None => slot.insert((addr, fill(addr)?)),
        };
        Ok(v)
    }

    /// Forgets every entry.
    pub fn invalidate(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
    }
}
