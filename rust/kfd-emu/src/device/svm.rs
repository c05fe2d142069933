//! AMDKFD_IOC_SVM and the SVM records of CRIU: decode, the argument
//! checks, the call into the ranges the state keeps (`state::svm`), and
//! the answer.

use super::state::svm::{self, Record};
use super::state::{Proc, R};
use super::uapi::{self, sys};

const OP_SET_ATTR: u32 = sys::kfd_ioctl_svm_op_KFD_IOCTL_SVM_OP_SET_ATTR;
const OP_GET_ATTR: u32 = sys::kfd_ioctl_svm_op_KFD_IOCTL_SVM_OP_GET_ATTR;
/// `struct kfd_ioctl_svm_args` before its attributes.
const ARGS: usize = 24;
/// One `struct kfd_ioctl_svm_attribute`.
const ATTR: usize = 8;
/// `struct kfd_criu_svm_range_priv_data` before its attributes.
pub const RECORD_HEADER: usize = 24;
/// The attributes a CRIU record holds besides one ACCESS per device.
const RECORD_COMMON_ATTRS: usize = 4;

fn attrs_of(b: &[u8], n: usize) -> Vec<(u32, u32)> {
    (0..n)
        .map(|i| (uapi::nth::<u32>(b, 2 * i), uapi::nth::<u32>(b, 2 * i + 1)))
        .collect()
}

/// AMDKFD_IOC_SVM: the argument checks of `kfd_ioctl_svm_validate` and
/// `kfd_ioctl_svm`, then SET_ATTR or GET_ATTR.  The answer is the
/// caller's bytes with the attributes as the op leaves them.
pub fn ioctl(p: &mut Proc, input: &[u8], out_size: usize) -> R<Vec<u8>> {
    let start: u64 = uapi::decode(input);
    let size: u64 = uapi::decode(input.get(8..).unwrap_or(&[]));
    let op: u32 = uapi::decode(input.get(16..).unwrap_or(&[]));
    let nattr: u32 = uapi::decode(input.get(20..).unwrap_or(&[]));
    let need = (nattr as usize)
        .checked_mul(ATTR)
        .and_then(|n| n.checked_add(ARGS));
    let Some(need) = need.filter(|&n| input.len() >= n) else {
        return Err(libc::EINVAL);
    };
    if !start.is_multiple_of(uapi::PAGE)
        || !size.is_multiple_of(uapi::PAGE)
        || start == 0
        || size == 0
    {
        return Err(libc::EINVAL);
    }
    let (start, size) = (start / uapi::PAGE, size / uapi::PAGE);
    let mut attrs = attrs_of(&input[ARGS..need], nattr as usize);
    let vmas = svm::vmas(p.lead)?;
    match op {
        OP_SET_ATTR => svm::set_attr(p, &vmas, start, size, &attrs)?,
        OP_GET_ATTR => svm::get_attr(p, &vmas, start, size, &mut attrs)?,
        // KFD answers a positive EINVAL here, which the syscall passes on
        // as a return value; an answer over FUSE can only be an errno.
        _ => return Err(libc::EINVAL),
    }
    let mut out = input.to_vec();
    for (i, (t, v)) in attrs.iter().enumerate() {
        uapi::put(&mut out, ARGS + i * ATTR, t);
        uapi::put(&mut out, ARGS + i * ATTR + 4, v);
    }
    out.resize(out_size, 0);
    Ok(out)
}

/// The size of one CRIU record of a process with `devices` devices.
pub fn record_size(devices: usize) -> usize {
    RECORD_HEADER + ATTR * (RECORD_COMMON_ATTRS + devices)
}

/// CHECKPOINT: one record per range (`kfd_criu_checkpoint_svm`): start and
/// size in pages, then what GET_ATTR answers for the range: preferred and
/// prefetch locations, flags, granularity and one access per device.
pub fn checkpoint(p: &mut Proc, blob: &mut Vec<u8>) -> R<()> {
    for r in svm::checkpoint(p)? {
        uapi::push(blob, &uapi::layout::object_type::SVM_RANGE);
        uapi::push(blob, &0u32);
        uapi::push(blob, &r.start);
        uapi::push(blob, &r.size);
        for (t, v) in r.attrs {
            uapi::push(blob, &t);
            uapi::push(blob, &v);
        }
    }
    Ok(())
}

/// RESTORE: a record as CHECKPOINT wrote it (`kfd_criu_restore_svm` keeps
/// it for RESUME without looking at it).
pub fn parse_record(b: &[u8], devices: usize) -> Record {
    let start: u64 = uapi::decode(&b[8..]);
    let size: u64 = uapi::decode(&b[16..]);
    Record {
        start,
        size,
        attrs: attrs_of(&b[RECORD_HEADER..], RECORD_COMMON_ATTRS + devices),
    }
}
