//! Compute-wave save/restore: the trap handler's layout, round trips of randomized waves
//! through a context save area, and damaged control stacks and save areas.

use gfx9::cwsr::layout::{hwreg_slot, wave_area_size, WG_DATA_PER_CU};
use gfx9::cwsr::stack::{DISPATCH_BYTES, HEADER_BYTES, WAVE_BYTES};
use gfx9::cwsr::{
    restore_wave, save_wave, Alloc, ControlStack, Error, Header, SaveArea, SaveWriter, Saved,
    WaveBlock,
};
use gfx9::state::{sreg, LANES};
use gfx9::{Target, Wave};

/// splitmix64: reproducible randomness without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn u32(&mut self) -> u32 {
        self.next() as u32
    }
}

const TARGETS: [Target; 2] = [Target::Gfx908, Target::Gfx90a];
/// MI100's control stack: KFD sizes it for `min(120 * 40, 8 / 1 * 512) = 4096` waves,
/// `align(40 + 4096 * 8 + 8, 4096) = 0x9000` (kfd_queue.c, libhsakmt queues.c).
const MI100_CTL_STACK: u32 = 0x9000;

fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// An allocation from random kernel descriptor granules.
fn random_alloc(rng: &mut Rng, target: Target, lds: bool) -> Alloc {
    loop {
        let v = rng.below(64) as u32;
        let s = rng.below(8) as u32;
        let acc = rng.below(64) as u32;
        let rsrc1 = v | (s << 6);
        let lds_bytes = if lds { rng.below(65) as u32 * 1024 } else { 0 };
        if let Ok(a) = Alloc::from_descriptor(target, rsrc1, acc, lds_bytes) {
            return a;
        }
    }
}

/// The SGPR operand codes a wave of `alloc` can hold: s0 up to the six aliased slots, and
/// FLAT_SCRATCH, XNACK_MASK, VCC.
fn sgpr_codes(alloc: &Alloc) -> Vec<usize> {
    let user = (alloc.sgprs as usize).min(108) - 6;
    (0..user)
        .chain(sreg::FLAT_SCRATCH_LO..sreg::VCC_LO + 2)
        .collect()
}

/// A wave with every register its allocation holds random: VGPRs, AccVGPRs, SGPRs (VCC,
/// FLAT_SCRATCH, XNACK_MASK), TTMP0–15, M0, EXEC, PC, SCC, STATUS, TRAPSTS, MODE.
fn random_wave(rng: &mut Rng, target: Target, alloc: &Alloc) -> Wave {
    let mut w = Wave::new(target, rng.next() & ((1 << 48) - 4));
    for r in 0..alloc.vgprs as usize {
        for l in 0..LANES {
            w.v_mut(r)[l] = rng.u32();
        }
    }
    for r in 0..alloc.agprs as usize {
        for l in 0..LANES {
            w.a_mut(r)[l] = rng.u32();
        }
    }
    for n in sgpr_codes(alloc) {
        w.set_sgpr(n, rng.u32());
    }
    for t in 0..16 {
        w.set_sgpr(sreg::TTMP0 + t, rng.u32());
    }
    w.set_sgpr(sreg::M0, rng.u32());
    w.set_exec(rng.next());
    w.scc = rng.below(2) == 1;
    w.status = rng.u32() & !1;
    w.trapsts = rng.u32();
    w.mode = rng.u32();
    w
}

/// Every saved register of `a` and `b` equal, named on failure.
fn assert_same(a: &Wave, b: &Wave, alloc: &Alloc, what: &str) {
    assert_eq!(a.pc, b.pc, "{what}: pc");
    assert_eq!(a.scc, b.scc, "{what}: scc");
    assert_eq!(a.status, b.status, "{what}: status");
    assert_eq!(a.trapsts, b.trapsts, "{what}: trapsts");
    assert_eq!(a.mode, b.mode, "{what}: mode");
    assert_eq!(a.sreg, b.sreg, "{what}: scalar registers");
    for r in 0..256 {
        assert_eq!(a.v(r), b.v(r), "{what}: v{r} ({} allocated)", alloc.vgprs);
        assert_eq!(a.a(r), b.a(r), "{what}: a{r} ({} allocated)", alloc.agprs);
    }
}

/// A kernel dispatch packet of `groups` workgroups of `waves` waves in x.
fn packet(groups: u32, waves: u32) -> [u8; 64] {
    let mut p = [0u8; 64];
    p[0..2].copy_from_slice(&2u16.to_le_bytes()); // HSA_PACKET_TYPE_KERNEL_DISPATCH
    p[2..4].copy_from_slice(&1u16.to_le_bytes()); // one dimension
    p[4..6].copy_from_slice(&((waves * 64) as u16).to_le_bytes());
    p[6..8].copy_from_slice(&1u16.to_le_bytes());
    p[8..10].copy_from_slice(&1u16.to_le_bytes());
    p[12..16].copy_from_slice(&(groups * waves * 64).to_le_bytes());
    p[16..20].copy_from_slice(&1u32.to_le_bytes());
    p[20..24].copy_from_slice(&1u32.to_le_bytes());
    p[32..40].copy_from_slice(&0x7f00_1234_5600u64.to_le_bytes());
    p
}

/// A context save area of `wave_area` bytes past an MI100-sized control stack, its header as
/// libhsakmt leaves it (debugger memory past the area, an error event).
fn area(wave_area: usize) -> Vec<u8> {
    let mut a = vec![0u8; MI100_CTL_STACK as usize + wave_area];
    Header {
        debug_offset: a.len() as u32,
        debug_size: 4096 * 32,
        err_payload_addr: 0x7fff_0000_1000,
        err_event_id: 7,
        ..Header::default()
    }
    .write(&mut a);
    a
}

/// One queue's save: dispatches of random allocations, workgroups of random waves, some at a
/// barrier, returns the waves and LDS saved (by dispatch, in save order) and the result.
struct Queue {
    target: Target,
    dispatches: Vec<(Alloc, Vec<Wave>, Vec<Vec<u8>>)>,
}

fn save_queue(rng: &mut Rng, target: Target, area: &mut [u8]) -> (Queue, Saved) {
    let mut q = Queue {
        target,
        dispatches: Vec::new(),
    };
    let mut w = SaveWriter::new(target, area, MI100_CTL_STACK).expect("writer");
    for d in 0..1 + rng.below(3) {
        let alloc = random_alloc(rng, target, true);
        let per_group = 1 + rng.below(4) as u32;
        let running = 1 + rng.below(3) as u32;
        let done = rng.below(5) as u32;
        w.begin_dispatch(
            0x100 + d,
            packet(done + running + 3, per_group),
            alloc,
            done + running,
            done,
        )
        .expect("dispatch");
        let mut waves = Vec::new();
        let mut ldss = Vec::new();
        for g in done..done + running {
            let lds: Vec<u8> = (0..alloc.lds_bytes).map(|_| rng.next() as u8).collect();
            for i in 0..per_group {
                let wave = random_wave(rng, target, &alloc);
                let barrier = rng.below(2) == 1;
                let l = (i == 0).then_some(&lds[..]);
                w.save(&wave, g, i as u8, barrier, false, l).expect("save");
                waves.push(wave);
            }
            ldss.push(lds);
        }
        q.dispatches.push((alloc, waves, ldss));
    }
    (q, w.finish().expect("finish"))
}

fn restore_queue(q: &Queue, area: &[u8], saved: &Saved, what: &str) {
    let sa = SaveArea::open(q.target, area, saved.ctl_stack_size, &saved.control_stack)
        .unwrap_or_else(|e| panic!("{what}: open: {e}"));
    assert_eq!(sa.stack().dispatches.len(), q.dispatches.len());
    for (d, (alloc, waves, ldss)) in q.dispatches.iter().enumerate() {
        let mut group = 0;
        for (i, wave) in waves.iter().enumerate() {
            let rec = sa.stack().dispatches[d].waves[i];
            let mut lds = vec![0xa5u8; alloc.lds_bytes as usize];
            let got = sa
                .wave(d, i, rec.first_of_group.then_some(&mut lds[..]))
                .unwrap_or_else(|e| panic!("{what}: dispatch {d} wave {i}: {e}"));
            assert_same(wave, &got, alloc, &format!("{what}: dispatch {d} wave {i}"));
            if rec.first_of_group {
                assert_eq!(
                    lds, ldss[group],
                    "{what}: dispatch {d} LDS of group {group}"
                );
                group += 1;
            }
        }
    }
}

#[test]
fn randomized_queues_round_trip_exactly() {
    let mut rng = Rng(0x5eed_c5a5);
    for target in TARGETS {
        for round in 0..12 {
            let mut a = area(8 << 20);
            let (q, saved) = save_queue(&mut rng, target, &mut a);
            restore_queue(&q, &a, &saved, &format!("{target:?} round {round}"));
            assert_eq!(
                saved.wg_state_offset - saved.ctl_stack_size,
                ControlStack::decode(target, &saved.control_stack)
                    .unwrap()
                    .wave_area_used() as u32
            );
        }
    }
}

#[test]
fn every_wave64_allocation_round_trips() {
    // Every VGPR granule (with no, half and all AccVGPRs on gfx90a), every SGPR granule.
    let mut rng = Rng(42);
    let mut tried = 0;
    for target in TARGETS {
        for v in 0..64u32 {
            for acc in [v / 2, v] {
                let s = v % 8;
                let Ok(alloc) = Alloc::from_descriptor(target, v | (s << 6), acc, 0) else {
                    continue;
                };
                let wave = random_wave(&mut rng, target, &alloc);
                let b = WaveBlock::of(&alloc);
                let mut block = vec![0u8; b.slot_bytes(false)];
                assert_eq!(save_wave(&wave, &alloc, None, &mut block), Ok(block.len()));
                let back = restore_wave(target, &alloc, &block, None).expect("restore");
                assert_same(&wave, &back, &alloc, &format!("{target:?} {alloc:?}"));
                tried += 1;
            }
        }
    }
    assert!(tried >= 64 * 2 + 64, "{tried} allocations");
}

#[test]
fn block_layout_is_the_trap_handlers() {
    // gfx908, rsrc1 VGPRS=7 (32 VGPRs, and 32 AccVGPRs), SGPRS=6 (112).
    let alloc = Alloc::from_descriptor(Target::Gfx908, 7 | (6 << 6), 0, 0).unwrap();
    assert_eq!((alloc.vgprs, alloc.agprs, alloc.sgprs), (32, 32, 112));
    let b = WaveBlock::of(&alloc);
    // AccVGPRs at size(arch VGPRs): the handler's ACC loop continues s_save_mem_offset.
    assert_eq!(b.agpr, 32 * 256);
    // SGPRs at get_vgpr_size_bytes: (VGPR_SIZE + 1) * 4 * 64 * 4, doubled for AccVGPRs.
    assert_eq!(b.sgpr, 2 * 32 * 256);
    // HWREGs at size(VGPR) + size(SGPR), (SGPR_SIZE + 1) * 16 * 4 bytes of SGPRs.
    assert_eq!(b.hwreg, b.sgpr + 112 * 4);
    // TTMP4-7 at +0x50, TTMP8-11 at +0x60, TTMP13 at +0x74 from the HWREG block.
    assert_eq!(b.ttmp + 4 * 4, b.hwreg + 0x50);
    assert_eq!(b.ttmp + 13 * 4, b.hwreg + 0x74);
    // LDS at size(VGPR) + size(SGPR) + get_hwreg_size_bytes() (128).
    assert_eq!(b.lds, b.hwreg + 128);
    // ROCdbgapi: the next record starts 64 bytes past this one's end.
    assert_eq!(b.slot, b.lds + 64);

    let mut w = Wave::new(Target::Gfx908, 0x7f12_3456_789c);
    w.v_mut(5)[7] = 0x5555_0007;
    w.a_mut(3)[0] = 0xacc0_0003;
    w.set_sgpr(17, 0x5917);
    w.set_vcc(0x0c0c_0000_0000_0c0c);
    w.set_sgpr64(sreg::FLAT_SCRATCH_LO, 0xf1a7_0000_0001_0000);
    w.set_sgpr64(sreg::XNACK_MASK_LO, 0x0123_4567_89ab_cdef);
    w.set_sgpr(sreg::TTMP0 + 13, 0x7713);
    w.set_sgpr(sreg::M0, 0x4d30_4d30);
    w.set_exec(0xe0e0_e0e0_0e0e_0e0e);
    w.scc = true;
    w.status = 0x0040_2000;
    w.trapsts = 0x400;
    w.mode = 0x0000_01f0;
    let mut block = vec![0u8; b.slot_bytes(false)];
    save_wave(&w, &alloc, None, &mut block).unwrap();
    // VGPR v at v * 256, lane l at + 4l.
    assert_eq!(get32(&block, 5 * 256 + 7 * 4), 0x5555_0007);
    assert_eq!(get32(&block, b.agpr + 3 * 256), 0xacc0_0003);
    assert_eq!(get32(&block, b.sgpr + 17 * 4), 0x5917);
    // 112 SGPRs: the aliased six end at min(112, 108): FLAT_SCRATCH at 102, VCC at 106.
    assert_eq!(get32(&block, b.sgpr + 102 * 4), 0x0001_0000);
    assert_eq!(get32(&block, b.sgpr + 103 * 4), 0xf1a7_0000);
    assert_eq!(get32(&block, b.sgpr + 104 * 4), 0x89ab_cdef);
    assert_eq!(get32(&block, b.sgpr + 106 * 4), 0x0000_0c0c);
    assert_eq!(get32(&block, b.sgpr + 107 * 4), 0x0c0c_0000);
    assert_eq!(get32(&block, b.ttmp + 13 * 4), 0x7713);
    let hw = |i: usize| get32(&block, b.hwreg + 4 * i);
    assert_eq!(hw(hwreg_slot::M0), 0x4d30_4d30);
    assert_eq!(hw(hwreg_slot::PC_LO), 0x3456_789c);
    assert_eq!(hw(hwreg_slot::PC_HI), 0x7f12);
    assert_eq!(hw(hwreg_slot::EXEC_LO), 0x0e0e_0e0e);
    assert_eq!(hw(hwreg_slot::EXEC_HI), 0xe0e0_e0e0);
    assert_eq!(hw(hwreg_slot::STATUS), 0x0040_2001, "SCC in STATUS bit 0");
    assert_eq!(hw(hwreg_slot::TRAPSTS), 0x400);
    assert_eq!(hw(hwreg_slot::XNACK_MASK_LO), 0x89ab_cdef);
    assert_eq!(hw(hwreg_slot::XNACK_MASK_HI), 0x0123_4567);
    assert_eq!(hw(hwreg_slot::MODE), 0x1f0);

    // 32 SGPRs: the aliased six are the last six, VCC at 30 and 31.
    let small = Alloc { sgprs: 32, ..alloc };
    let bs = WaveBlock::of(&small);
    let mut block = vec![0u8; bs.slot_bytes(false)];
    save_wave(&w, &small, None, &mut block).unwrap();
    assert_eq!(get32(&block, bs.sgpr + 26 * 4), 0x0001_0000);
    assert_eq!(get32(&block, bs.sgpr + 30 * 4), 0x0000_0c0c);
    assert_eq!(get32(&block, bs.sgpr + 17 * 4), 0x5917);
}

#[test]
fn gfx90a_unified_file_splits_at_accum_offset() {
    // 64 unified VGPRs (VGPRS=7, granule 8), ACCUM_OFFSET=9: 40 architectural, 24 AccVGPRs.
    let a = Alloc::from_descriptor(Target::Gfx90a, 7, 9, 1000).unwrap();
    assert_eq!((a.vgprs, a.agprs, a.lds_bytes), (40, 24, 1024));
    let b = WaveBlock::of(&a);
    // get_num_arch_vgprs from ACCV_OFFSET; AccVGPRs saved right after them; the VGPR region
    // is the unified count, (VGPR_SIZE + 1) * 8 * 256 bytes.
    assert_eq!(b.agpr, 40 * 256);
    assert_eq!(b.sgpr, 64 * 256);
    for t in TARGETS {
        let a = Alloc::from_descriptor(t, 11 | (3 << 6), 5, 4096).unwrap();
        assert_eq!(
            Alloc::from_hwregs(t, a.gpr_alloc(t), a.lds_alloc()),
            Ok(a),
            "{t:?}"
        );
    }
    // GPR_ALLOC field positions: gfx908 VGPR_SIZE at 8, gfx90a at 6 with ACCV_OFFSET at 12.
    let a = Alloc::from_hwregs(Target::Gfx908, 3 << 8 | 2 << 24, 4 << 12).unwrap();
    assert_eq!((a.vgprs, a.agprs, a.sgprs, a.lds_bytes), (16, 16, 48, 1024));
    let a = Alloc::from_hwregs(Target::Gfx90a, 3 << 6 | 4 << 12, 0).unwrap();
    assert_eq!((a.vgprs, a.agprs), (20, 12));
    let e = Alloc::from_descriptor(Target::Gfx90a, 1, 9, 0).unwrap_err();
    assert_eq!(e.field, "kernel descriptor ACCUM_OFFSET");
}

#[test]
fn area_sizes_are_kfds() {
    // WG_CONTEXT_DATA_SIZE_PER_CU for gfx908/gfx90a: 0x80000 + 0x4000 + 0x10000 + 0x1000.
    assert_eq!(WG_DATA_PER_CU, 0x95000);
    // MI100: 120 CUs, control stack 0x9000: 73,273,344 bytes per compute queue.
    assert_eq!(wave_area_size(120), Some(120 * 0x95000));
    assert_eq!(MI100_CTL_STACK + wave_area_size(120).unwrap(), 73_273_344);
    // MI210: 104 CUs (wave_num min(4160, 4096) = 4096, control stack 0x9000).
    assert_eq!(0x9000 + wave_area_size(104).unwrap(), 63_508_480);
    // MI250X, one GCD: 110 CUs.
    assert_eq!(0x9000 + wave_area_size(110).unwrap(), 67_170_304);
    // The header: kfd_context_save_area_header, 40 bytes.
    let h = Header {
        control_stack_offset: 1,
        control_stack_size: 2,
        wave_state_offset: 3,
        wave_state_size: 4,
        debug_offset: 5,
        debug_size: 6,
        err_payload_addr: 0x0807_0000_0000_0007,
        err_event_id: 9,
        reserved1: 10,
    };
    let mut b = [0u8; Header::SIZE];
    h.write(&mut b);
    for (at, v) in [
        (0, 1),
        (4, 2),
        (8, 3),
        (12, 4),
        (16, 5),
        (20, 6),
        (24, 7),
        (28, 0x0807_0000),
        (32, 9),
        (36, 10),
    ] {
        assert_eq!(get32(&b, at), v, "header offset {at}");
    }
    assert_eq!(Header::read(&b), Ok(h));
}

#[test]
fn publish_writes_what_get_wave_state_writes() {
    let mut rng = Rng(9);
    let mut a = area(4 << 20);
    let (_, saved) = save_queue(&mut rng, Target::Gfx908, &mut a);
    let before = Header::read(&a).unwrap();
    saved.publish(&mut a).unwrap();
    let h = Header::read(&a).unwrap();
    assert_eq!(h.control_stack_offset, saved.cntl_stack_offset);
    assert_eq!(h.control_stack_size as usize, saved.control_stack.len());
    assert_eq!(
        h.control_stack_offset + h.control_stack_size,
        MI100_CTL_STACK
    );
    assert_eq!(h.wave_state_offset, saved.wg_state_offset);
    assert_eq!(h.wave_state_offset - h.wave_state_size, MI100_CTL_STACK);
    // libhsakmt's fields untouched.
    assert_eq!(
        (
            h.debug_offset,
            h.debug_size,
            h.err_payload_addr,
            h.err_event_id
        ),
        (
            before.debug_offset,
            before.debug_size,
            before.err_payload_addr,
            before.err_event_id
        )
    );
    let stack = &a[h.control_stack_offset as usize..MI100_CTL_STACK as usize];
    assert_eq!(stack, &saved.control_stack[..]);
}

#[test]
fn control_stack_fits_kfds_budget_at_full_occupancy() {
    // 4096 waves (KFD's wave_num for MI100) of one dispatch, 4 waves per workgroup: the
    // records take 8 bytes a wave, as KFD's sizing gives the CP.
    let t = Target::Gfx908;
    let alloc = Alloc::from_descriptor(t, 0, 0, 0).unwrap();
    let mut a = area(4096 * WaveBlock::of(&alloc).slot_bytes(false));
    let mut w = SaveWriter::new(t, &mut a, MI100_CTL_STACK).unwrap();
    w.begin_dispatch(0, packet(2048, 4), alloc, 1024, 0)
        .unwrap();
    let wave = Wave::new(t, 0x1000);
    for g in 0..1024 {
        for i in 0..4u8 {
            w.save(&wave, g, i, false, false, (i == 0).then_some(&[][..]))
                .unwrap();
        }
    }
    let saved = w.finish().unwrap();
    assert_eq!(
        saved.control_stack.len(),
        HEADER_BYTES + DISPATCH_BYTES + 4096 * WAVE_BYTES
    );
    assert!(saved.cntl_stack_offset as usize >= Header::SIZE);
}

fn refused(e: Error, field: &str) {
    assert!(
        e.field.contains(field),
        "expected a refusal naming {field:?}, got {e}"
    );
}

#[test]
fn saves_that_cannot_be_resumed_are_refused() {
    let t = Target::Gfx908;
    let alloc = Alloc::from_descriptor(t, 3, 0, 512).unwrap();
    let mut a = area(1 << 20);
    let mut w = SaveWriter::new(t, &mut a, MI100_CTL_STACK).unwrap();
    let e = w
        .save(&Wave::new(t, 0), 0, 0, false, false, Some(&[0; 512]))
        .unwrap_err();
    refused(e, "dispatch");
    w.begin_dispatch(1, packet(4, 2), alloc, 1, 0).unwrap();
    // The first wave of a workgroup carries its LDS, the next does not.
    refused(
        w.save(&Wave::new(t, 0), 0, 0, false, false, None)
            .unwrap_err(),
        "wave[0].lds",
    );
    let lds = [0u8; 512];
    refused(
        w.save(&Wave::new(t, 1 << 48), 0, 0, false, false, Some(&lds))
            .unwrap_err(),
        "wave[0].pc",
    );
    refused(
        w.save(
            &Wave::new(Target::Gfx90a, 0),
            0,
            0,
            false,
            false,
            Some(&lds),
        )
        .unwrap_err(),
        "wave[0].target",
    );
    refused(
        w.save(&Wave::new(t, 0), 0, 0, false, false, Some(&lds[..256]))
            .unwrap_err(),
        "wave[0].lds",
    );
    w.save(&Wave::new(t, 0), 0, 0, false, false, Some(&lds))
        .unwrap();
    refused(
        w.save(&Wave::new(t, 0), 0, 1, false, false, Some(&lds))
            .unwrap_err(),
        "wave[1].lds",
    );
    w.save(&Wave::new(t, 0), 0, 1, false, false, None).unwrap();
    // Workgroup 0 saved twice over: the decoder check in finish refuses it.
    w.save(&Wave::new(t, 0), 0, 1, false, false, None).unwrap();
    refused(w.finish().unwrap_err(), "wave[2].wave_in_group");

    // A wave area too small for the waves.
    let mut small = area(4096);
    let mut w = SaveWriter::new(t, &mut small, MI100_CTL_STACK).unwrap();
    w.begin_dispatch(1, packet(4, 2), alloc, 1, 0).unwrap();
    refused(
        w.save(&Wave::new(t, 0), 0, 0, false, false, Some(&lds))
            .unwrap_err(),
        "wave[0]",
    );
    // A control stack that is not page aligned or larger than the area.
    refused(
        SaveWriter::new(t, &mut small, 0x8800).err().unwrap(),
        "ctl_stack_size",
    );
    refused(
        SaveWriter::new(t, &mut small, 0x10000).err().unwrap(),
        "ctl_stack_size",
    );
}

#[test]
fn control_stack_too_large_for_its_region_is_refused() {
    let t = Target::Gfx908;
    let alloc = Alloc::from_descriptor(t, 0, 0, 0).unwrap();
    let mut a = area(16 << 20);
    // A 0x1000-byte control stack holds (4096 - 40 - 16 - 128) / 8 = 489 waves.
    let mut w = SaveWriter::new(t, &mut a, 0x1000).unwrap();
    w.begin_dispatch(1, packet(600, 1), alloc, 490, 0).unwrap();
    for g in 0..490 {
        w.save(&Wave::new(t, 0), g, 0, false, false, Some(&[]))
            .unwrap();
    }
    refused(w.finish().unwrap_err(), "control stack");
}

/// A valid stack of two dispatches to damage.
fn sample(t: Target) -> (Vec<u8>, Vec<u8>, Saved) {
    let mut rng = Rng(77);
    let mut a = area(8 << 20);
    let mut w = SaveWriter::new(t, &mut a, MI100_CTL_STACK).unwrap();
    for d in 0..2u32 {
        let alloc = Alloc::from_descriptor(t, 3 + d, 1, 2048).unwrap();
        w.begin_dispatch(d as u64, packet(8, 3), alloc, 5, 2)
            .unwrap();
        for g in 2..5 {
            let lds = vec![g as u8; 2048];
            for i in 0..3u8 {
                let wave = random_wave(&mut rng, t, &alloc);
                w.save(&wave, g, i, i == 1, false, (i == 0).then_some(&lds[..]))
                    .unwrap();
            }
        }
    }
    let saved = w.finish().unwrap();
    (saved.control_stack.clone(), a, saved)
}

/// A change to a valid control stack.
type Damage = Box<dyn Fn(&mut Vec<u8>)>;

#[test]
fn damaged_control_stacks_name_the_field() {
    let t = Target::Gfx90a;
    let (good, _, _) = sample(t);
    let d0 = HEADER_BYTES;
    let w0 = d0 + DISPATCH_BYTES;
    let cases: Vec<(&str, Damage)> = vec![
        ("control stack: magic", Box::new(|b| b[0] ^= 1)),
        ("control stack: version", Box::new(|b| b[4] = 9)),
        ("control stack: bytes", Box::new(|b| b[12] ^= 8)),
        (
            "control stack: bytes",
            Box::new(|b| b.truncate(b.len() - 8)),
        ),
        ("control stack: waves", Box::new(|b| b[8] ^= 1)),
        ("control stack: dispatch[2].record", Box::new(|b| b[6] = 3)),
        ("dispatch[0].tag", Box::new(move |b| b[d0] ^= 0x10)),
        ("dispatch[0].waves", Box::new(move |b| b[d0 + 7] = 0x80)),
        (
            "dispatch[0].packet.header",
            Box::new(move |b| b[d0 + 16] = 3),
        ),
        (
            "dispatch[0].packet.workgroup_size_x",
            Box::new(move |b| {
                b[d0 + 20] = 0;
                b[d0 + 21] = 0;
            }),
        ),
        (
            "dispatch[0].next_workgroup",
            Box::new(move |b| b[d0 + 80] = 9),
        ),
        (
            "dispatch[0].workgroups_done",
            Box::new(move |b| b[d0 + 84] = 1),
        ),
        ("dispatch[0].alloc.vgprs", Box::new(move |b| b[d0 + 88] = 3)),
        ("dispatch[0].alloc.agprs", Box::new(move |b| b[d0 + 90] = 2)),
        ("dispatch[0].alloc.sgprs", Box::new(move |b| b[d0 + 92] = 8)),
        (
            "dispatch[0].alloc.lds_bytes",
            Box::new(move |b| b[d0 + 96] = 1),
        ),
        ("dispatch[0].reserved", Box::new(move |b| b[d0 + 120] = 1)),
        ("dispatch[0].xcc_count", Box::new(move |b| b[d0 + 102] = 0)),
        ("dispatch[0].xcc_count", Box::new(move |b| b[d0 + 102] = 33)),
        ("dispatch[0].xcc", Box::new(move |b| b[d0 + 100] = 1)),
        // Version 1 has no XCC fields: the count is a reserved byte there.
        ("dispatch[0].reserved", Box::new(move |b| b[4] = 1)),
        ("dispatch[0].wave[0].offset", Box::new(move |b| b[w0] = 1)),
        (
            "dispatch[0].wave[1].offset",
            Box::new(move |b| b[w0 + 8] ^= 1),
        ),
        (
            "dispatch[0].wave[0].flags",
            Box::new(move |b| b[w0 + 3] |= 0x80),
        ),
        (
            "dispatch[0].wave[1].first_of_group",
            Box::new(move |b| b[w0 + 8 + 3] |= 0x10),
        ),
        (
            "dispatch[0].wave[0].wave_in_group",
            Box::new(move |b| b[w0 + 3] |= 0x0c),
        ),
        (
            "dispatch[0].wave[1].wave_in_group",
            Box::new(move |b| b[w0 + 8 + 3] &= 0xf0),
        ),
        (
            "dispatch[0].wave[0].workgroup",
            Box::new(move |b| b[w0 + 4] = 7),
        ),
        // Workgroup 3's first wave claims workgroup 2: it follows workgroup 2's waves, so it
        // is no first wave any more.
        (
            "dispatch[0].wave[3].first_of_group",
            Box::new(move |b| b[w0 + 3 * 8 + 4] = 2),
        ),
        // Workgroup 4's first wave claims workgroup 2, whose waves came before workgroup 3's.
        (
            "dispatch[0].wave[6].workgroup",
            Box::new(move |b| b[w0 + 6 * 8 + 4] = 2),
        ),
    ];
    for (field, damage) in cases {
        let mut b = good.clone();
        damage(&mut b);
        let e = ControlStack::decode(t, &b).expect_err(field);
        assert!(
            e.field.contains(field) || e.to_string().contains(field),
            "damage of {field}: refusal names {e}"
        );
    }
    assert!(ControlStack::decode(t, &good).is_ok());
}

/// A version 1 stream (no XCC fields) reads as XCC 0 of 1.
#[test]
fn version_one_stacks_read_as_one_xcc() {
    let t = Target::Gfx90a;
    let (mut b, _, _) = sample(t);
    let new = ControlStack::decode(t, &b).unwrap();
    b[4] = 1;
    let d1 = HEADER_BYTES + DISPATCH_BYTES + 9 * WAVE_BYTES;
    for d in [HEADER_BYTES, d1] {
        b[d + 100..d + 104].fill(0);
    }
    assert_eq!(ControlStack::decode(t, &b), Ok(new));
}

/// The stacks of a dispatch on four XCCs: each XCC saves the running
/// workgroups the CP handed it (round-robin) and counts its own done ones;
/// a workgroup of another XCC, or counts of the whole dispatch, are refused.
#[test]
fn each_xcc_saves_its_own_workgroups() {
    let t = Target::Gfx942;
    let alloc = Alloc::from_descriptor(t, 0, 0, 0).unwrap();
    // 10 of 12 workgroups started, 8 and 9 running: XCC 0 ran 0, 4, runs 8.
    let xcc = |index| gfx9::cwsr::Xcc { index, count: 4 };
    let stack = |x: u16, groups: &[u32], done: u32| {
        let mut a = area(1 << 20);
        let mut w = SaveWriter::for_xcc(t, &mut a, MI100_CTL_STACK, xcc(x)).unwrap();
        w.begin_dispatch(3, packet(12, 1), alloc, 10, done).unwrap();
        for &g in groups {
            w.save(&Wave::new(t, 0), g, 0, false, false, Some(&[]))?;
        }
        w.finish().map(|s| s.control_stack)
    };
    let s0 = stack(0, &[8], 2).unwrap();
    let d = &ControlStack::decode(t, &s0).unwrap().dispatches[0];
    assert_eq!((d.xcc, d.workgroups_done), (xcc(0), 2));
    stack(1, &[9], 2).unwrap();
    // XCC 2 ran 2 and 6, runs none; XCC 3 ran 3 and 7.
    stack(2, &[], 2).unwrap();
    stack(3, &[], 2).unwrap();
    refused(
        stack(1, &[8], 2).unwrap_err(),
        "dispatch[0].wave[0].workgroup",
    );
    refused(
        stack(0, &[8], 9).unwrap_err(),
        "dispatch[0].workgroups_done",
    );
    assert_eq!(xcc(3).below(3), 0);
    assert_eq!(xcc(3).below(4), 1);
    assert!(xcc(2).owns(6) && !xcc(2).owns(7));
}

#[test]
fn damaged_save_areas_are_refused() {
    fn open<'a>(a: &'a [u8], stack: &[u8]) -> Result<SaveArea<'a>, Error> {
        SaveArea::open(Target::Gfx90a, a, MI100_CTL_STACK, stack)
    }
    let t = Target::Gfx90a;
    let (stack, mut a, saved) = sample(t);
    // The wave area ends where libhsakmt put the debugger's memory.
    let mut short = a.clone();
    let used = saved.wg_state_offset;
    Header {
        debug_offset: used - 64,
        debug_size: 4096,
        ..Header::read(&short).unwrap()
    }
    .write(&mut short);
    refused(open(&short, &stack).err().unwrap(), "control stack: waves");
    // A truncated area.
    refused(
        open(&a[..used as usize - 1], &stack).err().unwrap(),
        "control stack: waves",
    );
    // PC_HI with replay bits, a HWREG slot the handler never writes.
    let sa = open(&a, &stack).unwrap();
    let rec = sa.stack().dispatches[1].waves[4];
    let alloc = sa.stack().dispatches[1].alloc;
    let hwreg = MI100_CTL_STACK as usize + rec.offset as usize + WaveBlock::of(&alloc).hwreg;
    drop(sa);
    a[hwreg + 4 * hwreg_slot::PC_HI + 3] = 0x08;
    refused(
        open(&a, &stack).unwrap().wave(1, 4, None).unwrap_err(),
        "dispatch[1].wave[4].hwreg PC_HI",
    );
    a[hwreg + 4 * hwreg_slot::PC_HI + 3] = 0;
    a[hwreg + 4 * 12] = 1;
    refused(
        open(&a, &stack).unwrap().wave(1, 4, None).unwrap_err(),
        "dispatch[1].wave[4].hwreg slot 12",
    );
    a[hwreg + 4 * 12] = 0;
    let sa = open(&a, &stack).unwrap();
    refused(
        sa.wave(1, 4, Some(&mut [0u8; 2048])).unwrap_err(),
        "wave[4].lds",
    );
    refused(sa.wave(1, 3, None).unwrap_err(), "wave[3].lds");
    refused(
        sa.wave(1, 3, Some(&mut [0u8; 1024])).unwrap_err(),
        "wave[3].lds",
    );
    refused(sa.wave(2, 0, None).unwrap_err(), "dispatch[2]");
    assert!(sa.wave(1, 4, None).is_ok());
    // A control stack from another queue, larger than this one's region.
    let big = vec![0u8; MI100_CTL_STACK as usize];
    refused(
        SaveArea::open(t, &a, MI100_CTL_STACK, &big).err().unwrap(),
        "control stack",
    );
}

/// Mutations of a valid stack: every one decodes without a panic; what is refused names a
/// control stack field; what is accepted re-encodes to the same bytes (no two readings).
#[test]
fn mutated_control_stacks_never_panic_and_never_mean_two_things() {
    let mut rng = Rng(0xf022);
    let mut refusals = 0;
    let mut accepted = 0;
    for t in TARGETS {
        let (good, _, _) = sample(t);
        for _ in 0..20_000 {
            let mut b = good.clone();
            match rng.below(6) {
                0 => {
                    let i = rng.below(b.len() as u64) as usize;
                    b[i] ^= 1 << rng.below(8);
                }
                1 => {
                    let i = rng.below(b.len() as u64) as usize;
                    b[i] = rng.next() as u8;
                }
                2 => b.truncate(rng.below(b.len() as u64) as usize),
                3 => b.extend((0..1 + rng.below(64)).map(|_| rng.next() as u8)),
                4 => {
                    for _ in 0..1 + rng.below(8) {
                        let i = rng.below(b.len() as u64) as usize;
                        b[i] = rng.next() as u8;
                    }
                }
                _ => {
                    // Counts and lengths rewritten consistently with a truncation.
                    let n = HEADER_BYTES + rng.below((b.len() - HEADER_BYTES) as u64) as usize;
                    b.truncate(n);
                    let len = b.len() as u32;
                    b[12..16].copy_from_slice(&len.to_le_bytes());
                }
            }
            match ControlStack::decode(t, &b) {
                Ok(s) => {
                    accepted += 1;
                    assert_eq!(s.encode().unwrap(), b, "an accepted mutation re-encodes");
                }
                Err(e) => {
                    refusals += 1;
                    assert!(e.field.starts_with("control stack"), "{e}");
                    assert!(!e.what.is_empty());
                }
            }
        }
    }
    println!("mutations: {refusals} refused, {accepted} accepted (packet bytes, flags)");
    assert!(refusals > 30_000, "{refusals} refused");
}

#[test]
fn an_idle_queue_has_an_empty_control_stack() {
    let t = Target::Gfx908;
    let mut a = area(4096);
    let saved = SaveWriter::new(t, &mut a, MI100_CTL_STACK)
        .unwrap()
        .finish()
        .unwrap();
    assert!(saved.control_stack.is_empty());
    assert_eq!(saved.cntl_stack_offset, MI100_CTL_STACK);
    assert_eq!(saved.wg_state_offset, MI100_CTL_STACK);
    let sa = SaveArea::open(t, &a, MI100_CTL_STACK, &[]).unwrap();
    assert!(sa.stack().dispatches.is_empty());
}

#[test]
fn workgroup_ids_follow_the_packet_grid() {
    let t = Target::Gfx908;
    let alloc = Alloc::from_descriptor(t, 0, 0, 0).unwrap();
    let mut p = packet(1, 1);
    // 3-D grid: 4 x 3 x 2 workgroups of 64 items.
    p[2..4].copy_from_slice(&3u16.to_le_bytes());
    p[12..16].copy_from_slice(&256u32.to_le_bytes());
    p[16..20].copy_from_slice(&3u32.to_le_bytes());
    p[20..24].copy_from_slice(&2u32.to_le_bytes());
    let d = gfx9::cwsr::DispatchState {
        dispatch_id: 0,
        packet: p,
        alloc,
        next_workgroup: 0,
        workgroups_done: 0,
        xcc: gfx9::cwsr::Xcc::ONE,
        waves: vec![],
    };
    assert_eq!(d.grid_workgroups(), Ok([4, 3, 2]));
    assert_eq!(d.workgroups(), Ok(24));
    assert_eq!(d.workgroup_id(4 * 3 + 4 + 2), Ok([2, 1, 1]));
}

#[test]
fn extreme_packet_sizes_decode_without_overflow() {
    // 65535^3 work-items per workgroup overflow 32 bits: counted in 64.
    let t = Target::Gfx908;
    let (mut b, _, _) = sample(t);
    let at = HEADER_BYTES + 16;
    for d in 0..3 {
        b[at + 4 + 2 * d..at + 6 + 2 * d].copy_from_slice(&u16::MAX.to_le_bytes());
    }
    // One workgroup per dimension now, so workgroup 4 has not started: refused, no panic.
    let e = ControlStack::decode(t, &b).unwrap_err();
    assert!(e.field.starts_with("control stack: dispatch[0]"), "{e}");
}

/// Random damage to a save area (header, blocks, LDS) and its control stack together:
/// opening and restoring every wave never panics, whatever is refused.
#[test]
fn damaged_areas_never_panic() {
    let t = Target::Gfx908;
    let (stack, area, saved) = sample(t);
    let used = saved.wg_state_offset as usize;
    let mut rng = Rng(0xa4ea);
    let (mut restored, mut refused) = (0, 0);
    for _ in 0..100 {
        let mut a = area[..used + 4096].to_vec();
        let mut s = stack.clone();
        for _ in 0..1 + rng.below(16) {
            let i = if rng.below(4) == 0 {
                rng.below(Header::SIZE as u64) as usize
            } else {
                MI100_CTL_STACK as usize
                    + rng.below((used - MI100_CTL_STACK as usize) as u64) as usize
            };
            a[i] = rng.next() as u8;
        }
        if rng.below(3) == 0 {
            let i = rng.below(s.len() as u64) as usize;
            s[i] ^= 1 << rng.below(8);
        }
        let Ok(sa) = SaveArea::open(t, &a, MI100_CTL_STACK, &s) else {
            refused += 1;
            continue;
        };
        for (d, disp) in sa.stack().dispatches.iter().enumerate() {
            for (i, rec) in disp.waves.iter().enumerate() {
                let mut lds = vec![0u8; disp.alloc.lds_bytes as usize];
                if sa
                    .wave(d, i, rec.first_of_group.then_some(&mut lds[..]))
                    .is_ok()
                {
                    restored += 1;
                }
            }
        }
    }
    println!("{refused} refused, {restored} waves restored (register values are not checkable)");
    assert!(
        refused > 0 && restored > 0,
        "{refused} refused, {restored} restored"
    );
}
