//! Scalar ALU and program control against plain Rust references.

mod common;
use common::*;
use gfx9::exec::Stop;
use gfx9::Target;

const EDGES: [u32; 10] = [
    0,
    1,
    2,
    31,
    32,
    33,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1234_5678,
];

type Ref32 = fn(u32, u32, bool) -> (u32, Option<bool>);

/// SOP2 32-bit opcodes with an independent reference (result, SCC if written).
fn sop2_refs() -> Vec<(u32, &'static str, Ref32)> {
    vec![
        (0x00, "s_add_u32", |a, b, _| {
            (
                (a as u64 + b as u64) as u32,
                Some(a as u64 + b as u64 > u32::MAX as u64),
            )
        }),
        (0x01, "s_sub_u32", |a, b, _| {
            (a.wrapping_sub(b), Some(b > a))
        }),
        (0x02, "s_add_i32", |a, b, _| {
            let s = a as i32 as i64 + b as i32 as i64;
            (s as u32, Some(s != s as i32 as i64))
        }),
        (0x03, "s_sub_i32", |a, b, _| {
            let s = a as i32 as i64 - b as i32 as i64;
            (s as u32, Some(s != s as i32 as i64))
        }),
        (0x04, "s_addc_u32", |a, b, c| {
            let s = a as u64 + b as u64 + c as u64;
            (s as u32, Some(s >> 32 == 1))
        }),
        (0x05, "s_subb_u32", |a, b, c| {
            let s = a as i64 - b as i64 - c as i64;
            (s as u32, Some(s < 0))
        }),
        (0x06, "s_min_i32", |a, b, _| {
            (
                if (a as i32) < (b as i32) { a } else { b },
                Some((a as i32) < (b as i32)),
            )
        }),
        (0x07, "s_min_u32", |a, b, _| {
            (if a < b { a } else { b }, Some(a < b))
        }),
        (0x08, "s_max_i32", |a, b, _| {
            (
                if (a as i32) > (b as i32) { a } else { b },
                Some((a as i32) > (b as i32)),
            )
        }),
        (0x09, "s_max_u32", |a, b, _| {
            (if a > b { a } else { b }, Some(a > b))
        }),
        (0x0a, "s_cselect_b32", |a, b, c| {
            (if c { a } else { b }, None)
        }),
        (0x0c, "s_and_b32", |a, b, _| (a & b, Some(a & b != 0))),
        (0x0e, "s_or_b32", |a, b, _| (a | b, Some(a | b != 0))),
        (0x10, "s_xor_b32", |a, b, _| (a ^ b, Some(a ^ b != 0))),
        (0x12, "s_andn2_b32", |a, b, _| (a & !b, Some(a & !b != 0))),
        (0x14, "s_orn2_b32", |a, b, _| (a | !b, Some(a | !b != 0))),
        (0x16, "s_nand_b32", |a, b, _| {
            (!(a & b), Some(!(a & b) != 0))
        }),
        (0x18, "s_nor_b32", |a, b, _| (!(a | b), Some(!(a | b) != 0))),
        (0x1a, "s_xnor_b32", |a, b, _| {
            (!(a ^ b), Some(!(a ^ b) != 0))
        }),
        // Shift amounts use the low five bits: a shift by 32 is a shift by 0.
        (0x1c, "s_lshl_b32", |a, b, _| {
            let r = ((a as u64) << (b % 32)) as u32;
            (r, Some(r != 0))
        }),
        (0x1e, "s_lshr_b32", |a, b, _| {
            let r = ((a as u64) >> (b % 32)) as u32;
            (r, Some(r != 0))
        }),
        (0x20, "s_ashr_i32", |a, b, _| {
            let r = ((a as i32 as i64) >> (b % 32)) as u32;
            (r, Some(r != 0))
        }),
        (0x22, "s_bfm_b32", |a, b, _| {
            ((((1u64 << (a % 32)) - 1) << (b % 32)) as u32, None)
        }),
        (0x24, "s_mul_i32", |a, b, _| {
            ((a as i32 as i64 * b as i32 as i64) as u32, None)
        }),
        (0x2c, "s_mul_hi_u32", |a, b, _| {
            (((a as u64 * b as u64) >> 32) as u32, None)
        }),
        (0x2d, "s_mul_hi_i32", |a, b, _| {
            (((a as i32 as i64 * b as i32 as i64) >> 32) as u32, None)
        }),
        // The ISA's pseudocode: a 32-bit difference (wrapping), then its absolute value.
        (0x2a, "s_absdiff_i32", |a, b, _| {
            let d = (a as i32).wrapping_sub(b as i32);
            let r = if d < 0 {
                d.wrapping_neg() as u32
            } else {
                d as u32
            };
            (r, Some(r != 0))
        }),
        (0x2f, "s_lshl2_add_u32", |a, b, _| {
            let s = (a as u64) * 4 + b as u64;
            (s as u32, Some(s > u32::MAX as u64))
        }),
        (0x32, "s_pack_ll_b32_b16", |a, b, _| {
            ((a & 0xffff) | (b & 0xffff) << 16, None)
        }),
        (0x34, "s_pack_hh_b32_b16", |a, b, _| {
            (a >> 16 | (b >> 16) << 16, None)
        }),
    ]
}

#[test]
fn sop2_32bit_against_reference_on_edge_values() {
    let mut r = Rig::new(Target::Gfx90a);
    for (op, name, f) in sop2_refs() {
        for a in EDGES {
            for b in EDGES {
                for scc in [false, true] {
                    r.w.sreg[1] = a;
                    r.w.sreg[2] = b;
                    r.w.scc = scc;
                    r.w.sreg[3] = 0xdead_beef;
                    r.ok(&[sop2(op, 3, 1, 2)]);
                    let (d, s) = f(a, b, scc);
                    assert_eq!(r.w.sreg[3], d, "{name} {a:#x} {b:#x} scc={scc}");
                    assert_eq!(
                        r.w.scc,
                        s.unwrap_or(scc),
                        "{name} {a:#x} {b:#x} scc={scc}: SCC"
                    );
                }
            }
        }
    }
}

#[test]
fn sop2_64bit_shifts_and_logic() {
    let mut r = Rig::new(Target::Gfx908);
    let a = 0x8000_0001_0000_0003u64;
    for sh in [0u32, 1, 31, 32, 33, 63, 64, 65] {
        r.w.set_sgpr64(2, a);
        r.w.sreg[4] = sh;
        r.ok(&[
            sop2(0x1d, 6, 2, 4),
            sop2(0x1f, 8, 2, 4),
            sop2(0x21, 10, 2, 4),
        ]);
        assert_eq!(r.w.sgpr64(6), a << (sh % 64), "s_lshl_b64 {sh}");
        assert_eq!(r.w.sgpr64(8), a >> (sh % 64), "s_lshr_b64 {sh}");
        assert_eq!(
            r.w.sgpr64(10),
            ((a as i64) >> (sh % 64)) as u64,
            "s_ashr_i64 {sh}"
        );
    }
    r.w.set_sgpr64(2, 0xf0f0);
    r.w.set_sgpr64(4, 0x0f0f);
    r.ok(&[sop2(0x0d, 6, 2, 4)]);
    assert_eq!(
        (r.w.sgpr64(6), r.w.scc),
        (0, false),
        "s_and_b64 of disjoint masks"
    );
}

#[test]
fn bitfield_extract_signed_and_unsigned() {
    let mut r = Rig::new(Target::Gfx90a);
    // offset 4, width 8 of 0x0000_0f80 -> 0xf8; signed -> -8.
    r.w.sreg[1] = 0xf80;
    r.w.sreg[2] = 4 | 8 << 16;
    r.ok(&[sop2(0x25, 3, 1, 2), sop2(0x26, 4, 1, 2)]);
    assert_eq!(r.w.sreg[3], 0xf8);
    assert_eq!(r.w.sreg[4], (-8i32) as u32);
}

#[test]
fn inline_constants_and_literal() {
    let mut r = Rig::new(Target::Gfx90a);
    r.ok(&[
        sop1(0x00, 1, int(-16)),
        sop1(0x00, 2, int(64)),
        sop1(0x00, 3, 242), // 1.0
        sop1(0x00, 4, LIT),
        0xcafe_f00d,
        sop1(0x01, 6, int(-1)), // s_mov_b64 sign-extends inline integers
        sop1(0x01, 8, 242),     // 1.0 as a 64-bit operand is the f64 pattern
    ]);
    assert_eq!(
        &r.w.sreg[1..5],
        &[(-16i32) as u32, 64, 0x3f80_0000, 0xcafe_f00d]
    );
    assert_eq!(r.w.sgpr64(6), u64::MAX);
    assert_eq!(r.w.sgpr64(8), 1.0f64.to_bits());
}

#[test]
fn sop1_bit_operations() {
    let mut r = Rig::new(Target::Gfx90a);
    r.w.sreg[1] = 0x0000_0f00;
    r.ok(&[
        sop1(0x0c, 2, 1),
        sop1(0x10, 3, 1),
        sop1(0x12, 4, 1),
        sop1(0x08, 5, 1),
        sop1(0x16, 6, int(-1)),
        sop1(0x04, 7, 1),
    ]);
    assert_eq!(r.w.sreg[2], 4, "s_bcnt1_i32_b32");
    assert_eq!(r.w.sreg[3], 8, "s_ff1_i32_b32");
    assert_eq!(r.w.sreg[4], 20, "s_flbit_i32_b32");
    assert_eq!(r.w.sreg[5], 0x00f0_0000, "s_brev_b32");
    assert_eq!(r.w.sreg[6], u32::MAX, "s_sext_i32_i8");
    assert_eq!(r.w.sreg[7], !0xf00, "s_not_b32");
    r.w.sreg[1] = 0;
    r.ok(&[sop1(0x10, 3, 1), sop1(0x12, 4, 1)]);
    assert_eq!(
        (r.w.sreg[3], r.w.sreg[4]),
        (u32::MAX, u32::MAX),
        "no bit found is -1"
    );
}

#[test]
fn compares_set_scc() {
    let mut r = Rig::new(Target::Gfx90a);
    type Cmp = (u32, fn(u32, u32) -> bool);
    let cases: [Cmp; 6] = [
        (0x02, |a, b| (a as i32) > (b as i32)),
        (0x04, |a, b| (a as i32) < (b as i32)),
        (0x08, |a, b| a > b),
        (0x0a, |a, b| a < b),
        (0x06, |a, b| a == b),
        (0x0d, |a, b| (a >> (b % 32)) & 1 == 1),
    ];
    for (op, f) in cases {
        for a in EDGES {
            for b in EDGES {
                r.w.sreg[1] = a;
                r.w.sreg[2] = b;
                r.ok(&[sopc(op, 1, 2)]);
                assert_eq!(r.w.scc, f(a, b), "SOPC {op:#x} {a:#x} {b:#x}");
            }
        }
    }
}

#[test]
fn sopk_move_compare_add() {
    let mut r = Rig::new(Target::Gfx90a);
    r.ok(&[sopk(0x00, 1, 0xfffe), sopk(0x0e, 1, 3)]);
    assert_eq!(r.w.sreg[1], 1, "s_movk_i32 sign-extends, s_addk_i32 adds");
    r.w.sreg[2] = 0x7fff_ffff;
    r.ok(&[sopk(0x0e, 2, 1)]);
    assert!(r.w.scc, "s_addk_i32 signed overflow sets SCC");
    r.w.sreg[3] = 0xffff;
    r.ok(&[sopk(0x08, 3, 0xffff)]);
    assert!(r.w.scc, "s_cmpk_eq_u32 zero-extends");
    r.ok(&[sopk(0x02, 3, 0xffff)]);
    assert!(!r.w.scc, "s_cmpk_eq_i32 sign-extends");
}

#[test]
fn saveexec_and_exec_branches() {
    let mut r = Rig::new(Target::Gfx90a);
    r.w.set_exec(0xffff_0000_ffff_0000);
    r.w.set_sgpr64(2, 0x0000_00ff_00ff_0000);
    r.ok(&[sop1(0x20, 4, 2)]);
    assert_eq!(r.w.sgpr64(4), 0xffff_0000_ffff_0000, "old EXEC saved");
    assert_eq!(r.w.exec(), 0x0000_0000_00ff_0000);
    assert!(r.w.scc);
    // s_cbranch_execz over an s_mov when EXEC is zero.
    r.w.set_exec(0);
    r.w.sreg[9] = 7;
    r.ok(&[sopp(0x08, 1), sop1(0x00, 9, int(1))]);
    assert_eq!(r.w.sreg[9], 7, "branch taken");
    r.w.set_exec(1);
    r.ok(&[sopp(0x08, 1), sop1(0x00, 9, int(1))]);
    assert_eq!(r.w.sreg[9], 1, "branch not taken");
}

#[test]
fn loop_with_scc_branch() {
    let mut r = Rig::new(Target::Gfx90a);
    // s0 = 0; do { s0 += 3; s1 -= 1 } while (s1 != 0)
    r.w.sreg[1] = 10;
    r.ok(&[
        sop1(0x00, 0, int(0)),
        sop2(0x00, 0, 0, int(3)),
        sop2(0x01, 1, 1, int(1)),
        sopc(0x07, 1, int(0)),
        sopp(0x05, (-4i16) as u16),
    ]);
    assert_eq!(r.w.sreg[0], 30);
}

#[test]
fn getpc_setpc_and_call() {
    let mut r = Rig::new(Target::Gfx90a);
    r.ok(&[sop1(0x1c, 2, 0)]);
    assert_eq!(r.w.sgpr64(2), CODE + 4);
    // s_getpc; s_add_u32 s2, s2, 12; s_addc_u32 s3, s3, 0; s_setpc -> skips s_mov s9, 1.
    r.w.sreg[9] = 0;
    r.ok(&[
        sop1(0x1c, 2, 0),
        sop2(0x00, 2, 2, int(16)),
        sop2(0x04, 3, 3, int(0)),
        sop1(0x1d, 0, 2),
        sop1(0x00, 9, int(1)),
    ]);
    assert_eq!(r.w.sreg[9], 0);
}

#[test]
fn stops_barrier_sleep_trap_and_unknown_opcode() {
    let mut r = Rig::new(Target::Gfx90a);
    assert_eq!(r.run(&[sopp(0x0a, 0)]), Stop::Barrier);
    assert_eq!(r.w.pc, CODE + 4, "PC past the barrier");
    assert_eq!(r.run(&[sopp(0x0e, 3)]), Stop::Sleep(3));
    assert_eq!(r.run(&[sopp(0x12, 2)]), Stop::Trap(2));
    let s = r.run(&[sopp(0x11, 0)]); // s_sendmsghalt: not implemented
    match s {
        Stop::Illegal { reason, pc } => {
            assert_eq!(pc, CODE);
            assert_eq!(
                reason.to_string(),
                "unknown opcode 0x11 of encoding SOPP on Gfx90a"
            );
        }
        other => panic!("s_sendmsghalt gave {other}"),
    }
    assert_eq!(
        r.w.run(&mut r.mem, &mut r.lds, &mut r.cache, 0),
        Stop::Budget
    );
}

#[test]
fn sendmsg_interrupt_yields_m0_and_refuses_other_messages() {
    let mut r = Rig::new(Target::Gfx908);
    // s_mov_b32 m0, 0x123457; s_sendmsg sendmsg(MSG_INTERRUPT)
    let stop = r.run(&[sop1(0x00, 124, LIT), 0x0012_3457, sopp(0x10, 1)]);
    assert_eq!(stop, Stop::Interrupt(0x0012_3457));
    assert_eq!(r.w.pc, CODE + 12, "PC past s_sendmsg");
    for msg in [0u16, 2, 3, 4, 15] {
        match r.run(&[sopp(0x10, msg)]) {
            Stop::Illegal { reason, pc } => {
                assert_eq!(pc, CODE, "message {msg}");
                assert_eq!(
                    reason.to_string(),
                    "s_sendmsg: only MSG_INTERRUPT is modelled"
                );
            }
            other => panic!("s_sendmsg message {msg} gave {other}"),
        }
    }
}

#[test]
fn getreg_sh_mem_bases_gives_the_aperture_bits() {
    let mut r = Rig::new(Target::Gfx908);
    r.w.apertures.private_base = 0x0002_0000_0000_0000;
    r.w.apertures.shared_base = 0x0001_0000_0000_0000;
    let hwreg = |id: u16, off: u16, size: u16| id | off << 6 | (size - 1) << 11;
    // s_getreg_b32 s2, hwreg(HW_REG_SH_MEM_BASES, 0, 16); ... 16, 16; ... 0, 32
    r.ok(&[
        sopk(0x11, 2, hwreg(15, 0, 16)),
        sopk(0x11, 3, hwreg(15, 16, 16)),
        sopk(0x11, 4, hwreg(15, 0, 32)),
    ]);
    assert_eq!(r.w.sreg[2], 2, "private aperture bits 63:48");
    assert_eq!(r.w.sreg[3], 1, "shared aperture bits 63:48");
    assert_eq!(r.w.sreg[4], 0x0001_0002);
}

#[test]
fn getreg_hw_id_and_xcc_id_give_where_the_spi_placed_the_wave() {
    use gfx9::launch::HwSlot;
    let slot = HwSlot {
        xcc: 5,
        se: 3,
        sh: 1,
        cu: 9,
        simd: 2,
        wave: 7,
    };
    let hwreg = |id: u16, off: u16, size: u16| id | off << 6 | (size - 1) << 11;
    let mut r = Rig::new(Target::Gfx942);
    r.w.hw_id = slot.hw_id(0x13);
    r.w.xcc_id = u32::from(slot.xcc);
    // s_getreg_b32: WAVE_ID, SIMD_ID, CU_ID, SH_ID, SE_ID, TG_ID of HW_ID; XCC_ID.
    r.ok(&[
        sopk(0x11, 2, hwreg(4, 0, 4)),
        sopk(0x11, 3, hwreg(4, 4, 2)),
        sopk(0x11, 4, hwreg(4, 8, 4)),
        sopk(0x11, 5, hwreg(4, 12, 1)),
        sopk(0x11, 6, hwreg(4, 13, 2)),
        sopk(0x11, 7, hwreg(4, 16, 4)),
        sopk(0x11, 8, hwreg(20, 0, 4)),
    ]);
    assert_eq!(&r.w.sreg[2..9], &[7, 2, 9, 1, 3, 3, 5]);
    // XCC_ID is gfx940's: gfx90a has no such register.
    let mut r = Rig::new(Target::Gfx90a);
    match r.run(&[sopk(0x11, 2, hwreg(20, 0, 4))]) {
        Stop::Illegal { .. } => {}
        other => panic!("s_getreg XCC_ID on gfx90a gave {other}"),
    }
}
