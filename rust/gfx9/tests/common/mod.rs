//! Test rig: hand encoders for the instruction formats and a wave over a `VecMemory`.
#![allow(dead_code)]

pub mod launch;

use gfx9::exec::{CodeCache, Stop};
use gfx9::{Target, VecMemory, Wave};

pub const CODE: u64 = 0x10_0000;
pub const ENDPGM: u32 = 0xbf81_0000;
/// Operand codes.
pub const VCC: u32 = 106;
pub const EXEC: u32 = 126;
pub const LIT: u32 = 255;
pub const fn v(n: u32) -> u32 {
    256 + n
}
/// Inline integer constant (-16..=64).
pub const fn int(k: i32) -> u32 {
    if k >= 0 {
        128 + k as u32
    } else {
        (192 - k) as u32
    }
}

pub fn sop2(op: u32, d: u32, a: u32, b: u32) -> u32 {
    (0b10 << 30) | (op << 23) | (d << 16) | (b << 8) | a
}
pub fn sop1(op: u32, d: u32, a: u32) -> u32 {
    (0x17d << 23) | (d << 16) | (op << 8) | a
}
pub fn sopc(op: u32, a: u32, b: u32) -> u32 {
    (0x17e << 23) | (op << 16) | (b << 8) | a
}
pub fn sopk(op: u32, d: u32, k: u16) -> u32 {
    (0b1011 << 28) | (op << 23) | (d << 16) | k as u32
}
pub fn sopp(op: u32, k: u16) -> u32 {
    (0x17f << 23) | (op << 16) | k as u32
}
pub fn vop1(op: u32, d: u32, a: u32) -> u32 {
    (0x3f << 25) | (d << 17) | (op << 9) | a
}
pub fn vop2(op: u32, d: u32, a: u32, b: u32) -> u32 {
    (op << 25) | (d << 17) | ((b - 256) << 9) | a
}
pub fn vopc(op: u32, a: u32, b: u32) -> u32 {
    (0x3e << 25) | (op << 17) | ((b - 256) << 9) | a
}
/// VOP3a: `mods` = (abs, neg, clamp, omod).
pub fn vop3(op: u32, d: u32, s: [u32; 3], mods: (u32, u32, bool, u32)) -> [u32; 2] {
    let (abs, neg, clamp, omod) = mods;
    [
        (0b110100 << 26) | (op << 16) | ((clamp as u32) << 15) | (abs << 8) | d,
        s[0] | (s[1] << 9) | (s[2] << 18) | (omod << 27) | (neg << 29),
    ]
}
pub fn vop3b(op: u32, d: u32, sdst: u32, s: [u32; 3]) -> [u32; 2] {
    [
        (0b110100 << 26) | (op << 16) | (sdst << 8) | d,
        s[0] | (s[1] << 9) | (s[2] << 18),
    ]
}
pub const PLAIN: (u32, u32, bool, u32) = (0, 0, false, 0);
pub fn smem(op: u32, sdata: u32, sbase: u32, offset: u32) -> [u32; 2] {
    [
        (0b110000 << 26) | (op << 18) | (1 << 17) | (sdata << 6) | (sbase / 2),
        offset,
    ]
}
pub fn ds(op: u32, vdst: u32, addr: u32, d0: u32, d1: u32, off0: u32, off1: u32) -> [u32; 2] {
    [
        (0b110110 << 26) | (op << 17) | (off1 << 8) | off0,
        addr | (d0 << 8) | (d1 << 16) | (vdst << 24),
    ]
}
/// GLOBAL with saddr (0x7f: off), glc.
pub fn global(
    op: u32,
    vdst: u32,
    addr: u32,
    data: u32,
    saddr: u32,
    offset: i32,
    glc: bool,
) -> [u32; 2] {
    [
        (0b110111 << 26) | (op << 18) | (2 << 14) | ((glc as u32) << 16) | (offset as u32 & 0x1fff),
        addr | (data << 8) | (saddr << 16) | (vdst << 24),
    ]
}

pub struct Rig {
    pub w: Wave,
    pub mem: VecMemory,
    pub lds: Vec<u8>,
    pub cache: CodeCache,
}

impl Rig {
    pub fn new(t: Target) -> Rig {
        Rig {
            w: Wave::new(t, CODE),
            mem: VecMemory::new(),
            lds: vec![0; 65536],
            cache: CodeCache::new(10),
        }
    }

    /// Runs `code` followed by s_endpgm from CODE; returns the stop.
    pub fn run(&mut self, code: &[u32]) -> Stop {
        let mut bytes: Vec<u8> = code.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend(ENDPGM.to_le_bytes());
        self.mem.load(CODE, &bytes);
        self.cache.invalidate();
        self.w.pc = CODE;
        self.w
            .run(&mut self.mem, &mut self.lds, &mut self.cache, 10_000)
    }

    /// Runs and requires s_endpgm.
    pub fn ok(&mut self, code: &[u32]) {
        let s = self.run(code);
        assert_eq!(s, Stop::Endpgm, "code {code:08x?} stopped with {s}");
    }

    pub fn set_v(&mut self, r: usize, f: impl Fn(usize) -> u32) {
        for l in 0..64 {
            self.w.set_lane(r, l, f(l));
        }
    }
}
