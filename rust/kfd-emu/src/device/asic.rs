//! What amdgpu knows about one GPU: the facts its render node reports
//! through AMDGPU_INFO, derived from the profile.  No ioctl encoding here
//! (that is `render`), only the device: chip identity, IP blocks, rings,
//! memory sizes, firmware.
//!
//! Known gfx targets get the kernel's values for their IP versions
//! (soc15.c, gfx_v9_0.c, gfx_v9_4_3.c, sdma_v4_*.c; soc24.c and
//! sdma_v7_0.c for gfx1201); other targets get values derived from the gfx
//! target version and the family.

use crate::profile;

/// `AMDGPU_FAMILY_*`.
pub mod family {
    pub const AI: u32 = 141;
    pub const NV: u32 = 143;
    pub const GC_11_0_0: u32 = 145;
    pub const GC_12_0_0: u32 = 152;
}

/// An IP version `major.minor.rev` (IP discovery's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpVersion(pub u32, pub u32, pub u32);

impl IpVersion {
    /// `IP_VERSION_MAJ_MIN_REV`: what HW_IP_INFO reports as
    /// `ip_discovery_version`.
    pub fn packed(self) -> u32 {
        (self.0 << 16) | (self.1 << 8) | self.2
    }
}

/// An IP block as amdgpu registers it: the block driver's version (what
/// HW_IP_INFO reports as hw_ip_version_major/minor) and the hardware's IP
/// discovery version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpBlock {
    pub block: (u32, u32),
    pub hw: IpVersion,
}

/// Byte sizes amdgpu reserves or reports.
pub const VM_RESERVED_VRAM: u64 = 8 << 20;
/// `AMDGPU_VA_RESERVED_BOTTOM` and `..._TOP` (trap, seq64 and CSA areas).
pub const VA_RESERVED_BOTTOM: u64 = 1 << 16;
pub const VA_RESERVED_TOP: u64 = (2 << 12) + (2 << 20) + (2 << 20);
/// The GMC hole of 48-bit GPUVM: VAs at and above `HOLE_START` are used
/// sign-extended from `HOLE_END`.
pub const GMC_HOLE_START: u64 = 0x0000_8000_0000_0000;
pub const GMC_HOLE_END: u64 = 0xffff_8000_0000_0000;
/// A GPUVM of 48 bits (gfx9 and later, 4-level page tables).
pub const VM_SIZE: u64 = 1 << 48;
/// Small-BAR boards expose this much VRAM to the CPU.
pub const SMALL_BAR: u64 = 256 << 20;
/// `AMDGPU_VRAM_TYPE_HBM`: every MI part (HBM2, HBM2e and HBM3 all read
/// as HBM).
pub const VRAM_TYPE_HBM: u32 = 6;
/// `AMDGPU_VRAM_TYPE_GDDR6`: the Radeon parts from RDNA on.
pub const VRAM_TYPE_GDDR6: u32 = 9;

/// The kernel's `amdgpu_num_kcq` default: kernel compute queues per GPU.
pub const KERNEL_COMPUTE_RINGS: u32 = 8;

/// One emulated GPU as amdgpu describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Asic {
    pub device_id: u32,
    /// PCI revision (`pci_rev`, the key amdgpu.ids is looked up by).
    pub pci_rev: u32,
    /// Silicon revision (NBIO strap); the emulator models A0 silicon.
    pub chip_rev: u32,
    /// `external_rev_id`: chip_rev plus the ASIC's base (soc15.c).
    pub external_rev: u32,
    pub family: u32,
    pub gfx: IpBlock,
    pub sdma: IpBlock,
    /// Graphics rings (none on CDNA parts).
    pub gfx_rings: u32,
    pub compute_rings: u32,
    /// Whether the DMA rings take user submissions (see
    /// `profile::Gpu::dma_user_submission`).
    pub dma_user_submission: bool,
    /// SDMA engines (`adev->sdma.num_instances`): the profile's PCIe and
    /// XGMI engines together.
    pub sdma_instances: u32,
    /// Shader engines and arrays of one XCC (what amdgpu's gfx config and
    /// DEV_INFO describe), CUs per shader array.
    pub shader_engines: u32,
    pub sh_per_se: u32,
    pub cu_per_sh: u32,
    /// SIMDs of a CU, and wave slots of a SIMD.
    pub simd_per_cu: u32,
    pub max_waves_per_simd: u32,
    /// Active CUs of the whole GPU, and its XCCs (compute dies).
    pub cu_active: u32,
    pub xcc: u32,
    pub wave_front_size: u32,
    pub max_gprs: u32,
    pub max_hw_contexts: u32,
    pub ce_ram_size: u32,
    /// GB_ADDR_CONFIG as gfx v9 programs it.
    pub gb_addr_config: u32,
    /// kHz.
    pub max_engine_clock: u64,
    pub max_memory_clock: u64,
    /// The GPU clock counter's frequency in kHz: the emulator's counter
    /// (KFD GET_CLOCK_COUNTERS, AMDGPU_INFO_TIMESTAMP) counts nanoseconds.
    pub gpu_counter_freq: u32,
    pub vram_type: u32,
    pub vram_bit_width: u32,
    pub vram_size: u64,
    /// CPU-visible VRAM (all of it on large-BAR boards).
    pub visible_vram_size: u64,
    /// The GTT (TTM's page limit: half the system memory).
    pub gtt_size: u64,
    pub gds_size: u32,
    pub gws_size: u32,
    pub oa_size: u32,
    /// MEC (MEC1 and MEC2 run the same image) and SDMA firmware.
    pub mec_fw: u32,
    pub sdma_fw: u32,
}

/// The emulated GPU clock counter: CLOCK_MONOTONIC_RAW in nanoseconds,
/// the clock KFD's GET_CLOCK_COUNTERS reports as `gpu_clock_counter`
/// (also what the SDMA engine's TIMESTAMP packets write).
pub fn gpu_clock_counter() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_RAW, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `AMDGPU_FAMILY_*` of a gfx target version (`gfx_target_version`,
/// major*10000 + minor*100 + stepping).
pub fn family_of(gfx_target_version: u32) -> u32 {
    match gfx_target_version / 10000 {
        10 => family::NV,
        11 => family::GC_11_0_0,
        12 => family::GC_12_0_0,
        _ => family::AI,
    }
}

/// The IP facts of a gfx target: GC and SDMA blocks, the external
/// revision base, graphics rings, CE RAM.
struct Chip {
    gfx: IpBlock,
    sdma: IpBlock,
    external_rev_base: u32,
    gfx_rings: u32,
    ce_ram_size: u32,
}

fn chip(gfx_target_version: u32) -> Chip {
    let (major, minor, step) = (
        gfx_target_version / 10000,
        gfx_target_version / 100 % 100,
        gfx_target_version % 100,
    );
    let block = |b: (u32, u32), v: (u32, u32, u32)| IpBlock {
        block: b,
        hw: IpVersion(v.0, v.1, v.2),
    };
    match gfx_target_version {
        // gfx908, Arcturus (MI100): GC 9.4.1, SDMA 4.2.2.
        90008 => Chip {
            gfx: block((9, 0), (9, 4, 1)),
            sdma: block((4, 0), (4, 2, 2)),
            external_rev_base: 0x32,
            gfx_rings: 0,
            ce_ram_size: 0x8000,
        },
        // gfx90a, Aldebaran (MI200): GC 9.4.2, SDMA 4.4.0.
        90010 => Chip {
            gfx: block((9, 0), (9, 4, 2)),
            sdma: block((4, 0), (4, 4, 0)),
            external_rev_base: 0x3c,
            gfx_rings: 0,
            ce_ram_size: 0x8000,
        },
        // gfx940/941/942, Aqua Vanjaram (MI300): GC 9.4.3, SDMA 4.4.2.
        90400..=90402 => Chip {
            gfx: block((9, 4), (9, 4, 3)),
            sdma: block((4, 4), (4, 4, 2)),
            external_rev_base: 0x46,
            gfx_rings: 0,
            ce_ram_size: 0,
        },
        // gfx1201, Navi 48 (RX 9070 XT): GC 12.0.1, SDMA 7.0.1; soc24.c
        // sets external_rev_id to rev_id + 0x50.
        120001 => Chip {
            gfx: block((12, 0), (12, 0, 1)),
            sdma: block((7, 0), (7, 0, 1)),
            external_rev_base: 0x50,
            gfx_rings: 1,
            ce_ram_size: 0,
        },
        // Anything else: the GC version is the gfx target's, SDMA the
        // generation's first.
        _ => {
            let sdma_major = match major {
                9 => 4,
                10 => 5,
                11 => 6,
                _ => 7,
            };
            Chip {
                gfx: block((major, 0), (major, minor, step)),
                sdma: block((sdma_major, 0), (sdma_major, 0, 0)),
                external_rev_base: 1,
                gfx_rings: 1,
                ce_ram_size: if major == 9 { 0x8000 } else { 0 },
            }
        }
    }
}

impl Asic {
    /// GPU `g` of a machine with `system_mem` bytes of RAM.
    pub fn new(g: &profile::Gpu, system_mem: u64) -> Asic {
        let c = chip(g.gfx_target_version);
        let xcc = g.num_xcc.max(1);
        let sh_per_se = g.simd_arrays_per_engine.max(1);
        let shader_engines = (g.array_count / sh_per_se / xcc).max(1);
        let chip_rev = 0;
        Asic {
            device_id: g.device_id,
            pci_rev: g.pci_revision,
            chip_rev,
            external_rev: chip_rev + c.external_rev_base,
            family: family_of(g.gfx_target_version),
            gfx: c.gfx,
            sdma: c.sdma,
            gfx_rings: c.gfx_rings,
            compute_rings: KERNEL_COMPUTE_RINGS,
            dma_user_submission: g.dma_user_submission,
            sdma_instances: g.num_sdma_engines + g.num_sdma_xgmi_engines,
            shader_engines,
            sh_per_se,
            cu_per_sh: g.cu_per_simd_array,
            simd_per_cu: g.simd_per_cu,
            max_waves_per_simd: g.max_waves_per_simd,
            cu_active: g.cu_count,
            xcc,
            wave_front_size: g.wave_front_size,
            max_gprs: 256,
            max_hw_contexts: 8,
            ce_ram_size: c.ce_ram_size,
            // The golden bits gfx v9 ORs in, the shader engine count
            // (log2, bits 20:19) from the hardware.
            gb_addr_config: 0x2201_4042 | (shader_engines.max(1).ilog2() & 3) << 19,
            max_engine_clock: u64::from(g.max_engine_clk_fcompute) * 1000,
            max_memory_clock: u64::from(g.vram_clk_max) * 1000,
            gpu_counter_freq: 1_000_000,
            vram_type: if g.gfx_target_version >= 100000 {
                VRAM_TYPE_GDDR6
            } else {
                VRAM_TYPE_HBM
            },
            vram_bit_width: g.vram_width,
            vram_size: g.vram_size,
            visible_vram_size: if g.vram_public {
                g.vram_size
            } else {
                SMALL_BAR.min(g.vram_size)
            },
            gtt_size: system_mem / 2,
            gds_size: g.gds_size_in_kb * 1024,
            gws_size: g.num_gws,
            oa_size: 16,
            mec_fw: g.fw_version,
            sdma_fw: g.sdma_fw_version,
        }
    }

    /// The active-CU bitmap of XCC 0 as DEV_INFO lays it out
    /// (`cu_bitmap[se % 4][sh + se / 4]`), CUs spread evenly over the
    /// shader arrays, the first ones getting the remainder.
    pub fn cu_bitmap(&self) -> [[u32; 4]; 4] {
        let arrays = self.shader_engines * self.sh_per_se;
        let per_xcc = (self.cu_active / self.xcc).min(arrays * self.cu_per_sh);
        let mut bm = [[0u32; 4]; 4];
        for se in 0..self.shader_engines.min(8) {
            for sh in 0..self.sh_per_se.min(2) {
                let i = se * self.sh_per_se + sh;
                let n = (per_xcc / arrays + u32::from(i < per_xcc % arrays)).min(32);
                let col = (sh + se / 4) as usize;
                if col < 4 {
                    bm[(se % 4) as usize][col] = if n == 32 { u32::MAX } else { (1 << n) - 1 };
                }
            }
        }
        bm
    }

    /// `cu_ao_mask`: the always-on CUs (all active ones on a dGPU) of the
    /// first two shader engines and arrays, 8 bits each.
    pub fn cu_ao_mask(&self) -> u32 {
        let bm = self.cu_bitmap();
        let mut m = 0;
        for (se, row) in bm.iter().take(2).enumerate() {
            for (sh, bits) in row.iter().take(2).enumerate() {
                m |= (bits & 0xff) << (se * 16 + sh * 8);
            }
        }
        m
    }

    /// The GPUVM range user-mode drivers may use below the GMC hole, and
    /// the one above it.
    pub fn va_ranges(&self) -> ((u64, u64), (u64, u64)) {
        let vm = VM_SIZE - VA_RESERVED_TOP;
        let low = (VA_RESERVED_BOTTOM, vm.min(GMC_HOLE_START));
        let high = if vm > GMC_HOLE_START {
            (GMC_HOLE_END, GMC_HOLE_END | vm)
        } else {
            (0, 0)
        };
        (low, high)
    }
}
