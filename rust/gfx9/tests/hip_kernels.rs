//! test/hip's kernels as hipcc compiled them (the committed gfx908 and gfx90a code objects
//! in tests/fixtures/hip), run in the engine by the test-only launcher of
//! tests/common/launch.rs over a flat `VecMemory`, and checked against Rust references of
//! what each program computes.

mod common;
use common::launch::*;
use gfx9::Target;

#[test]
fn saxpy_matches_fma_bit_for_bit() {
    for t in TARGETS {
        let mut g = Gpu::new("saxpy", t);
        let n = 1000;
        let mut r = Rng(7);
        let x: Vec<f32> = (0..n).map(|_| r.uniform(-100.0, 100.0)).collect();
        let y: Vec<f32> = (0..n).map(|_| r.uniform(-100.0, 100.0)).collect();
        let (dx, dy) = (g.alloc_f32(&x), g.alloc_f32(&y));
        let args = Args::default().u32(n as u32).f32(2.5).ptr(dx).ptr(dy);
        g.launch(
            "_Z5saxpy",
            [(n as u32).div_ceil(256), 1, 1],
            [256, 1, 1],
            args,
        );
        let out = g.read_f32(dy, n);
        for i in 0..n {
            assert_eq!(out[i], 2.5f32.mul_add(x[i], y[i]), "{t:?} element {i}");
        }
    }
}

#[test]
fn matmul_with_lds_tiles_and_barriers() {
    let (m, n, k) = (37usize, 21usize, 19usize);
    let mut r = Rng(23);
    let a: Vec<f32> = (0..m * k).map(|_| r.uniform(-1.0, 1.0)).collect();
    let b: Vec<f32> = (0..k * n).map(|_| r.uniform(-1.0, 1.0)).collect();
    for t in TARGETS {
        let mut g = Gpu::new("matmul", t);
        let (da, db, dc) = (
            g.alloc_f32(&a),
            g.alloc_f32(&b),
            g.alloc(&vec![0xff; 4 * m * n]),
        );
        let args = Args::default()
            .u32(m as u32)
            .u32(n as u32)
            .u32(k as u32)
            .ptr(da)
            .ptr(db)
            .ptr(dc);
        let grid = [(n as u32).div_ceil(16), (m as u32).div_ceil(16), 1];
        g.launch("_Z6matmul", grid, [16, 16, 1], args);
        let c = g.read_f32(dc, m * n);
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|l| a[i * k + l] as f64 * b[l * n + j] as f64)
                    .sum();
                let got = c[i * n + j] as f64;
                assert!(
                    (got - want).abs() < 1e-5,
                    "{t:?} C[{i}][{j}] = {got}, want {want}"
                );
            }
        }
    }
}

#[test]
fn reduce_with_lds_and_int_float_atomics() {
    let n = 3000usize;
    let blocks = n.div_ceil(256) as u32;
    let mut r = Rng(19);
    let xi: Vec<u32> = (0..n)
        .map(|_| ((r.next() % 20001) as i32 - 10000) as u32)
        .collect();
    let xf: Vec<f32> = (0..n).map(|_| r.uniform(0.0, 1.0)).collect();
    let sum: i32 = xi.iter().map(|v| *v as i32).sum();
    let max = xi.iter().map(|v| *v as i32).max().expect("values");
    let min = *xi.iter().min().expect("values");
    let fsum: f64 = xf.iter().map(|v| *v as f64).sum();
    for t in TARGETS {
        let mut g = Gpu::new("reduce", t);
        let dx = g.alloc_u32(&xi);
        let (dtot, dmax, dmin) = (
            g.alloc_u32(&[0, 0]),
            g.alloc_u32(&[i32::MIN as u32]),
            g.alloc_u32(&[u32::MAX]),
        );
        let args = Args::default()
            .u32(n as u32)
            .ptr(dx)
            .ptr(dtot)
            .ptr(dmax)
            .ptr(dmin);
        g.launch("_Z7sum_int", [blocks, 1, 1], [256, 1, 1], args);
        assert_eq!(g.read_u32(dtot, 2), [sum as u32, n as u32], "{t:?} sums");
        assert_eq!(g.read_u32(dmax, 1)[0] as i32, max, "{t:?} atomicMax");
        assert_eq!(g.read_u32(dmin, 1)[0], min, "{t:?} atomicMin");

        let dxf = g.alloc_f32(&xf);
        let (dft, dftr, dcas) = (g.alloc_u32(&[0]), g.alloc_u32(&[0, 0]), g.alloc_u32(&[0]));
        let args = Args::default()
            .u32(n as u32)
            .ptr(dxf)
            .ptr(dft)
            .ptr(dftr)
            .ptr(dcas);
        g.launch("_Z9sum_float", [blocks, 1, 1], [256, 1, 1], args);
        let (ft, ftr) = (g.read_f32(dft, 1)[0], g.read_f32(dftr, 2));
        assert!(
            ((ft as f64) - fsum).abs() < 1e-3,
            "{t:?} float atomicAdd {ft} vs {fsum}"
        );
        assert!(
            ((ftr[0] as f64) - fsum).abs() < 1e-3,
            "{t:?} with return {ftr:?}"
        );
        assert_eq!(ftr[1], 0.0, "{t:?} no negative value returned");
        assert_eq!(g.read_u32(dcas, 1)[0], blocks, "{t:?} atomicCAS loop");
    }
}

#[test]
fn wave_ops_shuffles_and_votes() {
    // struct Lane { int from_rev, from_lane5, up3, down7, xor9, lane; u64 ballot;
    //               int any, all, pop; } = 48 bytes with padding.
    let n = 256usize;
    let mut r = Rng(29);
    let mut x: Vec<i32> = (0..n)
        .map(|i| (r.next() % 1000) as i32 - if i / 64 == 2 { 500 } else { 0 })
        .collect();
    x[64 + 17] = 42;
    for t in TARGETS {
        let mut g = Gpu::new("wave_ops", t);
        let dx = g.alloc_u32(&x.iter().map(|v| *v as u32).collect::<Vec<_>>());
        let dout = g.alloc(&vec![0; 48 * n]);
        g.launch(
            "_Z8wave_ops",
            [2, 1, 1],
            [128, 1, 1],
            Args::default().ptr(dx).ptr(dout),
        );
        let out = g.read_u32(dout, 12 * n);
        for w in 0..4 {
            let xv = &x[64 * w..64 * w + 64];
            let ballot = (0..64).fold(0u64, |b, l| b | ((xv[l] & 1) as u64) << l);
            let thirds = (0..64).filter(|&l| xv[l] % 3 == 0).count() as u32;
            let any = xv.contains(&42) as u32;
            let all = xv.iter().all(|v| *v >= 0) as u32;
            for l in 0..64 {
                let o = &out[12 * (64 * w + l)..12 * (64 * w + l + 1)];
                let want = [
                    xv[63 - l] as u32,
                    xv[5] as u32,
                    xv[if l >= 3 { l - 3 } else { l }] as u32,
                    xv[if l + 7 < 64 { l + 7 } else { l }] as u32,
                    xv[l ^ 9] as u32,
                    l as u32,
                    ballot as u32,
                    (ballot >> 32) as u32,
                    any,
                    all,
                    thirds,
                ];
                assert_eq!(&o[..11], &want, "{t:?} wave {w} lane {l}");
            }
        }
    }
}

/// test/hip/o0_calls.cpp's functions, in Rust.
fn collatz_steps(v: i32) -> i32 {
    if v <= 1 {
        0
    } else {
        1 + collatz_steps(if v % 2 != 0 { 3 * v + 1 } else { v / 2 })
    }
}

fn mix(a: i32, b: f32, table: &[i32; 16], k: i32) -> (i32, f32) {
    let local: Vec<i32> = (0..16).map(|j| table[j] * (j as i32 + k)).collect();
    let ra = local[(k & 15) as usize] + local[((k * 7) & 15) as usize] + a;
    let rb = b * 0.5 + local[((k + 3) & 15) as usize] as f32;
    (ra, rb)
}

#[test]
fn o0_build_with_scratch_spills_and_recursive_calls() {
    let n = 100usize;
    let table: [i32; 16] = std::array::from_fn(|j| 3 * j as i32 - 7);
    for t in TARGETS {
        let mut g = Gpu::new("o0_calls", t);
        let dt = g.alloc_u32(&table.map(|v| v as u32));
        let (ds, dp) = (g.alloc(&vec![0; 4 * n]), g.alloc(&vec![0; 8 * n]));
        let args = Args::default().u32(n as u32).ptr(dt).ptr(ds).ptr(dp);
        g.launch(
            "_Z9o0_kernel",
            [(n as u32).div_ceil(64), 1, 1],
            [64, 1, 1],
            args,
        );
        let steps = g.read_u32(ds, n);
        let pairs = g.read_u32(dp, 2 * n);
        for i in 0..n {
            assert_eq!(
                steps[i] as i32,
                collatz_steps(i as i32 + 1),
                "{t:?} steps {i}"
            );
            let (a, b) = mix(i as i32, i as f32, &table, i as i32);
            assert_eq!(pairs[2 * i] as i32, a, "{t:?} pair {i}.a");
            assert_eq!(f32::from_bits(pairs[2 * i + 1]), b, "{t:?} pair {i}.b");
        }
    }
}

fn f64s(g: &mut Gpu, va: u64, n: usize) -> Vec<f64> {
    g.read(va, 8 * n)
        .chunks(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8")))
        .collect()
}

fn alloc_f64(g: &mut Gpu, v: &[f64]) -> u64 {
    g.alloc(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

/// Relative-or-absolute closeness, NaN matching NaN (test/hip/check.h's close_to).
fn close_to(got: f64, want: f64, tol: f64) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    (got - want).abs() <= tol * want.abs().max(1.0)
}

#[test]
fn fp64_arithmetic_and_conversions_are_exact() {
    // struct F64Out { double fma, div, sqrt, minmax, from_i32, from_u32, from_i64;
    //                 float to_f32; int to_i32; unsigned to_u32; long long to_i64; }: 80 bytes
    let n = 200usize;
    let mut r = Rng(11);
    let a: Vec<f64> = (0..n)
        .map(|i| match i {
            0 => 0.0,
            1 => -0.0,
            _ => r.uniform(-50.0, 50.0) as f64 * (1.0 + r.uniform(0.0, 1.0) as f64 * 1e-7),
        })
        .collect();
    let b: Vec<f64> = (0..n)
        .map(|i| r.uniform(0.5, 8.0) as f64 * if i % 2 == 1 { -1.0 } else { 1.0 })
        .collect();
    let k: Vec<i32> = (0..n).map(|_| r.next() as i32).collect();
    for t in TARGETS {
        let mut g = Gpu::new("fp64_fp16", t);
        let (da, db) = (alloc_f64(&mut g, &a), alloc_f64(&mut g, &b));
        let dk = g.alloc_u32(&k.iter().map(|v| *v as u32).collect::<Vec<_>>());
        let dout = g.alloc(&vec![0; 80 * n]);
        let args = Args::default()
            .u32(n as u32)
            .ptr(da)
            .ptr(db)
            .ptr(dk)
            .ptr(dout);
        g.launch(
            "_Z7f64_ops",
            [(n as u32).div_ceil(128), 1, 1],
            [128, 1, 1],
            args,
        );
        let out = g.read(dout, 80 * n);
        for i in 0..n {
            let o = &out[80 * i..80 * (i + 1)];
            let d = |k: usize| f64::from_le_bytes(o[8 * k..8 * k + 8].try_into().expect("8"));
            let (x, y) = (a[i], b[i]);
            let want = [
                x.mul_add(y, 1.25),
                x / y,
                x.abs().sqrt(),
                x.min(y) + x.max(y) * 0.5,
                k[i] as f64,
                k[i] as u32 as f64,
                (k[i] as i64 * 1_000_003) as f64,
            ];
            for (f, w) in want.iter().enumerate() {
                assert_eq!(d(f).to_bits(), w.to_bits(), "{t:?} element {i} field {f}");
            }
            assert_eq!(
                f32::from_le_bytes(o[56..60].try_into().expect("4")),
                x as f32
            );
            assert_eq!(le32(o, 60) as i32, (x * 1000.0) as i32, "{t:?} {i} to_i32");
            assert_eq!(le32(o, 64), (x * 1000.0).abs() as u32, "{t:?} {i} to_u32");
            assert_eq!(le64(o, 72) as i64, (x * 1e12) as i64, "{t:?} {i} to_i64");
        }
    }
}

#[test]
fn transcendentals_within_tolerance() {
    let n = 256usize;
    let mut r = Rng(17);
    let xf: Vec<f32> = (0..n).map(|_| r.uniform(-20.0, 20.0)).collect();
    let xd: Vec<f64> = (0..n)
        .map(|_| r.uniform(-20.0, 20.0) as f64 + r.uniform(0.0, 1.0) as f64 * 1e-9)
        .collect();
    // sin, cos, exp(v/4), log(|v|+0.001), sqrt|v|, rsqrt(|v|+0.5), pow(|v|+0.5, 1.7)
    let reference = |v: f64| {
        [
            v.sin(),
            v.cos(),
            (v * 0.25).exp(),
            (v.abs() + 0.001).ln(),
            v.abs().sqrt(),
            1.0 / (v.abs() + 0.5).sqrt(),
            (v.abs() + 0.5).powf(1.7),
        ]
    };
    for t in TARGETS {
        let mut g = Gpu::new("transcendental", t);
        let (dxf, dof) = (g.alloc_f32(&xf), g.alloc(&vec![0; 4 * 7 * n]));
        let (dxd, dod) = (alloc_f64(&mut g, &xd), g.alloc(&vec![0; 8 * 7 * n]));
        g.launch(
            "_Z7f32_fns",
            [1, 1, 1],
            [256, 1, 1],
            Args::default().u32(n as u32).ptr(dxf).ptr(dof),
        );
        g.launch(
            "_Z7f64_fns",
            [1, 1, 1],
            [256, 1, 1],
            Args::default().u32(n as u32).ptr(dxd).ptr(dod),
        );
        let (of, od) = (g.read_f32(dof, 7 * n), f64s(&mut g, dod, 7 * n));
        for i in 0..n {
            for (f, w) in reference(xf[i] as f64).iter().enumerate() {
                let got = of[7 * i + f] as f64;
                assert!(
                    close_to(got, *w, 4e-6),
                    "{t:?} f32 fn {f} of {}: {got} vs {w}",
                    xf[i]
                );
            }
            for (f, w) in reference(xd[i]).iter().enumerate() {
                let got = od[7 * i + f];
                assert!(
                    close_to(got, *w, 1e-14),
                    "{t:?} f64 fn {f} of {}: {got} vs {w}",
                    xd[i]
                );
            }
        }
    }
}

/// test/hip/mlp.hip's model: 8 inputs, 32 tanh hidden units, 4 outputs, batch 128.
mod mlp {
    pub const IN: usize = 8;
    pub const HID: usize = 32;
    pub const OUT: usize = 4;
    pub const BATCH: usize = 128;
    pub const W1: usize = 0;
    pub const B1: usize = W1 + HID * IN;
    pub const W2: usize = B1 + HID;
    pub const B2: usize = W2 + OUT * HID;
    pub const NPARAM: usize = B2 + OUT;
    pub const LR: f32 = 0.1;

    /// One sample's loss and gradients, in the program's order of operations.
    pub fn sample_grad(w: &[f32], x: &[f32], y: &[f32], g: &mut [f32]) -> f32 {
        let mut h = [0f32; HID];
        let mut dout = [0f32; OUT];
        let mut loss = 0.0f32;
        for j in 0..HID {
            let a = (0..IN).fold(w[B1 + j], |a, i| a + w[W1 + j * IN + i] * x[i]);
            h[j] = a.tanh();
        }
        for k in 0..OUT {
            let o = (0..HID).fold(w[B2 + k], |o, j| o + w[W2 + k * HID + j] * h[j]);
            let d = o - y[k];
            loss += 0.5 * d * d;
            dout[k] = d / BATCH as f32;
            g[B2 + k] = dout[k];
            for j in 0..HID {
                g[W2 + k * HID + j] = dout[k] * h[j];
            }
        }
        for j in 0..HID {
            let dh = (0..OUT).fold(0.0f32, |s, k| s + w[W2 + k * HID + j] * dout[k]);
            let dh = dh * (1.0 - h[j] * h[j]);
            g[B1 + j] = dh;
            for i in 0..IN {
                g[W1 + j * IN + i] = dh * x[i];
            }
        }
        loss / BATCH as f32
    }

    /// The batch and the initial weights of make_data().
    pub fn data() -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut r = super::Rng(31);
        let mut x = vec![0f32; BATCH * IN];
        let mut y = vec![0f32; BATCH * OUT];
        for s in 0..BATCH {
            for i in 0..IN {
                x[s * IN + i] = r.uniform(-1.0, 1.0);
            }
            let xs = &x[s * IN..s * IN + IN];
            for k in 0..OUT {
                y[s * OUT + k] = 0.8 * (xs[k] + 0.5 * xs[k + 4]).sin() + 0.3 * xs[(k + 1) % IN];
            }
        }
        let w = (0..NPARAM)
            .map(|p| match p {
                _ if p < B1 => r.uniform(-0.6, 0.6),
                _ if p < W2 => 0.0,
                _ if p < B2 => r.uniform(-0.3, 0.3),
                _ => 0.0,
            })
            .collect();
        (x, y, w)
    }

    /// Per-step losses of the host training.
    pub fn train(x: &[f32], y: &[f32], w0: &[f32], steps: usize) -> Vec<f32> {
        let mut w = w0.to_vec();
        let mut g = vec![0f32; BATCH * NPARAM];
        (0..steps)
            .map(|_| {
                let l: Vec<f32> = (0..BATCH)
                    .map(|s| {
                        let gs = &mut g[s * NPARAM..(s + 1) * NPARAM];
                        sample_grad(&w, &x[s * IN..], &y[s * OUT..], gs)
                    })
                    .collect();
                for p in 0..NPARAM {
                    let sum = (0..BATCH).fold(0.0f32, |a, s| a + g[s * NPARAM + p]);
                    w[p] -= LR * sum;
                }
                l.iter().map(|v| *v as f64).sum::<f64>() as f32
            })
            .collect()
    }
}

/// Trains `steps` steps on the engine; returns the per-step losses and the final weights.
fn train_mlp(t: Target, x: &[f32], y: &[f32], w0: &[f32], steps: usize) -> (Vec<f32>, Vec<u8>) {
    use mlp::*;
    let mut g = Gpu::new("mlp", t);
    let (dw, dx, dy) = (g.alloc_f32(w0), g.alloc_f32(x), g.alloc_f32(y));
    let (dg, dl, dtot) = (
        g.alloc(&vec![0; 4 * BATCH * NPARAM]),
        g.alloc(&[0; 4 * BATCH]),
        g.alloc(&[0; 4]),
    );
    // mlp --hold-at's gate, open for every step: {open: u32::MAX, waves: 0}.
    let gate = g.alloc(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
    let losses = (0..steps as u32)
        .map(|step| {
            let fb = Args::default()
                .ptr(dw)
                .ptr(dx)
                .ptr(dy)
                .ptr(dg)
                .ptr(dl)
                .ptr(gate)
                .u32(step);
            g.launch("_Z16forward_backward", [2, 1, 1], [64, 1, 1], fb);
            let blocks = (NPARAM as u32).div_ceil(64);
            g.launch(
                "_Z6update",
                [blocks, 1, 1],
                [64, 1, 1],
                Args::default().ptr(dw).ptr(dg),
            );
            g.launch(
                "_Z8loss_sum",
                [1, 1, 1],
                [128, 1, 1],
                Args::default().ptr(dl).ptr(dtot),
            );
            g.read_f32(dtot, 1)[0]
        })
        .collect();
    (losses, g.read(dw, 4 * NPARAM))
}

#[test]
fn mlp_training_falls_follows_the_host_and_repeats_bit_for_bit() {
    let steps = 8;
    let (x, y, w0) = mlp::data();
    let host = mlp::train(&x, &y, &w0, steps);
    for t in TARGETS {
        let (losses, w) = train_mlp(t, &x, &y, &w0, steps);
        for (s, (got, want)) in losses.iter().zip(&host).enumerate() {
            assert!(
                close_to(*got as f64, *want as f64, 1e-3),
                "{t:?} step {s}: loss {got}, host {want}"
            );
        }
        assert!(
            losses[steps - 1] < 0.5 * losses[0],
            "{t:?} loss falls: {losses:?}"
        );
        let (again, w_again) = train_mlp(t, &x, &y, &w0, steps);
        assert_eq!(losses, again, "{t:?} losses repeat");
        assert!(w == w_again, "{t:?} weights repeat bit for bit");
    }
}

#[test]
fn mfma_kernels_multiply_exactly() {
    for (kernel, n, k) in [("_Z6mfma16", 16usize, 16usize), ("_Z6mfma32", 32, 2)] {
        let a: Vec<f32> = (0..n * k).map(|i| ((i * 7) % 9) as f32 - 4.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 7) as f32 - 3.0).collect();
        for t in TARGETS {
            let mut g = Gpu::new("mfma", t);
            let (da, db, dc) = (
                g.alloc_f32(&a),
                g.alloc_f32(&b),
                g.alloc(&vec![0xff; 4 * n * n]),
            );
            g.launch(
                kernel,
                [1, 1, 1],
                [64, 1, 1],
                Args::default().ptr(da).ptr(db).ptr(dc),
            );
            let c = g.read_f32(dc, n * n);
            for i in 0..n {
                for j in 0..n {
                    let want: f32 = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
                    assert_eq!(c[i * n + j], want, "{t:?} {kernel} C[{i}][{j}]");
                }
            }
        }
    }
}

/// test/hip/dgemm.hip's kernels (gfx90a: f64 MFMA) with dyadic inputs, every partial sum
/// exact: C = A*B + C0 bit for bit against a plain host DGEMM.
#[test]
fn dgemm_kernels_multiply_exactly_on_gfx90a() {
    // dgemm16: 64x48 result, K = 128, one wave per 16x16 tile; dgemm4: 32 batched 4x8 * 8x4.
    let cases = [
        ("_Z7dgemm16PKdS0_Pd", 1, 64, 48, 128, [3, 4, 1]),
        ("_Z6dgemm4PKdS0_Pd", 32, 4, 4, 8, [8, 1, 1]),
    ];
    for (kernel, batch, m, n, k, grid) in cases {
        let val = |x: usize, y: usize, m: usize, s: f64| {
            ((x * 7 + y * 3) % m) as f64 * s - (m / 2) as f64 * s
        };
        let a: Vec<f64> = (0..batch * m * k)
            .map(|i| val(i, 2, 17, 1.0 / 16.0))
            .collect();
        let b: Vec<f64> = (0..batch * k * n)
            .map(|i| val(i, 5, 13, 1.0 / 8.0))
            .collect();
        let c0: Vec<f64> = (0..batch * m * n).map(|i| val(i, 1, 29, 1.0)).collect();
        let mut g = Gpu::new("dgemm", Target::Gfx90a);
        let (da, db, dc) = (
            alloc_f64(&mut g, &a),
            alloc_f64(&mut g, &b),
            alloc_f64(&mut g, &c0),
        );
        g.launch(
            kernel,
            grid,
            [64, 1, 1],
            Args::default().ptr(da).ptr(db).ptr(dc),
        );
        let c = f64s(&mut g, dc, batch * m * n);
        for t in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let at = t * m * n + i * n + j;
                    let want = c0[at]
                        + (0..k)
                            .map(|l| a[t * m * k + i * k + l] * b[t * k * n + l * n + j])
                            .sum::<f64>();
                    assert_eq!(c[at], want, "{kernel} C[{t}][{i}][{j}]");
                }
            }
        }
    }
}

/// `x` rounded to the nearest f16 (ties to even), as an f32: the host's __float2half.
fn f16_round(x: f32) -> f32 {
    let a = x.abs();
    if !x.is_finite() || a == 0.0 {
        return x;
    }
    if a >= 65520.0 {
        return f32::INFINITY.copysign(x);
    }
    // The f16 quantum at a: 2^(exponent - 10) for normals, 2^-24 below 2^-14.
    let exp = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
    let q = 2f64.powi(exp.max(-14) - 10);
    (((a as f64) / q).round_ties_even() * q).copysign(x as f64) as f32
}

#[test]
fn f16_and_half2_arithmetic() {
    // struct F16Out { float prod, sum, quot, from_i, cvt_back, pk_lo, pk_hi; short to_i16; }
    let n = 128usize;
    let mut r = Rng(13);
    let mut a = vec![0f32; n];
    let mut b = vec![0f32; n];
    for i in 0..n {
        a[i] = r.uniform(-30.0, 30.0);
        b[i] = r.uniform(0.25, 4.0) * if i % 3 != 0 { 1.0 } else { -1.0 };
    }
    let h = f16_round;
    for t in TARGETS {
        let mut g = Gpu::new("fp64_fp16", t);
        let (da, db, dout) = (g.alloc_f32(&a), g.alloc_f32(&b), g.alloc(&vec![0; 32 * n]));
        let args = Args::default().u32(n as u32).ptr(da).ptr(db).ptr(dout);
        g.launch("_Z7f16_ops", [(n as u32) / 64, 1, 1], [64, 1, 1], args);
        let out = g.read_f32(dout, 8 * n);
        for i in 0..n {
            let o = &out[8 * i..8 * i + 8];
            let (x, y) = (h(a[i]), h(b[i]));
            let exact = [h(x * y), h(x + y), h(i as f32 - 128.0), x];
            assert_eq!(
                [o[0], o[1], o[3], o[4]],
                exact,
                "{t:?} element {i} ({x}, {y})"
            );
            assert!(
                close_to(o[2] as f64, (x / y) as f64, 1.0 / 512.0),
                "{t:?} {i} quot"
            );
            assert_eq!(
                [o[5], o[6]],
                [h(h(x + x) * x), h(h(y + y) * y)],
                "{t:?} {i} half2"
            );
            let to_i16 = o[7].to_bits() as u16 as i16;
            assert_eq!(to_i16, h(x * 10.0) as i16, "{t:?} {i} to_i16");
        }
    }
}
