//! The f64 MFMA forms of gfx90a and gfx942 against a plain Rust matrix multiply. The
//! reference reads the operand layouts register by register and lane by lane (what lane l
//! of a register pair holds, as AMD's matrix-cores lab notes give it), the inverse of the
//! engine's element-to-location mapping, and accumulates C + A[i][0]*B[0][j] + ... in k
//! order, each product fused into the running sum: the engine's documented order. Dyadic
//! values keep every partial sum exact; the edge cases check NaN, infinities, overflow and
//! denormals (kept, not flushed).

mod common;
use common::*;
use gfx9::exec::Stop;
use gfx9::Target;

/// One f64 form: opcode, name, output n x n, blocks.
struct Form {
    op: u32,
    name: &'static str,
    n: usize,
    blocks: usize,
}

const F16X16: Form = Form {
    op: 0x6e,
    name: "v_mfma_f64_16x16x4f64",
    n: 16,
    blocks: 1,
};
const F4X4: Form = Form {
    op: 0x6f,
    name: "v_mfma_f64_4x4x4f64",
    n: 4,
    blocks: 4,
};
const K: usize = 4;

/// What lane `l` of A (or B) holds: (block, row of A / column of B, k).
fn ab_element(f: &Form, l: usize) -> (usize, usize, usize) {
    if f.n == 4 {
        (l / 4 % 4, l % 4, l / 16)
    } else {
        (0, l % 16, l / 16)
    }
}

/// What register pair `r`, lane `l` of C and D hold: (block, i, j).
fn cd_element(f: &Form, r: usize, l: usize) -> (usize, usize, usize) {
    if f.n == 4 {
        (l / 4 % 4, l / 16, l % 4)
    } else {
        (0, 4 * r + l / 16, l % 16)
    }
}

fn pairs_out(f: &Form) -> usize {
    f.blocks * f.n * f.n / 64
}

fn mai(op: u32, vdst: u32, acc_cd: bool, src: [u32; 3]) -> [u32; 2] {
    [
        (0x1a7 << 23) | (op << 16) | ((acc_cd as u32) << 15) | vdst,
        src[0] | src[1] << 9 | src[2] << 18,
    ]
}

fn set_pair(r: &mut Rig, acc: bool, reg: usize, l: usize, x: f64) {
    let (lo, hi) = (x.to_bits() as u32, (x.to_bits() >> 32) as u32);
    if acc {
        r.w.a_mut(reg)[l] = lo;
        r.w.a_mut(reg + 1)[l] = hi;
    } else {
        r.w.set_lane(reg, l, lo);
        r.w.set_lane(reg + 1, l, hi);
    }
}

fn get_pair(r: &Rig, acc: bool, reg: usize, l: usize) -> f64 {
    let (lo, hi) = if acc {
        (r.w.a(reg)[l], r.w.a(reg + 1)[l])
    } else {
        (r.w.lane(reg, l), r.w.lane(reg + 1, l))
    };
    f64::from_bits(lo as u64 | (hi as u64) << 32)
}

/// Values of A[b][i][k], B[b][k][j] and C[b][i][j].
struct Values<'a> {
    a: &'a dyn Fn(usize, usize, usize) -> f64,
    b: &'a dyn Fn(usize, usize, usize) -> f64,
    c: &'a dyn Fn(usize, usize, usize) -> f64,
}

/// Runs form `f` on `t` with A in v[10:11], B in v[20:21] and C/D in AccVGPRs a[0..] (or
/// VGPRs v[100..] with `acc_cd` clear), then compares D with the reference.
fn check(f: &Form, t: Target, acc_cd: bool, vals: &Values<'_>) {
    let mut r = Rig::new(t);
    for l in 0..64 {
        let (b, i, k) = ab_element(f, l);
        set_pair(&mut r, false, 10, l, (vals.a)(b, i, k));
        set_pair(&mut r, false, 20, l, (vals.b)(b, k, i));
    }
    let base = if acc_cd { 0 } else { 100 };
    for p in 0..pairs_out(f) {
        for l in 0..64 {
            let (b, i, j) = cd_element(f, p, l);
            set_pair(&mut r, acc_cd, base + 2 * p, l, (vals.c)(b, i, j));
        }
    }
    r.w.set_exec(u64::MAX);
    r.ok(&mai(
        f.op,
        base as u32,
        acc_cd,
        [v(10), v(20), v(base as u32)],
    ));
    for p in 0..pairs_out(f) {
        for l in 0..64 {
            let (b, i, j) = cd_element(f, p, l);
            let want = (0..K).fold((vals.c)(b, i, j), |s, k| {
                (vals.a)(b, i, k).mul_add((vals.b)(b, k, j), s)
            });
            let got = get_pair(&r, acc_cd, base + 2 * p, l);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{} on {t:?}: pair {p} lane {l} = D[{b}][{i}][{j}]: got {got:e}, want {want:e}",
                f.name
            );
        }
    }
}

fn dyadic() -> Values<'static> {
    Values {
        a: &|b, i, k| ((b * 7 + i * 3 + k * 5) % 9) as f64 / 8.0 - 0.5,
        b: &|b, k, j| ((b * 5 + k * 2 + j * 7) % 7) as f64 * 0.25 - 0.75,
        c: &|b, i, j| ((b + i * 11 + j * 13) % 17) as f64 * 1024.0 - 8192.0,
    }
}

#[test]
fn f64_mfma_matches_matrix_multiply() {
    for t in [Target::Gfx90a, Target::Gfx942] {
        for f in [&F16X16, &F4X4] {
            check(f, t, true, &dyadic());
            check(f, t, false, &dyadic());
        }
    }
}

#[test]
fn f64_mfma_edges_nan_inf_overflow_denormal() {
    let tiny = f64::from_bits(1); // the smallest denormal
    let a = |_b: usize, i: usize, k: usize| match (i, k) {
        (1, 0) => f64::INFINITY,
        (2, 1) => f64::NAN,
        (3, _) => 1e308,
        (4, 2) => tiny,
        (5, 3) => -0.0,
        _ => (i + k) as f64 * 0.5,
    };
    let b = |_b: usize, k: usize, j: usize| match (k, j) {
        (0, 2) => 0.0, // inf * 0 = NaN in row 1
        (_, 3) => 4.0, // 1e308 * 4 overflows in row 3
        (2, 5) => 0.5, // a denormal halved rounds to even: 0
        _ => (k as f64 - j as f64) * 0.25,
    };
    let c = |_b: usize, i: usize, j: usize| match (i, j) {
        (0, 0) => f64::NEG_INFINITY,
        (6, 6) => f64::MAX,
        (4, _) => 0.0,
        _ => -((i * j) as f64),
    };
    let vals = Values {
        a: &a,
        b: &b,
        c: &c,
    };
    for t in [Target::Gfx90a, Target::Gfx942] {
        for f in [&F16X16, &F4X4] {
            check(f, t, true, &vals);
        }
    }
    // A denormal times one is kept: D = 0 + tiny * 1 (row 4, k 2, with B = 1 there).
    let b1 = |_b: usize, _k: usize, _j: usize| 1.0;
    let a1 = |_b: usize, i: usize, k: usize| if (i, k) == (4, 2) { tiny } else { 0.0 };
    let zero = |_b: usize, _i: usize, _j: usize| 0.0;
    check(
        &F16X16,
        Target::Gfx90a,
        true,
        &Values {
            a: &a1,
            b: &b1,
            c: &zero,
        },
    );
}

#[test]
fn f64_mfma_takes_c_as_a_64_bit_inline_constant() {
    // A = 0.5, B = 2 everywhere, C = inline 1.0 (code 242): D = 1 + 4 * (0.5 * 2) = 5.
    for t in [Target::Gfx90a, Target::Gfx942] {
        let mut r = Rig::new(t);
        for l in 0..64 {
            set_pair(&mut r, false, 10, l, 0.5);
            set_pair(&mut r, false, 20, l, 2.0);
        }
        r.ok(&mai(F16X16.op, 0, true, [v(10), v(20), 242]));
        for p in 0..4 {
            for l in 0..64 {
                assert_eq!(get_pair(&r, true, 2 * p, l), 5.0, "{t:?} pair {p} lane {l}");
            }
        }
    }
}

#[test]
fn f64_mfma_is_illegal_on_gfx908_and_refuses_partial_exec() {
    let mut r = Rig::new(Target::Gfx908);
    match r.run(&mai(F16X16.op, 0, true, [v(10), v(20), 0x80])) {
        Stop::Illegal { reason, .. } => {
            assert!(reason.to_string().contains("unknown opcode"), "{reason}")
        }
        other => panic!("gfx908 ran v_mfma_f64: {other}"),
    }
    let mut r = Rig::new(Target::Gfx90a);
    r.w.set_exec(u64::MAX >> 1);
    match r.run(&mai(F4X4.op, 0, true, [v(10), v(20), 0x80])) {
        Stop::Illegal { reason, .. } => {
            assert_eq!(reason.to_string(), "v_mfma: partial EXEC is not modelled")
        }
        other => panic!("partial EXEC gave {other}"),
    }
}

#[test]
fn f64_mfma_negates_a_b_c_on_gfx942_only() {
    // v_mfma_f64_4x4x4_4b_f64 with A = 1.5, B = 2, C = 10: BLGP's bits (A, B, C) negate.
    for neg in 0..8u32 {
        let mut r = Rig::new(Target::Gfx942);
        for l in 0..64 {
            set_pair(&mut r, false, 10, l, 1.5);
            set_pair(&mut r, false, 20, l, 2.0);
            set_pair(&mut r, true, 0, l, 10.0);
        }
        let mut w = mai(F4X4.op, 0, true, [v(10), v(20), v(0)]);
        w[1] |= neg << 29;
        r.ok(&w);
        let s = |bit: u32| if neg & bit != 0 { -1.0 } else { 1.0 };
        let want = s(4) * 10.0 + 4.0 * (s(1) * 1.5) * (s(2) * 2.0);
        for l in 0..64 {
            assert_eq!(get_pair(&r, true, 0, l), want, "neg {neg:03b} lane {l}");
        }
    }
    let mut r = Rig::new(Target::Gfx90a);
    let mut w = mai(F4X4.op, 0, true, [v(10), v(20), v(0)]);
    w[1] |= 1 << 29;
    match r.run(&w) {
        Stop::Illegal { reason, .. } => {
            assert_eq!(
                reason.to_string(),
                "v_mfma: CBSZ, ABID and BLGP are not modelled"
            )
        }
        other => panic!("gfx90a BLGP gave {other}"),
    }
}
