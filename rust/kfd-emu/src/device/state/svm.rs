//! SVM ranges: the attributes KFD keeps for ranges of a process' own
//! virtual memory, with KFD's checks, splitting and merging rules
//! (`kfd_svm.c` of Linux 6.1).  The ioctl and its CRIU records are
//! decoded and encoded in `device::svm`.
//!
//! The emulated GPU reaches a process' memory in place, so the attributes
//! change no placement: a prefetch to a GPU moves nothing, and the pages
//! stay where the process has them, as they would after KFD migrated them
//! back on a CPU access.  KFD drops the part of a range the process unmaps
//! (an MMU notifier); the emulator cannot see munmap, so it trims the
//! ranges to the process' mappings (`/proc/PID/maps`) whenever it looks at
//! them (SVM ioctls, PROCESS_INFO, CHECKPOINT, overlap checks).

use std::collections::BTreeMap;

use super::{Proc, R};
use crate::device::uapi::{self, sys};

pub const ATTR_PREFERRED_LOC: u32 = sys::kfd_ioctl_svm_attr_type_KFD_IOCTL_SVM_ATTR_PREFERRED_LOC;
pub const ATTR_PREFETCH_LOC: u32 = sys::kfd_ioctl_svm_attr_type_KFD_IOCTL_SVM_ATTR_PREFETCH_LOC;
pub const ATTR_ACCESS: u32 = sys::kfd_ioctl_svm_attr_type_KFD_IOCTL_SVM_ATTR_ACCESS;
pub const ATTR_ACCESS_IN_PLACE: u32 =
    sys::kfd_ioctl_svm_attr_type_KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE;
pub const ATTR_NO_ACCESS: u32 = sys::kfd_ioctl_svm_attr_type_KFD_IOCTL_SVM_ATTR_NO_ACCESS;
pub const ATTR_SET_FLAGS: u32 = sys::kfd_ioctl_svm_attr_type_KFD_IOCTL_SVM_ATTR_SET_FLAGS;
pub const ATTR_CLR_FLAGS: u32 = sys::kfd_ioctl_svm_attr_type_KFD_IOCTL_SVM_ATTR_CLR_FLAGS;
pub const ATTR_GRANULARITY: u32 = sys::kfd_ioctl_svm_attr_type_KFD_IOCTL_SVM_ATTR_GRANULARITY;
pub const LOC_SYSMEM: u32 = sys::kfd_ioctl_svm_location_KFD_IOCTL_SVM_LOCATION_SYSMEM;
pub const LOC_UNDEFINED: u32 = sys::kfd_ioctl_svm_location_KFD_IOCTL_SVM_LOCATION_UNDEFINED;
const DEFAULT_FLAGS: u32 = sys::KFD_IOCTL_SVM_FLAG_HOST_ACCESS | sys::KFD_IOCTL_SVM_FLAG_COHERENT;
const DEFAULT_GRANULARITY: u8 = 9;

/// One SVM range, in pages (`last` inclusive), with its attributes.
/// `access` and `in_place` are bitmaps of GPU indices (the pdd order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub last: u64,
    pub preferred_loc: u32,
    pub prefetch_loc: u32,
    pub granularity: u8,
    pub flags: u32,
    pub access: u64,
    pub in_place: u64,
}

/// A CRIU record waiting for RESUME (start and size in pages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub start: u64,
    pub size: u64,
    pub attrs: Vec<(u32, u32)>,
}

/// The process' SVM ranges, by first page.
#[derive(Debug, Default)]
pub struct Svm {
    pub ranges: BTreeMap<u64, Range>,
    /// Restored by CRIU RESTORE, applied at RESUME (as KFD does, once the
    /// process' memory is back).
    pub pending: Vec<Record>,
}

/// Every GPU supports the SVM API (dGPUs with device memory).
fn supported(p: &Proc) -> u64 {
    p.present()
        .filter(|(i, _)| *i < 64)
        .fold(0, |m, (i, _)| m | 1u64 << i)
}

fn new_range(p: &Proc, last: u64) -> Range {
    Range {
        last,
        preferred_loc: LOC_UNDEFINED,
        prefetch_loc: LOC_UNDEFINED,
        granularity: DEFAULT_GRANULARITY,
        flags: DEFAULT_FLAGS,
        access: if p.xnack { supported(p) } else { 0 },
        in_place: 0,
    }
}

/// A mapping of the process: pages `[start, end)` and whether it is a
/// device mapping (KFD refuses `VM_IO | VM_PFNMAP | VM_MIXEDMAP` ones: on
/// a real system, mappings of /dev/kfd and of render nodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub device: bool,
    /// Anonymous memory: no file behind it (heap, stack and the like count,
    /// the vDSO does not).
    pub anon: bool,
}

/// The process' mappings, in pages.
pub fn vmas(pid: u32) -> R<Vec<Vma>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|_| libc::ESRCH)?;
    Ok(parse_maps(&maps))
}

pub fn parse_maps(maps: &str) -> Vec<Vma> {
    let mut out = Vec::new();
    for l in maps.lines() {
        let mut it = l.split_whitespace();
        let Some((s, e)) = it.next().and_then(|r| r.split_once('-')) else {
            continue;
        };
        let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) else {
            continue;
        };
        let path = it.nth(4).unwrap_or("");
        let device = path == "/dev/kfd" || path.starts_with("/dev/dri/");
        let anon = path.is_empty() || (path.starts_with('[') && !path.starts_with("[vdso"));
        out.push(Vma {
            start: s / uapi::PAGE,
            end: e / uapi::PAGE,
            device,
            anon,
        });
    }
    out
}

/// Drops the pages of every range that are no longer mapped (KFD's MMU
/// notifier does it at munmap), splitting ranges around holes.
pub fn trim(p: &mut Proc, vmas: &[Vma]) {
    let old = std::mem::take(&mut p.svm.ranges);
    for (s, r) in old {
        for v in vmas {
            let (a, b) = (s.max(v.start), r.last.min(v.end.saturating_sub(1)));
            if v.end > v.start && a <= b {
                let mut piece = r.clone();
                piece.last = b;
                p.svm.ranges.insert(a, piece);
            }
        }
    }
}

/// `svm_range_is_valid`: every page of `[start, start + size)` in a
/// mapping that is not a device mapping (EFAULT), none in a BO mapped to
/// a GPU (EADDRINUSE).
fn is_valid(p: &Proc, vmas: &[Vma], start: u64, size: u64) -> R<()> {
    let end = start.checked_add(size).ok_or(libc::EFAULT)?;
    let mut at = start;
    while at < end {
        let v = vmas
            .iter()
            .find(|v| v.start <= at && at < v.end)
            .ok_or(libc::EFAULT)?;
        if v.device {
            return Err(libc::EFAULT);
        }
        at = v.end.min(end);
    }
    let (s, l) = (start * uapi::PAGE, end * uapi::PAGE - 1);
    if p.bos
        .overlapping(s, l.saturating_add(1))
        .any(|(_, b)| !b.mapped.is_empty())
    {
        return Err(libc::EADDRINUSE);
    }
    Ok(())
}

/// Whether any SVM range covers part of GPU VA `[va, va + size)`
/// (ALLOC_MEMORY_OF_GPU refuses such a VA with EADDRINUSE).
pub fn overlaps(p: &Proc, va: u64, size: u64) -> bool {
    let (s, l) = (va / uapi::PAGE, (va + size - 1) / uapi::PAGE);
    p.svm.ranges.range(..=l).any(|(_, r)| r.last >= s)
}

/// `svm_range_check_attr`.
fn check_attrs(p: &Proc, attrs: &[(u32, u32)]) -> R<()> {
    for &(ty, val) in attrs {
        let gpu = match ty {
            ATTR_PREFERRED_LOC if val != LOC_SYSMEM && val != LOC_UNDEFINED => Some(val),
            ATTR_PREFETCH_LOC if val != LOC_SYSMEM => Some(val),
            ATTR_ACCESS | ATTR_ACCESS_IN_PLACE | ATTR_NO_ACCESS => Some(val),
            ATTR_PREFERRED_LOC | ATTR_PREFETCH_LOC => None,
            ATTR_SET_FLAGS | ATTR_CLR_FLAGS | ATTR_GRANULARITY => None,
            _ => return Err(libc::EINVAL),
        };
        if let Some(id) = gpu {
            p.pdd_by_user_id(id).ok_or(libc::EINVAL)?;
        }
    }
    Ok(())
}

/// `svm_range_is_same_attrs`: a prefetch always counts as a change.
fn same_attrs(p: &Proc, r: &Range, attrs: &[(u32, u32)]) -> bool {
    attrs.iter().all(|&(ty, val)| {
        let bit = || 1u64 << p.pdd_by_user_id(val).unwrap_or(0);
        match ty {
            ATTR_PREFERRED_LOC => r.preferred_loc == val,
            ATTR_PREFETCH_LOC => false,
            ATTR_NO_ACCESS => (r.access | r.in_place) & bit() == 0,
            ATTR_ACCESS => r.access & bit() != 0,
            ATTR_ACCESS_IN_PLACE => r.in_place & bit() != 0,
            ATTR_SET_FLAGS => r.flags & val == val,
            ATTR_CLR_FLAGS => r.flags & val == 0,
            ATTR_GRANULARITY => r.granularity as u32 == val,
            _ => true,
        }
    })
}

/// `svm_range_apply_attrs`.
fn apply(p: &Proc, r: &mut Range, attrs: &[(u32, u32)]) {
    for &(ty, val) in attrs {
        let bit = || 1u64 << p.pdd_by_user_id(val).unwrap_or(0);
        match ty {
            ATTR_PREFERRED_LOC => r.preferred_loc = val,
            ATTR_PREFETCH_LOC => r.prefetch_loc = val,
            ATTR_NO_ACCESS => {
                r.access &= !bit();
                r.in_place &= !bit();
            }
            ATTR_ACCESS => {
                r.access |= bit();
                r.in_place &= !bit();
            }
            ATTR_ACCESS_IN_PLACE => {
                r.access &= !bit();
                r.in_place |= bit();
            }
            ATTR_SET_FLAGS => r.flags |= val,
            ATTR_CLR_FLAGS => r.flags &= !val,
            ATTR_GRANULARITY => r.granularity = val.min(0x3f) as u8,
            _ => {}
        }
    }
}

/// SET_ATTR on pages `[start, start + size)` (`svm_range_set_attr`):
/// ranges that overlap it with other attributes are split at its ends
/// and updated inside, the gaps get new ranges with the defaults and the
/// attributes.
pub fn set_attr(p: &mut Proc, vmas: &[Vma], start: u64, size: u64, attrs: &[(u32, u32)]) -> R<()> {
    check_attrs(p, attrs)?;
    trim(p, vmas);
    is_valid(p, vmas, start, size)?;
    if size == 0 {
        return Ok(());
    }
    let last = start + size - 1;
    let hits: Vec<(u64, Range)> = p
        .svm
        .ranges
        .range(..=last)
        .filter(|(_, r)| r.last >= start)
        .map(|(&s, r)| (s, r.clone()))
        .collect();
    let mut cur = start;
    let mut add: Vec<(u64, Range)> = Vec::new();
    for (s, r) in hits {
        if !same_attrs(p, &r, attrs) {
            p.svm.ranges.remove(&s);
            if s < start {
                let mut head = r.clone();
                head.last = start - 1;
                add.push((s, head));
            }
            let mut mid = r.clone();
            mid.last = r.last.min(last);
            apply(p, &mut mid, attrs);
            add.push((s.max(start), mid));
            if r.last > last {
                add.push((last + 1, r.clone()));
            }
        }
        if s > cur {
            let mut gap = new_range(p, s - 1);
            apply(p, &mut gap, attrs);
            add.push((cur, gap));
        }
        cur = r.last.min(last) + 1;
    }
    if cur <= last {
        let mut gap = new_range(p, last);
        apply(p, &mut gap, attrs);
        add.push((cur, gap));
    }
    p.svm.ranges.extend(add);
    Ok(())
}

/// GET_ATTR on pages `[start, start + size)` (`svm_range_get_attr`):
/// what all ranges in it share; the defaults when none is there.
pub fn get_attr(
    p: &mut Proc,
    vmas: &[Vma],
    start: u64,
    size: u64,
    attrs: &mut [(u32, u32)],
) -> R<()> {
    trim(p, vmas);
    is_valid(p, vmas, start, size)?;
    let want = Wanted::of(attrs)?;
    let last = (start + size).wrapping_sub(1);
    let hits: Vec<&Range> = p
        .svm
        .ranges
        .range(..=last)
        .filter(|(_, r)| r.last >= start)
        .map(|(_, r)| r)
        .collect();
    let shared = if hits.is_empty() {
        Shared::defaults(p)
    } else {
        Shared::of(p, &hits, want)
    };
    shared.answer(p, attrs)
}

/// The attributes a GET_ATTR asks for.
#[derive(Clone, Copy)]
struct Wanted {
    pref: bool,
    prefetch: bool,
    access: bool,
    flags: bool,
    gran: bool,
}

impl Wanted {
    fn of(attrs: &[(u32, u32)]) -> R<Wanted> {
        let mut w = Wanted {
            pref: false,
            prefetch: false,
            access: false,
            flags: false,
            gran: false,
        };
        for &(ty, _) in attrs {
            match ty {
                ATTR_PREFERRED_LOC => w.pref = true,
                ATTR_PREFETCH_LOC => w.prefetch = true,
                ATTR_ACCESS => w.access = true,
                ATTR_SET_FLAGS | ATTR_CLR_FLAGS => w.flags = true,
                ATTR_GRANULARITY => w.gran = true,
                _ => return Err(libc::EINVAL),
            }
        }
        Ok(w)
    }
}

/// What the ranges of a GET_ATTR share.
struct Shared {
    location: u32,
    prefetch: u32,
    /// Bit i: every range gives device i access (in place).
    access: u64,
    in_place: u64,
    flags_and: u32,
    flags_or: u32,
    granularity: u8,
}

impl Shared {
    /// No range in the interval: the defaults.
    fn defaults(p: &Proc) -> Shared {
        Shared {
            location: LOC_UNDEFINED,
            prefetch: LOC_UNDEFINED,
            access: if p.xnack { supported(p) } else { 0 },
            in_place: 0,
            flags_and: DEFAULT_FLAGS,
            flags_or: DEFAULT_FLAGS,
            granularity: DEFAULT_GRANULARITY,
        }
    }

    /// What `hits` share of the attributes `want` names; a location that
    /// differs between two ranges (or is undefined in one) is undefined.
    fn of(p: &Proc, hits: &[&Range], mut want: Wanted) -> Shared {
        let mut s = Shared {
            location: LOC_UNDEFINED,
            prefetch: LOC_UNDEFINED,
            access: supported(p),
            in_place: supported(p),
            flags_and: u32::MAX,
            flags_or: 0,
            granularity: 0xff,
        };
        for r in hits {
            if want.pref {
                if r.preferred_loc == LOC_UNDEFINED
                    || (s.location != LOC_UNDEFINED && s.location != r.preferred_loc)
                {
                    s.location = LOC_UNDEFINED;
                    want.pref = false;
                } else {
                    s.location = r.preferred_loc;
                }
            }
            if want.prefetch {
                if r.prefetch_loc == LOC_UNDEFINED
                    || (s.prefetch != LOC_UNDEFINED && s.prefetch != r.prefetch_loc)
                {
                    s.prefetch = LOC_UNDEFINED;
                    want.prefetch = false;
                } else {
                    s.prefetch = r.prefetch_loc;
                }
            }
            if want.access {
                s.access &= r.access;
                s.in_place &= r.in_place;
            }
            if want.flags {
                s.flags_and &= r.flags;
                s.flags_or |= r.flags;
            }
            if want.gran && r.granularity < s.granularity {
                s.granularity = r.granularity;
            }
        }
        s
    }

    /// Fills in the answer of each attribute of `attrs`.
    fn answer(&self, p: &Proc, attrs: &mut [(u32, u32)]) -> R<()> {
        for a in attrs.iter_mut() {
            match a.0 {
                ATTR_PREFERRED_LOC => a.1 = self.location,
                ATTR_PREFETCH_LOC => a.1 = self.prefetch,
                ATTR_ACCESS => {
                    let gpu = p.pdd_by_user_id(a.1).ok_or(libc::EINVAL)?;
                    a.0 = if self.access & (1 << gpu) != 0 {
                        ATTR_ACCESS
                    } else if self.in_place & (1 << gpu) != 0 {
                        ATTR_ACCESS_IN_PLACE
                    } else {
                        ATTR_NO_ACCESS
                    };
                }
                ATTR_SET_FLAGS => a.1 = self.flags_and,
                ATTR_CLR_FLAGS => a.1 = !self.flags_or,
                ATTR_GRANULARITY => a.1 = self.granularity as u32,
                _ => {}
            }
        }
        Ok(())
    }
}

/// CHECKPOINT (`kfd_criu_checkpoint_svm`): per range, its start and size
/// in pages and what GET_ATTR answers for it: preferred and prefetch
/// locations, flags, granularity and one access per device.
pub fn checkpoint(p: &mut Proc) -> R<Vec<Record>> {
    let ranges: Vec<(u64, u64)> = p.svm.ranges.iter().map(|(&s, r)| (s, r.last)).collect();
    let vmas = vmas(p.lead)?;
    let mut out = Vec::with_capacity(ranges.len());
    for (s, last) in ranges {
        let mut attrs = vec![
            (ATTR_PREFERRED_LOC, 0),
            (ATTR_PREFETCH_LOC, 0),
            (ATTR_SET_FLAGS, 0),
            (ATTR_GRANULARITY, 0),
        ];
        attrs.extend(p.present().map(|(_, d)| (ATTR_ACCESS, d.user_id)));
        get_attr(p, &vmas, s, last - s + 1, &mut attrs)?;
        out.push(Record {
            start: s,
            size: last - s + 1,
            attrs,
        });
    }
    Ok(out)
}

/// RESUME: the restored ranges get their attributes back
/// (`kfd_criu_resume_svm`): an undefined prefetch location is left out
/// (it would not pass the checks), and the flags the range did not have
/// are cleared.
pub fn resume(p: &mut Proc) -> R<()> {
    let pending = std::mem::take(&mut p.svm.pending);
    if pending.is_empty() {
        return Ok(());
    }
    let vmas = vmas(p.lead)?;
    for rec in pending {
        let mut set_flags = u32::MAX;
        let mut attrs = rec.attrs.clone();
        for a in attrs.iter_mut() {
            match a.0 {
                ATTR_PREFETCH_LOC if a.1 == LOC_UNDEFINED => *a = (ATTR_SET_FLAGS, 0),
                ATTR_SET_FLAGS => set_flags = a.1,
                _ => {}
            }
        }
        attrs.push((ATTR_CLR_FLAGS, !set_flags));
        set_attr(p, &vmas, rec.start, rec.size, &attrs)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_name_device_mappings() {
        let m = "\
55d0c0000000-55d0c0002000 r--p 00000000 08:01 1234 /usr/bin/cat
7f0000000000-7f0000004000 rw-s 400000000 00:2f 7 /dev/dri/renderD128
7f0000004000-7f0000006000 rw-s 1000000000 00:2e 5 /dev/kfd
7f0000006000-7f0000008000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0 [stack]
";
        let v = parse_maps(m);
        assert_eq!(v.len(), 5);
        assert_eq!(
            v.iter().map(|v| v.device).collect::<Vec<_>>(),
            [false, true, true, false, false]
        );
        assert_eq!(
            v.iter().map(|v| v.anon).collect::<Vec<_>>(),
            [false, false, false, true, true]
        );
        assert_eq!((v[3].start, v[3].end), (0x7f0000006, 0x7f0000008));
    }
}
