//! The KFD sysfs topology tree a profile describes
//! (`/sys/class/kfd/kfd/topology`): `generation_id`, `system_properties`
//! and `nodes/N/{gpu_id,name,properties,mem_banks,caches,io_links}`.
//!
//! Node order follows KFD: CPU nodes first, then GPUs in profile order.
//! Links, unless the profile sets `io_links_generated = false`: every GPU
//! has a PCIe link (type 2) to its CPU node and the CPU a link back; GPUs
//! sharing a non-zero hive id have XGMI links (type 11) to each other.
//! Unless it sets `cpu_links_generated = false`, CPU nodes are linked to
//! each other by HyperTransport (type 1, weight 32: the NUMA distance KFD's
//! CRAT reports between two sockets), which checkpoint tools ignore.  A
//! node's links declared by the profile's
//! `[[io_links]]` follow its generated ones, in declaration order (a
//! `both` link appears in the `to` node's list where it is declared).
//! `io_links_count` is the number of `io_links/L` directories.  Unless the
//! profile sets `p2p_links_generated = false`, the indirect links KFD
//! derives from those (see [`p2p_links`]) follow under `p2p_links/L`,
//! counted by `p2p_links_count`.

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use crate::profile::{Cpu, Gpu, Profile};

pub use crate::profile::links::{
    generated_links_of, link_defaults, Link, LinkDefaults, IOLINK_HYPERTRANSPORT, IOLINK_PCIE,
    IOLINK_XGMI, LINK_FLAGS,
};

/// Base of the SIMD id space KFD gives GPU nodes (`simd_id_base`).
const GPU_SIMD_ID_BASE: u32 = 0x8000_1000;

/// One file of the tree, path relative to the topology root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeFile {
    pub path: String,
    pub contents: String,
}

/// The links of node `node_id`, in sysfs order: the generated ones, then
/// the declared ones.
///
/// Panics on a profile whose `[[io_links]]` do not validate (every loader
/// validates).
pub fn links_of(p: &Profile, node_id: u32) -> Vec<Link> {
    let mut out = generated_links_of(p, node_id);
    let declared = p
        .declared_links()
        .unwrap_or_else(|e| panic!("links of an unvalidated profile: {e}"));
    for d in declared {
        if d.link.from == node_id {
            out.push(d.link);
        } else if d.both && d.link.to == node_id {
            out.push(d.link.reversed());
        }
    }
    out
}

/// The indirect links KFD adds when GPU `gi` comes up
/// (`kfd_create_indirect_link_prop`, Linux 5.19 and later), in the order it
/// adds them: for each CPU node `c` other than the one the GPU's first
/// io_link reaches, the link GPU -> `c` (a copy of that first link with
/// the weights and latencies of it and of `c`'s io_link to the same node
/// summed and the smaller bandwidths), and for a GPU whose VRAM is all
/// CPU-visible (`kfd_dev_is_large_bar`) the same link back, `c` -> GPU.
/// Returns (GPU's links, CPU nodes' links).  A GPU without io_links gets
/// none; a CPU node with no io_link to that node ends the list, as the
/// kernel's loop fails there.  Direct GPU <-> GPU peer links
/// (`kfd_add_peer_prop`) exist only with `CONFIG_HSA_AMD_P2P`, which
/// distribution kernels leave off, so none are made.
fn indirect_links(p: &Profile, gi: usize, links: &[Vec<Link>]) -> (Vec<Link>, Vec<Link>) {
    let node = p.gpu_node_id(gi);
    let (mut to_cpu, mut from_cpu) = (Vec::new(), Vec::new());
    let Some(first) = links[node as usize].first() else {
        return (to_cpu, from_cpu);
    };
    for c in 0..p.cpus.len() as u32 {
        if first.to == c {
            continue;
        }
        let Some(cpu_link) = links[c as usize].iter().find(|l| l.to == first.to) else {
            break;
        };
        let l = Link {
            from: node,
            to: c,
            weight: first.weight + cpu_link.weight,
            min_latency: first.min_latency + cpu_link.min_latency,
            max_latency: first.max_latency + cpu_link.max_latency,
            min_bw: first.min_bw.min(cpu_link.min_bw),
            max_bw: first.max_bw.min(cpu_link.max_bw),
            ..*first
        };
        to_cpu.push(l);
        if p.gpus[gi].vram_public {
            from_cpu.push(l.reversed());
        }
    }
    (to_cpu, from_cpu)
}

/// The p2p_links of every node (index: node id), in sysfs order: KFD adds
/// GPUs one by one, each appending to its own list and to its CPU nodes'.
/// Empty when the profile sets `p2p_links_generated = false`.
pub fn p2p_links(p: &Profile) -> Vec<Vec<Link>> {
    let n = p.cpus.len() + p.gpus.len();
    let mut out = vec![Vec::new(); n];
    if !p.p2p_links_generated {
        return out;
    }
    let links: Vec<Vec<Link>> = (0..n as u32).map(|i| links_of(p, i)).collect();
    for gi in 0..p.gpus.len() {
        let (to_cpu, from_cpu) = indirect_links(p, gi, &links);
        out[p.gpu_node_id(gi) as usize].extend(to_cpu);
        for l in from_cpu {
            out[l.from as usize].push(l);
        }
    }
    out
}

fn props(lines: &[(&str, u64)]) -> String {
    let mut s = String::new();
    for (k, v) in lines {
        let _ = writeln!(s, "{k} {v}");
    }
    s
}

/// `recommended_sdma_engine_id_mask` of a link, as KFD sets it since Linux
/// 6.10 (`kfd_set_recommended_sdma_engines`) and ROCr uses with KFD 1.17's
/// SDMA queues by engine: a GPU's XGMI engines towards another GPU when it
/// has some, else its PCIe engines; 0 on CPU-to-CPU links and, as older
/// kernels (no such file) read, before KFD 1.17.  (The per-socket table
/// KFD uses on 8-socket MI300X hives is not modelled: XGMI engines there
/// too.)
fn rec_sdma_mask(p: &Profile, l: &Link) -> u64 {
    let gpu_of = |node: u32| (node as usize).checked_sub(p.cpus.len());
    let (gpu, other_is_gpu) = match (gpu_of(l.from), gpu_of(l.to)) {
        (Some(g), o) => (g, o.is_some()),
        (None, Some(g)) => (g, false),
        (None, None) => return 0,
    };
    let Some(g) = p.gpus.get(gpu).filter(|_| p.kfd_minor_version >= 17) else {
        return 0;
    };
    let pcie = (1u64 << g.num_sdma_engines) - 1;
    let xgmi = ((1u64 << g.num_sdma_xgmi_engines) - 1) << g.num_sdma_engines;
    if other_is_gpu && xgmi != 0 {
        xgmi
    } else {
        pcie
    }
}

fn link_props(p: &Profile, l: &Link) -> String {
    props(&[
        ("type", l.kind.into()),
        ("version_major", 0),
        ("version_minor", 0),
        ("node_from", l.from.into()),
        ("node_to", l.to.into()),
        ("weight", l.weight.into()),
        ("min_latency", l.min_latency.into()),
        ("max_latency", l.max_latency.into()),
        ("min_bandwidth", l.min_bw.into()),
        ("max_bandwidth", l.max_bw.into()),
        ("recommended_transfer_size", 0),
        ("recommended_sdma_engine_id_mask", rec_sdma_mask(p, l)),
        ("flags", l.flags.into()),
    ])
}

/// Generates the whole tree (files only; directories are implied): the
/// system files, then each CPU node and each GPU node with its links.
pub fn generate(p: &Profile) -> Vec<TreeFile> {
    let p2p = p2p_links(p);
    let mut t = Tree::default();
    t.add("generation_id".into(), format!("{}\n", p.generation_id));
    t.add(
        "system_properties".into(),
        props(&[
            ("platform_oem", p.platform_oem),
            ("platform_id", p.platform_id),
            ("platform_rev", p.platform_rev),
        ]),
    );
    for (i, c) in p.cpus.iter().enumerate() {
        let id = p.cpu_node_id(i);
        let node = Node {
            profile: p,
            dir: format!("nodes/{id}"),
            links: links_of(p, id),
            p2p: &p2p[id as usize],
        };
        cpu_node(&mut t, &node, c);
    }
    for (i, g) in p.gpus.iter().enumerate() {
        let id = p.gpu_node_id(i);
        let node = Node {
            profile: p,
            dir: format!("nodes/{id}"),
            links: links_of(p, id),
            p2p: &p2p[id as usize],
        };
        gpu_node(&mut t, &node, i, g);
    }
    t.files
}

/// The files generated so far.
#[derive(Default)]
struct Tree {
    files: Vec<TreeFile>,
}

impl Tree {
    fn add(&mut self, path: String, contents: String) {
        self.files.push(TreeFile { path, contents });
    }
}

/// One node's directory and links.
struct Node<'a> {
    profile: &'a Profile,
    dir: String,
    links: Vec<Link>,
    p2p: &'a [Link],
}

impl Node<'_> {
    /// `io_links/N` and `p2p_links/N`.
    fn add_links(&self, t: &mut Tree) {
        for (l, link) in self.links.iter().enumerate() {
            t.add(
                format!("{}/io_links/{l}/properties", self.dir),
                link_props(self.profile, link),
            );
        }
        for (l, link) in self.p2p.iter().enumerate() {
            t.add(
                format!("{}/p2p_links/{l}/properties", self.dir),
                link_props(self.profile, link),
            );
        }
    }
}

fn cpu_node(t: &mut Tree, n: &Node, c: &Cpu) {
    let dir = &n.dir;
    t.add(format!("{dir}/gpu_id"), "0\n".into());
    t.add(format!("{dir}/name"), format!("{}\n", c.name));
    t.add(format!("{dir}/properties"), cpu_properties(n, c));
    t.add(
        format!("{dir}/mem_banks/0/properties"),
        props(&[
            ("heap_type", 0),
            ("size_in_bytes", c.mem_size),
            ("flags", 0),
            ("width", 72),
            ("mem_clk_max", 3200),
        ]),
    );
    n.add_links(t);
}

fn cpu_properties(n: &Node, c: &Cpu) -> String {
    let links = &n.links;
    let p2p = n.p2p;
    props(&[
        ("cpu_cores_count", c.cpu_cores_count.into()),
        ("simd_count", 0),
        ("mem_banks_count", 1),
        ("caches_count", 0),
        ("io_links_count", links.len() as u64),
        ("p2p_links_count", p2p.len() as u64),
        ("cpu_core_id_base", c.cpu_core_id_base.into()),
        ("simd_id_base", 0),
        ("max_waves_per_simd", 0),
        ("lds_size_in_kb", 0),
        ("gds_size_in_kb", 0),
        ("num_gws", 0),
        ("wave_front_size", 0),
        ("array_count", 0),
        ("simd_arrays_per_engine", 0),
        ("cu_per_simd_array", 0),
        ("simd_per_cu", 0),
        ("max_slots_scratch_cu", 0),
        ("gfx_target_version", 0),
        ("vendor_id", 0),
        ("device_id", 0),
        ("location_id", 0),
        ("domain", 0),
        ("drm_render_minor", 0),
        ("hive_id", 0),
        ("num_sdma_engines", 0),
        ("num_sdma_xgmi_engines", 0),
        ("num_sdma_queues_per_engine", 0),
        ("num_cp_queues", 0),
        ("max_engine_clk_ccompute", c.max_engine_clk_ccompute.into()),
    ])
}

fn gpu_node(t: &mut Tree, n: &Node, i: usize, g: &Gpu) {
    let dir = &n.dir;
    t.add(format!("{dir}/gpu_id"), format!("{}\n", g.gpu_id.0));
    t.add(format!("{dir}/name"), format!("{}\n", g.name));
    t.add(format!("{dir}/properties"), gpu_properties(n, i, g));
    t.add(
        format!("{dir}/mem_banks/0/properties"),
        props(&[
            ("heap_type", g.vram_heap_type().into()),
            ("size_in_bytes", g.vram_size),
            ("flags", 0),
            ("width", g.vram_width.into()),
            ("mem_clk_max", g.vram_clk_max.into()),
        ]),
    );
    let simd_base = GPU_SIMD_ID_BASE + (i as u32) * 0x1000;
    for (m, contents) in gpu_caches(g, simd_base).into_iter().enumerate() {
        t.add(format!("{dir}/caches/{m}/properties"), contents);
    }
    n.add_links(t);
}

fn gpu_properties(n: &Node, i: usize, g: &Gpu) -> String {
    let links = &n.links;
    let p2p = n.p2p;
    props(&[
        ("cpu_cores_count", 0),
        ("simd_count", g.simd_count().into()),
        ("mem_banks_count", 1),
        ("caches_count", g.caches_count().into()),
        ("io_links_count", links.len() as u64),
        ("p2p_links_count", p2p.len() as u64),
        ("cpu_core_id_base", 0),
        (
            "simd_id_base",
            u64::from(GPU_SIMD_ID_BASE) + (i as u64) * 0x1000,
        ),
        ("max_waves_per_simd", g.max_waves_per_simd.into()),
        ("lds_size_in_kb", g.lds_size_in_kb.into()),
        ("gds_size_in_kb", g.gds_size_in_kb.into()),
        ("num_gws", g.num_gws.into()),
        ("wave_front_size", g.wave_front_size.into()),
        ("array_count", g.array_count.into()),
        ("simd_arrays_per_engine", g.simd_arrays_per_engine.into()),
        ("cu_per_simd_array", g.cu_per_simd_array.into()),
        ("simd_per_cu", g.simd_per_cu.into()),
        ("max_slots_scratch_cu", g.max_slots_scratch_cu.into()),
        ("gfx_target_version", g.gfx_target_version.into()),
        ("vendor_id", g.vendor_id.into()),
        ("device_id", g.device_id.into()),
        ("location_id", g.location_id.into()),
        ("domain", g.domain.into()),
        ("drm_render_minor", g.drm_render_minor.0.into()),
        ("hive_id", g.hive_id),
        ("num_sdma_engines", g.num_sdma_engines.into()),
        ("num_sdma_xgmi_engines", g.num_sdma_xgmi_engines.into()),
        (
            "num_sdma_queues_per_engine",
            g.num_sdma_queues_per_engine.into(),
        ),
        ("num_cp_queues", g.num_cp_queues.into()),
        ("max_engine_clk_fcompute", g.max_engine_clk_fcompute.into()),
        ("local_mem_size", 0),
        ("fw_version", g.fw_version.into()),
        ("capability", g.capability.into()),
        ("debug_prop", g.debug_prop.into()),
        ("sdma_fw_version", g.sdma_fw_version.into()),
        ("unique_id", g.unique_id),
        ("num_xcc", g.num_xcc.into()),
        ("max_engine_clk_ccompute", g.max_engine_clk_ccompute.into()),
    ])
}

/// Each cache instance's properties, in KFD's order: by cache, then by
/// instance, each with the CUs it serves as `sibling_map`.
fn gpu_caches(g: &Gpu, simd_base: u32) -> Vec<String> {
    let mut out = Vec::new();
    for c in &g.caches {
        for inst in 0..c.count {
            let first_cu = inst * c.cus_per_instance;
            let sib: Vec<&str> = (0..g.cu_count)
                .map(|cu| {
                    if cu >= first_cu && cu < first_cu + c.cus_per_instance {
                        "1"
                    } else {
                        "0"
                    }
                })
                .collect();
            let mut s = props(&[
                ("processor_id_low", simd_base.into()),
                ("level", c.level.into()),
                ("size", c.size.into()),
                ("cache_line_size", c.cache_line_size.into()),
                ("cache_lines_per_tag", c.cache_lines_per_tag.into()),
                ("association", c.association.into()),
                ("latency", c.latency.into()),
                ("type", c.kind.into()),
            ]);
            let _ = writeln!(s, "sibling_map {}", sib.join(","));
            out.push(s);
        }
    }
    out
}

/// Writes the tree below `root` (created if missing), files 0444.
pub fn write_tree(p: &Profile, root: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(root)?;
    // Empty directories that real sysfs always has.
    for i in 0..p.cpus.len() + p.gpus.len() {
        for sub in ["mem_banks", "caches", "io_links", "p2p_links"] {
            std::fs::create_dir_all(root.join(format!("nodes/{i}/{sub}")))?;
        }
    }
    for f in generate(p) {
        let path = root.join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, f.contents.as_bytes())
            .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", path.display())))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444))?;
    }
    Ok(())
}

/// The tree as text, one `== path ==` header per file (for
/// `kfd-emu topology`).
pub fn render(p: &Profile) -> String {
    let mut s = String::new();
    for f in generate(p) {
        let _ = writeln!(s, "== {} ==", f.path);
        s.push_str(&f.contents);
    }
    s
}
