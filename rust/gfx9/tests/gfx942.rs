//! gfx942: the opcodes it adds against plain Rust references, the ones it dropped refused as
//! the CP refuses an illegal instruction, and the 64-bit aperture reads LLVM 21 emits.

mod common;

use common::*;
use gfx9::exec::{Illegal, Stop};
use gfx9::state::Apertures;
use gfx9::Target;

fn pair(r: &Rig, reg: usize, l: usize) -> u64 {
    r.w.lane(reg, l) as u64 | (r.w.lane(reg + 1, l) as u64) << 32
}

fn set_pair(r: &mut Rig, reg: usize, f: impl Fn(usize) -> u64) {
    r.set_v(reg, |l| f(l) as u32);
    r.set_v(reg + 1, |l| (f(l) >> 32) as u32);
}

#[test]
fn v_mov_b64_moves_pairs_under_exec() {
    let mut r = Rig::new(Target::Gfx942);
    set_pair(&mut r, 2, |l| 0x1234_5678_0000_0000 | l as u64);
    set_pair(&mut r, 4, |_| u64::MAX);
    r.w.set_exec(0x0000_ffff_0000_ffff);
    r.ok(&[vop1(0x38, 4, v(2))]);
    for l in 0..64 {
        let want = if (0x0000_ffff_0000_ffffu64 >> l) & 1 == 1 {
            0x1234_5678_0000_0000 | l as u64
        } else {
            u64::MAX
        };
        assert_eq!(pair(&r, 4, l), want, "v_mov_b64 lane {l}");
    }
}

#[test]
fn v_lshl_add_u64_shifts_then_adds_with_wrap() {
    let mut r = Rig::new(Target::Gfx942);
    let a = |l: usize| (l as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let c = |l: usize| u64::MAX - l as u64;
    set_pair(&mut r, 2, a);
    set_pair(&mut r, 6, c);
    for shift in 0..=4u32 {
        r.ok(&vop3(0x208, 10, [v(2), int(shift as i32), v(6)], PLAIN));
        for l in 0..64 {
            let want = (a(l) << shift).wrapping_add(c(l));
            assert_eq!(pair(&r, 10, l), want, "shift {shift} lane {l}");
        }
    }
}

#[test]
fn fmamk_and_fmaak_are_fused() {
    // a * b + c with a product that rounds away in an unfused multiply: fused keeps it.
    let (a, k, c) = (1.0f32 + f32::EPSILON, 1.0f32 - f32::EPSILON, -1.0f32);
    let mut r = Rig::new(Target::Gfx942);
    r.set_v(1, |_| a.to_bits());
    r.set_v(2, |_| c.to_bits());
    r.set_v(3, |_| k.to_bits());
    // v_fmamk_f32 v4, v1, K, v2 (D = S0 * K + S1); v_fmaak_f32 v5, v1, v3, K (D = S0 * S1 + K).
    r.ok(&[
        vop2(0x17, 4, v(1), v(2)),
        k.to_bits(),
        vop2(0x18, 5, v(1), v(3)),
        c.to_bits(),
    ]);
    let want = a.mul_add(k, c);
    assert_ne!(want, a * k + c, "the inputs must tell fused from unfused");
    for l in 0..64 {
        assert_eq!(f32::from_bits(r.w.lane(4, l)), want, "v_fmamk_f32 lane {l}");
        assert_eq!(f32::from_bits(r.w.lane(5, l)), want, "v_fmaak_f32 lane {l}");
    }
    // gfx90a: the same words are v_madmk/v_madak (unfused).
    let mut r = Rig::new(Target::Gfx90a);
    r.set_v(1, |_| a.to_bits());
    r.set_v(2, |_| c.to_bits());
    r.ok(&[vop2(0x17, 4, v(1), v(2)), k.to_bits()]);
    assert_eq!(f32::from_bits(r.w.lane(4, 0)), a * k + c);
}

#[test]
fn dropped_opcodes_are_illegal_on_gfx942_only() {
    // v_mac_f32 v1, v2, v3 (VOP2 0x16): gone on gfx940; v_mov_b64 is new there.
    for (t, word, legal) in [
        (Target::Gfx90a, vop2(0x16, 1, v(2), v(3)), true),
        (Target::Gfx942, vop2(0x16, 1, v(2), v(3)), false),
        (Target::Gfx90a, vop1(0x38, 4, v(2)), false),
    ] {
        let mut r = Rig::new(t);
        match r.run(&[word]) {
            Stop::Endpgm => assert!(legal, "{t:?} {word:08x} ran"),
            Stop::Illegal {
                reason: Illegal::UnknownOpcode { .. },
                pc,
            } => {
                assert!(!legal, "{t:?} {word:08x} refused");
                assert_eq!(pc, CODE, "the stop names the instruction's address");
            }
            s => panic!("{t:?} {word:08x}: {s}"),
        }
    }
}

#[test]
fn aperture_bases_read_as_64_bits_give_the_address() {
    for t in [Target::Gfx90a, Target::Gfx942] {
        let mut r = Rig::new(t);
        r.w.apertures = Apertures {
            shared_base: 0x1000_0000_0000,
            private_base: 0x2000_0000_0000,
        };
        // s_mov_b64 s[4:5], src_private_base; s_mov_b64 s[6:7], src_shared_base;
        // s_mov_b32 s8, src_private_base (the high dword, as LLVM 15 reads it).
        r.ok(&[sop1(0x01, 4, 237), sop1(0x01, 6, 235), sop1(0x00, 8, 237)]);
        assert_eq!(r.w.sgpr64(4), 0x2000_0000_0000, "{t:?} 64-bit private base");
        assert_eq!(r.w.sgpr64(6), 0x1000_0000_0000, "{t:?} 64-bit shared base");
        assert_eq!(r.w.sgpr(8), 0x2000, "{t:?} 32-bit private base");
    }
}
