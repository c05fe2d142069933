//! gfx942's fp8/bf8 conversions and its new MFMA forms (xf32, 8-bit-per-lane i8, fp8/bf8)
//! against plain Rust references: the formats decoded from their
//! definitions (E4M3FNUZ, E5M2FNUZ), rounding to nearest even by searching all 255 codes
//! for the nearest value, stochastic rounding by its bounds and its mean, and matrix
//! products summed in f64 (inputs small enough that every partial sum is exact).

mod common;
use common::*;
use gfx9::exec::{Illegal, Stop};
use gfx9::Target::{self, Gfx942};

/// (mantissa bits, bias, opcode suffix) of fp8 and bf8.
const FP8: (i32, i32) = (3, 8);
const BF8: (i32, i32) = (2, 16);

/// The value of code `c`, `None` for the NaN 0x80.
fn value(c: u8, (mb, bias): (i32, i32)) -> Option<f64> {
    if c == 0x80 {
        return None;
    }
    let (e, m) = (((c & 0x7f) >> mb) as i32, (c as i32) & ((1 << mb) - 1));
    let v = if e == 0 {
        m as f64 * 2f64.powi(1 - bias - mb)
    } else {
        (1.0 + m as f64 / (1 << mb) as f64) * 2f64.powi(e - bias)
    };
    Some(if c & 0x80 != 0 { -v } else { v })
}

/// Round to nearest even by search: NaN, infinities and values above the largest give 0x80.
fn nearest(x: f32, fmt: (i32, i32)) -> u8 {
    let max = value(0x7f, fmt).unwrap();
    if !x.is_finite() || (x as f64).abs() > max {
        return 0x80;
    }
    let mut best = 0u8;
    for c in 0..=255u8 {
        let Some(v) = value(c, fmt) else { continue };
        let (d, db) = (
            (v - x as f64).abs(),
            (value(best, fmt).unwrap() - x as f64).abs(),
        );
        if d < db || (d == db && c & 1 == 0 && best & 1 == 1) {
            best = c;
        }
    }
    if value(best, fmt) == Some(0.0) {
        0
    } else {
        best
    }
}

/// Inputs: every code's value, the midpoints between neighbours and one f32 ulp either side,
/// the range's edges, specials, f32 denormals and a spread of random values.
fn inputs(fmt: (i32, i32)) -> Vec<f32> {
    let mut vals: Vec<f64> = (0..=255u8).filter_map(|c| value(c, fmt)).collect();
    vals.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mut out: Vec<f32> = Vec::new();
    for w in vals.windows(2) {
        let mid = ((w[0] + w[1]) / 2.0) as f32;
        out.extend([w[0] as f32, mid, f32::from_bits(mid.to_bits() + 1)]);
        if mid != 0.0 {
            out.push(f32::from_bits(mid.to_bits() - 1));
        }
    }
    let max = value(0x7f, fmt).unwrap() as f32;
    out.extend([max, -max, max * 1.0001, -max * 1.03, 1e30, f32::INFINITY]);
    out.extend([
        f32::NEG_INFINITY,
        f32::NAN,
        -0.0,
        0.0,
        f32::from_bits(1),
        -1e-30,
    ]);
    let mut s = 0x1234_5678u32;
    for _ in 0..2000 {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        // Exponents 2^-24 .. 2^16, any mantissa, either sign.
        let e = 103 + (s >> 8) % 40;
        out.push(f32::from_bits(
            (s & 0x8000_0000) | e << 23 | (s & 0x7f_ffff),
        ));
    }
    out
}

/// The representable values either side of `x` (toward zero first).
fn neighbours(x: f32, fmt: (i32, i32)) -> (f32, f32) {
    let mut vals: Vec<f64> = (0..=127u8).filter_map(|c| value(c, fmt)).collect();
    vals.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let a = x.abs() as f64;
    let k = vals.iter().rposition(|&v| v <= a).unwrap();
    (
        (vals[k] as f32).copysign(x),
        (vals[k + 1] as f32).copysign(x),
    )
}

fn vop3_opsel(op: u32, d: u32, s: [u32; 3], op_sel: u32, neg: u32) -> [u32; 2] {
    let mut w = vop3(op, d, s, (0, neg, false, 0));
    w[0] |= op_sel << 11;
    w
}

#[test]
fn cvt_pk_fp8_bf8_round_to_nearest_even_and_keep_the_other_word() {
    for (op, fmt) in [(0x2a2, FP8), (0x2a3, BF8)] {
        let xs = inputs(fmt);
        for chunk in xs.chunks(128) {
            let mut r = Rig::new(Gfx942);
            r.set_v(1, |l| chunk.get(2 * l).unwrap_or(&0.0).to_bits());
            r.set_v(2, |l| chunk.get(2 * l + 1).unwrap_or(&0.0).to_bits());
            r.set_v(3, |_| 0xdead_beef);
            r.set_v(4, |_| 0xdead_beef);
            r.ok(&vop3_opsel(op, 3, [v(1), v(2), 0], 0, 0));
            r.ok(&vop3_opsel(op, 4, [v(1), v(2), 0], 8, 0));
            for l in 0..64 {
                let (a, b) = (r.w.lane(1, l), r.w.lane(2, l));
                let want = nearest(f32::from_bits(a), fmt) as u32
                    | (nearest(f32::from_bits(b), fmt) as u32) << 8;
                assert_eq!(
                    r.w.lane(3, l),
                    0xdead_0000 | want,
                    "{op:#x} low word of {a:#x}, {b:#x}"
                );
                assert_eq!(
                    r.w.lane(4, l),
                    want << 16 | 0xbeef,
                    "{op:#x} high word of {a:#x}, {b:#x}"
                );
            }
        }
    }
    // -|x| through the input modifiers: v_cvt_pk_fp8_f32 v5, -v1, |v2| (neg bit 0, abs bit 1).
    let mut r = Rig::new(Gfx942);
    r.set_v(1, |_| 1.5f32.to_bits());
    r.set_v(2, |_| (-3.0f32).to_bits());
    let mut w = vop3_opsel(0x2a2, 5, [v(1), v(2), 0], 0, 1);
    w[0] |= 2 << 8;
    r.ok(&w);
    assert_eq!(
        r.w.lane(5, 0),
        nearest(-1.5, FP8) as u32 | (nearest(3.0, FP8) as u32) << 8
    );
}

#[test]
fn cvt_f32_fp8_bf8_decode_every_code_by_byte_and_word_select() {
    for (op, pk_op, fmt) in [(0x54, 0x56, FP8), (0x55, 0x57, BF8)] {
        for sel in 0..4u32 {
            let mut r = Rig::new(Gfx942);
            // Lane l's four bytes: codes 4l .. 4l+3.
            r.set_v(2, |l| {
                u32::from_le_bytes([0, 1, 2, 3].map(|k| (4 * l + k) as u8))
            });
            // SDWA: src0 v2, dst_sel DWORD, src0_sel BYTE_sel.
            r.ok(&[vop1(op, 1, 0xf9), 2 | 6 << 8 | sel << 16]);
            r.ok(&[vop1(pk_op, 6, 0xf9), 2 | 6 << 8 | (4 + sel / 2) << 16]);
            for l in 0..64 {
                let code = |k: u32| (4 * l as u32 + k) as u8;
                let want = |c: u8| value(c, fmt).map_or(0x7fc0_0000, |v| (v as f32).to_bits());
                assert_eq!(
                    r.w.lane(1, l),
                    want(code(sel)),
                    "{op:#x} byte {sel} lane {l}"
                );
                let w0 = 2 * (sel / 2);
                assert_eq!(
                    r.w.lane(6, l),
                    want(code(w0)),
                    "{pk_op:#x} word {sel} lane {l}"
                );
                assert_eq!(
                    r.w.lane(7, l),
                    want(code(w0 + 1)),
                    "{pk_op:#x} word {sel} lane {l}"
                );
            }
        }
        // The plain VOP1 form reads byte 0 (and 1).
        let mut r = Rig::new(Gfx942);
        r.set_v(2, |_| 0x0000_3c38);
        r.ok(&[vop1(op, 1, v(2))]);
        assert_eq!(r.w.lane(1, 5), (value(0x38, fmt).unwrap() as f32).to_bits());
    }
}

#[test]
fn cvt_sr_rounds_between_neighbours_with_the_right_odds() {
    for (op, fmt) in [(0x2a4, FP8), (0x2a5, BF8)] {
        let kept = 23 - fmt.0 as u32;
        for x in [1.3f32, -100.0, 0.3, -0.0071] {
            let (lo, hi) = neighbours(x, fmt);
            let (clo, chi) = (nearest(lo, fmt), nearest(hi, fmt));
            let mut ups = 0;
            for round in 0..64u32 {
                let mut r = Rig::new(Gfx942);
                r.set_v(1, |_| x.to_bits());
                r.set_v(2, |l| (round * 64 + l as u32).wrapping_mul(0x9e37_79b9));
                r.set_v(3, |_| 0x1122_3344);
                // Byte 2: op_sel[3:2] = 2.
                r.ok(&vop3_opsel(op, 3, [v(1), v(2), 0], 8, 0));
                for l in 0..64 {
                    let got = r.w.lane(3, l);
                    assert_eq!(got & 0xff00_ffff, 0x1100_3344, "{op:#x}: other bytes kept");
                    let c = (got >> 16) as u8;
                    assert!(
                        c == clo || c == chi,
                        "{op:#x} {x}: code {c:#x} not {clo:#x}/{chi:#x}"
                    );
                    ups += (c == chi) as u32;
                }
            }
            let p = ((x - lo) / (hi - lo)) as f64;
            let got = ups as f64 / 4096.0;
            assert!((got - p).abs() < 0.03, "{op:#x} {x}: away {got}, want {p}");
            // Zero random bits truncate; all ones round anything inexact away.
            for (seed, want) in [(0u32, clo), ((1 << kept) - 1, chi)] {
                let mut r = Rig::new(Gfx942);
                r.set_v(1, |_| x.to_bits());
                r.set_v(2, |_| seed);
                r.ok(&vop3_opsel(op, 3, [v(1), v(2), 0], 0, 0));
                assert_eq!(r.w.lane(3, 0) as u8, want, "{op:#x} {x} seed {seed:#x}");
            }
        }
        // Exact values, NaN and overflow do not depend on the bits.
        for (x, want) in [(1.5f32, nearest(1.5, fmt)), (f32::NAN, 0x80), (1e9, 0x80)] {
            let mut r = Rig::new(Gfx942);
            r.set_v(1, |_| x.to_bits());
            r.set_v(2, |l| (l as u32).wrapping_mul(0x9e37_79b9));
            r.ok(&vop3_opsel(op, 3, [v(1), v(2), 0], 0, 0));
            assert!((0..64).all(|l| r.w.lane(3, l) as u8 == want), "{op:#x} {x}");
        }
    }
}

#[test]
fn conversions_are_illegal_before_gfx942() {
    for t in [Target::Gfx908, Target::Gfx90a] {
        let mut r = Rig::new(t);
        for code in [
            vec![vop1(0x54, 1, v(2))],
            vop3(0x2a2, 1, [v(1), v(2), 0], PLAIN).to_vec(),
        ] {
            assert!(
                matches!(
                    r.run(&code),
                    Stop::Illegal {
                        reason: Illegal::UnknownOpcode { .. },
                        ..
                    }
                ),
                "{t:?} {code:08x?}"
            );
        }
    }
}

/// One dense gfx942 MFMA: n x n output, k-groups, elements per lane, and how to pack them.
struct Form {
    op: u32,
    name: &'static str,
    n: usize,
    groups: usize,
    per: usize,
    a: Elem,
    b: Elem,
}

#[derive(Clone, Copy, PartialEq)]
enum Elem {
    Fp8,
    Bf8,
    I8,
    Xf32,
}

impl Elem {
    /// Packs small values (each exactly representable) into two registers; for xf32 the
    /// low 13 bits are filled with noise the hardware drops.
    fn pack(self, vals: &[f64]) -> [u32; 2] {
        let mut r = [0u32; 2];
        for (e, &x) in vals.iter().enumerate() {
            match self {
                Elem::Fp8 | Elem::Bf8 => {
                    let fmt = if self == Elem::Fp8 { FP8 } else { BF8 };
                    let c = nearest(x as f32, fmt);
                    assert_eq!(
                        value(c, fmt),
                        Some(x),
                        "{x} is no {}",
                        ["fp8", "bf8"][(self == Elem::Bf8) as usize]
                    );
                    r[e / 4] |= (c as u32) << (8 * (e % 4));
                }
                Elem::I8 => r[e / 4] |= (x as i8 as u8 as u32) << (8 * (e % 4)),
                Elem::Xf32 => r[e] = (x as f32).to_bits() | (0x1357 + e as u32 * 0x0a0a) & 0x1fff,
            }
        }
        r
    }
}

/// The C/D layout of the dense f32 forms: what register `q`, lane `l` holds.
fn cd_element(n: usize, q: usize, l: usize) -> (usize, usize) {
    let groups = 64 / n;
    (q % 4 + 4 * (l / n) + 4 * groups * (q / 4), l % n)
}

fn mai(op: u32, neg: u32) -> [u32; 2] {
    // vdst a0 (ACC_CD), A v[10:11], B v[20:21], C a0.
    [
        (0x1a7 << 23) | (op << 16) | (1 << 15),
        v(10) | v(20) << 9 | v(0) << 18 | neg << 29,
    ]
}

fn check(f: &Form) {
    let k = f.groups * f.per;
    let int = f.a == Elem::I8;
    let small = |e: Elem, x: usize| -> f64 {
        match e {
            Elem::I8 => [-128.0, 127.0, -3.0, 5.0, 0.0, 1.0, -1.0][x % 7],
            Elem::Bf8 => [0.5, -1.5, 2.0, -0.25, 3.0, 0.0][x % 6],
            _ => [0.5, -1.5, 2.0, -0.25, 3.0, 0.0, 1.25][x % 7],
        }
    };
    let a_val = |i: usize, kk: usize| small(f.a, i * 3 + kk * 5);
    let b_val = |kk: usize, j: usize| small(f.b, kk * 2 + j * 7 + 1);
    let c_val = |i: usize, j: usize| ((i * 11 + j * 13) % 17) as f64 - 8.0;
    let mut r = Rig::new(Gfx942);
    for l in 0..64 {
        let (row, g) = (l % f.n, l / f.n);
        let ks = (0..f.per).map(|e| g * f.per + e);
        let pa =
            f.a.pack(&ks.clone().map(|kk| a_val(row, kk)).collect::<Vec<_>>());
        let pb = f.b.pack(&ks.map(|kk| b_val(kk, row)).collect::<Vec<_>>());
        for q in 0..2 {
            r.w.set_lane(10 + q, l, pa[q]);
            r.w.set_lane(20 + q, l, pb[q]);
        }
    }
    let enc = |x: f64| {
        if int {
            x as i32 as u32
        } else {
            (x as f32).to_bits()
        }
    };
    let nout = f.n * f.n / 64;
    for q in 0..nout {
        for l in 0..64 {
            let (i, j) = cd_element(f.n, q, l);
            r.w.a_mut(q)[l] = enc(c_val(i, j));
        }
    }
    r.w.set_exec(u64::MAX);
    r.ok(&mai(f.op, 0));
    for q in 0..nout {
        for l in 0..64 {
            let (i, j) = cd_element(f.n, q, l);
            let want = c_val(i, j) + (0..k).map(|kk| a_val(i, kk) * b_val(kk, j)).sum::<f64>();
            assert_eq!(
                r.w.a(q)[l],
                enc(want),
                "{}: register {q} lane {l} = D[{i}][{j}]",
                f.name
            );
        }
    }
}

#[test]
fn new_dense_mfma_forms_match_matrix_multiply() {
    use Elem::*;
    let forms = [
        Form {
            op: 0x3e,
            name: "v_mfma_f32_16x16x8_xf32",
            n: 16,
            groups: 4,
            per: 2,
            a: Xf32,
            b: Xf32,
        },
        Form {
            op: 0x3f,
            name: "v_mfma_f32_32x32x4_xf32",
            n: 32,
            groups: 2,
            per: 2,
            a: Xf32,
            b: Xf32,
        },
        Form {
            op: 0x56,
            name: "v_mfma_i32_32x32x16_i8",
            n: 32,
            groups: 2,
            per: 8,
            a: I8,
            b: I8,
        },
        Form {
            op: 0x57,
            name: "v_mfma_i32_16x16x32_i8",
            n: 16,
            groups: 4,
            per: 8,
            a: I8,
            b: I8,
        },
        Form {
            op: 0x70,
            name: "v_mfma_f32_16x16x32_bf8_bf8",
            n: 16,
            groups: 4,
            per: 8,
            a: Bf8,
            b: Bf8,
        },
        Form {
            op: 0x71,
            name: "v_mfma_f32_16x16x32_bf8_fp8",
            n: 16,
            groups: 4,
            per: 8,
            a: Bf8,
            b: Fp8,
        },
        Form {
            op: 0x72,
            name: "v_mfma_f32_16x16x32_fp8_bf8",
            n: 16,
            groups: 4,
            per: 8,
            a: Fp8,
            b: Bf8,
        },
        Form {
            op: 0x73,
            name: "v_mfma_f32_16x16x32_fp8_fp8",
            n: 16,
            groups: 4,
            per: 8,
            a: Fp8,
            b: Fp8,
        },
        Form {
            op: 0x74,
            name: "v_mfma_f32_32x32x16_bf8_bf8",
            n: 32,
            groups: 2,
            per: 8,
            a: Bf8,
            b: Bf8,
        },
        Form {
            op: 0x75,
            name: "v_mfma_f32_32x32x16_bf8_fp8",
            n: 32,
            groups: 2,
            per: 8,
            a: Bf8,
            b: Fp8,
        },
        Form {
            op: 0x76,
            name: "v_mfma_f32_32x32x16_fp8_bf8",
            n: 32,
            groups: 2,
            per: 8,
            a: Fp8,
            b: Bf8,
        },
        Form {
            op: 0x77,
            name: "v_mfma_f32_32x32x16_fp8_fp8",
            n: 32,
            groups: 2,
            per: 8,
            a: Fp8,
            b: Fp8,
        },
    ];
    for f in &forms {
        check(f);
    }
}

#[test]
fn fp8_nan_in_a_product_gives_nan() {
    // A = fp8 NaN (0x80) in lane 0's first element: row 0 of D is NaN, the rest finite.
    let mut r = Rig::new(Gfx942);
    r.set_v(10, |l| if l == 0 { 0x80 } else { 0x38 }); // 0x38 = 1.0
    r.set_v(11, |_| 0x3838_3838);
    r.set_v(20, |_| 0x3838_3838);
    r.set_v(21, |_| 0x3838_3838);
    for q in 0..4 {
        r.w.a_mut(q).fill(0);
    }
    r.ok(&mai(0x73, 0));
    for q in 0..4 {
        for l in 0..64 {
            let (i, _) = cd_element(16, q, l);
            let d = f32::from_bits(r.w.a(q)[l]);
            assert_eq!(d.is_nan(), i == 0, "register {q} lane {l}: {d}");
        }
    }
}
