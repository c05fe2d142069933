//! A test-only launcher for hipcc's code objects (used by tests/hip_kernels.rs and, through
//! `#[path]`, by examples/rate.rs): it does what the CP and SPI do for a dispatch, as
//! AMDGPUUsage describes it. It loads the code object, reads the kernel descriptor, writes
//! an AQL dispatch packet and the kernarg segment, and starts each wave with the user SGPRs
//! the descriptor enables (private segment buffer, dispatch and queue pointers, kernarg
//! pointer, flat scratch init), the workgroup ids, the scratch wave offset and the work-item
//! ids (packed in v0 on gfx90a). A workgroup's waves are interleaved with a small budget
//! and released together from each s_barrier; workgroups run one after another.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

use gfx9::exec::{CodeCache, Stop};
use gfx9::{Memory, Target, VecMemory, Wave};

pub const CODE: u64 = 0x1_0000_0000;
pub const DISPATCH: u64 = 0x2_0000_0000;
pub const QUEUE: u64 = 0x2_0000_1000;
pub const KERNARG: u64 = 0x2_0001_0000;
pub const HEAP: u64 = 0x3_0000_0000;
pub const SCRATCH: u64 = 0x8_0000_0000;
pub const SHARED_APERTURE: u64 = 0x0001_0000_0000_0000;
pub const PRIVATE_APERTURE: u64 = 0x0002_0000_0000_0000;
pub const TARGETS: [Target; 2] = [Target::Gfx908, Target::Gfx90a];

pub fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
pub fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

/// The loadable segments and the kernel descriptor symbols (`<name>.kd`) of an ELF code
/// object.
struct CodeObject {
    segments: Vec<(u64, Vec<u8>, u64)>,
    kds: HashMap<String, u64>,
}

fn parse_elf(b: &[u8]) -> CodeObject {
    assert_eq!(&b[..4], b"\x7fELF", "an ELF file");
    let (phoff, shoff) = (le64(b, 32) as usize, le64(b, 40) as usize);
    let (phnum, shentsize, shnum) = (
        le16(b, 56) as usize,
        le16(b, 58) as usize,
        le16(b, 60) as usize,
    );
    let segments = (0..phnum)
        .map(|k| phoff + 56 * k)
        .filter(|&p| le32(b, p) == 1) // PT_LOAD
        .map(|p| {
            let (off, va) = (le64(b, p + 8) as usize, le64(b, p + 16));
            let (filesz, memsz) = (le64(b, p + 32) as usize, le64(b, p + 40));
            (va, b[off..off + filesz].to_vec(), memsz)
        })
        .collect();
    let section = |k: usize| shoff + shentsize * k;
    let mut kds = HashMap::new();
    for s in (0..shnum).map(section).filter(|&s| le32(b, s + 4) == 2) {
        // SHT_SYMTAB: entries of 24 bytes, names in the linked string table.
        let (off, size) = (le64(b, s + 24) as usize, le64(b, s + 32) as usize);
        let strtab = section(le32(b, s + 40) as usize);
        let stroff = le64(b, strtab + 24) as usize;
        for e in (off..off + size).step_by(24) {
            let name_at = stroff + le32(b, e) as usize;
            let end = b[name_at..].iter().position(|c| *c == 0).expect("NUL");
            let name = std::str::from_utf8(&b[name_at..name_at + end]).expect("UTF-8");
            if let Some(kernel) = name.strip_suffix(".kd") {
                kds.insert(kernel.to_string(), le64(b, e + 8));
            }
        }
    }
    CodeObject { segments, kds }
}

/// The fields of a kernel descriptor (AMDGPUUsage, "Kernel Descriptor") the launcher uses.
#[derive(Debug)]
struct Kd {
    group_segment: u32,
    private_segment: u32,
    kernarg_size: u32,
    entry: u64,
    rsrc2: u32,
    properties: u16,
}

impl Kd {
    fn read(mem: &mut VecMemory, va: u64) -> Kd {
        let mut b = [0u8; 64];
        mem.read(va, &mut b).expect("kernel descriptor mapped");
        Kd {
            group_segment: le32(&b, 0),
            private_segment: le32(&b, 4),
            kernarg_size: le32(&b, 8),
            entry: va.wrapping_add(le64(&b, 16)),
            rsrc2: le32(&b, 52),
            properties: le16(&b, 56),
        }
    }
}

/// Kernel arguments laid out as the C ABI does.
#[derive(Default)]
pub struct Args(Vec<u8>);

impl Args {
    fn put(mut self, bytes: &[u8]) -> Args {
        while !self.0.len().is_multiple_of(bytes.len()) {
            self.0.push(0);
        }
        self.0.extend_from_slice(bytes);
        self
    }
    pub fn u32(self, v: u32) -> Args {
        self.put(&v.to_le_bytes())
    }
    pub fn f32(self, v: f32) -> Args {
        self.put(&v.to_le_bytes())
    }
    pub fn ptr(self, v: u64) -> Args {
        self.put(&v.to_le_bytes())
    }
}

/// One emulated device running the kernels of one code object.
pub struct Gpu {
    t: Target,
    mem: VecMemory,
    cache: CodeCache,
    kds: HashMap<String, u64>,
    heap: u64,
    prog: String,
    /// Wave instructions retired by the waves that ended.
    pub retired: u64,
    /// Their lane operations.
    pub lanes: u64,
}

impl Gpu {
    pub fn new(prog: &str, t: Target) -> Gpu {
        let cpu = t.name();
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/hip/{prog}-{cpu}.co"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let co = parse_elf(&bytes);
        let mut mem = VecMemory::new();
        for (va, data, memsz) in &co.segments {
            mem.map(CODE + va, *memsz);
            mem.load(CODE + va, data);
        }
        mem.map(DISPATCH, 64);
        mem.map(QUEUE, 256);
        Gpu {
            t,
            mem,
            cache: CodeCache::new(12),
            kds: co.kds,
            heap: HEAP,
            prog: format!("{prog}-{cpu}"),
            retired: 0,
            lanes: 0,
        }
    }

    /// A buffer holding `data`; returns its address.
    pub fn alloc(&mut self, data: &[u8]) -> u64 {
        let va = self.heap;
        self.mem.map(va, data.len().max(1) as u64);
        self.mem.load(va, data);
        self.heap += (data.len() as u64).div_ceil(256).max(1) * 256;
        va
    }

    pub fn alloc_f32(&mut self, v: &[f32]) -> u64 {
        self.alloc(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
    }

    pub fn alloc_u32(&mut self, v: &[u32]) -> u64 {
        self.alloc(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
    }

    pub fn read(&mut self, va: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        self.mem.read(va, &mut b).expect("buffer mapped");
        b
    }

    pub fn read_f32(&mut self, va: u64, n: usize) -> Vec<f32> {
        self.read(va, 4 * n)
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
            .collect()
    }

    pub fn read_u32(&mut self, va: u64, n: usize) -> Vec<u32> {
        self.read(va, 4 * n)
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4")))
            .collect()
    }

    /// Every kernel of the code object: its name and what its descriptor says.
    pub fn kernel_codes(&mut self) -> Vec<(String, gfx9::launch::KernelCode)> {
        let mut kds: Vec<(String, u64)> = self.kds.iter().map(|(n, v)| (n.clone(), *v)).collect();
        kds.sort();
        kds.into_iter()
            .map(|(name, va)| {
                let mut b = [0u8; gfx9::launch::KERNEL_OBJECT_BYTES];
                self.mem
                    .read(CODE + va, &mut b)
                    .expect("kernel descriptor mapped");
                (name, gfx9::launch::KernelCode::parse(&b))
            })
            .collect()
    }

    /// Runs `kernel` (a prefix of its mangled name) over `grid` workgroups of `block`.
    pub fn launch(&mut self, kernel: &str, grid: [u32; 3], block: [u32; 3], args: Args) {
        let (name, kd_va) = self
            .kds
            .iter()
            .find(|(n, _)| n.starts_with(kernel))
            .map(|(n, v)| (n.clone(), *v))
            .unwrap_or_else(|| panic!("{}: no kernel {kernel}", self.prog));
        let kd = Kd::read(&mut self.mem, CODE + kd_va);
        self.write_packet(&kd, CODE + kd_va, grid, block);
        let mut kernarg = args.0;
        kernarg.resize(kernarg.len().max(kd.kernarg_size as usize), 0);
        self.mem.load(KERNARG, &kernarg);
        let threads = block.iter().product::<u32>();
        let wave_scratch = kd.private_segment as u64 * 64;
        if wave_scratch > 0 {
            self.mem
                .map(SCRATCH, wave_scratch * threads.div_ceil(64) as u64);
        }
        for gz in 0..grid[2] {
            for gy in 0..grid[1] {
                for gx in 0..grid[0] {
                    let waves = (0..threads.div_ceil(64))
                        .map(|w| self.wave(&kd, [gx, gy, gz], block, w, wave_scratch))
                        .collect();
                    self.run_group(&name, &kd, waves, [gx, gy, gz]);
                }
            }
        }
    }

    /// The AQL kernel dispatch packet the kernel reads its sizes from.
    fn write_packet(&mut self, kd: &Kd, kd_va: u64, grid: [u32; 3], block: [u32; 3]) {
        let mut p = [0u8; 64];
        for k in 0..3 {
            p[4 + 2 * k..6 + 2 * k].copy_from_slice(&(block[k] as u16).to_le_bytes());
            p[12 + 4 * k..16 + 4 * k].copy_from_slice(&(grid[k] * block[k]).to_le_bytes());
        }
        p[2..4].copy_from_slice(&3u16.to_le_bytes()); // setup: 3 dimensions
        p[24..28].copy_from_slice(&kd.private_segment.to_le_bytes());
        p[28..32].copy_from_slice(&kd.group_segment.to_le_bytes());
        p[32..40].copy_from_slice(&kd_va.to_le_bytes());
        p[40..48].copy_from_slice(&KERNARG.to_le_bytes());
        self.mem.load(DISPATCH, &p);
    }

    /// Wave `w` of workgroup `group` with its initial registers.
    fn wave(&self, kd: &Kd, group: [u32; 3], block: [u32; 3], w: u32, scratch: u64) -> Wave {
        let mut wave = Wave::new(self.t, kd.entry);
        wave.apertures.shared_base = SHARED_APERTURE;
        wave.apertures.private_base = PRIVATE_APERTURE;
        let mut sgprs: Vec<u32> = Vec::new();
        let enabled = |bit: u32| kd.properties >> bit & 1 != 0;
        if enabled(0) {
            // The scratch V#: swizzled, 4-byte elements, index stride 64, add_tid.
            let d3 = (1 << 19) | (3 << 21) | (1 << 23);
            sgprs.extend([
                SCRATCH as u32,
                (SCRATCH >> 32) as u32 | 1 << 31,
                u32::MAX,
                d3,
            ]);
        }
        for (bit, value) in [
            (1, DISPATCH),
            (2, QUEUE),
            (3, KERNARG),
            (4, 0),
            (5, SCRATCH),
        ] {
            if enabled(bit) {
                sgprs.extend([value as u32, (value >> 32) as u32]);
            }
        }
        if enabled(6) {
            sgprs.push(kd.private_segment);
        }
        assert_eq!(
            sgprs.len() as u32,
            (kd.rsrc2 >> 1) & 31,
            "{}: user SGPR count",
            self.prog
        );
        for (k, id) in group.iter().enumerate() {
            if kd.rsrc2 >> (7 + k) & 1 != 0 {
                sgprs.push(*id);
            }
        }
        if kd.rsrc2 >> 10 & 1 != 0 {
            sgprs.push(0); // workgroup info
        }
        if kd.rsrc2 & 1 != 0 {
            sgprs.push((w as u64 * scratch) as u32); // private segment wave offset
        }
        for (k, v) in sgprs.into_iter().enumerate() {
            wave.set_sgpr(k, v);
        }
        let threads = block.iter().product::<u32>();
        let live = (threads - 64 * w).min(64);
        wave.set_exec(if live == 64 {
            u64::MAX
        } else {
            (1 << live) - 1
        });
        for l in 0..64 {
            let tid = 64 * w + l as u32;
            let (x, y, z) = (
                tid % block[0],
                tid / block[0] % block[1],
                tid / (block[0] * block[1]),
            );
            match self.t {
                Target::Gfx90a | Target::Gfx942 => wave.set_lane(0, l, x | y << 10 | z << 20),
                Target::Gfx908 => {
                    wave.set_lane(0, l, x);
                    wave.set_lane(1, l, y);
                    wave.set_lane(2, l, z);
                }
            }
        }
        wave
    }

    fn run_group(&mut self, name: &str, kd: &Kd, mut waves: Vec<Wave>, group: [u32; 3]) {
        let mut lds = vec![0u8; kd.group_segment.max(4) as usize];
        let mut done = vec![false; waves.len()];
        while done.iter().any(|d| !d) {
            let mut at_barrier = 0;
            for (k, w) in waves.iter_mut().enumerate() {
                if done[k] {
                    continue;
                }
                loop {
                    match w.run(&mut self.mem, &mut lds, &mut self.cache, 97) {
                        Stop::Budget | Stop::Sleep(_) => continue,
                        Stop::Barrier => at_barrier += 1,
                        Stop::Endpgm => {
                            done[k] = true;
                            self.retired += w.retired;
                            self.lanes += w.lanes;
                        }
                        other => panic!("{} {name} group {group:?} wave {k}: {other}", self.prog),
                    }
                    break;
                }
            }
            let live = done.iter().filter(|d| !**d).count();
            assert!(
                at_barrier == 0 || at_barrier == live,
                "{} {name}: a barrier reached by {at_barrier} of {live} waves",
                self.prog
            );
        }
    }
}

/// The test data generator of test/hip/check.h (xorshift32).
pub struct Rng(pub u32);

impl Rng {
    pub fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * (self.next() >> 8) as f32 / 16_777_216.0
    }
}
