//! Wave64 state: the registers a wave owns.

use crate::regfile::RegFile;

/// The GPU the wave runs on. gfx908 and gfx90a differ in a few opcodes (gfx90a's packed f32
/// and f64 atomics, gfx908's v_mul_legacy_f32 at VOP2 0x04) and in VGPR-tuple alignment;
/// gfx942 is gfx90a less the opcodes it dropped or renamed, plus its own (`exec/gfx942.rs`),
/// with architected flat scratch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// MI100 (CDNA1).
    Gfx908,
    /// MI200 (CDNA2).
    Gfx90a,
    /// MI300X/MI300A (CDNA3).
    Gfx942,
}

impl Target {
    /// The processor name LLVM and ROCm use.
    pub fn name(self) -> &'static str {
        match self {
            Target::Gfx908 => "gfx908",
            Target::Gfx90a => "gfx90a",
            Target::Gfx942 => "gfx942",
        }
    }

    /// gfx90a's register file: one unified file of VGPRs and AccVGPRs, register tuples
    /// aligned, work-item ids packed in v0 (gfx90a and gfx942).
    pub fn unified_vgprs(self) -> bool {
        self != Target::Gfx908
    }

    /// Architected flat scratch (AMDGPUUsage's processor table): the SPI sets FLAT_SCRATCH
    /// to the wave's scratch base; no scratch buffer resource, no wave offset SGPR.
    pub fn architected_flat_scratch(self) -> bool {
        self == Target::Gfx942
    }
}

/// Lanes of a wave (defined with the register file, which stores rows of them).
pub use crate::regfile::LANES;
/// Architectural VGPRs (and as many AccVGPRs) per lane.
pub const VGPRS: usize = 256;
/// Rows kept past the last VGPR so that a tuple starting at v255 reads zeros instead of
/// indexing out of bounds; memory instructions refuse such tuples before they get here.
const VGPR_SLACK: usize = 16;
/// Scalar operand codes 0..=127 (SGPRs, VCC, TTMPs, M0, EXEC) address [`Wave::sreg`]; the
/// slack holds what a 16-dword load starting near the top would write.
pub const SREG_CODES: usize = 128 + 16;

/// Scalar register operand codes.
pub mod sreg {
    pub const FLAT_SCRATCH_LO: usize = 102;
    pub const XNACK_MASK_LO: usize = 104;
    pub const VCC_LO: usize = 106;
    pub const TTMP0: usize = 108;
    pub const M0: usize = 124;
    pub const EXEC_LO: usize = 126;
}

/// Hardware registers s_getreg/s_setreg reach (HW_REG ids of GFX9).
pub mod hwreg {
    pub const MODE: u16 = 1;
    pub const STATUS: u16 = 2;
    pub const TRAPSTS: u16 = 3;
    pub const HW_ID: u16 = 4;
    pub const GPR_ALLOC: u16 = 5;
    pub const LDS_ALLOC: u16 = 6;
    pub const IB_STS: u16 = 7;
    pub const SH_MEM_BASES: u16 = 15;
    pub const TBA_LO: u16 = 16;
    pub const TBA_HI: u16 = 17;
    pub const TMA_LO: u16 = 18;
    pub const TMA_HI: u16 = 19;
    /// The XCC a wave runs on (gfx940 and later: MI300's dies).
    pub const XCC_ID: u16 = 20;
}

/// Apertures the inline operands 235..=238 read (SRC_SHARED_BASE ... SRC_PRIVATE_LIMIT):
/// where flat addresses fall into LDS and scratch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Apertures {
    pub shared_base: u64,
    pub private_base: u64,
}

/// One wave's registers.
#[derive(Clone, Debug)]
pub struct Wave {
    pub target: Target,
    pub pc: u64,
    /// Scalar registers by operand code: s0..s101, FLAT_SCRATCH, XNACK_MASK, VCC, TTMP0..15,
    /// M0, EXEC.
    pub sreg: [u32; SREG_CODES],
    pub scc: bool,
    vgpr: RegFile,
    agpr: RegFile,
    pub mode: u32,
    pub status: u32,
    pub trapsts: u32,
    /// HW_ID as s_getreg reads it (the CP model fills in wave, SIMD, CU ids).
    pub hw_id: u32,
    /// XCC_ID as s_getreg reads it on gfx942 (the XCC the CP gave the wave).
    pub xcc_id: u32,
    pub tba: u64,
    pub tma: u64,
    pub apertures: Apertures,
    /// Wave id within its workgroup, for the scheduler's bookkeeping.
    pub id_in_group: u32,
    /// Instructions executed since creation.
    pub retired: u64,
    /// Lane operations since creation: the lanes EXEC enabled, summed over the vector
    /// instructions (VALU, LDS, vector memory) retired.
    pub lanes: u64,
}

impl Wave {
    /// A wave with every register zero, EXEC all ones, at `pc`.
    pub fn new(target: Target, pc: u64) -> Wave {
        let mut w = Wave {
            target,
            pc,
            sreg: [0; SREG_CODES],
            scc: false,
            vgpr: RegFile::new(VGPRS + VGPR_SLACK),
            agpr: RegFile::new(VGPRS + VGPR_SLACK),
            mode: 0,
            status: 0,
            trapsts: 0,
            hw_id: 0,
            xcc_id: 0,
            tba: 0,
            tma: 0,
            apertures: Apertures::default(),
            id_in_group: 0,
            retired: 0,
            lanes: 0,
        };
        w.set_exec(u64::MAX);
        w
    }

    /// Makes this wave a new one at `pc` without clearing its VGPRs and AccVGPRs (a new
    /// wave's vector registers are undefined; reusing a wave saves their allocation).
    pub fn reset(&mut self, target: Target, pc: u64) {
        self.target = target;
        self.pc = pc;
        self.sreg = [0; SREG_CODES];
        self.scc = false;
        self.mode = 0;
        self.status = 0;
        self.trapsts = 0;
        self.hw_id = 0;
        self.xcc_id = 0;
        self.tba = 0;
        self.tma = 0;
        self.apertures = Apertures::default();
        self.id_in_group = 0;
        self.retired = 0;
        self.lanes = 0;
        self.set_exec(u64::MAX);
    }

    pub fn exec(&self) -> u64 {
        self.sgpr64(sreg::EXEC_LO)
    }

    pub fn set_exec(&mut self, v: u64) {
        self.set_sgpr64(sreg::EXEC_LO, v);
    }

    pub fn vcc(&self) -> u64 {
        self.sgpr64(sreg::VCC_LO)
    }

    pub fn set_vcc(&mut self, v: u64) {
        self.set_sgpr64(sreg::VCC_LO, v);
    }

    pub fn m0(&self) -> u32 {
        self.sreg[sreg::M0]
    }

    /// The scalar register at operand code `n` (0 past the end).
    pub fn sgpr(&self, n: usize) -> u32 {
        self.sreg.get(n).copied().unwrap_or(0)
    }

    /// Writes the scalar register at operand code `n`; codes past the end are dropped.
    pub fn set_sgpr(&mut self, n: usize, v: u32) {
        if let Some(r) = self.sreg.get_mut(n) {
            *r = v;
        }
    }

    pub fn sgpr64(&self, n: usize) -> u64 {
        self.sgpr(n) as u64 | (self.sgpr(n + 1) as u64) << 32
    }

    pub fn set_sgpr64(&mut self, n: usize, v: u64) {
        self.set_sgpr(n, v as u32);
        self.set_sgpr(n + 1, (v >> 32) as u32);
    }

    /// FLAT_SCRATCH, the wave's scratch base for flat and scratch_* instructions.
    pub fn flat_scratch(&self) -> u64 {
        self.sgpr64(sreg::FLAT_SCRATCH_LO)
    }

    /// VGPR `r` (an index 0..=255 plus tuple slack), all lanes.
    pub fn v(&self, r: usize) -> &[u32; LANES] {
        self.vgpr.get(r)
    }

    pub fn v_mut(&mut self, r: usize) -> &mut [u32; LANES] {
        self.vgpr.get_mut(r)
    }

    /// AccVGPR `r`, all lanes.
    pub fn a(&self, r: usize) -> &[u32; LANES] {
        self.agpr.get(r)
    }

    pub fn a_mut(&mut self, r: usize) -> &mut [u32; LANES] {
        self.agpr.get_mut(r)
    }

    /// VGPR or AccVGPR row, as the instruction's acc bit says.
    pub fn row(&self, acc: bool, r: usize) -> &[u32; LANES] {
        if acc {
            self.a(r)
        } else {
            self.v(r)
        }
    }

    pub fn row_mut(&mut self, acc: bool, r: usize) -> &mut [u32; LANES] {
        if acc {
            self.a_mut(r)
        } else {
            self.v_mut(r)
        }
    }

    /// The value of a VGPR in one lane (for callers reading results).
    pub fn lane(&self, r: usize, lane: usize) -> u32 {
        self.v(r)[lane]
    }

    pub fn set_lane(&mut self, r: usize, lane: usize, v: u32) {
        self.v_mut(r)[lane] = v;
    }
}
