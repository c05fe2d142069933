//! Memory instructions against plain Rust references: SMEM, DS (LDS), GLOBAL/FLAT/SCRATCH
//! loads, stores and atomics, MUBUF with its range check, and faults.

mod common;
use common::*;
use gfx9::exec::Stop;
use gfx9::{Memory, Target};

const BUF: u64 = 0x50_0000;

fn rig_with_buffer(words: &[u32]) -> Rig {
    let mut r = Rig::new(Target::Gfx90a);
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    r.mem.load(BUF, &bytes);
    r
}

fn word(r: &mut Rig, at: u64) -> u32 {
    let mut b = [0u8; 4];
    r.mem.read(at, &mut b).expect("mapped");
    u32::from_le_bytes(b)
}

#[test]
fn smem_loads_dwords_and_buffer_loads() {
    let data: Vec<u32> = (0..32).map(|k| 0x1000 + k).collect();
    let mut r = rig_with_buffer(&data);
    r.w.set_sgpr64(2, BUF);
    r.ok(&smem(0x04, 20, 2, 8)); // s_load_dwordx16 s[20:35], s[2:3], 0x8
    assert_eq!(&r.w.sreg[20..36], &data[2..18]);
    // s_buffer_load_dwordx2 s[40:41], s[4:7], 0x10: the resource's 48-bit base.
    r.w.set_sgpr64(4, BUF | 0x0004_0000_0000_0000);
    r.ok(&smem(0x09, 40, 4, 0x10));
    assert_eq!(&r.w.sreg[40..42], &data[4..6]);
}

#[test]
fn ds_reads_writes_and_atomics() {
    let mut r = Rig::new(Target::Gfx90a);
    r.set_v(1, |l| 8 * l as u32); // address
    r.set_v(2, |l| l as u32 + 1);
    r.set_v(3, |l| 1000 + l as u32);
    r.ok(&ds(0x0e, 0, 1, 2, 3, 0, 1)); // ds_write2_b32 v1, v2, v3 offset1:1
    r.ok(&ds(0x76, 4, 1, 0, 0, 0, 0)); // ds_read_b64 v[4:5], v1
    for l in 0..64 {
        assert_eq!(
            (r.w.lane(4, l), r.w.lane(5, l)),
            (l as u32 + 1, 1000 + l as u32),
            "lane {l}"
        );
    }
    // Every lane adds its id+1 to one LDS word; the returning form gives each lane the old value.
    r.set_v(6, |_| 0x800);
    r.ok(&ds(0x20, 7, 6, 2, 0, 0, 0)); // ds_add_rtn_u32 v7, v6, v2
    let mut b = [0u8; 4];
    b.copy_from_slice(&r.lds[0x800..0x804]);
    assert_eq!(u32::from_le_bytes(b), (1..=64).sum::<u32>());
    let olds: Vec<u32> = (0..64).map(|l| r.w.lane(7, l)).collect();
    assert_eq!(
        olds,
        (0..64u32).map(|l| l * (l + 1) / 2).collect::<Vec<_>>(),
        "lanes in order"
    );
    // ds_cmpst_b32: data0 is the compare value, data1 the new one.
    r.set_v(8, |_| 0x800 + 4);
    r.set_v(9, |_| 0);
    r.set_v(10, |l| 50 + l as u32);
    r.ok(&ds(0x10, 0, 8, 9, 10, 0, 0));
    assert_eq!(
        &r.lds[0x804..0x808],
        &50u32.to_le_bytes(),
        "only the first lane's compare matched"
    );
    // Out of range: reads give zero, writes are dropped.
    r.set_v(11, |_| 0x10_0000);
    r.ok(&ds(0x0d, 0, 11, 2, 0, 0, 0));
    r.ok(&ds(0x36, 12, 11, 0, 0, 0, 0));
    assert!((0..64).all(|l| r.w.lane(12, l) == 0));
    // ds_read_i8 sign-extends, ds_read_u16 zero-extends.
    r.lds[0x900] = 0x80;
    r.lds[0x901] = 0xff;
    r.set_v(13, |_| 0x900);
    r.ok(&ds(0x39, 14, 13, 0, 0, 0, 0));
    r.ok(&ds(0x3c, 15, 13, 0, 0, 0, 0));
    assert_eq!((r.w.lane(14, 0), r.w.lane(15, 0)), (0xffff_ff80, 0xff80));
}

#[test]
fn ds_bpermute_and_swizzle() {
    let mut r = Rig::new(Target::Gfx90a);
    r.set_v(1, |l| 4 * (63 - l as u32)); // each lane reads lane 63-l
    r.set_v(2, |l| 100 + l as u32);
    r.ok(&ds(0x3f, 3, 1, 2, 0, 0, 0));
    assert!(
        (0..64).all(|l| r.w.lane(3, l) == 100 + 63 - l as u32),
        "ds_bpermute_b32"
    );
    // swizzle bitmask mode: xor_mask 1 swaps neighbours (offset = xor << 10 | and 0x1f).
    r.ok(&ds(0x3d, 4, 0, 2, 0, 0x1f, 1 << 2));
    assert!(
        (0..64).all(|l| r.w.lane(4, l) == 100 + (l ^ 1) as u32),
        "ds_swizzle_b32"
    );
}

#[test]
fn global_loads_stores_and_atomics() {
    let mut r = rig_with_buffer(&[0; 512]);
    r.w.set_sgpr64(2, BUF);
    r.set_v(1, |l| 4 * l as u32);
    r.set_v(2, |l| 0x8000_0000 | l as u32);
    r.ok(&global(0x1c, 0, 1, 2, 2, 16, false)); // global_store_dword v1, v2, s[2:3] offset:16
    assert_eq!(word(&mut r, BUF + 16 + 4 * 5), 0x8000_0005);
    r.ok(&global(0x13, 3, 1, 0, 2, 16, false)); // global_load_sshort: sign-extends the low half
    assert_eq!(r.w.lane(3, 7), 7);
    r.ok(&global(0x12, 3, 1, 0, 2, 18, false)); // global_load_ushort of the high half
    assert_eq!(r.w.lane(3, 7), 0x8000);
    // global_atomic_add_f32 from every lane to one word (gfx90a), returning (glc).
    r.set_v(4, |_| 0x100);
    r.set_v(5, |_| 0.5f32.to_bits());
    r.ok(&global(0x4d, 6, 4, 5, 2, 0, true));
    assert_eq!(f32::from_bits(word(&mut r, BUF + 0x100)), 32.0);
    assert_eq!(
        f32::from_bits(r.w.lane(6, 63)),
        31.5,
        "last lane saw 63 adds"
    );
    // global_atomic_cmpswap: data pair {new, compare}; only lane 0's compare (0) matches.
    r.set_v(8, |_| 0x200);
    r.set_v(10, |l| 7 + l as u32);
    r.set_v(11, |_| 0);
    r.ok(&global(0x41, 12, 8, 10, 2, 0, true));
    assert_eq!(word(&mut r, BUF + 0x200), 7);
    assert_eq!((r.w.lane(12, 0), r.w.lane(12, 1)), (0, 7));
    // 64-bit vaddr form ("off"), and a store of x4.
    r.set_v(20, |l| (BUF + 0x400 + 16 * l as u64) as u32);
    r.set_v(21, |_| (BUF >> 32) as u32);
    for k in 0..4 {
        r.set_v(24 + k, |l| (l * 10) as u32 + k as u32);
    }
    r.ok(&global(0x1f, 0, 20, 24, 0x7f, 0, false));
    assert_eq!(word(&mut r, BUF + 0x400 + 16 * 3 + 8), 32);
}

#[test]
fn scratch_uses_the_swizzled_private_layout() {
    let mut r = Rig::new(Target::Gfx90a);
    let scratch = 0x70_0000u64;
    r.mem.map(scratch, 64 * 4 * 4);
    r.w.set_sgpr64(102, scratch); // FLAT_SCRATCH
    r.set_v(1, |_| 8); // byte 8 of each lane's private memory
    r.set_v(2, |l| l as u32 * 3);
    // scratch_store_dword v1, v2, off ; scratch_load_dword v3, v1, off
    r.ok(&[
        (0b110111 << 26) | (0x1c << 18) | (1 << 14),
        1 | (2 << 8) | (0x7f << 16),
    ]);
    r.ok(&[
        (0b110111 << 26) | (0x14 << 18) | (1 << 14),
        1 | (0x7f << 16) | (3 << 24),
    ]);
    assert!((0..64).all(|l| r.w.lane(3, l) == l as u32 * 3));
    // dword 2 of lane 5 sits at base + 2 * 256 + 5 * 4.
    assert_eq!(word(&mut r, scratch + 2 * 256 + 5 * 4), 15);
}

#[test]
fn wide_private_accesses_are_swizzled_per_dword() {
    let mut r = Rig::new(Target::Gfx908);
    let scratch = 0x70_0000u64;
    r.mem.map(scratch, 64 * 4 * 4);
    r.w.set_sgpr64(102, scratch); // FLAT_SCRATCH
    r.w.apertures.private_base = 0x0002_0000_0000_0000;
    r.set_v(1, |_| 4); // byte 4 of each lane's private memory
    r.set_v(2, |l| 0x100 + l as u32);
    r.set_v(3, |l| 0x200 + l as u32);
    // scratch_store_dwordx2 v1, v[2:3], off: dwords 1 and 2 of each lane, 256 bytes apart
    r.ok(&[
        (0b110111 << 26) | (0x1d << 18) | (1 << 14),
        1 | (2 << 8) | (0x7f << 16),
    ]);
    for l in 0..64 {
        assert_eq!(word(&mut r, scratch + 256 + 4 * l), 0x100 + l as u32);
        assert_eq!(word(&mut r, scratch + 512 + 4 * l), 0x200 + l as u32);
    }
    // The same bytes through the private aperture: flat_load_dwordx2 v[6:7], v[4:5];
    // then flat_store_short v[8:9], v10 at byte 6 (the high half of dword 1).
    r.set_v(4, |_| 4);
    r.set_v(5, |_| 0x2_0000);
    r.set_v(8, |_| 6);
    r.set_v(9, |_| 0x2_0000);
    r.set_v(10, |l| 0xab00 + l as u32);
    r.ok(&[
        (0b110111 << 26) | (0x15 << 18),
        4 | (6 << 24),
        (0b110111 << 26) | (0x1a << 18),
        8 | (10 << 8),
    ]);
    for l in 0..64 {
        assert_eq!(r.w.lane(6, l), 0x100 + l as u32, "lane {l} dword 1");
        assert_eq!(r.w.lane(7, l), 0x200 + l as u32, "lane {l} dword 2");
        let want = (0xab00 + l as u32) << 16 | (0x100 + l as u32);
        assert_eq!(
            word(&mut r, scratch + 256 + 4 * l as u64),
            want,
            "lane {l} short"
        );
    }
}

#[test]
fn mubuf_offen_and_range_check() {
    let mut r = rig_with_buffer(&(0..64).collect::<Vec<u32>>());
    // V#: base BUF, stride 0, num_records 64 bytes.
    r.w.set_sgpr64(8, BUF);
    r.w.sreg[10] = 64;
    r.w.sreg[11] = 0;
    r.set_v(1, |l| 4 * l as u32);
    // buffer_load_dword v2, v1, s[8:11], 0 offen offset:4
    r.ok(&[
        (0b111000 << 26) | (0x14 << 18) | (1 << 12) | 4,
        1 | (2 << 8) | (2 << 16) | (128 << 24),
    ]);
    for l in 0..64 {
        let want = if 4 * l + 4 + 4 <= 64 { l as u32 + 1 } else { 0 };
        assert_eq!(
            r.w.lane(2, l),
            want,
            "lane {l}: out-of-range loads read zero"
        );
    }
}

#[test]
fn mubuf_scratch_resource_matches_the_private_layout() {
    // hipcc's scratch V#: swizzled, 4-byte elements, index stride 64, add_tid; soffset is
    // the frame (wave-scaled bytes).
    let mut r = Rig::new(Target::Gfx908);
    let scratch = 0x70_0000u64;
    r.mem.map(scratch, 16 * 256);
    r.w.set_sgpr64(8, scratch | 1 << 63);
    r.w.sreg[10] = u32::MAX;
    r.w.sreg[11] = (1 << 19) | (3 << 21) | (1 << 23);
    r.w.sreg[12] = 0x400; // frame: dword 4 of every lane
    r.set_v(2, |l| 0x500 + l as u32);
    // buffer_store_dword v2, off, s[8:11], s12 offset:8
    r.ok(&[
        (0b111000 << 26) | (0x1c << 18) | 8,
        (2 << 8) | (2 << 16) | (12 << 24),
    ]);
    for l in 0..64u64 {
        // base + frame + dword 2 of the lane's frame, 256 bytes per dword.
        assert_eq!(
            word(&mut r, scratch + 0x400 + 2 * 256 + 4 * l),
            0x500 + l as u32
        );
    }
    // The same location through the private aperture: FLAT_SCRATCH + (0x400/64 + 8) offset.
    r.w.set_sgpr64(102, scratch);
    r.w.apertures.private_base = 0x0002_0000_0000_0000;
    r.set_v(4, |_| 0x400 / 64 + 8);
    r.set_v(5, |_| 0x2_0000);
    r.ok(&[(0b110111 << 26) | (0x14 << 18), 4 | (6 << 24)]); // flat_load_dword v6, v[4:5]
    assert!((0..64).all(|l| r.w.lane(6, l) == 0x500 + l as u32));
    // buffer_load_dwordx2 through it would span two elements: refused.
    match r.run(&[
        (0b111000 << 26) | (0x15 << 18) | 8,
        (2 << 8) | (2 << 16) | (12 << 24),
    ]) {
        Stop::Illegal { reason, .. } => assert_eq!(
            reason.to_string(),
            "buffer access: a swizzled access wider than the element size is not modelled"
        ),
        other => panic!("buffer_load_dwordx2 gave {other}"),
    }
}

#[test]
fn faults_and_bad_tuples_stop_the_wave() {
    let mut r = Rig::new(Target::Gfx90a);
    r.w.set_sgpr64(2, 0xdead_0000);
    r.set_v(1, |l| 4 * l as u32);
    match r.run(&global(0x14, 3, 1, 0, 2, 0, false)) {
        Stop::Fault { fault, pc } => {
            assert_eq!((fault.addr, fault.write, pc), (0xdead_0000, false, CODE))
        }
        other => panic!("{other}"),
    }
    r.w.set_sgpr64(2, BUF);
    r.mem.map(BUF, 4096);
    // global_load_dwordx4 into v254..v257 runs past v255.
    match r.run(&global(0x17, 254, 1, 0, 2, 0, false)) {
        Stop::Illegal { reason, .. } => {
            assert!(reason.to_string().contains("past v255"), "{reason}")
        }
        other => panic!("{other}"),
    }
}

/// Consecutive lanes with all of EXEC take the coalesced path (one access, whole rows);
/// any other mask goes lane by lane. Both must move the same bytes to the same places.
#[test]
fn coalesced_and_lane_by_lane_accesses_agree() {
    const X4: u64 = 0x1000; // 64 lanes of 16 bytes
    let src: Vec<u32> = (0..256).map(|k| 0x1000_0000 + k * 0x0101).collect();
    for exec in [u64::MAX, 0xffff_ffff_ffff_fffe, 0x8000_0000_0000_0001] {
        let mut r = rig_with_buffer(&[0; 4096]);
        r.mem.load(
            BUF,
            &src.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<_>>(),
        );
        r.w.set_sgpr64(2, BUF);
        r.set_v(1, |l| 16 * l as u32);
        r.set_v(2, |l| X4 as u32 + 16 * l as u32);
        r.set_v(3, |l| 2 * l as u32);
        for k in 10..14 {
            r.set_v(k, |_| 0xdead_beef);
        }
        r.w.set_exec(exec);
        // global_load_dwordx4 v[10:13], v1, s[2:3]; global_store_dwordx4 v2, v[10:13]
        r.ok(&global(0x17, 10, 1, 0, 2, 0, false));
        r.ok(&global(0x1f, 0, 2, 10, 2, 0, false));
        // global_load_ushort_d16_hi v3 (2-byte lanes: the per-lane placement), then
        // global_store_short_d16_hi of it back, 2 bytes per lane past the x4 copy.
        r.ok(&global(0x25, 3, 3, 0, 2, 0, false));
        r.set_v(4, |l| 0x2000 + 2 * l as u32);
        r.ok(&global(0x1b, 0, 4, 3, 2, 0, false));
        for l in 0..64 {
            let on = (exec >> l) & 1 == 1;
            for k in 0..4 {
                let want = if on { src[4 * l + k] } else { 0xdead_beef };
                assert_eq!(
                    r.w.lane(10 + k, l),
                    want,
                    "exec {exec:#x} lane {l} v{}",
                    10 + k
                );
                let stored = word(&mut r, BUF + X4 + 16 * l as u64 + 4 * k as u64);
                assert_eq!(stored, if on { want } else { 0 }, "exec {exec:#x} lane {l}");
            }
            let half = (src[l / 2] >> (16 * (l % 2))) & 0xffff;
            let v3 = r.w.lane(3, l);
            assert_eq!(
                v3,
                if on {
                    half << 16 | ((2 * l as u32) & 0xffff)
                } else {
                    2 * l as u32
                }
            );
            let mut b = [0u8; 2];
            r.mem
                .read(BUF + 0x2000 + 2 * l as u64, &mut b)
                .expect("mapped");
            let want = if on { half as u16 } else { 0 };
            assert_eq!(u16::from_le_bytes(b), want, "exec {exec:#x} lane {l} short");
        }
    }
}

/// A memory that counts how the engine reaches it: per-lane calls, batched lane calls,
/// fresh (GLC) reads and acquires.
#[derive(Default)]
struct Counting {
    mem: gfx9::VecMemory,
    reads: usize,
    fresh: usize,
    writes: usize,
    read_lanes: Vec<(u64, bool)>,
    write_lanes: Vec<u64>,
    acquires: usize,
}

impl Memory for Counting {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), gfx9::Fault> {
        self.reads += 1;
        self.mem.read(addr, buf)
    }
    fn read_fresh(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), gfx9::Fault> {
        self.fresh += 1;
        self.mem.read(addr, buf)
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), gfx9::Fault> {
        self.writes += 1;
        self.mem.write(addr, data)
    }
    fn atomic(
        &mut self,
        addr: u64,
        size: usize,
        op: gfx9::AtomicOp,
        src: u64,
        cmp: u64,
    ) -> Result<u64, gfx9::Fault> {
        self.mem.atomic(addr, size, op, src, cmp)
    }
    fn acquire(&mut self) {
        self.acquires += 1;
    }
    fn read_lanes(
        &mut self,
        lanes: &gfx9::memory::Lanes<'_>,
        fresh: bool,
        buf: &mut [u8],
    ) -> Result<(), gfx9::Fault> {
        self.read_lanes.push((lanes.mask, fresh));
        gfx9::memory::read_each_lane(self, lanes, fresh, buf)
    }
    fn write_lanes(
        &mut self,
        lanes: &gfx9::memory::Lanes<'_>,
        data: &[u8],
    ) -> Result<(), gfx9::Fault> {
        self.write_lanes.push(lanes.mask);
        gfx9::memory::write_each_lane(self, lanes, data)
    }
}

/// Runs `code` and s_endpgm on `w` over `mem`.
fn run_on(w: &mut gfx9::Wave, mem: &mut Counting, code: &[u32]) -> Stop {
    let mut bytes: Vec<u8> = code.iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes.extend(ENDPGM.to_le_bytes());
    mem.mem.load(CODE, &bytes);
    let mut cache = gfx9::exec::CodeCache::new(6);
    w.pc = CODE;
    w.run(mem, &mut [], &mut cache, 100)
}

#[test]
fn strided_lanes_go_in_one_call_glc_reads_fresh_and_invalidations_acquire() {
    let mut mem = Counting::default();
    mem.mem.map(BUF, 0x1000);
    let mut w = gfx9::Wave::new(Target::Gfx90a, CODE);
    w.set_sgpr64(2, BUF);
    let odd = 0xaaaa_aaaa_aaaa_aaaa;
    w.set_exec(odd);
    for l in 0..64 {
        w.set_lane(1, l, 12 * l as u32); // a 12-byte stride: no coalescing
        w.set_lane(2, l, 0x100 + l as u32);
        w.set_lane(3, l, 0x200 + l as u32);
    }
    // global_store_dwordx2 v1, v[2:3], s[2:3]; global_load_dwordx2 v[4:5], v1, s[2:3] glc.
    let st = global(0x1d, 0, 1, 2, 2, 0, false);
    let ld = global(0x15, 4, 1, 0, 2, 0, true);
    assert_eq!(
        run_on(&mut w, &mut mem, &[st[0], st[1], ld[0], ld[1]]),
        Stop::Endpgm
    );
    assert_eq!(mem.write_lanes, [odd], "one batched store");
    assert_eq!(mem.read_lanes, [(odd, true)], "one batched GLC load");
    assert_eq!((mem.writes, mem.fresh), (32, 32), "lane by lane underneath");
    for l in 0..64 {
        let mut b = [0u8; 8];
        mem.mem.read(BUF + 12 * l, &mut b).expect("mapped");
        let want = if l % 2 == 1 {
            (0x100 + l) | (0x200 + l) << 32
        } else {
            0
        };
        assert_eq!(u64::from_le_bytes(b), want, "lane {l}'s store");
        let got = (w.lane(4, l as usize), w.lane(5, l as usize));
        let want = if l % 2 == 1 {
            (0x100 + l as u32, 0x200 + l as u32)
        } else {
            (0, 0)
        };
        assert_eq!(got, want, "lane {l}'s load");
    }
    // buffer_wbinvl1, buffer_wbinvl1_vol and s_dcache_inv invalidate; a plain load reads
    // through the cacheable path.
    let inv = smem(0x20, 0, 0, 0);
    let ld = global(0x15, 4, 1, 0, 2, 0, false);
    let code = [0xe0f8_0000, 0, 0xe0fc_0000, 0, inv[0], inv[1], ld[0], ld[1]];
    assert_eq!(run_on(&mut w, &mut mem, &code), Stop::Endpgm);
    assert_eq!(mem.acquires, 3);
    assert_eq!(mem.read_lanes[1], (odd, false));
}

#[test]
fn system_scope_loads_read_fresh() {
    // gfx90a's SCC (gfx942's sc1) alone marks a system-scope load, which must see what
    // another agent (the CPU, a peer GPU) wrote: it bypasses what the memory read ahead as
    // a GLC load does. FLAT/GLOBAL carry it in bit 25, MUBUF in bit 15.
    let mut mem = Counting::default();
    mem.mem.map(BUF, 0x1000);
    let mut w = gfx9::Wave::new(Target::Gfx90a, CODE);
    w.set_sgpr64(2, BUF);
    // V# in s[8:11]: base BUF, stride 0, 4 KiB of records.
    w.set_sgpr64(8, BUF);
    w.sreg[10] = 0x1000;
    w.sreg[11] = 0;
    let odd = 0xaaaa_aaaa_aaaa_aaaa;
    w.set_exec(odd);
    for l in 0..64 {
        w.set_lane(1, l, 12 * l as u32); // a 12-byte stride: no coalescing
    }
    // global_load_dwordx2 v[4:5], v1, s[2:3]; the same with scc;
    // buffer_load_dword v2, v1, s[8:11], 0 offen scc.
    let plain = global(0x15, 4, 1, 0, 2, 0, false);
    let sys = [plain[0] | 1 << 25, plain[1]];
    let buf = [
        (0b111000 << 26) | (0x14 << 18) | (1 << 15) | (1 << 12),
        1 | (2 << 8) | (2 << 16) | (128 << 24),
    ];
    let code = [plain[0], plain[1], sys[0], sys[1], buf[0], buf[1]];
    assert_eq!(run_on(&mut w, &mut mem, &code), Stop::Endpgm);
    assert_eq!(
        mem.read_lanes,
        [(odd, false), (odd, true), (odd, true)],
        "a plain load may be served ahead, scc loads read memory now"
    );
}
