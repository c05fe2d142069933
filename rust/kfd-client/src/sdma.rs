//! SDMA packet encoding (SDMA v4 layout, used by GFX9 and newer through KFD user queues).
//!
//! A packet is a run of little-endian dwords; dword 0 carries the opcode in bits 7..0 and
//! the sub-opcode in bits 15..8. Byte counts in COPY_LINEAR and CONSTANT_FILL are stored as
//! `bytes - 1` on GFX9+ (older engines stored `bytes`), in a 22-bit field, so one packet
//! moves at most 4 MiB; [`copy_linear_split`] cuts larger copies. Addresses are GPU VAs.

use std::fmt;

/// Opcodes (dword 0, bits 7..0).
pub mod op {
    pub const NOP: u32 = 0;
    pub const COPY: u32 = 1;
    pub const WRITE: u32 = 2;
    pub const FENCE: u32 = 5;
    pub const TRAP: u32 = 6;
    pub const CONST_FILL: u32 = 11;
}

/// Sub-opcodes (dword 0, bits 15..8).
pub mod sub_op {
    pub const COPY_LINEAR: u32 = 0;
    pub const WRITE_LINEAR: u32 = 0;
}

/// Largest byte count one COPY_LINEAR or CONSTANT_FILL packet can carry (22-bit `bytes - 1`).
pub const MAX_LINEAR_BYTES: u64 = 1 << 22;
/// Largest payload of one WRITE_LINEAR packet, in dwords (20-bit `dwords - 1`).
pub const MAX_WRITE_DWORDS: usize = 1 << 20;
/// The NOP header's count field (bits 29..16) limits how many dwords one NOP may skip.
pub const MAX_NOP_SKIP: usize = (1 << 14) - 1;
/// TRAP's context id is 28 bits wide.
pub const TRAP_CONTEXT_MASK: u32 = 0x0fff_ffff;

/// Dwords of each fixed-size packet.
pub const COPY_LINEAR_DWORDS: usize = 7;
pub const CONST_FILL_DWORDS: usize = 5;
pub const FENCE_DWORDS: usize = 4;
pub const TRAP_DWORDS: usize = 2;

/// Why a packet could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketError {
    /// A byte or dword count of zero: the engine cannot express it (`count - 1` underflows).
    Empty(&'static str),
    /// More than one packet can carry.
    TooLarge {
        packet: &'static str,
        len: u64,
        max: u64,
    },
    /// An address or length the engine requires to be dword aligned is not.
    Misaligned {
        packet: &'static str,
        what: &'static str,
        value: u64,
    },
    /// A TRAP context id wider than 28 bits.
    TrapContext(u32),
}

impl fmt::Display for PacketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Empty(p) => write!(f, "SDMA {p}: zero length"),
            Self::TooLarge { packet, len, max } => {
                write!(
                    f,
                    "SDMA {packet}: length {len} exceeds the packet limit {max}"
                )
            }
            Self::Misaligned {
                packet,
                what,
                value,
            } => {
                write!(f, "SDMA {packet}: {what} {value:#x} is not 4-byte aligned")
            }
            Self::TrapContext(c) => write!(f, "SDMA TRAP: context {c:#x} wider than 28 bits"),
        }
    }
}

impl std::error::Error for PacketError {}

const fn header(op: u32, sub_op: u32) -> u32 {
    (op & 0xff) | ((sub_op & 0xff) << 8)
}

const fn lo(a: u64) -> u32 {
    a as u32
}

const fn hi(a: u64) -> u32 {
    (a >> 32) as u32
}

fn dword_aligned(packet: &'static str, what: &'static str, value: u64) -> Result<(), PacketError> {
    if value.is_multiple_of(4) {
        Ok(())
    } else {
        Err(PacketError::Misaligned {
            packet,
            what,
            value,
        })
    }
}

fn linear_count(packet: &'static str, bytes: u64) -> Result<u32, PacketError> {
    if bytes == 0 {
        return Err(PacketError::Empty(packet));
    }
    if bytes > MAX_LINEAR_BYTES {
        return Err(PacketError::TooLarge {
            packet,
            len: bytes,
            max: MAX_LINEAR_BYTES,
        });
    }
    Ok((bytes - 1) as u32)
}

/// COPY_LINEAR: copies `bytes` from `src` to `dst` (byte granular; no alignment needed).
pub fn copy_linear(out: &mut Vec<u32>, src: u64, dst: u64, bytes: u64) -> Result<(), PacketError> {
    let count = linear_count("COPY_LINEAR", bytes)?;
    out.extend_from_slice(&[
        header(op::COPY, sub_op::COPY_LINEAR),
        count,
        // Parameter: linear, no swap on either side.
        0,
        lo(src),
        hi(src),
        lo(dst),
        hi(dst),
    ]);
    Ok(())
}

/// A copy of any size as back-to-back COPY_LINEAR packets of at most [`MAX_LINEAR_BYTES`].
pub fn copy_linear_split(
    out: &mut Vec<u32>,
    src: u64,
    dst: u64,
    bytes: u64,
) -> Result<(), PacketError> {
    if bytes == 0 {
        return Err(PacketError::Empty("COPY_LINEAR"));
    }
    let mut done = 0;
    while done < bytes {
        let n = (bytes - done).min(MAX_LINEAR_BYTES);
        copy_linear(out, src + done, dst + done, n)?;
        done += n;
    }
    Ok(())
}

/// CONSTANT_FILL with a 32-bit pattern: `bytes` (a multiple of 4) at `dst` (dword aligned).
pub fn constant_fill(
    out: &mut Vec<u32>,
    dst: u64,
    pattern: u32,
    bytes: u64,
) -> Result<(), PacketError> {
    const P: &str = "CONSTANT_FILL";
    dword_aligned(P, "destination", dst)?;
    dword_aligned(P, "length", bytes)?;
    let count = linear_count(P, bytes)?;
    // Fill size (bits 31..30) 2 = the pattern is a whole dword.
    out.extend_from_slice(&[
        header(op::CONST_FILL, 0) | (2 << 30),
        lo(dst),
        hi(dst),
        pattern,
        count,
    ]);
    Ok(())
}

/// WRITE_LINEAR: stores `data` at `dst` (dword aligned).
pub fn write_linear(out: &mut Vec<u32>, dst: u64, data: &[u32]) -> Result<(), PacketError> {
    const P: &str = "WRITE_LINEAR";
    dword_aligned(P, "destination", dst)?;
    if data.is_empty() {
        return Err(PacketError::Empty(P));
    }
    if data.len() > MAX_WRITE_DWORDS {
        return Err(PacketError::TooLarge {
            packet: P,
            len: data.len() as u64,
            max: MAX_WRITE_DWORDS as u64,
        });
    }
    out.extend_from_slice(&[
        header(op::WRITE, sub_op::WRITE_LINEAR),
        lo(dst),
        hi(dst),
        (data.len() - 1) as u32,
    ]);
    out.extend_from_slice(data);
    Ok(())
}

/// FENCE: the engine writes `value` to `addr` (dword aligned) once all earlier packets ran.
pub fn fence(out: &mut Vec<u32>, addr: u64, value: u32) -> Result<(), PacketError> {
    dword_aligned("FENCE", "address", addr)?;
    out.extend_from_slice(&[header(op::FENCE, 0), lo(addr), hi(addr), value]);
    Ok(())
}

/// TRAP: raises an interrupt carrying `context`; KFD turns it into its signal events.
pub fn trap(out: &mut Vec<u32>, context: u32) -> Result<(), PacketError> {
    if context & !TRAP_CONTEXT_MASK != 0 {
        return Err(PacketError::TrapContext(context));
    }
    out.extend_from_slice(&[header(op::TRAP, 0), context]);
    Ok(())
}

/// `n` dwords of padding: one NOP header whose count skips the `n - 1` dwords after it (the
/// engine ignores their contents; zeros are written). Used to avoid a packet straddling the
/// end of the ring.
pub fn nop(out: &mut Vec<u32>, n: usize) -> Result<(), PacketError> {
    if n == 0 {
        return Err(PacketError::Empty("NOP"));
    }
    if n - 1 > MAX_NOP_SKIP {
        return Err(PacketError::TooLarge {
            packet: "NOP",
            len: n as u64,
            max: MAX_NOP_SKIP as u64 + 1,
        });
    }
    out.push(header(op::NOP, 0) | (((n - 1) as u32) << 16));
    out.resize(out.len() + n - 1, 0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(f: impl FnOnce(&mut Vec<u32>) -> Result<(), PacketError>) -> Vec<u32> {
        let mut v = Vec::new();
        f(&mut v).unwrap();
        v
    }

    #[test]
    fn copy_linear_stores_bytes_minus_one() {
        let v = enc(|o| copy_linear(o, 0x1_2345_6780, 0xffff_8000_0000_1000, 4096));
        assert_eq!(
            v,
            [
                0x0000_0001,
                4095,
                0,
                0x2345_6780,
                0x1,
                0x0000_1000,
                0xffff_8000
            ]
        );
        assert_eq!(v.len(), COPY_LINEAR_DWORDS);
        // A single byte is count 0; an odd byte count is allowed.
        assert_eq!(enc(|o| copy_linear(o, 1, 3, 1))[1], 0);
        assert_eq!(enc(|o| copy_linear(o, 1, 3, 7))[1], 6);
        // The largest count fills the 22-bit field exactly.
        assert_eq!(
            enc(|o| copy_linear(o, 0, 0, MAX_LINEAR_BYTES))[1],
            0x3f_ffff
        );
    }

    #[test]
    fn copy_linear_limits() {
        let mut v = Vec::new();
        assert_eq!(
            copy_linear(&mut v, 0, 0, 0),
            Err(PacketError::Empty("COPY_LINEAR"))
        );
        assert!(matches!(
            copy_linear(&mut v, 0, 0, MAX_LINEAR_BYTES + 1),
            Err(PacketError::TooLarge { len, .. }) if len == MAX_LINEAR_BYTES + 1
        ));
        assert!(
            v.is_empty(),
            "a rejected packet must not leave partial dwords"
        );
    }

    #[test]
    fn split_copy_covers_the_range_in_order() {
        let total = 2 * MAX_LINEAR_BYTES + 12;
        let v = enc(|o| copy_linear_split(o, 0x10_0000_0000, 0x20_0000_0000, total));
        let pkts: Vec<&[u32]> = v.chunks(COPY_LINEAR_DWORDS).collect();
        assert_eq!(pkts.len(), 3);
        let mut expect_off = 0u64;
        for p in &pkts {
            assert_eq!(p[0], 1);
            let src = p[3] as u64 | (p[4] as u64) << 32;
            let dst = p[5] as u64 | (p[6] as u64) << 32;
            assert_eq!(src, 0x10_0000_0000 + expect_off);
            assert_eq!(dst, 0x20_0000_0000 + expect_off);
            expect_off += p[1] as u64 + 1;
        }
        assert_eq!(expect_off, total);
        assert_eq!(pkts[2][1], 11);
    }

    #[test]
    fn constant_fill_layout() {
        let v = enc(|o| constant_fill(o, 0x7f12_3456_7000, 0xdead_beef, 64));
        assert_eq!(v, [0x8000_000b, 0x3456_7000, 0x7f12, 0xdead_beef, 63]);
        let mut v = Vec::new();
        assert!(matches!(
            constant_fill(&mut v, 2, 0, 4),
            Err(PacketError::Misaligned {
                what: "destination",
                ..
            })
        ));
        assert!(matches!(
            constant_fill(&mut v, 4, 0, 6),
            Err(PacketError::Misaligned { what: "length", .. })
        ));
        assert_eq!(
            constant_fill(&mut v, 4, 0, 0),
            Err(PacketError::Empty("CONSTANT_FILL"))
        );
        assert!(v.is_empty());
    }

    #[test]
    fn write_linear_layout() {
        let v = enc(|o| write_linear(o, 0x1_0000_0010, &[7, 8, 9]));
        assert_eq!(v, [0x0000_0002, 0x0000_0010, 0x1, 2, 7, 8, 9]);
        assert_eq!(enc(|o| write_linear(o, 0, &[5]))[3], 0);
        let mut v = Vec::new();
        assert_eq!(
            write_linear(&mut v, 0, &[]),
            Err(PacketError::Empty("WRITE_LINEAR"))
        );
        assert!(write_linear(&mut v, 6, &[1]).is_err());
    }

    #[test]
    fn fence_layout() {
        let v = enc(|o| fence(o, 0x7fff_0000_1004, 0x1234_5678));
        assert_eq!(v, [0x0000_0005, 0x0000_1004, 0x7fff, 0x1234_5678]);
        assert_eq!(v.len(), FENCE_DWORDS);
        assert!(fence(&mut Vec::new(), 0x1002, 0).is_err());
    }

    #[test]
    fn trap_layout() {
        assert_eq!(enc(|o| trap(o, 0x0abc_def0)), [0x0000_0006, 0x0abc_def0]);
        assert_eq!(
            trap(&mut Vec::new(), 0x1000_0000),
            Err(PacketError::TrapContext(0x1000_0000))
        );
    }

    #[test]
    fn nop_skips_the_rest() {
        assert_eq!(enc(|o| nop(o, 1)), [0]);
        assert_eq!(enc(|o| nop(o, 4)), [3 << 16, 0, 0, 0]);
        assert!(nop(&mut Vec::new(), 0).is_err());
        assert!(nop(&mut Vec::new(), MAX_NOP_SKIP + 2).is_err());
        assert_eq!(enc(|o| nop(o, MAX_NOP_SKIP + 1))[0], 0x3fff_0000);
    }

    #[test]
    fn errors_name_the_packet() {
        let e = copy_linear(&mut Vec::new(), 0, 0, 0).unwrap_err();
        assert_eq!(e.to_string(), "SDMA COPY_LINEAR: zero length");
        let e = fence(&mut Vec::new(), 3, 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "SDMA FENCE: address 0x3 is not 4-byte aligned"
        );
    }
}
