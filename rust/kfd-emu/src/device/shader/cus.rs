//! Where the SPI puts a dispatch's workgroups: on the CUs of their XCC
//! that the queue's CU mask (SET_CU_MASK) enables, a whole workgroup on
//! one CU, each wave in a free slot of one of the CU's SIMDs.
//!
//! The mask's bits map to CUs as KFD maps them into the MQD's
//! COMPUTE_STATIC_THREAD_MGMT_SE registers: bit `i` of the user's mask
//! walks the CUs of every shader engine first, then the shader arrays,
//! then the CU index (bit 0 is SE0 SH0 CU0, bit 1 SE1 SH0 CU0, ...), only
//! over CUs that exist; on a GPU of `n` XCCs (MI300) the bits take turns
//! over the XCCs, XCC `x` reading bits `x`, `x + n`, `x + 2n`, ... A
//! queue without a mask runs on every CU.  A CU holds as many waves as its
//! SIMDs have wave slots (the profile's `simd_per_cu` × `max_waves_per_simd`:
//! 4 × 10 on gfx908, 4 × 8 on gfx90a and gfx942) and workgroups while its
//! 64 KiB of LDS lasts, so a queue masked to fewer CUs has fewer waves
//! resident at once.

use gfx9::launch::HwSlot;

/// LDS bytes of one CU.
const CU_LDS: usize = 64 << 10;
/// SIMDs of a CU and wave slots of a SIMD at most: what HW_ID's SIMD_ID
/// (2 bits) and WAVE_ID (4 bits) can name.
const MAX_SIMDS: usize = 4;
const MAX_WAVES_PER_SIMD: u8 = 16;
/// Bits of the user's mask KFD reads at most (`num_cu_mask` above is
/// dropped).
const MASK_BITS: usize = 1024;
/// Shader engines and arrays KFD's mapping walks at most, and CUs per
/// array.
const MAX_SE: usize = 8;
const MAX_SH: usize = 2;
const CUS_PER_SH: u8 = 16;

/// The wave slots of one CU: its SIMDs, and each SIMD's slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaveSlots {
    simds: u8,
    per_simd: u8,
}

impl WaveSlots {
    /// A CU of `simds` SIMDs (the profile's `simd_per_cu`) of `per_simd`
    /// wave slots each (`max_waves_per_simd`), each at least 1 and at
    /// most what HW_ID can name.
    pub fn new(simds: u32, per_simd: u32) -> WaveSlots {
        WaveSlots {
            simds: simds.clamp(1, MAX_SIMDS as u32) as u8,
            per_simd: per_simd.clamp(1, MAX_WAVES_PER_SIMD.into()) as u8,
        }
    }

    /// The waves one CU holds.
    pub fn per_cu(self) -> u32 {
        u32::from(self.simds) * u32::from(self.per_simd)
    }
}

impl Default for WaveSlots {
    fn default() -> Self {
        WaveSlots::new(1, 1)
    }
}

/// One XCC's CUs, alike on every XCC: the active CUs of each shader
/// array (CU_ID 0.. of each), as DEV_INFO's CU bitmap reports them, and
/// the wave slots of each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CuLayout {
    pub xccs: u16,
    pub shader_engines: u8,
    pub sh_per_se: u8,
    /// Active CUs of `[se][sh]`.
    pub active: [[u8; MAX_SH]; MAX_SE],
    pub slots: WaveSlots,
}

impl CuLayout {
    /// The layout of a GPU whose XCC 0 has `cu_bitmap` (DEV_INFO's,
    /// `[se % 4][sh + se / 4]`) and CUs of `slots`.
    pub fn new(
        xccs: u32,
        shader_engines: u32,
        sh_per_se: u32,
        cu_bitmap: [[u32; 4]; 4],
        slots: WaveSlots,
    ) -> Self {
        let (ses, shs) = (
            (shader_engines as usize).min(MAX_SE),
            (sh_per_se as usize).min(MAX_SH),
        );
        let mut active = [[0; MAX_SH]; MAX_SE];
        for (se, row) in active.iter_mut().enumerate().take(ses) {
            for (sh, n) in row.iter_mut().enumerate().take(shs) {
                *n = cu_bitmap[se % 4][sh + se / 4].count_ones() as u8;
            }
        }
        CuLayout {
            xccs: xccs.max(1) as u16,
            shader_engines: ses as u8,
            sh_per_se: shs as u8,
            active,
            slots,
        }
    }

    /// The CUs of every XCC, in the order the mask's bits walk them.
    fn walk(&self) -> impl Iterator<Item = (u8, u8, u8)> + '_ {
        (0..CUS_PER_SH).flat_map(move |cu| {
            (0..self.sh_per_se).flat_map(move |sh| {
                (0..self.shader_engines)
                    .filter(move |&se| self.active[se as usize][sh as usize] > cu)
                    .map(move |se| (se, sh, cu))
            })
        })
    }

    /// The CUs a queue with `mask` (SET_CU_MASK's words; empty: none set)
    /// runs on, for each XCC.
    pub fn enabled(&self, mask: &[u32]) -> Vec<Vec<HwSlot>> {
        let n = self.xccs.max(1) as usize;
        let per_xcc = self.walk().count();
        let bits = (mask.len() * 32).min(MASK_BITS).min(per_xcc * n);
        (0..n)
            .map(|x| {
                self.walk()
                    .enumerate()
                    .map(|(k, cu)| (x + k * n, cu))
                    .take_while(|&(i, _)| mask.is_empty() || i < bits)
                    .filter(|&(i, _)| mask.is_empty() || mask[i / 32] >> (i % 32) & 1 == 1)
                    .map(|(_, (se, sh, cu))| HwSlot {
                        xcc: x as u8,
                        se,
                        sh,
                        cu,
                        ..HwSlot::default()
                    })
                    .collect()
            })
            .collect()
    }
}

/// One CU's waves and LDS in use by a dispatch.
#[derive(Clone, Debug)]
struct CuLoad {
    at: HwSlot,
    /// Busy wave slots of each SIMD (bit `k`: slot `k`).
    slots: [u16; MAX_SIMDS],
    lds: usize,
}

impl CuLoad {
    fn waves(&self) -> u32 {
        self.slots.iter().map(|s| s.count_ones()).sum()
    }

    /// A free slot of the SIMD with the most free slots (None: all busy).
    fn take_slot(&mut self, shape: WaveSlots) -> Option<HwSlot> {
        let full = ((1u32 << shape.per_simd) - 1) as u16;
        let simd = (0..usize::from(shape.simds))
            .filter(|&s| self.slots[s] != full)
            .min_by_key(|&s| self.slots[s].count_ones())?;
        let wave = (!self.slots[simd]).trailing_zeros() as u8;
        self.slots[simd] |= 1 << wave;
        Some(HwSlot {
            simd: simd as u8,
            wave,
            ..self.at
        })
    }
}

/// Where a workgroup went: its CU (an index into its XCC's enabled CUs)
/// and each wave's slot.
#[derive(Clone, Debug, Default)]
pub struct Seat {
    pub cu: usize,
    pub waves: Vec<HwSlot>,
}

/// The CUs a dispatch may use on each XCC, with what it has on them.
pub struct Cus {
    xccs: Vec<Vec<CuLoad>>,
    shape: WaveSlots,
}

impl Cus {
    /// `enabled`: each XCC's CUs the queue's mask enables, each of
    /// `shape`'s wave slots.
    pub fn new(shape: WaveSlots, enabled: &[Vec<HwSlot>]) -> Cus {
        let load = |&at: &HwSlot| CuLoad {
            at,
            slots: [0; MAX_SIMDS],
            lds: 0,
        };
        Cus {
            xccs: enabled
                .iter()
                .map(|c| c.iter().map(load).collect())
                .collect(),
            shape,
        }
    }

    /// Whether XCC `x` has a CU the dispatch may use.
    pub fn any_on(&self, x: usize) -> bool {
        self.xccs.get(x).is_some_and(|c| !c.is_empty())
    }

    /// Seats a workgroup of `n` waves and `lds` bytes on the least loaded
    /// CU of XCC `x` with room for it; None when none has.
    pub fn place(&mut self, x: usize, n: usize, lds: usize) -> Option<Seat> {
        let room = self.shape.per_cu();
        let cus = self.xccs.get_mut(x)?;
        let cu = (0..cus.len())
            .filter(|&c| cus[c].waves() + n as u32 <= room && cus[c].lds + lds <= CU_LDS)
            .min_by_key(|&c| cus[c].waves())?;
        Some(self.seat_on(x, cu, n, lds))
    }

    /// Seats a workgroup rebuilt from a context save area on the least
    /// loaded CU of XCC `x` (its waves were resident when they were saved:
    /// they get slots even where the CU is full, sharing a SIMD's last);
    /// None when the XCC has no CU the dispatch may use.
    pub fn reseat(&mut self, x: usize, n: usize, lds: usize) -> Option<Seat> {
        let cus = self.xccs.get(x)?;
        let cu = (0..cus.len()).min_by_key(|&c| cus[c].waves())?;
        Some(self.seat_on(x, cu, n, lds))
    }

    fn seat_on(&mut self, x: usize, cu: usize, n: usize, lds: usize) -> Seat {
        let shape = self.shape;
        let load = &mut self.xccs[x][cu];
        load.lds += lds;
        let waves = (0..n)
            .map(|k| {
                load.take_slot(shape).unwrap_or(HwSlot {
                    simd: (k % usize::from(shape.simds)) as u8,
                    wave: shape.per_simd - 1,
                    ..load.at
                })
            })
            .collect();
        Seat { cu, waves }
    }

    /// Frees what a workgroup of XCC `x` held.
    pub fn release(&mut self, x: usize, seat: &Seat, lds: usize) {
        let Some(load) = self.xccs.get_mut(x).and_then(|c| c.get_mut(seat.cu)) else {
            return;
        };
        load.lds = load.lds.saturating_sub(lds);
        for w in &seat.waves {
            load.slots[w.simd as usize] &= !(1 << w.wave);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gfx908's CUs: 4 SIMDs of 10 wave slots; gfx90a's: of 8.
    const GFX908: WaveSlots = WaveSlots {
        simds: 4,
        per_simd: 10,
    };
    const GFX90A: WaveSlots = WaveSlots {
        simds: 4,
        per_simd: 8,
    };

    /// MI100's XCC: 4 SEs of 2 arrays, 120 CUs: 15 per array.
    fn mi100() -> CuLayout {
        let bm = [[0x7fff; 4]; 4].map(|r| [r[0], r[1], 0, 0]);
        CuLayout::new(1, 4, 2, bm, GFX908)
    }

    fn cus(v: &[HwSlot]) -> Vec<(u8, u8, u8)> {
        v.iter().map(|c| (c.se, c.sh, c.cu)).collect()
    }

    #[test]
    fn mask_bits_walk_the_shader_engines_then_the_arrays_then_the_cu_index() {
        let l = mi100();
        let all = l.enabled(&[]);
        assert_eq!(all[0].len(), 120);
        // Bits 0, 1: SE0 and SE1 SH0 CU0; bit 4: SE0 SH1 CU0; bit 8: SE0 SH0 CU1.
        let e = l.enabled(&[0b1_0001_0011, 0, 0, 0]);
        assert_eq!(cus(&e[0]), [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]);
        // Bits past the GPU's CUs enable nothing.
        assert!(l.enabled(&[0, 0, 0, 0, 0xffff_ffff])[0].is_empty());
        assert!(l.enabled(&[0])[0].is_empty());
    }

    #[test]
    fn on_several_xccs_the_bits_take_turns() {
        // MI300X's partition of 8 XCCs: 4 SEs of 1 array, 38 CUs (10, 10, 9, 9).
        let bm = [
            [0x3ff, 0, 0, 0],
            [0x3ff, 0, 0, 0],
            [0x1ff, 0, 0, 0],
            [0x1ff, 0, 0, 0],
        ];
        let l = CuLayout::new(8, 4, 1, bm, GFX90A);
        // Bits 0..7: CU0 of SE0 on XCC 0..7; bit 8: CU0 of SE1 on XCC 0.
        let e = l.enabled(&[0x0000_0105]);
        assert_eq!(cus(&e[0]), [(0, 0, 0), (1, 0, 0)]);
        assert_eq!(cus(&e[2]), [(0, 0, 0)]);
        assert!(e[1].is_empty() && e[7].is_empty());
        assert_eq!(e[2][0].xcc, 2);
        assert_eq!(l.enabled(&[])[7].len(), 38);
    }

    #[test]
    fn a_cu_holds_its_simds_wave_slots_and_its_lds() {
        let l = mi100();
        let mut c = Cus::new(l.slots, &l.enabled(&[1]));
        // 40 wave slots: 2 workgroups of 16 waves fit, a third does not.
        let a = c.place(0, 16, 0).expect("first workgroup");
        let b = c.place(0, 16, 0).expect("second workgroup");
        assert!(c.place(0, 16, 0).is_none());
        let mut slots: Vec<(u8, u8)> = a
            .waves
            .iter()
            .chain(&b.waves)
            .map(|w| (w.simd, w.wave))
            .collect();
        slots.sort();
        slots.dedup();
        assert_eq!(slots.len(), 32, "every wave has its own slot");
        c.release(0, &a, 0);
        assert!(c.place(0, 16, 40 << 10).is_some());
        assert!(c.place(0, 1, 40 << 10).is_none(), "64 KiB of LDS");
        // A queue with no CU of XCC 0 places nothing there.
        let mut none = Cus::new(l.slots, &l.enabled(&[0]));
        assert!(!none.any_on(0) && none.place(0, 1, 0).is_none());
    }

    #[test]
    fn workgroups_spread_over_the_enabled_cus() {
        let l = mi100();
        let mut c = Cus::new(GFX90A, &l.enabled(&[0b11]));
        let seats: Vec<u8> = (0..4)
            .map(|_| c.place(0, 4, 0).unwrap().waves[0].se)
            .collect();
        assert_eq!(seats, [0, 1, 0, 1]);
    }
}
