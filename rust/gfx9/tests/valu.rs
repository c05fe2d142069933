//! Vector ALU against plain Rust references: every lane of EXEC gets the reference result,
//! every other lane keeps its old value; VCC/SGPR-pair results, modifiers, DPP and SDWA.

mod common;
use common::*;
use gfx9::Target;

/// A mask with active lanes in every row and bank, and inactive ones too.
const EXEC_MASK: u64 = 0xf0f0_ff00_5555_fffe;
const SENTINEL: u32 = 0xdead_beef;

/// Opcode, mnemonic, reference.
type Case<F> = (u32, &'static str, F);
type Bin = Case<fn(u32, u32) -> u32>;
type FBin = Case<fn(f32, f32) -> f32>;
type Un = Case<fn(u32) -> u32>;

const U32S: [u32; 16] = [
    0,
    1,
    2,
    31,
    32,
    33,
    63,
    64,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x00ff_ffff,
    0x0100_0000,
    0x1234_5678,
    0xfedc_ba98,
    24,
];

fn f32s() -> [f32; 16] {
    [
        0.0,
        -0.0,
        1.0,
        -1.5,
        3.25,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-40,
        -1e-42,
        f32::MAX,
        f32::MIN_POSITIVE,
        0.1,
        1e30,
        -7.0,
        2.5,
    ]
}

/// Lane `l` of source `k`: the value sets crossed so that all pairs appear.
fn pick<T: Copy>(set: &[T], k: usize, l: usize) -> T {
    set[if k == 0 {
        l % set.len()
    } else {
        (l / set.len() + l * 3) % set.len()
    }]
}

fn setup(r: &mut Rig, sets: [&dyn Fn(usize) -> u32; 2]) {
    r.w.set_exec(u64::MAX);
    r.set_v(1, sets[0]);
    r.set_v(2, sets[1]);
    r.set_v(0, |_| SENTINEL);
    r.w.set_exec(EXEC_MASK);
}

fn same_bits_or_both_nan(a: u32, b: u32) -> bool {
    a == b || (f32::from_bits(a).is_nan() && f32::from_bits(b).is_nan())
}

fn check_lanes(r: &Rig, what: &str, want: impl Fn(usize) -> u32) {
    for l in 0..64 {
        let got = r.w.lane(0, l);
        if (EXEC_MASK >> l) & 1 == 0 {
            assert_eq!(got, SENTINEL, "{what}: inactive lane {l} written");
        } else {
            assert!(
                same_bits_or_both_nan(got, want(l)),
                "{what}: lane {l}: got {got:#x}, want {:#x}",
                want(l)
            );
        }
    }
}

/// Runs a two-source 32-bit opcode in its VOP2 form and its VOP3 form against `f`.
fn check_vop2(
    op: u32,
    name: &str,
    a: impl Fn(usize) -> u32,
    b: impl Fn(usize) -> u32,
    f: impl Fn(u32, u32) -> u32,
) {
    let mut r = Rig::new(Target::Gfx90a);
    for form in 0..2 {
        setup(&mut r, [&a, &b]);
        if form == 0 {
            r.ok(&[vop2(op, 0, v(1), v(2))]);
        } else {
            r.ok(&vop3(0x100 + op, 0, [v(1), v(2), 0], PLAIN));
        }
        check_lanes(&r, &format!("{name} form {form}"), |l| f(a(l), b(l)));
    }
}

fn u(k: usize) -> impl Fn(usize) -> u32 {
    move |l| pick(&U32S, k, l)
}

fn fl(k: usize) -> impl Fn(usize) -> u32 {
    move |l| pick(&f32s(), k, l).to_bits()
}

fn f32op(f: fn(f32, f32) -> f32) -> impl Fn(u32, u32) -> u32 {
    move |a, b| f(f32::from_bits(a), f32::from_bits(b)).to_bits()
}

#[test]
fn vop2_integer_against_reference() {
    let cases: [Bin; 16] = [
        (0x34, "v_add_u32", |a, b| a.wrapping_add(b)),
        (0x35, "v_sub_u32", |a, b| a.wrapping_sub(b)),
        (0x36, "v_subrev_u32", |a, b| b.wrapping_sub(a)),
        (0x0c, "v_min_i32", |a, b| (a as i32).min(b as i32) as u32),
        (0x0d, "v_max_i32", |a, b| (a as i32).max(b as i32) as u32),
        (0x0e, "v_min_u32", |a, b| a.min(b)),
        (0x0f, "v_max_u32", |a, b| a.max(b)),
        // Shift amounts >= 32 use their low five bits.
        (0x10, "v_lshrrev_b32", |a, b| b >> (a % 32)),
        (0x11, "v_ashrrev_i32", |a, b| {
            ((b as i32) >> (a % 32)) as u32
        }),
        (0x12, "v_lshlrev_b32", |a, b| b << (a % 32)),
        (0x13, "v_and_b32", |a, b| a & b),
        (0x14, "v_or_b32", |a, b| a | b),
        (0x15, "v_xor_b32", |a, b| a ^ b),
        (0x08, "v_mul_u32_u24", |a, b| {
            ((a & 0xffffff) as u64 * (b & 0xffffff) as u64) as u32
        }),
        (0x09, "v_mul_hi_u32_u24", |a, b| {
            (((a & 0xffffff) as u64 * (b & 0xffffff) as u64) >> 32) as u32
        }),
        (0x06, "v_mul_i32_i24", |a, b| {
            (((a << 8) as i32 >> 8) as i64 * ((b << 8) as i32 >> 8) as i64) as u32
        }),
    ];
    for (op, name, f) in cases {
        check_vop2(op, name, u(0), u(1), f);
    }
}

#[test]
fn vop2_float_against_reference_with_nan_inf_denormals() {
    let cases: [FBin; 6] = [
        (0x01, "v_add_f32", |a, b| a + b),
        (0x02, "v_sub_f32", |a, b| a - b),
        (0x03, "v_subrev_f32", |a, b| b - a),
        (0x05, "v_mul_f32", |a, b| a * b),
        // IEEE minNum/maxNum: a NaN operand yields the other one; -0 orders below +0.
        (0x0a, "v_min_f32", |a, b| match (a.is_nan(), b.is_nan()) {
            (true, _) => b,
            (_, true) => a,
            _ if a < b || (a == b && a.is_sign_negative()) => a,
            _ => b,
        }),
        (0x0b, "v_max_f32", |a, b| match (a.is_nan(), b.is_nan()) {
            (true, _) => b,
            (_, true) => a,
            _ if a > b || (a == b && b.is_sign_negative()) => a,
            _ => b,
        }),
    ];
    for (op, name, f) in cases {
        check_vop2(op, name, fl(0), fl(1), f32op(f));
    }
}

#[test]
fn vop3_modifiers_abs_neg_clamp_omod() {
    let mut r = Rig::new(Target::Gfx90a);
    let (a, b) = (fl(0), fl(1));
    // |a| + -b, then *2 (omod 1), clamped to [0, 1].
    setup(&mut r, [&a, &b]);
    r.ok(&vop3(0x101, 0, [v(1), v(2), 0], (1, 2, true, 1)));
    check_lanes(&r, "v_add_f32 |a| + -b omod*2 clamp", |l| {
        let x = (f32::from_bits(a(l)).abs() + -f32::from_bits(b(l))) * 2.0;
        (if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) }).to_bits()
    });
}

#[test]
fn vop1_conversions_and_transcendentals() {
    let mut r = Rig::new(Target::Gfx90a);
    let f = fl(0);
    let cases: [Un; 14] = [
        (0x08, "v_cvt_i32_f32", |x| f32::from_bits(x) as i32 as u32), // saturating, NaN -> 0
        (0x07, "v_cvt_u32_f32", |x| f32::from_bits(x) as u32),
        (0x20, "v_exp_f32", |x| f32::from_bits(x).exp2().to_bits()),
        (0x21, "v_log_f32", |x| f32::from_bits(x).log2().to_bits()),
        (0x22, "v_rcp_f32", |x| (1.0 / f32::from_bits(x)).to_bits()),
        (0x27, "v_sqrt_f32", |x| f32::from_bits(x).sqrt().to_bits()),
        (0x24, "v_rsq_f32", |x| {
            (1.0 / f32::from_bits(x).sqrt()).to_bits()
        }),
        (0x1f, "v_floor_f32", |x| f32::from_bits(x).floor().to_bits()),
        (0x1c, "v_trunc_f32", |x| f32::from_bits(x).trunc().to_bits()),
        (0x1e, "v_rndne_f32", |x| {
            f32::from_bits(x).round_ties_even().to_bits()
        }),
        (0x29, "v_sin_f32", |x| {
            (((f32::from_bits(x) as f64) * std::f64::consts::TAU).sin() as f32).to_bits()
        }),
        (0x0b, "v_cvt_f32_f16(v_cvt_f16_f32)", |x| x),
        (0x2b, "v_not_b32", |x| !x),
        (0x2c, "v_bfrev_b32", |x| x.reverse_bits()),
    ];
    for (op, name, g) in cases {
        setup(&mut r, [&f, &f]);
        if op == 0x0b {
            // Round trip through half precision: exact for values representable in f16.
            r.set_v(1, |l| {
                [
                    1.0f32,
                    -1.5,
                    0.0,
                    -0.0,
                    65504.0,
                    f32::INFINITY,
                    0.000_061_035_156,
                    2.5,
                ][l % 8]
                    .to_bits()
            });
            r.ok(&[vop1(0x0a, 3, v(1)), vop1(0x0b, 0, v(3))]);
            let src: Vec<u32> = (0..64).map(|l| r.w.lane(1, l)).collect();
            check_lanes(&r, name, |l| src[l]);
            continue;
        }
        r.ok(&[vop1(op, 0, v(1))]);
        check_lanes(&r, name, |l| g(f(l)));
    }
    let ints = u(0);
    setup(&mut r, [&ints, &ints]);
    r.ok(&[vop1(0x05, 0, v(1))]);
    check_lanes(&r, "v_cvt_f32_i32", |l| (ints(l) as i32 as f32).to_bits());
    r.set_v(0, |_| SENTINEL);
    r.ok(&[vop1(0x2d, 0, v(1))]);
    check_lanes(&r, "v_ffbh_u32", |l| {
        if ints(l) == 0 {
            u32::MAX
        } else {
            ints(l).leading_zeros()
        }
    });
}

#[test]
fn f16_rounding_edges() {
    use gfx9::fp::{f16_to_f32, f32_to_f16};
    assert_eq!(f32_to_f16(65520.0), 0x7c00, "rounds to infinity");
    assert_eq!(f32_to_f16(65519.0), 0x7bff);
    assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001, "smallest subnormal");
    assert_eq!(
        f32_to_f16(2.980_232_2e-8),
        0x0000,
        "half of it ties to even zero"
    );
    assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00, "tie to even");
    assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
    for h in 0..=0xffffu16 {
        let x = f16_to_f32(h);
        if !x.is_nan() {
            assert_eq!(f32_to_f16(x), h, "f16 {h:#06x} round trip");
        }
    }
}

#[test]
fn compares_write_vcc_sgpr_pairs_and_exec() {
    let mut r = Rig::new(Target::Gfx90a);
    let (a, b) = (fl(0), fl(1));
    let want = |f: fn(f32, f32) -> bool| -> u64 {
        (0..64)
            .filter(|&l| (EXEC_MASK >> l) & 1 == 1 && f(f32::from_bits(a(l)), f32::from_bits(b(l))))
            .fold(0, |m, l| m | 1 << l)
    };
    setup(&mut r, [&a, &b]);
    r.w.set_vcc(u64::MAX);
    r.ok(&[vopc(0x41, v(1), v(2))]);
    assert_eq!(
        r.w.vcc(),
        want(|x, y| x < y),
        "v_cmp_lt_f32 into VCC, inactive lanes 0"
    );
    r.ok(&vop3(0x049, 10, [v(1), v(2), 0], PLAIN));
    assert_eq!(
        r.w.sgpr64(10),
        want(|x, y| x.partial_cmp(&y).is_none_or(|o| o.is_lt())),
        "v_cmp_nge_f32 (VOP3) into s[10:11]"
    );
    r.ok(&[vopc(0x48, v(1), v(2))]);
    assert_eq!(
        r.w.vcc(),
        want(|x, y| x.is_nan() || y.is_nan()),
        "v_cmp_u_f32"
    );
    r.ok(&[vopc(0x52, v(1), v(2))]);
    assert_eq!(r.w.exec(), want(|x, y| x == y), "v_cmpx_eq_f32 writes EXEC");
    // v_cmp_class_f32 with mask (quiet NaN | +inf | -0) = bits 1, 9, 5.
    setup(&mut r, [&a, &b]);
    r.set_v(3, |_| 0x222);
    r.ok(&[vopc(0x10, v(1), v(3))]);
    let cls = (0..64).filter(|&l| {
        let x = f32::from_bits(a(l));
        (EXEC_MASK >> l) & 1 == 1
            && (x.is_nan() || x == f32::INFINITY || (x == 0.0 && x.is_sign_negative()))
    });
    assert_eq!(r.w.vcc(), cls.fold(0, |m, l| m | 1 << l), "v_cmp_class_f32");
    let (ia, ib) = (u(0), u(1));
    setup(&mut r, [&ia, &ib]);
    r.ok(&[vopc(0xc1, v(1), v(2)), vopc(0xc9, v(1), v(2))]);
    let lt_u = (0..64)
        .filter(|&l| (EXEC_MASK >> l) & 1 == 1 && ia(l) < ib(l))
        .fold(0u64, |m, l| m | 1 << l);
    assert_eq!(r.w.vcc(), lt_u, "v_cmp_lt_u32");
}

#[test]
fn carry_chain_adds_64_bit_values() {
    let mut r = Rig::new(Target::Gfx90a);
    let (a, b) = (u(0), u(1));
    setup(&mut r, [&a, &b]);
    r.set_v(3, |l| l as u32);
    r.set_v(4, |l| 0xffff_ffff - l as u32);
    // {v0,v5} = {v1,v3} + {v2,v4}
    r.ok(&[vop2(0x19, 0, v(1), v(2)), vop2(0x1c, 5, v(3), v(4))]);
    for l in (0..64).filter(|l| (EXEC_MASK >> l) & 1 == 1) {
        let x = (a(l) as u64 | (l as u64) << 32)
            .wrapping_add(b(l) as u64 | ((0xffff_ffff - l as u64) << 32));
        assert_eq!(
            (r.w.lane(0, l), r.w.lane(5, l)),
            (x as u32, (x >> 32) as u32),
            "lane {l}"
        );
    }
    // VOP3b form: carry-out into s[20:21].
    setup(&mut r, [&a, &b]);
    r.ok(&vop3b(0x119, 0, 20, [v(1), v(2), 0]));
    let c = (0..64)
        .filter(|&l| (EXEC_MASK >> l) & 1 == 1 && a(l).checked_add(b(l)).is_none())
        .fold(0u64, |m, l| m | 1 << l);
    assert_eq!(r.w.sgpr64(20), c);
}

#[test]
fn cndmask_mad_u64_and_64_bit_shift() {
    let mut r = Rig::new(Target::Gfx90a);
    let (a, b) = (u(0), u(1));
    setup(&mut r, [&a, &b]);
    r.w.set_vcc(0x0123_4567_89ab_cdef);
    r.ok(&[vop2(0x00, 0, v(1), v(2))]);
    check_lanes(&r, "v_cndmask_b32", |l| {
        if (0x0123_4567_89ab_cdefu64 >> l) & 1 == 1 {
            b(l)
        } else {
            a(l)
        }
    });
    r.set_v(6, |l| l as u32 * 7);
    r.set_v(7, |_| 1);
    r.ok(&vop3b(0x1e8, 8, 30, [v(1), v(2), v(6)]));
    for l in (0..64).filter(|l| (EXEC_MASK >> l) & 1 == 1) {
        let p = a(l) as u64 * b(l) as u64 + ((1u64 << 32) | (l as u64 * 7));
        assert_eq!(
            r.w.lane(8, l) as u64 | (r.w.lane(9, l) as u64) << 32,
            p,
            "v_mad_u64_u32 lane {l}"
        );
    }
    r.ok(&vop3(0x28f, 10, [int(3), v(6), 0], PLAIN));
    for l in (0..64).filter(|l| (EXEC_MASK >> l) & 1 == 1) {
        let x = ((l as u64 * 7) | (1 << 32)) << 3;
        assert_eq!(
            r.w.lane(10, l) as u64 | (r.w.lane(11, l) as u64) << 32,
            x,
            "v_lshlrev_b64 lane {l}"
        );
    }
}

#[test]
fn f64_arithmetic() {
    let mut r = Rig::new(Target::Gfx90a);
    let vals = [
        1.5f64,
        -0.0,
        f64::INFINITY,
        1e-310,
        3.0,
        -2.25,
        f64::NAN,
        1e300,
    ];
    r.w.set_exec(u64::MAX);
    for (reg, k) in [(2usize, 0usize), (4, 3)] {
        r.set_v(reg, |l| vals[(l + k) % 8].to_bits() as u32);
        r.set_v(reg + 1, |l| (vals[(l + k) % 8].to_bits() >> 32) as u32);
    }
    let get = |r: &Rig, reg: usize, l: usize| {
        f64::from_bits(r.w.lane(reg, l) as u64 | (r.w.lane(reg + 1, l) as u64) << 32)
    };
    r.ok(&vop3(0x280, 6, [v(2), v(4), 0], PLAIN));
    r.ok(&vop3(0x281, 8, [v(2), v(4), 0], PLAIN));
    r.ok(&vop3(0x1cc, 10, [v(2), v(4), v(2)], PLAIN));
    for l in 0..64 {
        let (x, y) = (vals[l % 8], vals[(l + 3) % 8]);
        for (reg, want) in [(6, x + y), (8, x * y), (10, x.mul_add(y, x))] {
            let got = get(&r, reg, l);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "reg {reg} lane {l}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn fp32_division_sequence_is_exact() {
    // hipcc's fp32 division (assembled with llvm-mc-15 for gfx90a):
    //   v_div_scale_f32 v2, s[0:1], v1, v1, v0 ; v_div_scale_f32 v3, vcc, v0, v1, v0
    //   v_rcp_f32 v4, v2 ; v_fma_f32 v5, -v2, v4, 1.0 ; v_fma_f32 v4, v5, v4, v4
    //   v_mul_f32 v5, v3, v4 ; v_fma_f32 v6, -v2, v5, v3 ; v_fma_f32 v5, v6, v4, v5
    //   v_fma_f32 v2, -v2, v5, v3 ; v_div_fmas_f32 v2, v2, v4, v5 ; v_div_fixup_f32 v0, v2, v1, v0
    let code = [
        0xd1e0_0002,
        0x0402_0301,
        0xd1e0_6a03,
        0x0402_0300,
        0x7e08_4502,
        0xd1cb_0005,
        0x23ca_0902,
        0xd1cb_0004,
        0x0412_0905,
        0x0a0a_0903,
        0xd1cb_0006,
        0x240e_0b02,
        0xd1cb_0005,
        0x0416_0906,
        0xd1cb_0002,
        0x240e_0b02,
        0xd1e2_0002,
        0x0416_0902,
        0xd1de_0000,
        0x0402_0302,
    ];
    let num = [
        1.0f32,
        2.0,
        10.0,
        -7.0,
        0.0,
        1.0,
        0.0,
        f32::INFINITY,
        355.0,
        1e-3,
        3.0,
        f32::NAN,
    ];
    let den = [
        3.0f32, 7.0, 0.1, 3.0, 5.0, 0.0, 0.0, 2.0, 113.0, 7e3, -0.0, 1.0,
    ];
    let mut r = Rig::new(Target::Gfx90a);
    r.set_v(0, |l| num[l % num.len()].to_bits());
    r.set_v(1, |l| den[l % den.len()].to_bits());
    r.ok(&code);
    for l in 0..64 {
        let want = num[l % num.len()] / den[l % den.len()];
        let got = f32::from_bits(r.w.lane(0, l));
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "lane {l}: {got} vs {want}"
        );
    }
}

#[test]
fn lane_operations_readlane_writelane_mbcnt() {
    let mut r = Rig::new(Target::Gfx90a);
    r.set_v(1, |l| 100 + l as u32);
    r.w.set_exec(0xff00);
    r.ok(&[vop1(0x02, 5, v(1))]);
    assert_eq!(
        r.w.sreg[5], 108,
        "v_readfirstlane_b32 reads the first active lane"
    );
    r.w.sreg[6] = 42;
    r.ok(&vop3(0x289, 7, [v(1), 6, 0], PLAIN));
    assert_eq!(r.w.sreg[7], 142, "v_readlane_b32 ignores EXEC");
    r.ok(&vop3(0x28a, 1, [int(-1), int(3), 0], PLAIN));
    assert_eq!(
        r.w.lane(1, 3),
        u32::MAX,
        "v_writelane_b32 writes an inactive lane"
    );
    r.w.set_exec(u64::MAX);
    r.ok(&vop3(0x28c, 2, [int(-1), int(0), 0], PLAIN));
    r.ok(&vop3(0x28d, 2, [int(-1), v(2), 0], PLAIN));
    for l in 0..64 {
        assert_eq!(r.w.lane(2, l), l as u32, "v_mbcnt_lo/hi give the lane id");
    }
}

#[test]
fn dpp_row_shift_quad_perm_and_broadcast() {
    let mut r = Rig::new(Target::Gfx90a);
    r.set_v(1, |l| 1000 + l as u32);
    r.set_v(2, |_| 5);
    r.set_v(0, |_| SENTINEL);
    // v_mov_b32_dpp v0, v1 row_shr:1 bound_ctrl:0 (out-of-row lanes read 0)
    r.ok(&[0x7e00_02fa, 0xff09_1101]);
    for l in 0..64 {
        assert_eq!(
            r.w.lane(0, l),
            if l % 16 == 0 { 0 } else { 1000 + l as u32 - 1 },
            "row_shr lane {l}"
        );
    }
    // v_add_u32_dpp v0, v1, v2 quad_perm:[3,2,1,0]
    r.ok(&[0x6800_04fa, 0xff00_1b01]);
    for l in 0..64 {
        assert_eq!(
            r.w.lane(0, l),
            1000 + ((l & !3) + 3 - (l & 3)) as u32 + 5,
            "quad_perm lane {l}"
        );
    }
    // v_mov_b32_dpp v0, v1 row_bcast:15 row_mask:0xa: rows 1 and 3 take lane 15 of the row before.
    r.set_v(0, |_| SENTINEL);
    r.ok(&[0x7e00_02fa, 0xaf01_4201]);
    for l in 0..64 {
        let want = match l / 16 {
            1 => 1015,
            3 => 1047,
            _ => SENTINEL,
        };
        assert_eq!(r.w.lane(0, l), want, "row_bcast:15 lane {l}");
    }
}

#[test]
fn sdwa_selects_sources_and_destination() {
    let mut r = Rig::new(Target::Gfx90a);
    r.set_v(1, |l| 0x1122_3344 + l as u32);
    r.set_v(2, |_| 0xabcd_0000);
    r.set_v(0, |_| 0x5555_6666);
    // v_add_u32_sdwa v0, v1, v2 src0_sel:BYTE_1 src1_sel:WORD_1
    r.ok(&[0x6800_04f9, 0x0501_0601]);
    for l in 0..64 {
        assert_eq!(
            r.w.lane(0, l),
            ((0x1122_3344 + l as u32) >> 8 & 0xff) + 0xabcd,
            "sdwa add lane {l}"
        );
    }
    // v_mov_b32_sdwa v0, v1 dst_sel:WORD_1 dst_unused:UNUSED_PRESERVE src0_sel:WORD_0
    r.set_v(0, |_| 0x5555_6666);
    r.ok(&[0x7e00_02f9, 0x0004_1501]);
    for l in 0..64 {
        assert_eq!(
            r.w.lane(0, l),
            ((0x3344 + l as u32) << 16) | 0x6666,
            "sdwa preserve lane {l}"
        );
    }
}

#[test]
fn half_precision_and_packed() {
    use gfx9::fp::{f16_to_f32, f32_to_f16};
    let mut r = Rig::new(Target::Gfx90a);
    let h = [1.0f32, 0.5, -2.0, 65504.0, 1e-7, 3.0];
    r.set_v(1, |l| {
        f32_to_f16(h[l % 6]) as u32 | (f32_to_f16(h[(l + 1) % 6]) as u32) << 16
    });
    r.set_v(2, |l| {
        f32_to_f16(h[(l + 2) % 6]) as u32 | (f32_to_f16(h[(l + 3) % 6]) as u32) << 16
    });
    r.ok(&[vop2(0x1f, 0, v(1), v(2))]);
    // v_pk_add_f16 v3, v1, v2 (op_sel_hi default [1,1])
    r.ok(&[
        (0x1a7 << 23) | (0x0f << 16) | 3,
        v(1) | (v(2) << 9) | (3 << 27),
    ]);
    for l in 0..64 {
        let add = |x: f32, y: f32| f32_to_f16(x + y) as u32;
        assert_eq!(
            r.w.lane(0, l),
            add(h[l % 6], h[(l + 2) % 6]),
            "v_add_f16 lane {l} (high half zeroed)"
        );
        let lo = add(h[l % 6], h[(l + 2) % 6]);
        let hi = add(h[(l + 1) % 6], h[(l + 3) % 6]);
        assert_eq!(r.w.lane(3, l), lo | hi << 16, "v_pk_add_f16 lane {l}");
        let _ = f16_to_f32(0);
    }
}

fn set_f64(r: &mut Rig, reg: usize, f: impl Fn(usize) -> f64) {
    r.set_v(reg, |l| f(l).to_bits() as u32);
    r.set_v(reg + 1, |l| (f(l).to_bits() >> 32) as u32);
}

fn lane_f64(r: &Rig, reg: usize, l: usize) -> u64 {
    r.w.lane(reg, l) as u64 | (r.w.lane(reg + 1, l) as u64) << 32
}

#[test]
fn trig_preop_gives_pieces_of_two_over_pi() {
    // (x, piece, result bits): 53-bit pieces of 2/π = 0.a2f9836e4e441529fc2757d1f534ddc0...,
    // worked out with exact integer arithmetic; the shift grows past exponent 1077 and the
    // scale gains 2^128 from exponent 1968; pieces past the 1201 bits (or below the f64
    // range) are zero.
    let cases: [(f64, u32, u64); 8] = [
        (1.0, 0, 0x3fe4_5f30_6dc9_c882),
        (1.0, 1, 0x3c94_a7f0_9d5f_47d4),
        (-7.5, 2, 0x394a_6ee0_6db1_4acc),
        (1.0, 22, 0),
        (2f64.powi(60), 0, 0x3f87_cc1b_7272_20a9),
        (2f64.powi(60), 3, 0x3591_0e41_07f9_458e),
        (2f64.powi(950), 1, 0x0c81_6ba9_3dd6_3f5e),
        (-3.5, 31, 0),
    ];
    let mut r = Rig::new(Target::Gfx908);
    r.w.set_exec(u64::MAX);
    set_f64(&mut r, 2, |l| cases[l % 8].0);
    r.set_v(4, |l| cases[l % 8].1);
    r.set_v(6, |_| SENTINEL);
    r.set_v(7, |_| SENTINEL);
    r.w.set_exec(EXEC_MASK);
    r.ok(&vop3(0x292, 6, [v(2), v(4), 0], PLAIN));
    for l in 0..64 {
        let want = if (EXEC_MASK >> l) & 1 == 0 {
            (SENTINEL as u64) << 32 | SENTINEL as u64
        } else {
            cases[l % 8].2
        };
        assert_eq!(lane_f64(&r, 6, l), want, "lane {l}: {:?}", cases[l % 8]);
    }
    // The first three pieces add up to 2/π rounded to nearest.
    let sum: f64 = (0..3).map(|k| f64::from_bits(cases[k].2)).sum();
    assert_eq!(sum, std::f64::consts::FRAC_2_PI);
}

/// v_div_fixup's special cases, as the ISA lists them (sign is the XOR of the operands').
fn div_fixup_reference(q: f32, d: f32, n: f32) -> f32 {
    let sign = if d.is_sign_negative() != n.is_sign_negative() {
        -1.0
    } else {
        1.0
    };
    if d.is_nan() || n.is_nan() || (d == 0.0 && n == 0.0) || (d.is_infinite() && n.is_infinite()) {
        f32::NAN
    } else if d == 0.0 || n.is_infinite() {
        sign * f32::INFINITY
    } else if d.is_infinite() || n == 0.0 {
        sign * 0.0
    } else {
        sign * q.abs()
    }
}

#[test]
fn div_fixup_f16_special_cases() {
    use gfx9::fp::{f16_to_f32, f32_to_f16};
    // (quotient, denominator, numerator)
    let cases: [(f32, f32, f32); 10] = [
        (0.75, 2.0, 1.5),
        (0.75, -2.0, 1.5),
        (-0.75, -2.0, -1.5),
        (1.0, 0.0, 0.0),
        (1.0, 0.0, -3.0),
        (1.0, 4.0, f32::INFINITY),
        (1.0, f32::INFINITY, f32::NEG_INFINITY),
        (1.0, f32::NEG_INFINITY, 2.0),
        (1.0, 5.0, -0.0),
        (1.0, f32::NAN, 1.0),
    ];
    let h = |x: f32| f32_to_f16(x) as u32;
    let mut r = Rig::new(Target::Gfx90a);
    r.w.set_exec(u64::MAX);
    r.set_v(1, |l| h(cases[l % 10].0) | 0xabcd << 16);
    r.set_v(2, |l| h(cases[l % 10].1));
    r.set_v(3, |l| h(cases[l % 10].2));
    r.set_v(0, |_| SENTINEL);
    r.w.set_exec(EXEC_MASK);
    r.ok(&vop3(0x207, 0, [v(1), v(2), v(3)], PLAIN));
    for l in 0..64 {
        let got = r.w.lane(0, l);
        if (EXEC_MASK >> l) & 1 == 0 {
            assert_eq!(got, SENTINEL, "inactive lane {l} written");
            continue;
        }
        let (q, d, n) = cases[l % 10];
        let want = div_fixup_reference(q, d, n);
        let got16 = f16_to_f32(got as u16);
        assert!(
            got16.to_bits() == want.to_bits() || (got16.is_nan() && want.is_nan()),
            "lane {l}: v_div_fixup_f16({q}, {d}, {n}) = {got16}, want {want}"
        );
    }
}

/// v_fma_f32 and v_fmac_f32 run as the CPU's FMA instruction where it has one: the result is
/// the exactly rounded a*b+c (one rounding, denormal results kept), NaN in gives NaN out,
/// and EXEC all ones or partial changes which lanes are written, not their values.
#[test]
fn fma_rounds_once_keeps_denormals_and_propagates_nan() {
    let tiny = f32::from_bits(1); // the smallest denormal
    let cases: [(f32, f32, f32); 12] = [
        (1.0 + f32::EPSILON, 1.0 - f32::EPSILON, -1.0), // the product's low bits survive
        (tiny, 0.5, 0.0),                               // rounds to even: 0
        (tiny, 1.5, 0.0),                               // rounds to even: 2 ulp
        (f32::MIN_POSITIVE, 0.5, tiny),                 // denormal result
        (-1e-20, 1e-20, 1e-40),                         // denormal addend dominates
        (f32::MAX, 2.0, -f32::MAX),                     // overflow in the product only
        (f32::NAN, 1.0, 1.0),
        (1.0, f32::NAN, 1.0),
        (1.0, 1.0, f32::NAN),
        (f32::INFINITY, 0.0, 1.0), // invalid: NaN
        (f32::INFINITY, 1.0, f32::NEG_INFINITY),
        (-0.0, 0.0, -0.0),
    ];
    let set = |k: usize| move |l: usize| [cases[l % 12].0, cases[l % 12].1, cases[l % 12].2][k];
    for exec in [u64::MAX, EXEC_MASK] {
        let mut r = Rig::new(Target::Gfx90a);
        r.set_v(1, |l| set(0)(l).to_bits());
        r.set_v(2, |l| set(1)(l).to_bits());
        r.set_v(3, |l| set(2)(l).to_bits());
        r.set_v(0, |_| SENTINEL);
        r.set_v(4, |l| set(2)(l).to_bits());
        r.w.set_exec(exec);
        r.ok(&vop3(0x1cb, 0, [v(1), v(2), v(3)], PLAIN)); // v_fma_f32 v0, v1, v2, v3
        r.ok(&[vop2(0x3b, 4, v(1), v(2))]); // v_fmac_f32 v4, v1, v2
        for l in 0..64 {
            let (a, b, c) = (set(0)(l), set(1)(l), set(2)(l));
            let want = a.mul_add(b, c).to_bits();
            let on = (exec >> l) & 1 == 1;
            for (reg, old) in [(0, SENTINEL), (4, c.to_bits())] {
                let got = r.w.lane(reg, l);
                if !on {
                    assert_eq!(
                        got, old,
                        "exec {exec:#x}: inactive lane {l} of v{reg} written"
                    );
                } else if f32::from_bits(want).is_nan() {
                    assert!(
                        f32::from_bits(got).is_nan(),
                        "lane {l} v{reg}: {got:#x} not NaN"
                    );
                } else {
                    assert_eq!(got, want, "lane {l} v{reg}: fma({a:e}, {b:e}, {c:e})");
                }
            }
        }
    }
    // The expectations are those of IEEE fma itself, not only the reference's.
    assert_eq!(tiny.mul_add(0.5, 0.0).to_bits(), 0);
    assert_eq!(tiny.mul_add(1.5, 0.0).to_bits(), 2);
    assert_eq!(f32::MIN_POSITIVE.mul_add(0.5, tiny).to_bits(), 0x0040_0001);
}

/// The f16 nearest to `x` (ties to even), by search: independent of the engine's rounding.
fn nearest_f16(x: f64) -> u32 {
    use gfx9::fp::{f16_to_f32, f32_to_f16};
    let guess = f32_to_f16(x as f32);
    let cands = [guess.wrapping_sub(1), guess, guess.wrapping_add(1)];
    let dist = |h: u16| (f16_to_f32(h) as f64 - x).abs();
    let best = cands
        .into_iter()
        .filter(|&h| h & 0x7c00 != 0x7c00 || h & 0x3ff == 0)
        .min_by(|&a, &b| {
            dist(a)
                .partial_cmp(&dist(b))
                .unwrap()
                .then((a & 1).cmp(&(b & 1)))
        })
        .unwrap();
    best as u32
}

#[test]
fn fma_mix_and_dot2_f16_select_halves_and_round_once() {
    use gfx9::fp::{f16_to_f32, f32_to_f16};
    let h = [1.5f32, -0.25, 3.0, 0.0009765625, -7.5, 2.0, 0.1];
    let f16 = |k: usize| f32_to_f16(h[k % h.len()]) as u32;
    let lo_hi = |v: u32| {
        (
            f16_to_f32(v as u16) as f64,
            f16_to_f32((v >> 16) as u16) as f64,
        )
    };
    for t in [Target::Gfx908, Target::Gfx90a] {
        let mut r = Rig::new(t);
        r.set_v(1, |l| f16(l) | f16(l + 1) << 16);
        r.set_v(2, |l| f16(l + 2) | f16(l + 3) << 16);
        r.set_v(5, |l| (0.375f32 * l as f32 - 5.0).to_bits());
        r.set_v(6, |_| 0xabcd_1234);
        r.set_v(9, |l| (l as f32 * 0.5).to_bits());
        // Encodings from llvm-mc-15 -mcpu=gfx908.
        r.ok(&[0xd3a00004, 0x1c160501]); // v_fma_mix_f32 v4, v1, v2, v5 op_sel_hi:[1,1,0]
        let v4_plain: Vec<u32> = (0..64).map(|l| r.w.lane(4, l)).collect();
        // v_fma_mix_f32 v4, v1, -v2, v5 op_sel:[1,0,0] op_sel_hi:[1,1,0]
        r.ok(&[0xd3a00804, 0x5c160501]);
        for (l, &plain) in v4_plain.iter().enumerate() {
            let ((a0, a1), (b0, _)) = (lo_hi(r.w.lane(1, l)), lo_hi(r.w.lane(2, l)));
            let c = f32::from_bits(r.w.lane(5, l)) as f64;
            let f32b = |x: f64| (x as f32).to_bits();
            assert_eq!(plain, f32b(a0 * b0 + c), "mix lane {l}");
            assert_eq!(r.w.lane(4, l), f32b(a1 * -b0 + c), "mix op_sel lane {l}");
        }
        r.ok(&[
            0xd3a00104, 0x0c160501, // v_fma_mix_f32 v4, |v1|, v2, v5 op_sel_hi:[1,0,0]
            0xd3a18006, 0x1c160501, // v_fma_mixlo_f16 v6, v1, v2, v5 op_sel_hi:[1,1,0] clamp
            0xd3a34007, 0x1c160501, // v_dot2_f32_f16 v7, v1, v2, v5
            0x6e120501, // v_dot2c_f32_f16 v9, v1, v2
        ]);
        for l in 0..64 {
            let ((a0, a1), (b0, b1)) = (lo_hi(r.w.lane(1, l)), lo_hi(r.w.lane(2, l)));
            let c = f32::from_bits(r.w.lane(5, l)) as f64;
            let b32 = f32::from_bits(r.w.lane(2, l)) as f64;
            let want = ((a0.abs() * b32 + c) as f32).to_bits();
            assert_eq!(r.w.lane(4, l), want, "|a| f32 b lane {l}");
            let mixlo = nearest_f16((a0 * b0 + c).clamp(0.0, 1.0));
            assert_eq!(r.w.lane(6, l), 0xabcd_0000 | mixlo, "mixlo clamp lane {l}");
            let dot = (a0 * b0 + a1 * b1 + c) as f32;
            assert_eq!(r.w.lane(7, l), dot.to_bits(), "dot2 lane {l}");
            let acc = (a0 * b0 + a1 * b1 + l as f64 * 0.5) as f32;
            assert_eq!(r.w.lane(9, l), acc.to_bits(), "dot2c lane {l}");
        }
        r.ok(&[
            0xd3a20006, 0x1c160501, // v_fma_mixhi_f16 v6, v1, v2, v5 op_sel_hi:[1,1,0]
            0xd3a34807,
            0x54160501, // v_dot2_f32_f16 v7, v1, v2, v5 op_sel:[1,0,0] op_sel_hi:[0,1,1] neg_lo:[0,1,0]
        ]);
        for l in 0..64 {
            let ((a0, a1), (b0, b1)) = (lo_hi(r.w.lane(1, l)), lo_hi(r.w.lane(2, l)));
            let c = f32::from_bits(r.w.lane(5, l)) as f64;
            let lo = nearest_f16((a0 * b0 + c).clamp(0.0, 1.0));
            assert_eq!(
                r.w.lane(6, l),
                nearest_f16(a0 * b0 + c) << 16 | lo,
                "mixhi lane {l}"
            );
            // First elements: a's high half (op_sel), -b's low; second: a's low half
            // (op_sel_hi 0), b's high half.
            let dot = (a1 * -b0 + a0 * b1 + c) as f32;
            assert_eq!(r.w.lane(7, l), dot.to_bits(), "dot2 op_sel lane {l}");
        }
    }
}

#[test]
fn integer_dots_wrap_saturate_and_accumulate() {
    let bytes = [0x80u8, 0x7f, 0xff, 0x01, 0x00, 0x40, 0xc0, 0x33];
    let word = |k: usize| u32::from_le_bytes(std::array::from_fn(|j| bytes[(k + j * 3) % 8]));
    for t in [Target::Gfx908, Target::Gfx90a] {
        let mut r = Rig::new(t);
        r.set_v(1, word);
        r.set_v(2, |l| word(l + 5));
        r.set_v(5, |l| [0, 1, 0x7fff_fff0, 0x8000_0005, 0xffff_fff0][l % 5]);
        r.set_v(9, |l| l as u32 * 1000);
        r.ok(&[
            0xd3a84008, 0x1c160501, // v_dot4_i32_i8 v8, v1, v2, v5
            0xd3a9c00a, 0x1c160501, // v_dot4_u32_u8 v10, v1, v2, v5 clamp
            0xd3aa400b, 0x1c160501, // v_dot8_i32_i4 v11, v1, v2, v5
            0xd3a6400c, 0x1c160501, // v_dot2_i32_i16 v12, v1, v2, v5
            0x72120501, // v_dot4c_i32_i8 v9, v1, v2
        ]);
        for l in 0..64 {
            let (a, b, c) = (r.w.lane(1, l), r.w.lane(2, l), r.w.lane(5, l));
            let els = |v: u32, bits: u32, signed: bool| -> Vec<i64> {
                (0..32 / bits)
                    .map(|k| {
                        let x = (v >> (k * bits)) & (((1u64 << bits) - 1) as u32);
                        if signed && x >> (bits - 1) != 0 {
                            x as i64 - (1i64 << bits)
                        } else {
                            x as i64
                        }
                    })
                    .collect()
            };
            let dot = |bits, signed| -> i64 {
                els(a, bits, signed)
                    .iter()
                    .zip(els(b, bits, signed))
                    .map(|(x, y)| x * y)
                    .sum()
            };
            let want = (dot(8, true) + c as i32 as i64) as u32;
            assert_eq!(r.w.lane(8, l), want, "dot4_i32_i8 lane {l}");
            let u = (dot(8, false) + c as i64).min(u32::MAX as i64) as u32;
            assert_eq!(r.w.lane(10, l), u, "dot4_u32_u8 clamp lane {l}");
            assert_eq!(
                r.w.lane(11, l),
                (dot(4, true) + c as i32 as i64) as u32,
                "dot8 lane {l}"
            );
            assert_eq!(
                r.w.lane(12, l),
                (dot(16, true) + c as i32 as i64) as u32,
                "dot2 lane {l}"
            );
            assert_eq!(
                r.w.lane(9, l),
                (dot(8, true) + l as i64 * 1000) as u32,
                "dot4c lane {l}"
            );
        }
    }
}

/// A wave's lane operations count the lanes EXEC enables in each vector instruction and
/// nothing for scalar ones (the rate `make bench` prints per core).
#[test]
fn lane_operations_count_exec_lanes_of_vector_instructions() {
    const V_ADD_U32: u32 = 0x34;
    const S_MOV_B32: u32 = 0x00;
    let mut r = Rig::new(Target::Gfx90a);
    r.w.set_exec(EXEC_MASK);
    r.ok(&[
        vop2(V_ADD_U32, 1, 256 + 2, 256 + 3),
        sop1(S_MOV_B32, 0, 0x80),
        vop2(V_ADD_U32, 4, 256 + 1, 256 + 1),
    ]);
    assert_eq!(r.w.retired, 4, "two VALU, one SALU, s_endpgm");
    assert_eq!(r.w.lanes, 2 * EXEC_MASK.count_ones() as u64);
}
