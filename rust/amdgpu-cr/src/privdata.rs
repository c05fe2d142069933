//! Inspection of KFD's private CRIU blob (`criu_kfd.priv_data`).
//!
//! The blob is the kernel's business and is stored verbatim, but for the BO
//! records of BOs imported from another process ([`without_bos`]).  Its layout
//! has one trap: the per-BO record holds `MAX_GPU_INSTANCE` gpu_ids, and
//! kernels changed that constant from 16 to 64 without changing the blob
//! version, so BO records are 80 or 272 bytes.  A restore on a kernel with
//! the other size fails with a bare EINVAL.  Walking the blob with each
//! candidate record size tells which kernel family wrote the image, so the
//! failure can be explained (and the dump can record it).
//!
//! Layout (little endian, packed back to back): process record (8 bytes:
//! version, xnack mode), one 8-byte record per device, one record per BO,
//! then `num_objects` objects, each starting with a u32 type: 0 = queue
//! (120-byte header whose u32 at 108 is the control stack size and at 112
//! the MQD size, followed by those bytes), 1 = event (64 bytes), 2 = SVM
//! range (24 bytes + 8 per attribute, 4 + one per device).

/// The BO record sizes kernels have used (`MAX_GPU_INSTANCE` 16 and 64).
pub const BO_RECORD_SIZES: [u64; 2] = [80, 272];

const PROCESS_RECORD: u64 = 8;
const DEVICE_RECORD: u64 = 8;
const QUEUE_HEADER: u64 = 120;
const EVENT_RECORD: u64 = 64;
const SVM_HEADER: u64 = 24;
const SVM_ATTR: u64 = 8;

/// What a successful walk found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrivLayout {
    pub version: u32,
    pub bo_record_size: u64,
    pub queues: u32,
    pub events: u32,
    pub svm_ranges: u32,
}

/// Why the blob does not parse with any known BO record size.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrivError {
    #[error("priv_data of {size} bytes is too short for the process and device records")]
    TooShort { size: u64 },
    #[error("priv_data does not parse with BO records of 80 or 272 bytes (last attempt: {last})")]
    NoLayout { last: String },
    #[error("priv_data parses with several BO record sizes: {0:?}")]
    Ambiguous(Vec<u64>),
}

fn u32_at(b: &[u8], off: u64) -> Option<u32> {
    let off = usize::try_from(off).ok()?;
    let bytes = b.get(off..off.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// One object record of the blob: its type (0 queue, 1 event, 2 SVM
/// range) and where its bytes are (the queue's MQD and control stack, the
/// range's attributes included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Object {
    pub kind: u32,
    pub offset: u64,
    pub len: u64,
}

/// Walks the blob assuming BO records of `bo_record_size` bytes.
pub fn walk(
    blob: &[u8],
    num_devices: u32,
    num_bos: u64,
    num_objects: u32,
    bo_record_size: u64,
) -> Result<PrivLayout, String> {
    let objects = objects(blob, num_devices, num_bos, num_objects, bo_record_size)?;
    let count = |kind| objects.iter().filter(|o| o.kind == kind).count() as u32;
    Ok(PrivLayout {
        version: u32_at(blob, 0).ok_or("no process record")?,
        bo_record_size,
        queues: count(0),
        events: count(1),
        svm_ranges: count(2),
    })
}

/// The object records of the blob, which must hold exactly the process,
/// device and BO records (of `bo_record_size` bytes) and `num_objects`
/// objects.  Allocates one entry per object found, never by the counts.
pub fn objects(
    blob: &[u8],
    num_devices: u32,
    num_bos: u64,
    num_objects: u32,
    bo_record_size: u64,
) -> Result<Vec<Object>, String> {
    let len = blob.len() as u64;
    u32_at(blob, 0).ok_or("no process record")?;
    let mut off = bo_records_at(num_devices);
    off = num_bos
        .checked_mul(bo_record_size)
        .and_then(|b| b.checked_add(off))
        .ok_or("BO records overflow")?;
    if off > len {
        return Err(format!(
            "BO records end at {off}, past the blob's {len} bytes"
        ));
    }
    let mut out = Vec::new();
    for i in 0..num_objects {
        let ty = u32_at(blob, off).ok_or_else(|| format!("object {i} starts past the end"))?;
        let size = match ty {
            0 => {
                let ctl = u32_at(blob, off + 108).ok_or_else(|| format!("queue {i} truncated"))?;
                let mqd = u32_at(blob, off + 112).ok_or_else(|| format!("queue {i} truncated"))?;
                QUEUE_HEADER + u64::from(ctl) + u64::from(mqd)
            }
            1 => EVENT_RECORD,
            2 => SVM_HEADER + SVM_ATTR * (4 + u64::from(num_devices)),
            t => return Err(format!("object {i} at offset {off} has unknown type {t}")),
        };
        out.push(Object {
            kind: ty,
            offset: off,
            len: size,
        });
        off += size;
        if off > len {
            return Err(format!(
                "object {i} ends at {off}, past the blob's {len} bytes"
            ));
        }
    }
    if off != len {
        return Err(format!("{} bytes left after the last object", len - off));
    }
    Ok(out)
}

/// Finds the BO record size the blob was written with.
pub fn detect(
    blob: &[u8],
    num_devices: u32,
    num_bos: u64,
    num_objects: u32,
) -> Result<PrivLayout, PrivError> {
    let fixed = bo_records_at(num_devices);
    if (blob.len() as u64) < fixed {
        return Err(PrivError::TooShort {
            size: blob.len() as u64,
        });
    }
    let mut found = Vec::new();
    let mut last = String::new();
    for size in BO_RECORD_SIZES {
        match walk(blob, num_devices, num_bos, num_objects, size) {
            Ok(l) => found.push(l),
            Err(e) => last = format!("{size}-byte records: {e}"),
        }
    }
    match found.len() {
        1 => Ok(found[0]),
        0 => Err(PrivError::NoLayout { last }),
        _ => Err(PrivError::Ambiguous(
            found.iter().map(|l| l.bo_record_size).collect(),
        )),
    }
}

/// One BO's record: its user address (userptr BOs), its id in the
/// process' IDR of its GPU, and the user gpu_ids it is mapped on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoRecord {
    pub user_addr: u64,
    pub idr_handle: u32,
    pub mapped_gpu_ids: Vec<u32>,
}

/// Where the BO records start.
fn bo_records_at(num_devices: u32) -> u64 {
    PROCESS_RECORD + DEVICE_RECORD * u64::from(num_devices)
}

/// The `num_bos` BO records of a blob of `layout` (from [`detect`]).
/// `None`: the blob is shorter than they are.
pub fn bo_records(
    blob: &[u8],
    num_devices: u32,
    num_bos: u64,
    layout: &PrivLayout,
) -> Option<Vec<BoRecord>> {
    let start = bo_records_at(num_devices);
    let size = layout.bo_record_size;
    (0..num_bos)
        .map(|i| {
            let at = start.checked_add(i.checked_mul(size)?)?;
            let from = usize::try_from(at).ok()?;
            let r = blob.get(from..from.checked_add(usize::try_from(size).ok()?)?)?;
            let mapped = r[12..]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .take_while(|&g| g != 0)
                .collect();
            Some(BoRecord {
                user_addr: u64::from_le_bytes(r[0..8].try_into().ok()?),
                idr_handle: u32_at(r, 8)?,
                mapped_gpu_ids: mapped,
            })
        })
        .collect()
}

/// The blob without the records of BOs `drop` (indices in bucket order),
/// for a RESTORE of the other BOs.  `None`: the blob is shorter than its
/// BO records.
pub fn without_bos(
    blob: &[u8],
    num_devices: u32,
    num_bos: u64,
    layout: &PrivLayout,
    drop: &std::collections::BTreeSet<usize>,
) -> Option<Vec<u8>> {
    let start = usize::try_from(bo_records_at(num_devices)).ok()?;
    let size = usize::try_from(layout.bo_record_size).ok()?;
    let end = start.checked_add(size.checked_mul(usize::try_from(num_bos).ok()?)?)?;
    if end > blob.len() {
        return None;
    }
    let mut out = blob[..start].to_vec();
    for (i, r) in blob[start..end].chunks_exact(size).enumerate() {
        if !drop.contains(&i) {
            out.extend_from_slice(r);
        }
    }
    out.extend_from_slice(&blob[end..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bo_records_read_and_leave_out() {
        for stride in BO_RECORD_SIZES {
            let mut b = blob(2, 3, stride, &[(16, 16)], 1, 0);
            for i in 0..3u64 {
                let at = (8 + 16 + i * stride) as usize;
                b[at..at + 8].copy_from_slice(&(0x1000 * (i + 1)).to_le_bytes());
                b[at + 8..at + 12].copy_from_slice(&(i as u32 + 4).to_le_bytes());
                b[at + 12..at + 16].copy_from_slice(&0x3f2cu32.to_le_bytes());
            }
            let l = detect(&b, 2, 3, 2).unwrap();
            let r = bo_records(&b, 2, 3, &l).unwrap();
            assert_eq!(r[1].user_addr, 0x2000);
            assert_eq!(r[1].idr_handle, 5);
            assert_eq!(r[1].mapped_gpu_ids, vec![0x3f2c]);
            let out = without_bos(&b, 2, 3, &l, &[1].into()).unwrap();
            assert_eq!(out.len() as u64, b.len() as u64 - stride);
            let l2 = detect(&out, 2, 2, 2).unwrap();
            let r2 = bo_records(&out, 2, 2, &l2).unwrap();
            assert_eq!((r2[0].idr_handle, r2[1].idr_handle), (4, 6));
            assert!(bo_records(&b[..40], 2, 3, &l).is_none());
        }
    }

    /// Builds a blob the way the kernel lays it out.
    fn blob(
        devices: u32,
        bos: u64,
        stride: u64,
        queues: &[(u32, u32)],
        events: u32,
        svm: u32,
    ) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.resize(b.len() + 8 * devices as usize + (stride * bos) as usize, 0);
        for &(ctl, mqd) in queues {
            let mut q = vec![0u8; 120];
            q[0..4].copy_from_slice(&0u32.to_le_bytes());
            q[108..112].copy_from_slice(&ctl.to_le_bytes());
            q[112..116].copy_from_slice(&mqd.to_le_bytes());
            b.extend_from_slice(&q);
            b.resize(b.len() + (ctl + mqd) as usize, 0xaa);
        }
        for _ in 0..events {
            let mut e = vec![0u8; 64];
            e[0..4].copy_from_slice(&1u32.to_le_bytes());
            b.extend_from_slice(&e);
        }
        for _ in 0..svm {
            let mut s = vec![0u8; 24 + 8 * (4 + devices as usize)];
            s[0..4].copy_from_slice(&2u32.to_le_bytes());
            b.extend_from_slice(&s);
        }
        b
    }

    #[test]
    fn detects_both_record_sizes() {
        for stride in BO_RECORD_SIZES {
            let b = blob(2, 5, stride, &[(4096, 2048), (0, 512)], 3, 1);
            let l = detect(&b, 2, 5, 6).unwrap();
            assert_eq!(
                l,
                PrivLayout {
                    version: 1,
                    bo_record_size: stride,
                    queues: 2,
                    events: 3,
                    svm_ranges: 1
                }
            );
        }
    }

    #[test]
    fn rejects_damaged_blobs() {
        let b = blob(1, 3, 80, &[(16, 16)], 1, 0);
        // Wrong object count, truncation, trailing bytes, unknown type.
        assert!(detect(&b, 1, 3, 3).is_err());
        assert!(detect(&b[..b.len() - 1], 1, 3, 2).is_err());
        let mut long = b.clone();
        long.extend_from_slice(&[0; 8]);
        assert!(matches!(
            detect(&long, 1, 3, 2),
            Err(PrivError::NoLayout { .. })
        ));
        let mut bad = b.clone();
        let first_obj = 8 + 8 + 3 * 80;
        bad[first_obj] = 7;
        let e = detect(&bad, 1, 3, 2).unwrap_err().to_string();
        assert!(e.contains("unknown type 7") || e.contains("records"), "{e}");
        assert_eq!(
            detect(&[0; 4], 2, 0, 0),
            Err(PrivError::TooShort { size: 4 })
        );
        // Huge counts must not overflow or allocate.
        assert!(detect(&b, 1, u64::MAX, 2).is_err());
        assert!(walk(&b, u32::MAX, 3, 2, 80).is_err());
    }

    #[test]
    fn no_bos_is_ambiguous() {
        let b = blob(1, 0, 80, &[], 1, 0);
        assert_eq!(
            detect(&b, 1, 0, 1),
            Err(PrivError::Ambiguous(vec![80, 272]))
        );
    }
}
