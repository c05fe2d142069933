//! The storage of a wave's vector register file (VGPRs or AccVGPRs): rows of 64 lanes that
//! read as zero until written, with their memory recycled per thread.
//!
//! A wave's two files are 2 × 272 rows of 256 bytes. Allocating and zeroing them for every
//! wave cost more than running a short kernel's wave (saxpy's waves retire ~30 instructions).
//! A file is therefore allocated at its first write, remembers how many rows were written,
//! and on drop zeroes only those and goes back to a small per-thread pool for the next wave.

use std::cell::RefCell;

/// Lanes of a wave.
pub const LANES: usize = 64;

/// The rows of one file.
pub(crate) type Rows = Box<[[u32; LANES]]>;

/// Files kept per thread for reuse (each 68 KiB).
const POOL: usize = 32;

thread_local! {
    static FREE: RefCell<Vec<Rows>> = const { RefCell::new(Vec::new()) };
}

static ZERO: [u32; LANES] = [0; LANES];

/// Iterates the set bits of a lane mask.
#[inline(always)]
pub fn lanes(mut m: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let l = m.trailing_zeros() as usize;
            m &= m - 1;
            l
        })
    })
}

/// One vector register file of `len` rows.
#[derive(Debug)]
pub(crate) struct RegFile {
    rows: Option<Rows>,
    len: usize,
    /// Rows `used..` are zero.
    used: usize,
}

impl RegFile {
    /// A file of `len` zero rows; no memory until the first write.
    pub(crate) fn new(len: usize) -> RegFile {
        RegFile {
            rows: None,
            len,
            used: 0,
        }
    }

    /// Row `r` (panics past the end, as an index does).
    #[inline]
    pub(crate) fn get(&self, r: usize) -> &[u32; LANES] {
        match &self.rows {
            Some(rows) => &rows[r],
            None => {
                assert!(r < self.len, "register row {r} of {}", self.len);
                &ZERO
            }
        }
    }

    /// Row `r` for writing.
    #[inline]
    pub(crate) fn get_mut(&mut self, r: usize) -> &mut [u32; LANES] {
        if r >= self.used {
            self.used = (r + 1).min(self.len);
        }
        let len = self.len;
        &mut self.rows.get_or_insert_with(|| take(len))[r]
    }
}

/// Zeroed rows from the pool, or new ones.
fn take(len: usize) -> Rows {
    let reused = FREE
        .try_with(|f| {
            let mut f = f.borrow_mut();
            let at = f.iter().position(|r| r.len() == len)?;
            Some(f.swap_remove(at))
        })
        .ok()
        .flatten();
    reused.unwrap_or_else(|| vec![[0; LANES]; len].into_boxed_slice())
}

impl Drop for RegFile {
    fn drop(&mut self) {
        let Some(mut rows) = self.rows.take() else {
            return;
        };
        rows[..self.used].fill([0; LANES]);
        // At thread exit the pool may be gone: the rows are then simply freed.
        let _ = FREE.try_with(|f| {
            let mut f = f.borrow_mut();
            if f.len() < POOL {
                f.push(rows);
            }
        });
    }
}

impl Clone for RegFile {
    fn clone(&self) -> RegFile {
        let rows = self.rows.as_ref().map(|src| {
            let mut rows = take(self.len);
            rows[..self.used].copy_from_slice(&src[..self.used]);
            rows
        });
        RegFile {
            rows,
            len: self.len,
            used: self.used,
        }
    }
}
