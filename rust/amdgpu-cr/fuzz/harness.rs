//! The validation path over arbitrary image directories, shared by the
//! cargo-fuzz target `validate_dir` and by `cargo test`'s
//! `tests/validate_fuzz.rs` (included by path in both, so the library
//! carries no fuzzing API).
//!
//! An input is a small archive of files, each `u8 kind`, `u32 LE length`
//! and that many bytes (a length past the end takes what is left); the
//! kind picks the file's name from [`NAMES`].  The files are written to a
//! scratch directory, which then goes through what `criu-rocm gpu-check`
//! runs before a restore ([`restore::dry_run`]) against a fixed emulated
//! host: one CPU and one GPU (gpu_id 0x1a2b, renderD128) in a fake sysfs
//! tree, and `/dev/kfd` and the render node as plain files.  Whatever the
//! bytes, it must return verdicts, never panic.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use amdgpu_cr::env::{Checks, EnginePolicy};
use amdgpu_cr::session::restore::{self, DryRunEntry, HostRenderNodes, RestoreOptions};

/// The host's GPU.
pub const HOST_GPU: u32 = 0x1a2b;

/// File names an archive entry may take: KFD images with a positive and a
/// negative (id >= 2^31) file id, their render-node images and pages files
/// (of the host's GPU and of another), CRIU's process tree, and the other
/// files a restore's validation reads: the GPU image digests, CRIU's
/// inventory and files images and the two processes' memory maps.
pub const NAMES: [&str; 13] = [
    "amdgpu-kfd-1.img",
    "amdgpu-pages-1-1a2b.img",
    "amdgpu-renderD-3.img",
    "pstree.img",
    "amdgpu-kfd--2.img",
    "amdgpu-pages--2-1a2b.img",
    "amdgpu-renderD-4.img",
    "amdgpu-pages-1-5c3d.img",
    "amdgpu-digests.img",
    "inventory.img",
    "files.img",
    "mm-4242.img",
    "mm-4243.img",
];

/// The properties of the host's GPU node (an MI100-like part).
const GPU_PROPS: &str = "cpu_cores_count 0\nsimd_count 480\nmem_banks_count 1\n\
    caches_count 244\nio_links_count 1\nmax_waves_per_simd 8\nlds_size_in_kb 64\n\
    gds_size_in_kb 0\nnum_gws 64\nwave_front_size 64\narray_count 8\n\
    simd_arrays_per_engine 1\ncu_per_simd_array 15\nsimd_per_cu 4\n\
    max_slots_scratch_cu 32\ngfx_target_version 90008\nvendor_id 4098\n\
    device_id 29580\nlocation_id 3072\ndomain 0\ndrm_render_minor 128\n\
    hive_id 0\nnum_sdma_engines 2\nnum_sdma_xgmi_engines 0\n\
    num_sdma_queues_per_engine 8\nnum_cp_queues 24\nfw_version 70\n\
    capability 746326912\nsdma_fw_version 18\n";

const CPU_PROPS: &str = "cpu_cores_count 16\nsimd_count 0\nmem_banks_count 1\n\
    io_links_count 1\nvendor_id 0\ndevice_id 0\ndrm_render_minor 0\n";

/// The emulated host the directories are checked against.
pub struct Host {
    pub opts: RestoreOptions,
}

fn put(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

impl Host {
    /// Writes the host's sysfs tree and device files below `root`.
    pub fn new(root: &Path) -> Host {
        let nodes = root.join("sys/nodes");
        put(&nodes.join("0/gpu_id"), "0\n");
        put(&nodes.join("0/properties"), CPU_PROPS);
        put(
            &nodes.join("0/io_links/0/properties"),
            "type 2\nnode_from 0\nnode_to 1\nweight 20\n",
        );
        put(&nodes.join("1/gpu_id"), &format!("{HOST_GPU}\n"));
        put(&nodes.join("1/properties"), GPU_PROPS);
        put(
            &nodes.join("1/mem_banks/0/properties"),
            "heap_type 1\nsize_in_bytes 34342961152\nwidth 4096\n",
        );
        put(
            &nodes.join("1/io_links/0/properties"),
            "type 2\nnode_from 1\nnode_to 0\nweight 20\n",
        );
        put(&root.join("dev/kfd"), "");
        put(&root.join("dev/dri/renderD128"), "");
        Host {
            opts: RestoreOptions {
                dev_dir: root.join("dev"),
                sysfs_nodes: nodes,
                staging_cap: None,
                policy: EnginePolicy::Cpu,
                checks: Checks::default(),
                host_nodes: HostRenderNodes::probe(&root.join("dev")),
                verify_key: None,
            },
        }
    }
}

/// Packs files (kind, bytes) into an input (the tests' seeds).
#[allow(dead_code)]
pub fn pack(files: &[(u8, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (kind, bytes) in files {
        out.push(*kind);
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

/// Unpacks an input into `dir` (emptied first).  Later entries of a kind
/// replace earlier ones.
pub fn unpack(data: &[u8], dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    std::fs::create_dir_all(dir).expect("scratch directory");
    let mut at = 0;
    while at + 5 <= data.len() {
        let kind = data[at] as usize % NAMES.len();
        let len = u32::from_le_bytes(data[at + 1..at + 5].try_into().expect("4 bytes")) as usize;
        at += 5;
        let end = at.saturating_add(len).min(data.len());
        std::fs::write(dir.join(NAMES[kind]), &data[at..end]).expect("write a scratch file");
        at = end;
    }
}

/// Unpacks `data` into `scratch` and checks it as gpu-check does.
pub fn validate_dir(host: &Host, data: &[u8], scratch: &Path) -> Vec<DryRunEntry> {
    unpack(data, scratch);
    match restore::dry_run(scratch, &host.opts) {
        Ok(v) => v.entries,
        // Only listing the directory can fail as a whole.
        Err(e) => panic!("gpu-check's check failed as a whole: {e}"),
    }
}

/// The VRAM BO of [`check_privdata`]'s process: rings and save areas of
/// its queues lie in it.
#[allow(dead_code)]
pub const PRIV_BO: (u64, u64) = (0x7f00_0000_0000, 2 << 20);

/// The validation of KFD's private data alone
/// ([`amdgpu_cr::validate::privdata::check`], the fuzz target
/// `validate_privdata`).  An input is an archive as [`unpack`] reads one;
/// its first file is the object count (one byte) and the blob of a process
/// with the host's GPU (its device record as a dump writes it from the
/// fake sysfs tree) and the one BO [`PRIV_BO`] (272-byte BO records).
/// `Ok(false)`: the blob's framing does not hold its objects (the
/// validation's earlier check refuses that, not this one).
#[allow(dead_code)]
pub fn check_privdata(host: &Host, data: &[u8], scratch: &Path) -> Result<bool, String> {
    use amdgpu_cr::proto::{CriuKfd, KfdBoEntry};
    let file = data
        .get(5..)
        .map(|rest| {
            let len = u32::from_le_bytes(data[1..5].try_into().expect("4 bytes")) as usize;
            &rest[..len.min(rest.len())]
        })
        .unwrap_or_default();
    let (count, blob) = file.split_first().map_or((0, &[][..]), |(c, b)| (*c, b));
    let topo = amdgpu_cr::topology::Topology::parse_sysfs(&host.opts.sysfs_nodes)
        .expect("the fake sysfs tree");
    let gpu = amdgpu_cr::ids::GpuId(HOST_GPU);
    let entries = topo
        .to_image_entries(&[(gpu, gpu)].into_iter().collect())
        .expect("image entries");
    let image = amdgpu_cr::image::KfdImage {
        msg: CriuKfd {
            pid: 4242,
            num_of_gpus: 1,
            num_of_cpus: 1,
            device_entries: entries,
            num_of_bos: 1,
            bo_entries: vec![KfdBoEntry {
                addr: PRIV_BO.0,
                size: PRIV_BO.1,
                offset: 0x1_0000_0000,
                alloc_flags: 1,
                gpu_id: HOST_GPU,
                ..Default::default()
            }],
            num_of_objects: u32::from(count),
            priv_data: blob.to_vec(),
            priv_bo_record_size: Some(272),
            ..Default::default()
        },
    };
    std::fs::create_dir_all(scratch).expect("scratch directory");
    let m = &image.msg;
    if amdgpu_cr::privdata::walk(&m.priv_data, 1, 1, m.num_of_objects, 272).is_err() {
        return Ok(false);
    }
    amdgpu_cr::validate::privdata::check(scratch, "amdgpu-kfd-1.img", &image)
        .map(|()| true)
        .map_err(|r| r.to_string())
}

/// The host of a fuzzing process, made at its first input under the root
/// `make_root` gives.  The host lives as long as the process, which exits
/// without running destructors: its directory stays.
pub fn fuzz_host(make_root: impl FnOnce() -> PathBuf) -> &'static (Host, PathBuf) {
    static HOST: OnceLock<(Host, PathBuf)> = OnceLock::new();
    HOST.get_or_init(|| {
        let root = make_root();
        (Host::new(&root), root.join("img"))
    })
}
