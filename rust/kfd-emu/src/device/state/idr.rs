//! Ids handed out as the kernel's idr hands them out
//! (`idr_alloc(idr, ptr, start, end)`): the lowest free id of the range,
//! a freed id given again, or a given id taken when free
//! (`idr_alloc(idr, ptr, id, id + 1)`).  A render file's GEM handles,
//! contexts and BO lists (from 1) and a KFD process device's BO ids (from
//! 0) are such ids.  The free ids are kept as ranges, so that handing one
//! out, taking one and freeing one cost a search among the ranges, not a
//! walk of the ids taken.  [`IdrMap`] keeps a map by id with its idr, so
//! that the two cannot fall out of step.

use std::collections::BTreeMap;
use std::ops::Deref;

/// The free ids of one idr.
#[derive(Clone, Debug)]
pub struct Idr {
    /// The ids of the idr: `first..=last`.
    first: u32,
    last: u32,
    /// Free ids: first id of a range to its last, ranges apart (neither
    /// overlapping nor adjacent).
    free: BTreeMap<u32, u32>,
}

impl Idr {
    /// An idr of ids `first..=last`, all free.
    pub fn new(first: u32, last: u32) -> Idr {
        let mut free = BTreeMap::new();
        if first <= last {
            free.insert(first, last);
        }
        Idr { first, last, free }
    }

    /// `idr_alloc(idr, ptr, first, 0)`'s ids: `first` to INT_MAX.
    pub fn from(first: u32) -> Idr {
        Idr::new(first, i32::MAX as u32)
    }

    /// The lowest free id (None: none is, the idr's ENOSPC).
    pub fn lowest(&self) -> Option<u32> {
        self.free.keys().next().copied()
    }

    /// Takes the lowest free id (None: none is free).
    pub fn alloc(&mut self) -> Option<u32> {
        let id = self.lowest()?;
        self.take(id).then_some(id)
    }

    /// Takes `id`: false when it is taken or not an id of the idr.
    pub fn take(&mut self, id: u32) -> bool {
        let Some((&a, &b)) = self.free.range(..=id).next_back() else {
            return false;
        };
        if id > b {
            return false;
        }
        self.free.remove(&a);
        if a < id {
            self.free.insert(a, id - 1);
        }
        if id < b {
            self.free.insert(id + 1, b);
        }
        true
    }

    /// Frees `id`: false when it is free or not an id of the idr.
    pub fn free(&mut self, id: u32) -> bool {
        if id < self.first || id > self.last {
            return false;
        }
        let below = self.free.range(..=id).next_back().map(|(&a, &b)| (a, b));
        if below.is_some_and(|(_, b)| id <= b) {
            return false;
        }
        let start = match below {
            Some((a, b)) if b + 1 == id => a,
            _ => id,
        };
        let end = match id.checked_add(1).and_then(|n| self.free.remove(&n)) {
            Some(b) => b,
            None => id,
        };
        self.free.insert(start, end);
        true
    }
}

/// What the ids of an idr name, with the idr: ids are taken and freed
/// only with their entries, and the map reads as a `BTreeMap`.
pub struct IdrMap<T> {
    map: BTreeMap<u32, T>,
    idr: Idr,
}

impl<T> IdrMap<T> {
    /// An empty map of `idr`'s ids (all free).
    pub fn new(idr: Idr) -> IdrMap<T> {
        IdrMap {
            map: BTreeMap::new(),
            idr,
        }
    }

    /// `v` at the lowest free id, which it returns (None: none is free).
    pub fn insert_lowest(&mut self, v: T) -> Option<u32> {
        let id = self.idr.alloc()?;
        self.map.insert(id, v);
        Some(id)
    }

    /// The entry of `id` goes, and `id` is free again.
    pub fn remove(&mut self, id: u32) -> Option<T> {
        let v = self.map.remove(&id)?;
        self.idr.free(id);
        Some(v)
    }

    /// The entry of `old` moves to `new`, which must be free (false: it is
    /// taken or not an id of the idr, or `old` has no entry).
    pub fn rename(&mut self, old: u32, new: u32) -> bool {
        if !self.map.contains_key(&old) || !self.idr.take(new) {
            return false;
        }
        let v = self.remove(old).expect("looked up");
        self.map.insert(new, v);
        true
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        self.map.get_mut(&id)
    }
}

impl<T> Deref for IdrMap<T> {
    type Target = BTreeMap<u32, T>;

    fn deref(&self) -> &BTreeMap<u32, T> {
        &self.map
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The lowest id of `first..=last` not in `taken`, by a walk.
    pub(crate) fn naive_lowest(taken: &BTreeSet<u32>, first: u32, last: u32) -> Option<u32> {
        (first..=last).find(|i| !taken.contains(i))
    }

    /// A xorshift generator: the same sequence on every run.
    pub(crate) struct Rng(pub u64);

    impl Rng {
        /// The next number below `n`.
        pub(crate) fn below(&mut self, n: u32) -> u32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % u64::from(n)) as u32
        }
    }

    /// Under a long pseudo-random sequence of allocations, takes of given
    /// ids (free, taken, outside the range) and frees, the idr hands out
    /// what a walk for the lowest free id finds, and refuses what the walk
    /// says is taken or outside.
    #[test]
    fn hands_out_the_lowest_free_id_as_a_walk_finds_it() {
        for (first, last) in [(0, 200), (1, 200), (1, 63)] {
            let (mut idr, mut taken) = (Idr::new(first, last), BTreeSet::new());
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ u64::from(first));
            for step in 0..20_000 {
                let id = rng.below(last + 8);
                match rng.below(4) {
                    0 | 1 => {
                        let want = naive_lowest(&taken, first, last);
                        assert_eq!(idr.alloc(), want, "step {step}");
                        taken.extend(want);
                    }
                    2 => {
                        let want = (first..=last).contains(&id) && !taken.contains(&id);
                        assert_eq!(idr.take(id), want, "step {step}: take {id}");
                        if want {
                            taken.insert(id);
                        }
                    }
                    _ => assert_eq!(idr.free(id), taken.remove(&id), "step {step}: free {id}"),
                }
                assert_eq!(idr.lowest(), naive_lowest(&taken, first, last));
            }
        }
    }

    /// The ends of the range: INT_MAX is the last id of an unbounded idr,
    /// and an idr taken whole has none to give.
    #[test]
    fn ends_of_the_range() {
        let mut idr = Idr::from(1);
        assert!(idr.take(i32::MAX as u32));
        assert!(!idr.take(i32::MAX as u32 + 1), "above INT_MAX");
        assert!(!idr.take(0), "below the first id");
        assert_eq!(idr.alloc(), Some(1));
        let mut small = Idr::new(0, 1);
        assert_eq!(
            (small.alloc(), small.alloc(), small.alloc()),
            (Some(0), Some(1), None)
        );
        assert!(small.free(0));
        assert!(!small.free(0), "freed twice");
        assert_eq!(small.alloc(), Some(0));
    }

    /// An IdrMap's ids come and go with its entries: a removed entry's id
    /// and a renamed entry's old id are given again, a rename to a taken
    /// id or to none of the idr's is refused and changes nothing.
    #[test]
    fn a_map_keeps_its_idr_in_step() {
        let mut m = IdrMap::new(Idr::from(1));
        let ids: Vec<_> = "abcd"
            .chars()
            .map(|c| m.insert_lowest(c).unwrap())
            .collect();
        assert_eq!(ids, [1, 2, 3, 4]);
        assert_eq!(m.remove(2), Some('b'));
        assert_eq!(m.remove(2), None);
        assert!(!m.rename(3, 4), "taken");
        assert!(!m.rename(3, 0), "not an id of the idr");
        assert!(!m.rename(2, 7), "no entry");
        assert!(m.rename(3, 9));
        assert_eq!(m.keys().copied().collect::<Vec<_>>(), [1, 4, 9]);
        assert_eq!(m.insert_lowest('e'), Some(2));
        assert_eq!(m.insert_lowest('f'), Some(3), "the renamed entry's old id");
        assert_eq!(m.insert_lowest('g'), Some(5));
        *m.get_mut(9).unwrap() = 'C';
        assert_eq!(m[&9], 'C');
    }
}
