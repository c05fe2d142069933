//! MFMA against a plain Rust matrix multiply. The reference reads the operand layouts the
//! way the ISA guides describe them, register by register and lane by lane (what register r,
//! lane l holds), the inverse of the engine's element-to-location mapping. Values are small
//! integers, so every sum is exact whatever the order of accumulation.

mod common;
use common::*;
use gfx9::exec::Stop;
use gfx9::fp::f32_to_f16;
use gfx9::Target;

#[derive(Clone, Copy, Debug)]
enum Kind {
    F32,
    F16,
    Bf16x2,
    Bf16x4,
    I8,
}

impl Kind {
    /// (elements per lane, registers per lane)
    fn per_lane(self) -> (usize, usize) {
        match self {
            Kind::F32 => (1, 1),
            Kind::F16 | Kind::Bf16x4 => (4, 2),
            Kind::Bf16x2 => (2, 1),
            Kind::I8 => (4, 1),
        }
    }

    /// Packs small integers into a lane's registers.
    fn pack(self, vals: &[i32]) -> [u32; 2] {
        let mut r = [0u32; 2];
        for (e, v) in vals.iter().enumerate() {
            let (bits, width) = match self {
                Kind::F32 => ((*v as f32).to_bits(), 32),
                Kind::F16 => (f32_to_f16(*v as f32) as u32, 16),
                Kind::Bf16x2 | Kind::Bf16x4 => ((*v as f32).to_bits() >> 16, 16),
                Kind::I8 => (*v as u8 as u32, 8),
            };
            let at = e * width;
            r[at / 32] |= bits << (at % 32);
        }
        r
    }
}

struct Case {
    op: u32,
    name: &'static str,
    n: usize,
    blocks: usize,
    groups: usize,
    kind: Kind,
}

const fn case(
    op: u32,
    name: &'static str,
    n: usize,
    blocks: usize,
    groups: usize,
    kind: Kind,
) -> Case {
    Case {
        op,
        name,
        n,
        blocks,
        groups,
        kind,
    }
}

const CASES: &[Case] = &[
    case(0x40, "v_mfma_f32_32x32x1f32", 32, 2, 1, Kind::F32),
    case(0x41, "v_mfma_f32_16x16x1f32", 16, 4, 1, Kind::F32),
    case(0x42, "v_mfma_f32_4x4x1f32", 4, 16, 1, Kind::F32),
    case(0x44, "v_mfma_f32_32x32x2f32", 32, 1, 2, Kind::F32),
    case(0x45, "v_mfma_f32_16x16x4f32", 16, 1, 4, Kind::F32),
    case(0x4a, "v_mfma_f32_4x4x4f16", 4, 16, 1, Kind::F16),
    case(0x4c, "v_mfma_f32_32x32x8f16", 32, 1, 2, Kind::F16),
    case(0x4d, "v_mfma_f32_16x16x16f16", 16, 1, 4, Kind::F16),
    case(0x51, "v_mfma_i32_16x16x4i8", 16, 4, 1, Kind::I8),
    case(0x54, "v_mfma_i32_32x32x8i8", 32, 1, 2, Kind::I8),
    case(0x6d, "v_mfma_f32_16x16x8bf16", 16, 1, 4, Kind::Bf16x2),
    case(0x66, "v_mfma_f32_32x32x8bf16_1k", 32, 1, 2, Kind::Bf16x4),
];

/// What lane `l`'s element `e` of A (or B) is: (block, row of A / column of B, k).
fn ab_element(c: &Case, l: usize, e: usize) -> (usize, usize, usize) {
    let rest = l / c.n;
    let (g, b) = (rest % c.groups, rest / c.groups);
    (b, l % c.n, g * c.kind.per_lane().0 + e)
}

/// What register `r`, lane `l` of C and D hold: (block, i, j).
fn cd_element(c: &Case, r: usize, l: usize) -> (usize, usize, usize) {
    if c.n == 4 {
        return (l / 4, r, l % 4);
    }
    let per_block = c.n * c.n / 64;
    let (b, rr) = (r / per_block, r % per_block);
    let groups = 64 / c.n;
    (b, rr % 4 + 4 * (l / c.n) + 4 * groups * (rr / 4), l % c.n)
}

fn out_regs(c: &Case) -> usize {
    if c.n == 4 {
        4
    } else {
        c.blocks * c.n * c.n / 64
    }
}

fn mai(op: u32, vdst: u32, acc_cd: bool, src: [u32; 3]) -> [u32; 2] {
    [
        (0x1a7 << 23) | (op << 16) | ((acc_cd as u32) << 15) | vdst,
        src[0] | src[1] << 9 | src[2] << 18,
    ]
}

/// Runs case `c` on `t` (C and D in AccVGPRs, or VGPRs v[100..] on gfx90a with !acc_cd).
fn check(c: &Case, t: Target, acc_cd: bool) {
    let k = c.groups * c.kind.per_lane().0;
    let a_val = |b: usize, i: usize, kk: usize| ((b * 7 + i * 3 + kk * 5) % 9) as i32 - 4;
    let b_val = |b: usize, kk: usize, j: usize| ((b * 5 + kk * 2 + j * 7) % 7) as i32 - 3;
    let c_val = |b: usize, i: usize, j: usize| ((b + i * 11 + j * 13) % 17) as i32 - 8;
    let mut r = Rig::new(t);
    let (per, regs) = c.kind.per_lane();
    for l in 0..64 {
        let a: Vec<i32> = (0..per)
            .map(|e| {
                let (b, i, kk) = ab_element(c, l, e);
                a_val(b, i, kk)
            })
            .collect();
        let bb: Vec<i32> = (0..per)
            .map(|e| {
                let (b, j, kk) = ab_element(c, l, e);
                b_val(b, kk, j)
            })
            .collect();
        let (pa, pb) = (c.kind.pack(&a), c.kind.pack(&bb));
        for q in 0..regs {
            r.w.set_lane(10 + q, l, pa[q]);
            r.w.set_lane(20 + q, l, pb[q]);
        }
    }
    let is_int = matches!(c.kind, Kind::I8);
    let enc = |v: i32| {
        if is_int {
            v as u32
        } else {
            (v as f32).to_bits()
        }
    };
    let nout = out_regs(c);
    let base = if acc_cd { 0 } else { 100 };
    for q in 0..nout {
        for l in 0..64 {
            let (b, i, j) = cd_element(c, q, l);
            let v = enc(c_val(b, i, j));
            if acc_cd {
                r.w.a_mut(q)[l] = v;
            } else {
                r.w.set_lane(base + q, l, v);
            }
        }
    }
    r.w.set_exec(u64::MAX);
    r.ok(&mai(
        c.op,
        base as u32,
        acc_cd,
        [v(10), v(20), v(base as u32)],
    ));
    for q in 0..nout {
        for l in 0..64 {
            let (b, i, j) = cd_element(c, q, l);
            let want = c_val(b, i, j)
                + (0..k)
                    .map(|kk| a_val(b, i, kk) * b_val(b, kk, j))
                    .sum::<i32>();
            let got = if acc_cd {
                r.w.a(q)[l]
            } else {
                r.w.lane(base + q, l)
            };
            assert_eq!(
                got,
                enc(want),
                "{} on {t:?}: register {q} lane {l} = D[{b}][{i}][{j}]",
                c.name
            );
        }
    }
}

#[test]
fn mfma_matches_matrix_multiply_on_both_targets() {
    for c in CASES {
        if !c.name.ends_with("_1k") {
            check(c, Target::Gfx908, true);
        }
        check(c, Target::Gfx90a, true);
    }
    // gfx90a: ACC_CD clear puts C and D in VGPRs.
    check(&CASES[3], Target::Gfx90a, false);
    check(&CASES[7], Target::Gfx90a, false);
}

#[test]
fn mfma_with_inline_c_and_refusals() {
    let c = &CASES[4]; // 16x16x4f32: A = 1, B = 2 everywhere, C = inline 0 → D = 8
    let mut r = Rig::new(Target::Gfx908);
    r.set_v(10, |_| 1.0f32.to_bits());
    r.set_v(20, |_| 2.0f32.to_bits());
    r.ok(&mai(c.op, 0, true, [v(10), v(20), int(0)]));
    for q in 0..4 {
        assert!(
            r.w.a(q).iter().all(|v| *v == 8.0f32.to_bits()),
            "register {q}"
        );
    }
    r.w.set_exec(u64::MAX >> 1);
    match r.run(&mai(c.op, 0, true, [v(10), v(20), int(0)])) {
        Stop::Illegal { reason, .. } => {
            assert_eq!(reason.to_string(), "v_mfma: partial EXEC is not modelled")
        }
        other => panic!("partial EXEC gave {other}"),
    }
    r.w.set_exec(u64::MAX);
    let mut w = mai(c.op, 0, true, [v(10), v(20), int(0)]);
    w[0] |= 1 << 8; // CBSZ 1
    match r.run(&w) {
        Stop::Illegal { reason, .. } => {
            assert_eq!(
                reason.to_string(),
                "v_mfma: CBSZ, ABID and BLGP are not modelled"
            )
        }
        other => panic!("CBSZ gave {other}"),
    }
}
