//! The KFD topology: model, sysfs parser and conversion to and from the
//! device entries stored in `amdgpu-kfd-<id>.img`.
//!
//! A node is a directory `<root>/<N>` (`N` numeric) with a `gpu_id` file
//! (`0` for a CPU node), a `properties` file of `name value` lines, and for
//! GPUs `mem_banks/<M>/properties` (the VRAM heap) and
//! `io_links/<L>/properties` (links to other nodes).  The product passes
//! [`SYSFS_NODES`]; tests pass a directory they built.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::ids::{GpuId, RenderMinor};
use crate::proto::{DevIolink, KfdDeviceEntry};

/// Where the kernel publishes the topology.
pub const SYSFS_NODES: &str = "/sys/class/kfd/kfd/topology/nodes";

/// io_link type of a PCIe link.
pub const IOLINK_PCIE: u32 = 2;
/// io_link type of an XGMI link.
pub const IOLINK_XGMI: u32 = 11;

/// mem_banks heap types that describe VRAM (public = inside the BAR).
const HEAP_FB_PUBLIC: u64 = 1;
const HEAP_FB_PRIVATE: u64 = 2;

/// Errors parsing the topology.  Each names the file (and line) at fault.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("{path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{path}:{line}: cannot parse {text:?} as \"name value\"")]
    BadLine {
        path: PathBuf,
        line: usize,
        text: String,
    },
    #[error("{path}: property {name} = {value} does not fit in 32 bits")]
    TooLarge {
        path: PathBuf,
        name: String,
        value: u64,
    },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    #[error("image device entry {index} (node {node_id}): {what}")]
    BadEntry {
        index: usize,
        node_id: u32,
        what: String,
    },
}

macro_rules! node_props {
    ($($name:ident),* $(,)?) => {
        /// The properties of a node that the image records and the matcher
        /// compares (all of `kfd_device_entry` except ids and links).
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct NodeProps {
            $(pub $name: u32,)*
            pub hive_id: u64,
            pub vram_size: u64,
            pub vram_public: bool,
        }

        impl NodeProps {
            /// Sets a 32-bit property by its sysfs name; false if unknown.
            fn set_u32(&mut self, name: &str, value: u32) -> bool {
                match name {
                    $(stringify!($name) => self.$name = value,)*
                    _ => return false,
                }
                true
            }

            fn is_u32(name: &str) -> bool {
                matches!(name, $(stringify!($name))|*)
            }

            fn fill_entry(&self, e: &mut KfdDeviceEntry) {
                $(e.$name = self.$name;)*
                e.hive_id = self.hive_id;
                e.vram_size = self.vram_size;
                e.vram_public = u32::from(self.vram_public);
            }

            fn from_entry(e: &KfdDeviceEntry) -> Self {
                NodeProps {
                    $($name: e.$name,)*
                    hive_id: e.hive_id,
                    vram_size: e.vram_size,
                    vram_public: e.vram_public != 0,
                }
            }
        }
    };
}

node_props!(
    cpu_cores_count,
    simd_count,
    mem_banks_count,
    caches_count,
    io_links_count,
    max_waves_per_simd,
    lds_size_in_kb,
    gds_size_in_kb,
    num_gws,
    wave_front_size,
    array_count,
    simd_arrays_per_engine,
    cu_per_simd_array,
    simd_per_cu,
    max_slots_scratch_cu,
    vendor_id,
    device_id,
    domain,
    drm_render_minor,
    num_sdma_engines,
    num_sdma_xgmi_engines,
    num_sdma_queues_per_engine,
    num_cp_queues,
    fw_version,
    capability,
    sdma_fw_version,
);

/// A directed link from one node to another (`type` 2 PCIe or 11 XGMI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoLink {
    pub kind: u32,
    pub node_to: u32,
}

/// One topology node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub node_id: u32,
    /// `None` for a CPU node.
    pub gpu_id: Option<GpuId>,
    pub props: NodeProps,
    pub links: Vec<IoLink>,
    /// What this host's KFD sizes a queue's MQD and control stack by
    /// (sysfs only: images do not record it).
    pub kernel: KernelProps,
}

/// The properties of a host GPU node that images do not record but the
/// validation of KFD's private data needs: the sizes KFD writes for a
/// queue follow from them ([`kfd_abi::criu::mqd_size`],
/// [`kfd_abi::criu::ctl_stack_size`]).  Zero when sysfs lacks them
/// (kernels before `num_xcc`: one XCC).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelProps {
    pub gfx_target_version: u32,
    pub num_xcc: u32,
}

impl Node {
    pub fn is_gpu(&self) -> bool {
        self.gpu_id.is_some()
    }

    /// Render minor of a GPU node.
    pub fn render_minor(&self) -> RenderMinor {
        RenderMinor(self.props.drm_render_minor)
    }

    /// This node as an image's device entry without links: its node id,
    /// gpu_id as the topology gives it, and properties.
    pub fn gpu_entry(&self) -> KfdDeviceEntry {
        let mut e = KfdDeviceEntry {
            node_id: self.node_id,
            gpu_id: self.gpu_id.map_or(0, |g| g.0),
            ..Default::default()
        };
        self.props.fill_entry(&mut e);
        e
    }
}

/// The set of nodes, CPUs and GPUs, ordered by node id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    pub nodes: Vec<Node>,
}

impl Topology {
    /// Builds a topology from nodes (sorted by node id).
    pub fn new(mut nodes: Vec<Node>) -> Self {
        nodes.sort_by_key(|n| n.node_id);
        Topology { nodes }
    }

    /// Parses the sysfs topology below `root` (normally [`SYSFS_NODES`]).
    ///
    /// Nodes whose directory cannot be stat'ed or whose `gpu_id` cannot be
    /// read are skipped: a device cgroup hides GPUs that way.
    pub fn parse_sysfs(root: &Path) -> Result<Self, TopologyError> {
        let mut nodes = Vec::new();
        for (node_id, dir) in numeric_subdirs(root)? {
            if fs::metadata(&dir).is_err() {
                log::debug!("{}: not accessible, skipped", dir.display());
                continue;
            }
            let gpu_id = match fs::read_to_string(dir.join("gpu_id"))
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            {
                Some(id) => id,
                None => {
                    log::debug!("{}: gpu_id unreadable, node skipped", dir.display());
                    continue;
                }
            };
            nodes.push(parse_node(node_id, gpu_id, &dir)?);
        }
        if nodes.is_empty() {
            return Err(TopologyError::Invalid {
                path: root.to_owned(),
                what: "no topology node found".into(),
            });
        }
        Ok(Topology::new(nodes))
    }

    /// Rebuilds a topology from an image's device entries.  A node is a GPU
    /// iff its gpu_id is non-zero (upstream looks at `cpu_cores_count`,
    /// which misclassifies APU nodes that have both).
    pub fn from_image_entries(entries: &[KfdDeviceEntry]) -> Result<Self, TopologyError> {
        let mut seen = BTreeSet::new();
        let mut nodes = Vec::with_capacity(entries.len());
        for (index, e) in entries.iter().enumerate() {
            if !seen.insert(e.node_id) {
                return Err(TopologyError::BadEntry {
                    index,
                    node_id: e.node_id,
                    what: "duplicate node_id".into(),
                });
            }
            nodes.push(Node {
                node_id: e.node_id,
                gpu_id: (e.gpu_id != 0).then_some(GpuId(e.gpu_id)),
                props: NodeProps::from_entry(e),
                links: e
                    .iolinks
                    .iter()
                    .map(|l| IoLink {
                        kind: l.r#type,
                        node_to: l.node_to_id,
                    })
                    .collect(),
                kernel: KernelProps::default(),
            });
        }
        Ok(Topology::new(nodes))
    }

    /// Device entries for a checkpoint image: every CPU node, and the GPU
    /// nodes of `actual_to_user` (the GPUs the process has), with gpu_ids
    /// translated to user ids.  Links are kept when valid, of type PCIe or
    /// XGMI, and pointing at a node that is written too.
    ///
    /// Unlike upstream, GPUs the process cannot use are left out instead of
    /// failing the dump (upstream issue #2723).
    pub fn to_image_entries(
        &self,
        actual_to_user: &BTreeMap<GpuId, GpuId>,
    ) -> Result<Vec<KfdDeviceEntry>, TopologyError> {
        for actual in actual_to_user.keys() {
            if self.gpu(*actual).is_none() {
                return Err(TopologyError::Invalid {
                    path: PathBuf::from(SYSFS_NODES),
                    what: format!("the process uses GPU {actual} which the topology does not list"),
                });
            }
        }
        let kept: BTreeSet<u32> = self
            .nodes
            .iter()
            .filter(|n| n.gpu_id.is_none_or(|g| actual_to_user.contains_key(&g)))
            .map(|n| n.node_id)
            .collect();
        let mut out = Vec::new();
        for n in self.nodes.iter().filter(|n| kept.contains(&n.node_id)) {
            let mut e = KfdDeviceEntry {
                node_id: n.node_id,
                gpu_id: n.gpu_id.map_or(0, |g| actual_to_user[&g].0),
                ..Default::default()
            };
            if n.is_gpu() {
                n.props.fill_entry(&mut e);
            } else {
                // Upstream records only these for CPU nodes.
                e.cpu_cores_count = n.props.cpu_cores_count;
            }
            e.iolinks = n
                .links
                .iter()
                .filter(|l| {
                    matches!(l.kind, IOLINK_PCIE | IOLINK_XGMI) && kept.contains(&l.node_to)
                })
                .map(|l| DevIolink {
                    r#type: l.kind,
                    node_to_id: l.node_to,
                })
                .collect();
            out.push(e);
        }
        Ok(out)
    }

    /// Leaves out the GPU nodes `keep` rejects (CPU nodes stay); links to
    /// them stay, as links to GPUs a device cgroup hides do.
    pub fn retain_gpus(&mut self, keep: impl Fn(&Node) -> bool) {
        self.nodes.retain(|n| !n.is_gpu() || keep(n));
    }

    pub fn node(&self, node_id: u32) -> Option<&Node> {
        self.nodes.iter().find(|n| n.node_id == node_id)
    }

    pub fn gpu(&self, gpu_id: GpuId) -> Option<&Node> {
        self.nodes.iter().find(|n| n.gpu_id == Some(gpu_id))
    }

    pub fn gpu_by_render_minor(&self, minor: RenderMinor) -> Option<&Node> {
        self.gpus().find(|n| n.props.drm_render_minor == minor.0)
    }

    pub fn gpus(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.is_gpu())
    }

    pub fn cpus(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| !n.is_gpu())
    }

    /// A link is valid when its target node exists here.
    pub fn link_valid(&self, link: &IoLink) -> bool {
        self.node(link.node_to).is_some()
    }

    /// Whether the target of `link` (from node `from`) links back with the
    /// same type.
    pub fn link_bidirectional(&self, from: u32, link: &IoLink) -> bool {
        self.node(link.node_to).is_some_and(|peer| {
            peer.links
                .iter()
                .any(|b| b.kind == link.kind && b.node_to == from)
        })
    }

    /// The valid links of `node`.
    pub fn valid_links<'a>(&'a self, node: &'a Node) -> impl Iterator<Item = &'a IoLink> + 'a {
        node.links.iter().filter(|l| self.link_valid(l))
    }

    /// XGMI hives: groups of two or more GPUs connected by bidirectional
    /// XGMI links (transitively), as lists of node ids in ascending order.
    pub fn hives(&self) -> Vec<Vec<u32>> {
        let mut hive_of: BTreeMap<u32, usize> = BTreeMap::new();
        let mut hives: Vec<Vec<u32>> = Vec::new();
        for start in self.gpus() {
            if hive_of.contains_key(&start.node_id) {
                continue;
            }
            let mut members = vec![start.node_id];
            let mut todo = vec![start.node_id];
            hive_of.insert(start.node_id, hives.len());
            while let Some(id) = todo.pop() {
                let node = self.node(id).expect("member exists");
                for l in &node.links {
                    let peer_is_gpu = self.node(l.node_to).is_some_and(Node::is_gpu);
                    if l.kind == IOLINK_XGMI
                        && peer_is_gpu
                        && self.link_bidirectional(id, l)
                        && !hive_of.contains_key(&l.node_to)
                    {
                        hive_of.insert(l.node_to, hives.len());
                        members.push(l.node_to);
                        todo.push(l.node_to);
                    }
                }
            }
            members.sort_unstable();
            hives.push(members);
        }
        hives.retain(|h| h.len() > 1);
        hives
    }
}

fn numeric_subdirs(dir: &Path) -> Result<Vec<(u32, PathBuf)>, TopologyError> {
    let rd = fs::read_dir(dir).map_err(|source| TopologyError::Io {
        path: dir.to_owned(),
        op: "opendir",
        source,
    })?;
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|source| TopologyError::Io {
            path: dir.to_owned(),
            op: "readdir",
            source,
        })?;
        if let Some(n) = ent.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) {
            out.push((n, ent.path()));
        }
    }
    out.sort_by_key(|(n, _)| *n);
    Ok(out)
}

/// Reads a sysfs `properties` file into (name, value, line number) triples.
fn read_properties(path: &Path) -> Result<Vec<(String, u64, usize)>, TopologyError> {
    let text = fs::read_to_string(path).map_err(|source| TopologyError::Io {
        path: path.to_owned(),
        op: "read",
        source,
    })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let parsed = match (words.next(), words.next(), words.next()) {
            (Some(name), Some(value), None) => value.parse::<u64>().ok().map(|v| (name, v)),
            _ => None,
        };
        let Some((name, value)) = parsed else {
            return Err(TopologyError::BadLine {
                path: path.to_owned(),
                line: i + 1,
                text: line.to_owned(),
            });
        };
        out.push((name.to_owned(), value, i + 1));
    }
    Ok(out)
}

fn parse_node(node_id: u32, gpu_id: u32, dir: &Path) -> Result<Node, TopologyError> {
    let path = dir.join("properties");
    let mut props = NodeProps::default();
    let mut kernel = KernelProps::default();
    for (name, value, _) in read_properties(&path)? {
        if name == "hive_id" {
            props.hive_id = value;
        } else if name == "gfx_target_version" || name == "num_xcc" {
            let v = u32::try_from(value).map_err(|_| TopologyError::TooLarge {
                path: path.clone(),
                name: name.clone(),
                value,
            })?;
            match name.as_str() {
                "num_xcc" => kernel.num_xcc = v,
                _ => kernel.gfx_target_version = v,
            }
        } else if NodeProps::is_u32(&name) {
            let v = u32::try_from(value).map_err(|_| TopologyError::TooLarge {
                path: path.clone(),
                name: name.clone(),
                value,
            })?;
            props.set_u32(&name, v);
        }
    }
    let mut links = Vec::new();
    let io_dir = dir.join("io_links");
    if io_dir.is_dir() {
        for (_, link_dir) in numeric_subdirs(&io_dir)? {
            let lp = link_dir.join("properties");
            let kv = read_properties(&lp)?;
            let get = |key: &str| kv.iter().find(|(n, _, _)| n == key).map(|(_, v, _)| *v);
            let (Some(kind), Some(to)) = (get("type"), get("node_to")) else {
                return Err(TopologyError::Invalid {
                    path: lp,
                    what: "io link without type or node_to".into(),
                });
            };
            let kind = u32::try_from(kind).unwrap_or(u32::MAX);
            if kind != IOLINK_PCIE && kind != IOLINK_XGMI {
                continue;
            }
            let node_to = u32::try_from(to).map_err(|_| TopologyError::TooLarge {
                path: lp.clone(),
                name: "node_to".into(),
                value: to,
            })?;
            links.push(IoLink { kind, node_to });
        }
    }
    if gpu_id != 0 {
        let banks = dir.join("mem_banks");
        if banks.is_dir() {
            for (_, bank_dir) in numeric_subdirs(&banks)? {
                let bp = bank_dir.join("properties");
                let kv = read_properties(&bp)?;
                let get = |key: &str| kv.iter().find(|(n, _, _)| n == key).map(|(_, v, _)| *v);
                let heap = get("heap_type");
                if heap == Some(HEAP_FB_PUBLIC) || heap == Some(HEAP_FB_PRIVATE) {
                    props.vram_public = heap == Some(HEAP_FB_PUBLIC);
                    props.vram_size = get("size_in_bytes").unwrap_or(0);
                    break;
                }
            }
        }
        if props.vram_size == 0 {
            // Upstream refuses such GPUs (APUs with only system heaps);
            // we record vram_size 0 and let the matcher compare it.
            log::info!("{}: GPU node without a VRAM heap", dir.display());
        }
    }
    Ok(Node {
        node_id,
        gpu_id: (gpu_id != 0).then_some(GpuId(gpu_id)),
        props,
        links,
        kernel,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::image::tests::tempdir;

    /// Writes a fake sysfs tree: each node is (id, gpu_id, properties
    /// text, VRAM (heap, size) or none, links (type, node_to)).
    pub(crate) struct FakeNode<'a> {
        pub id: u32,
        pub gpu_id: u32,
        pub props: &'a str,
        pub vram: Option<(u64, u64)>,
        pub links: &'a [(u32, u32)],
    }

    pub(crate) fn write_tree(root: &Path, nodes: &[FakeNode<'_>]) {
        for n in nodes {
            let d = root.join(n.id.to_string());
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("gpu_id"), format!("{}\n", n.gpu_id)).unwrap();
            fs::write(d.join("properties"), n.props).unwrap();
            if let Some((heap, size)) = n.vram {
                let b = d.join("mem_banks/0");
                fs::create_dir_all(&b).unwrap();
                fs::write(b.join("properties"), "heap_type 0\nsize_in_bytes 1\n").unwrap();
                let b = d.join("mem_banks/1");
                fs::create_dir_all(&b).unwrap();
                fs::write(
                    b.join("properties"),
                    format!("heap_type {heap}\nsize_in_bytes {size}\nwidth 4096\n"),
                )
                .unwrap();
            }
            for (i, (kind, to)) in n.links.iter().enumerate() {
                let l = d.join(format!("io_links/{i}"));
                fs::create_dir_all(&l).unwrap();
                fs::write(
                    l.join("properties"),
                    format!("type {kind}\nnode_from {}\nnode_to {to}\nweight 20\n", n.id),
                )
                .unwrap();
            }
        }
    }

    const GPU_PROPS: &str = "cpu_cores_count 0\nsimd_count 304\nmem_banks_count 1\n\
        caches_count 244\nio_links_count 3\nmax_waves_per_simd 8\nlds_size_in_kb 64\n\
        gds_size_in_kb 0\nnum_gws 64\nwave_front_size 64\narray_count 8\n\
        simd_arrays_per_engine 1\ncu_per_simd_array 10\nsimd_per_cu 4\n\
        max_slots_scratch_cu 32\ngfx_target_version 90402\nvendor_id 4098\n\
        device_id 29857\nlocation_id 3072\ndomain 0\ndrm_render_minor 128\n\
        hive_id 1311768467463790320\nnum_sdma_engines 2\nnum_sdma_xgmi_engines 6\n\
        num_sdma_queues_per_engine 8\nnum_cp_queues 24\nfw_version 151\n\
        capability 746326912\nsdma_fw_version 19\nmax_engine_clk_fcompute 2100\n";

    #[test]
    fn parses_cpu_and_gpu_nodes_links_and_hives() {
        let root = tempdir();
        let gpu2 = GPU_PROPS.replace("drm_render_minor 128", "drm_render_minor 129");
        write_tree(
            &root,
            &[
                FakeNode {
                    id: 0,
                    gpu_id: 0,
                    props: "cpu_cores_count 64\nsimd_count 0\n",
                    vram: None,
                    links: &[(IOLINK_PCIE, 1), (IOLINK_PCIE, 2)],
                },
                FakeNode {
                    id: 1,
                    gpu_id: 0x1a2b,
                    props: GPU_PROPS,
                    vram: Some((HEAP_FB_PUBLIC, 64 << 30)),
                    links: &[(IOLINK_PCIE, 0), (IOLINK_XGMI, 2), (1, 0)],
                },
                FakeNode {
                    id: 2,
                    gpu_id: 0x5c3d,
                    props: &gpu2,
                    vram: Some((HEAP_FB_PRIVATE, 32 << 30)),
                    links: &[(IOLINK_PCIE, 0), (IOLINK_XGMI, 1), (IOLINK_XGMI, 7)],
                },
            ],
        );
        // A node hidden by a device cgroup has no readable gpu_id.
        fs::create_dir_all(root.join("3")).unwrap();
        fs::create_dir_all(root.join("not-a-node")).unwrap();

        let t = Topology::parse_sysfs(&root).unwrap();
        assert_eq!(t.nodes.len(), 3);
        assert_eq!(t.cpus().count(), 1);
        assert_eq!(t.nodes[0].props.cpu_cores_count, 64);
        let g1 = t.gpu(GpuId(0x1a2b)).unwrap();
        assert_eq!(g1.props.simd_count, 304);
        assert_eq!(g1.props.hive_id, 0x1234_5678_9abc_def0);
        assert_eq!(g1.props.vram_size, 64 << 30);
        assert!(g1.props.vram_public);
        assert_eq!(g1.props.fw_version, 151);
        // Links of other types are dropped while parsing.
        assert_eq!(g1.links.len(), 2);
        let g2 = t.gpu_by_render_minor(RenderMinor(129)).unwrap();
        assert_eq!(g2.gpu_id, Some(GpuId(0x5c3d)));
        assert!(!g2.props.vram_public);
        // Link to node 7 does not exist → invalid.
        assert_eq!(t.valid_links(g2).count(), 2);
        assert!(t.link_bidirectional(1, &g1.links[1]));
        assert_eq!(t.hives(), vec![vec![1, 2]]);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn bad_properties_name_the_file_and_line() {
        let root = tempdir();
        write_tree(
            &root,
            &[FakeNode {
                id: 0,
                gpu_id: 0,
                props: "cpu_cores_count 4\nsimd_count x\n",
                vram: None,
                links: &[],
            }],
        );
        let e = Topology::parse_sysfs(&root).unwrap_err().to_string();
        assert!(
            e.contains("0/properties:2") && e.contains("simd_count x"),
            "{e}"
        );

        fs::write(root.join("0/properties"), "vendor_id 4294967296\n").unwrap();
        let e = Topology::parse_sysfs(&root).unwrap_err().to_string();
        assert!(e.contains("vendor_id = 4294967296"), "{e}");

        fs::remove_dir_all(root.join("0")).unwrap();
        let e = Topology::parse_sysfs(&root).unwrap_err().to_string();
        assert!(e.contains("no topology node"), "{e}");
        fs::remove_dir_all(&root).unwrap();
    }

    pub(crate) fn gpu(node_id: u32, gpu_id: u32, links: &[(u32, u32)]) -> Node {
        Node {
            node_id,
            gpu_id: Some(GpuId(gpu_id)),
            props: NodeProps {
                simd_count: 304,
                mem_banks_count: 1,
                caches_count: 100,
                num_gws: 64,
                vendor_id: 0x1002,
                device_id: 0x74a1,
                fw_version: 150,
                sdma_fw_version: 19,
                capability: 0x2c00_0000,
                drm_render_minor: 128 + node_id,
                vram_size: 64 << 30,
                vram_public: true,
                ..Default::default()
            },
            links: links
                .iter()
                .map(|&(kind, node_to)| IoLink { kind, node_to })
                .collect(),
            kernel: KernelProps::default(),
        }
    }

    pub(crate) fn cpu(node_id: u32, links: &[(u32, u32)]) -> Node {
        Node {
            node_id,
            gpu_id: None,
            props: NodeProps {
                cpu_cores_count: 32,
                ..Default::default()
            },
            links: links
                .iter()
                .map(|&(kind, node_to)| IoLink { kind, node_to })
                .collect(),
            kernel: KernelProps::default(),
        }
    }

    #[test]
    fn image_entries_roundtrip_and_drop_foreign_gpus() {
        let t = Topology::new(vec![
            cpu(0, &[(IOLINK_PCIE, 1), (IOLINK_PCIE, 2), (IOLINK_PCIE, 3)]),
            gpu(1, 0x1111, &[(IOLINK_PCIE, 0), (IOLINK_XGMI, 2)]),
            gpu(2, 0x2222, &[(IOLINK_PCIE, 0), (IOLINK_XGMI, 1)]),
            gpu(3, 0x3333, &[(IOLINK_PCIE, 0)]),
        ]);
        // The process (restored earlier) sees 0x2222 as user 0xaaaa and 0x1111
        // as 0xbbbb; it has no access to 0x3333.
        let map = BTreeMap::from([
            (GpuId(0x2222), GpuId(0xaaaa)),
            (GpuId(0x1111), GpuId(0xbbbb)),
        ]);
        let entries = t.to_image_entries(&map).unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[1].gpu_id, 0xbbbb);
        assert_eq!(entries[2].gpu_id, 0xaaaa);
        assert_eq!(entries[0].iolinks.len(), 2, "link to the dropped GPU kept");
        assert_eq!(entries[0].simd_count, 0);
        assert_eq!(entries[1].simd_count, 304);
        let back = Topology::from_image_entries(&entries).unwrap();
        assert_eq!(back.gpus().count(), 2);
        assert_eq!(back.gpu(GpuId(0xaaaa)).unwrap().props, t.nodes[2].props);
        assert_eq!(back.hives(), vec![vec![1, 2]]);

        let bad = BTreeMap::from([(GpuId(0x9999), GpuId(1))]);
        let e = t.to_image_entries(&bad).unwrap_err().to_string();
        assert!(e.contains("0x9999"), "{e}");
        let mut dup = entries.clone();
        dup[2].node_id = 1;
        assert!(Topology::from_image_entries(&dup).is_err());
    }

    #[test]
    fn unidirectional_xgmi_is_not_a_hive() {
        let t = Topology::new(vec![
            gpu(1, 0x1111, &[(IOLINK_XGMI, 2)]),
            gpu(2, 0x2222, &[]),
        ]);
        assert!(t.hives().is_empty());
    }
}
