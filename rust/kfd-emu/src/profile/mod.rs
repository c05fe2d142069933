//! Machine profiles: which GPUs and CPU nodes the emulator presents.
//!
//! A profile is a TOML document.  The built-in ones (in `profiles/`) are
//! embedded in the binary; `--profile-file` either supplies a complete
//! profile or a partial one that is merged over `--profile`, so a restore
//! can be tried on "another machine" (other gpu_ids, minors, order, less
//! VRAM, older firmware) without writing a profile from scratch.
//!
//! Layout of a profile document:
//! * top-level scalars (`name`, `description`, `generation_id`, platform ids,
//!   `kfd_minor_version`: the KFD interface, 1.11 to 1.18, default 18);
//! * `[gpu_defaults]`: fields shared by every GPU;
//! * `[[gpus]]`: one table per GPU, merged over `gpu_defaults`;
//! * `[[cpus]]`: one table per CPU (NUMA) node;
//! * optional `gpu_count`: keep only the first N GPUs (for overrides);
//! * optional `io_links_generated`, `cpu_links_generated`,
//!   `p2p_links_generated` (all default true) and `[[io_links]]`: the
//!   topology's io_links and p2p_links (see [`IoLinkSpec`] and
//!   [`links`]);
//! * optional `gem_change_handle` (default false): the render nodes
//!   rename GEM handles as Linux 6.18.0-6.18.35 do (see
//!   [`Profile::gem_change_handle`]).
//!
//! Merging an override: tables merge key by key, arrays of tables merge
//! element by element (extra elements are appended), anything else is
//! replaced.  A GPU resolves as base `gpu_defaults` ← override
//! `gpu_defaults` ← base `gpus[i]` ← override `gpus[i]`, which is why the
//! built-in profiles keep only identity fields (ids, minors, PCI location,
//! NUMA node, hive) in their per-GPU tables.  `io_links` is the exception:
//! links have no index identity, so an override's `io_links` replaces the
//! base's list whole (`io_links = []` removes it).  `gpu_count` drops the
//! explicit links that name a dropped GPU along with it.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use toml::{Table, Value};

pub mod links;

use kfd_abi::ids::{GpuId, RenderMinor};
use links::Link;

/// The built-in profiles, by name.
const BUILTIN: &[(&str, &str)] = &[
    ("mi100", include_str!("../../profiles/mi100.toml")),
    ("mi100x2", include_str!("../../profiles/mi100x2.toml")),
    ("mi210x4", include_str!("../../profiles/mi210x4.toml")),
    ("mi250x8", include_str!("../../profiles/mi250x8.toml")),
    ("mi300x8", include_str!("../../profiles/mi300x8.toml")),
    ("rx9070xt", include_str!("../../profiles/rx9070xt.toml")),
];

/// Profiles write kfd-abi's id newtypes (`GpuId`, `RenderMinor`) as
/// plain integers.
mod id_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer, T: Copy + Into<u32>>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32((*v).into())
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: From<u32>>(d: D) -> Result<T, D::Error> {
        u32::deserialize(d).map(T::from)
    }
}

/// One level of a GPU's cache hierarchy, instantiated `count` times in
/// `nodes/N/caches/`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheLevel {
    pub level: u32,
    /// KiB.
    pub size: u32,
    pub cache_line_size: u32,
    pub cache_lines_per_tag: u32,
    pub association: u32,
    pub latency: u32,
    /// KFD cache type bits (1 data, 2 instruction, 4 CPU, 8 HSA CU).
    #[serde(rename = "type")]
    pub kind: u32,
    /// How many CUs share one instance.
    pub cus_per_instance: u32,
    pub count: u32,
}

/// One emulated GPU (a KFD topology node with a gpu_id).  Field names are
/// the sysfs property names where one exists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    #[serde(with = "id_serde")]
    pub gpu_id: GpuId,
    /// The node's `name` file, the gfx target (`gfx90a`).
    pub name: String,
    /// The product name ROCm shows: what libdrm's amdgpu.ids table gives
    /// for `device_id` and `pci_revision`.
    pub marketing_name: String,
    pub gfx_target_version: u32,
    pub vendor_id: u32,
    pub device_id: u32,
    /// PCI revision id (sysfs `revision`).  With `device_id` it is the key
    /// of libdrm's amdgpu.ids, which gives user space the marketing name.
    /// Optional (0), for profiles written before it existed.
    #[serde(default)]
    pub pci_revision: u32,
    pub domain: u32,
    /// PCI bus/device/function: `bus << 8 | dev << 3 | fn`.
    pub location_id: u32,
    #[serde(with = "id_serde")]
    pub drm_render_minor: RenderMinor,
    /// Index into [`Profile::cpus`] of the NUMA node the GPU hangs off.
    pub numa_node: u32,
    /// XGMI hive; 0 when the GPU is in no hive.  GPUs with equal non-zero
    /// hive ids get XGMI links to each other.
    pub hive_id: u64,
    /// The ASIC's serial number (amdgpu's `unique_id`, the topology's
    /// `unique_id`, from which ROCr makes the agent's UUID); 0: none.
    pub unique_id: u64,
    /// Bytes of VRAM (`mem_banks/0/properties: size_in_bytes`).
    pub vram_size: u64,
    /// Whether VRAM is all CPU-visible (heap_type 1) or not (heap_type 2).
    pub vram_public: bool,
    pub vram_width: u32,
    pub vram_clk_max: u32,
    /// Active compute units; `simd_count = cu_count * simd_per_cu`.
    pub cu_count: u32,
    pub array_count: u32,
    pub simd_arrays_per_engine: u32,
    pub cu_per_simd_array: u32,
    pub simd_per_cu: u32,
    pub max_waves_per_simd: u32,
    pub lds_size_in_kb: u32,
    pub gds_size_in_kb: u32,
    pub num_gws: u32,
    pub wave_front_size: u32,
    pub max_slots_scratch_cu: u32,
    pub num_xcc: u32,
    pub num_sdma_engines: u32,
    pub num_sdma_xgmi_engines: u32,
    pub num_sdma_queues_per_engine: u32,
    pub num_cp_queues: u32,
    pub fw_version: u32,
    pub sdma_fw_version: u32,
    pub capability: u32,
    pub debug_prop: u32,
    pub max_engine_clk_fcompute: u32,
    pub max_engine_clk_ccompute: u32,
    pub caches: Vec<CacheLevel>,
    /// Whether amdgpu's DMA rings take user submissions (AMDGPU_CS).
    /// `false` models rings marked `no_user_submission` (SDMA 7.1 by
    /// default, SDMA 6/7 with `amdgpu.disable_kq=1`): `amdgpu_hw_ip_info`
    /// then counts no DMA ring (`available_rings` 0) and `amdgpu_cs_p2_ib`
    /// refuses an IB for one with EINVAL.  KFD's own SDMA queues are not
    /// affected.  Optional (true).
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub dma_user_submission: bool,
}

impl Gpu {
    pub fn simd_count(&self) -> u32 {
        self.cu_count * self.simd_per_cu
    }

    /// What KFD sizes a queue's control stack and context save area from.
    pub fn cwsr_props(&self) -> kfd_abi::criu::CwsrProps {
        kfd_abi::criu::CwsrProps {
            gfx_target_version: self.gfx_target_version,
            simd_count: self.simd_count(),
            simd_per_cu: self.simd_per_cu,
            array_count: self.array_count,
            simd_arrays_per_engine: self.simd_arrays_per_engine,
            num_xcc: self.num_xcc.max(1),
        }
    }

    pub fn caches_count(&self) -> u32 {
        self.caches.iter().map(|c| c.count).sum()
    }

    /// `mem_banks` heap type of the VRAM bank.
    pub fn vram_heap_type(&self) -> u32 {
        if self.vram_public {
            1
        } else {
            2
        }
    }
}

/// One CPU (NUMA) node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cpu {
    pub name: String,
    pub cpu_cores_count: u32,
    pub cpu_core_id_base: u32,
    /// Bytes of system memory on this node.
    pub mem_size: u64,
    pub max_engine_clk_ccompute: u32,
}

/// The io_link types KFD reports (`HSA_IOLINKTYPE`), by the names a
/// profile may use for them (any case).
pub const LINK_TYPES: &[(&str, u32)] = &[
    ("HyperTransport", 1),
    ("PCIe", 2),
    ("AMBA", 3),
    ("MIPI", 4),
    ("QPI", 5),
    ("RapidIO", 8),
    ("InfiniBand", 9),
    ("XGMI", 11),
    ("XGOP", 12),
    ("GZ", 13),
    ("EthernetRDMA", 14),
    ("RDMAOther", 15),
    ("Other", 16),
];

/// A link type as a profile writes it: a name from [`LINK_TYPES`] or the
/// number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LinkTypeSpec {
    Number(u32),
    Name(String),
}

/// A node as a link names it: `"cpuN"` / `"gpuN"` (index into `[[cpus]]`
/// / `[[gpus]]`) or an integer, the gpu_id of a GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NodeRef {
    GpuId(u32),
    Name(String),
}

impl fmt::Display for NodeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeRef::GpuId(id) => write!(f, "gpu_id {id:#x}"),
            NodeRef::Name(n) => write!(f, "{n:?}"),
        }
    }
}

/// One declared io_link (`[[io_links]]`).  Omitted numbers take the values
/// of the generated links of that type (see [`links::link_defaults`]); other types
/// have no defaults for `weight`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoLinkSpec {
    #[serde(rename = "type")]
    pub kind: LinkTypeSpec,
    pub from: NodeRef,
    pub to: NodeRef,
    /// `"both"` (the default: `to` gets the same link back) or `"one-way"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_latency: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_latency: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_bandwidth: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bandwidth: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<u32>,
}

/// The keys an `[[io_links]]` table may have.
const IO_LINK_KEYS: &[&str] = &[
    "type",
    "from",
    "to",
    "direction",
    "weight",
    "min_latency",
    "max_latency",
    "min_bandwidth",
    "max_bandwidth",
    "flags",
];

/// A declared link resolved to topology node ids, defaults applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeclaredLink {
    pub link: Link,
    /// The `to` node has the same link back.
    pub both: bool,
}

/// The KFD interface versions the emulator speaks: 1.11 to 1.18.
pub const KFD_MINOR_VERSIONS: std::ops::RangeInclusive<u32> = 11..=18;

fn default_kfd_minor() -> u32 {
    *KFD_MINOR_VERSIONS.end()
}

fn default_true() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// A resolved machine profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    pub description: String,
    pub generation_id: u32,
    pub platform_oem: u64,
    pub platform_id: u64,
    pub platform_rev: u64,
    /// The minor version of the KFD interface (major 1) the emulated kernel
    /// speaks and GET_VERSION reports: 18, Linux 6.18's, unless the profile
    /// says otherwise; down to 11 (Linux 6.1, what Debian bookworm's ROCm
    /// 5.2 was built for), with the ioctls and layouts of that version.
    #[serde(default = "default_kfd_minor")]
    pub kfd_minor_version: u32,
    pub cpus: Vec<Cpu>,
    pub gpus: Vec<Gpu>,
    /// Whether the usual GPU links are generated (PCIe between each GPU
    /// and its CPU node, XGMI within a hive).
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub io_links_generated: bool,
    /// Whether CPU nodes get HyperTransport links to each other, as KFD's
    /// CRAT gives a multi-socket AMD host (independent of
    /// `io_links_generated`).
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub cpu_links_generated: bool,
    /// Whether the `p2p_links` KFD derives (`kfd_create_indirect_link_prop`)
    /// are listed.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub p2p_links_generated: bool,
    /// Links declared by the profile, added after the generated ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub io_links: Vec<IoLinkSpec>,
    /// Whether the kernel renames GEM handles (DRM_IOCTL_GEM_CHANGE_HANDLE)
    /// as Linux 6.18.0 to 6.18.35 do.  False (the default) models 7.1 and
    /// the stable kernels with its fix (6.18.36, 7.0.13; CVE-2026-53145),
    /// which answer EINVAL to every call.
    #[serde(default, skip_serializing_if = "is_false")]
    pub gem_change_handle: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Errors loading a profile.  Each names the profile or file and field.
#[derive(Debug)]
pub enum ProfileError {
    UnknownName(String),
    Read { path: String, err: std::io::Error },
    Parse { source: String, err: String },
    Invalid { profile: String, what: String },
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileError::UnknownName(n) => write!(
                f,
                "unknown profile {n:?} (known: {})",
                builtin_names().collect::<Vec<_>>().join(", ")
            ),
            ProfileError::Read { path, err } => write!(f, "{path}: {err}"),
            ProfileError::Parse { source, err } => write!(f, "{source}: {err}"),
            ProfileError::Invalid { profile, what } => write!(f, "profile {profile}: {what}"),
        }
    }
}

impl std::error::Error for ProfileError {}

/// Names of the built-in profiles.
pub fn builtin_names() -> impl Iterator<Item = &'static str> {
    BUILTIN.iter().map(|(n, _)| *n)
}

fn builtin_text(name: &str) -> Result<&'static str, ProfileError> {
    BUILTIN
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .ok_or_else(|| ProfileError::UnknownName(name.to_owned()))
}

fn parse_doc(source: &str, text: &str) -> Result<Table, ProfileError> {
    text.parse::<Table>().map_err(|e| ProfileError::Parse {
        source: source.to_owned(),
        err: e.to_string(),
    })
}

/// Merges `over` into `base`: tables key by key, arrays of tables element by
/// element, everything else replaced.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Table(b), Value::Table(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(bv) => merge(bv, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (Value::Array(b), Value::Array(o))
            if o.iter().all(Value::is_table) && b.iter().all(Value::is_table) =>
        {
            for (i, v) in o.into_iter().enumerate() {
                match b.get_mut(i) {
                    Some(bv) => merge(bv, v),
                    None => b.push(v),
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// Splits a document into (gpu_defaults, gpus, rest).
fn take_gpu_parts(
    source: &str,
    doc: &mut Table,
) -> Result<(Value, Vec<Value>, Option<i64>), ProfileError> {
    let defaults = doc
        .remove("gpu_defaults")
        .unwrap_or_else(|| Value::Table(Table::new()));
    if !defaults.is_table() {
        return Err(ProfileError::Parse {
            source: source.to_owned(),
            err: "gpu_defaults must be a table".into(),
        });
    }
    let gpus = match doc.remove("gpus") {
        None => Vec::new(),
        Some(Value::Array(a)) if a.iter().all(Value::is_table) => a,
        Some(_) => {
            return Err(ProfileError::Parse {
                source: source.to_owned(),
                err: "gpus must be an array of tables ([[gpus]])".into(),
            })
        }
    };
    let count = match doc.remove("gpu_count") {
        None => None,
        Some(Value::Integer(n)) if n >= 0 => Some(n),
        Some(v) => {
            return Err(ProfileError::Parse {
                source: source.to_owned(),
                err: format!("gpu_count must be a non-negative integer, not {v}"),
            })
        }
    };
    Ok((defaults, gpus, count))
}

/// Checks the shape of a document's `io_links` (an array of tables with
/// known keys), so that a mistake names the link and field.
fn check_io_links(source: &str, doc: &Table) -> Result<(), ProfileError> {
    let bad = |err: String| ProfileError::Parse {
        source: source.to_owned(),
        err,
    };
    let Some(v) = doc.get("io_links") else {
        return Ok(());
    };
    let Value::Array(links) = v else {
        return Err(bad(
            "io_links must be an array of tables ([[io_links]])".into()
        ));
    };
    for (i, l) in links.iter().enumerate() {
        let Value::Table(t) = l else {
            return Err(bad(format!("io_links[{i}] must be a table, not {l}")));
        };
        for k in t.keys() {
            if !IO_LINK_KEYS.contains(&k.as_str()) {
                return Err(bad(format!(
                    "io_links[{i}]: unknown field `{k}` (known: {})",
                    IO_LINK_KEYS.join(", ")
                )));
            }
        }
        for k in ["type", "from", "to"] {
            if !t.contains_key(k) {
                return Err(bad(format!("io_links[{i}]: missing field `{k}`")));
            }
        }
    }
    Ok(())
}

/// Whether `r` names one of the GPUs `dropped` (index, gpu_id) that
/// `gpu_count` removes.
fn names_dropped(r: &NodeRef, dropped: &[(usize, Option<GpuId>)]) -> bool {
    match r {
        NodeRef::GpuId(id) => dropped.iter().any(|(_, g)| *g == Some(GpuId(*id))),
        NodeRef::Name(n) => n
            .strip_prefix("gpu")
            .and_then(|i| i.parse::<usize>().ok())
            .is_some_and(|i| dropped.iter().any(|(j, _)| *j == i)),
    }
}

/// Resolves a base document and optional override into a profile.
fn resolve(
    base_src: &str,
    base: &str,
    over: Option<(&str, &str)>,
) -> Result<Profile, ProfileError> {
    let mut base_doc = parse_doc(base_src, base)?;
    check_io_links(base_src, &base_doc)?;
    let (mut defaults, base_gpus, mut count) = take_gpu_parts(base_src, &mut base_doc)?;
    let mut over_gpus = Vec::new();
    let mut source = base_src.to_owned();
    let mut over_doc = None;
    if let Some((over_src, over_text)) = over {
        let mut doc = parse_doc(over_src, over_text)?;
        check_io_links(over_src, &doc)?;
        let (od, og, oc) = take_gpu_parts(over_src, &mut doc)?;
        merge(&mut defaults, od);
        over_gpus = og;
        count = oc.or(count);
        // Links have no index identity: the override's list replaces.
        if doc.contains_key("io_links") {
            base_doc.remove("io_links");
        }
        over_doc = Some(doc);
        source = format!("{base_src} + {over_src}");
    }
    let mut rest = Value::Table(base_doc);
    if let Some(doc) = over_doc {
        merge(&mut rest, Value::Table(doc));
    }
    let n = base_gpus.len().max(over_gpus.len());
    let mut base_gpus = base_gpus.into_iter();
    let mut over_gpus = over_gpus.into_iter();
    let mut gpus = Vec::with_capacity(n);
    for _ in 0..n {
        let mut g = defaults.clone();
        if let Some(b) = base_gpus.next() {
            merge(&mut g, b);
        }
        if let Some(o) = over_gpus.next() {
            merge(&mut g, o);
        }
        gpus.push(g);
    }
    // GPUs beyond gpu_count go, and so do the links that name them.
    let mut dropped = Vec::new();
    if let Some(c) = count {
        let c = c as usize;
        for (i, g) in gpus.iter().enumerate().skip(c) {
            let id = g.get("gpu_id").and_then(Value::as_integer);
            dropped.push((i, id.and_then(|v| u32::try_from(v).ok()).map(GpuId)));
        }
        gpus.truncate(c);
    }
    let Value::Table(mut doc) = rest else {
        unreachable!("rest starts as a table and merges keep it one")
    };
    doc.insert("gpus".into(), Value::Array(gpus));
    let mut profile: Profile =
        Value::Table(doc)
            .try_into()
            .map_err(|e: toml::de::Error| ProfileError::Parse {
                source: source.clone(),
                err: e.to_string(),
            })?;
    profile
        .io_links
        .retain(|l| !names_dropped(&l.from, &dropped) && !names_dropped(&l.to, &dropped));
    profile.validate().map_err(|e| match e {
        ProfileError::Invalid { profile, what } if source != format!("profile {profile}") => {
            ProfileError::Invalid {
                profile: format!("{profile} ({source})"),
                what,
            }
        }
        e => e,
    })?;
    Ok(profile)
}

impl Profile {
    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Result<Profile, ProfileError> {
        resolve(&format!("profile {name}"), builtin_text(name)?, None)
    }

    /// Loads `--profile NAME` and/or `--profile-file F`: with both, the file
    /// is a partial override of the named profile; with only the file, it
    /// must be complete.
    pub fn load(name: Option<&str>, file: Option<&Path>) -> Result<Profile, ProfileError> {
        let file_text = match file {
            Some(p) => Some((
                p.display().to_string(),
                std::fs::read_to_string(p).map_err(|err| ProfileError::Read {
                    path: p.display().to_string(),
                    err,
                })?,
            )),
            None => None,
        };
        match (name, &file_text) {
            (Some(n), None) => Profile::builtin(n),
            (Some(n), Some((src, text))) => Profile::with_override(n, src, text),
            (None, Some((src, text))) => resolve(src, text, None),
            (None, None) => Err(ProfileError::Invalid {
                profile: "<none>".into(),
                what: "give --profile NAME and/or --profile-file FILE".into(),
            }),
        }
    }

    /// Built-in profile `name` with the partial profile `text` merged over it.
    pub fn with_override(name: &str, source: &str, text: &str) -> Result<Profile, ProfileError> {
        resolve(
            &format!("profile {name}"),
            builtin_text(name)?,
            Some((source, text)),
        )
    }

    /// Parses a complete profile document.
    pub fn from_toml(source: &str, text: &str) -> Result<Profile, ProfileError> {
        resolve(source, text, None)
    }

    /// The profile as a complete TOML document (loadable with
    /// [`Profile::from_toml`]).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a profile always serialises")
    }

    /// The GPUs, in topology order.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    pub fn gpu(&self, id: GpuId) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.gpu_id == id)
    }

    /// Topology node id of CPU node `i` / GPU `i`: CPUs first, as KFD does.
    pub fn cpu_node_id(&self, i: usize) -> u32 {
        i as u32
    }

    pub fn gpu_node_id(&self, i: usize) -> u32 {
        (self.cpus.len() + i) as u32
    }

    fn invalid(&self, what: String) -> ProfileError {
        ProfileError::Invalid {
            profile: self.name.clone(),
            what,
        }
    }

    /// Checks the cross-field rules the kernel guarantees on real hardware.
    pub fn validate(&self) -> Result<(), ProfileError> {
        if self.cpus.is_empty() {
            return Err(self.invalid("needs at least one [[cpus]] node".into()));
        }
        if !KFD_MINOR_VERSIONS.contains(&self.kfd_minor_version) {
            return Err(self.invalid(format!(
                "kfd_minor_version {} is outside {}..={} (KFD 1.11 to 1.18)",
                self.kfd_minor_version,
                KFD_MINOR_VERSIONS.start(),
                KFD_MINOR_VERSIONS.end()
            )));
        }
        for (i, c) in self.cpus.iter().enumerate() {
            if c.cpu_cores_count == 0 {
                return Err(self.invalid(format!("cpus[{i}].cpu_cores_count is 0")));
            }
        }
        let mut ids = std::collections::BTreeSet::new();
        let mut minors = std::collections::BTreeSet::new();
        for (i, g) in self.gpus.iter().enumerate() {
            let at = format!("gpus[{i}] (gpu_id {})", g.gpu_id);
            if g.gpu_id.0 == 0 {
                return Err(self.invalid(format!("{at}: gpu_id 0 denotes a CPU node")));
            }
            if !ids.insert(g.gpu_id) {
                return Err(self.invalid(format!("{at}: duplicate gpu_id")));
            }
            if !(128..=255).contains(&g.drm_render_minor.0) {
                return Err(self.invalid(format!(
                    "{at}: drm_render_minor {} is outside 128..=255",
                    g.drm_render_minor
                )));
            }
            if !minors.insert(g.drm_render_minor) {
                return Err(self.invalid(format!(
                    "{at}: duplicate drm_render_minor {}",
                    g.drm_render_minor
                )));
            }
            if g.numa_node as usize >= self.cpus.len() {
                return Err(self.invalid(format!(
                    "{at}: numa_node {} but only {} cpu node(s)",
                    g.numa_node,
                    self.cpus.len()
                )));
            }
            if g.vram_size == 0 {
                return Err(self.invalid(format!("{at}: vram_size is 0")));
            }
            if g.cu_count == 0 || g.simd_per_cu == 0 {
                return Err(self.invalid(format!("{at}: cu_count and simd_per_cu must be > 0")));
            }
            if g.cu_count > g.array_count * g.simd_arrays_per_engine * g.cu_per_simd_array {
                return Err(self.invalid(format!(
                    "{at}: cu_count {} exceeds array_count*simd_arrays_per_engine*cu_per_simd_array",
                    g.cu_count
                )));
            }
            if g.num_sdma_engines == 0 || g.num_sdma_queues_per_engine == 0 {
                return Err(self.invalid(format!("{at}: needs SDMA engines and queues")));
            }
        }
        self.declared_links().map(|_| ())
    }

    /// Topology node id of the node `r` names.
    fn node_of(&self, r: &NodeRef) -> Result<u32, String> {
        match r {
            NodeRef::GpuId(id) => self
                .gpus
                .iter()
                .position(|g| g.gpu_id.0 == *id)
                .map(|i| self.gpu_node_id(i))
                .ok_or_else(|| format!("{r}: no GPU has this gpu_id")),
            NodeRef::Name(n) => {
                let (what, count, first) = if let Some(i) = n.strip_prefix("cpu") {
                    ("CPU", self.cpus.len(), i)
                } else if let Some(i) = n.strip_prefix("gpu") {
                    ("GPU", self.gpus.len(), i)
                } else {
                    return Err(format!(
                        "{r} names no node (write \"cpuN\" or \"gpuN\", N an index into \
                         [[cpus]] or [[gpus]], or a gpu_id as an integer)"
                    ));
                };
                let i: usize = first
                    .parse()
                    .ok()
                    .filter(|_| first.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| {
                        format!("{r}: expected a decimal index after \"{}\"", &n[..3])
                    })?;
                if i >= count {
                    return Err(format!("{r}: the profile has {count} {what} node(s)"));
                }
                Ok(if what == "CPU" {
                    self.cpu_node_id(i)
                } else {
                    self.gpu_node_id(i)
                })
            }
        }
    }

    /// How a message names node `id`: `gpu1 (node 3)`.
    fn node_desc(&self, id: u32) -> String {
        let ncpu = self.cpus.len() as u32;
        if id < ncpu {
            format!("cpu{id} (node {id})")
        } else {
            format!("gpu{} (node {id})", id - ncpu)
        }
    }

    /// The `[[io_links]]` resolved to node ids with defaults applied, in
    /// declaration order.  Errors name the link and field.
    pub fn declared_links(&self) -> Result<Vec<DeclaredLink>, ProfileError> {
        let mut seen: std::collections::BTreeMap<(u32, u32, u32), String> =
            std::collections::BTreeMap::new();
        for n in 0..(self.cpus.len() + self.gpus.len()) as u32 {
            for l in links::generated_links_of(self, n) {
                seen.insert((l.from, l.to, l.kind), "a generated link".into());
            }
        }
        let mut out = Vec::with_capacity(self.io_links.len());
        for (i, spec) in self.io_links.iter().enumerate() {
            let at = format!("io_links[{i}]");
            let declared = self.declared_link(&at, spec)?;
            self.check_new_link(&mut seen, &at, &declared)?;
            out.push(declared);
        }
        Ok(out)
    }

    /// One `[[io_links]]` entry (`at` names it) with its defaults applied.
    fn declared_link(&self, at: &str, spec: &IoLinkSpec) -> Result<DeclaredLink, ProfileError> {
        let kind = self.link_type(at, &spec.kind)?;
        let from = self
            .node_of(&spec.from)
            .map_err(|why| self.invalid(format!("{at}.from: {why}")))?;
        let to = self
            .node_of(&spec.to)
            .map_err(|why| self.invalid(format!("{at}.to: {why}")))?;
        if from == to {
            return Err(self.invalid(format!(
                "{at}: from and to are the same node, {}",
                self.node_desc(from)
            )));
        }
        let both = match spec.direction.as_deref() {
            None | Some("both") => true,
            Some("one-way") => false,
            Some(d) => {
                return Err(self.invalid(format!(
                    "{at}.direction: {d:?}: expected \"both\" or \"one-way\""
                )))
            }
        };
        let defaults = links::link_defaults(kind);
        let weight = match (spec.weight, defaults) {
            (Some(w), _) => w,
            (None, Some(d)) => d.weight,
            (None, None) => {
                return Err(self.invalid(format!(
                    "{at}.weight: required for type {kind} (only HyperTransport, PCIe and \
                     XGMI links have defaults)"
                )))
            }
        };
        let link = Link {
            kind,
            from,
            to,
            weight,
            min_latency: spec.min_latency.unwrap_or(0),
            max_latency: spec.max_latency.unwrap_or(0),
            min_bw: spec
                .min_bandwidth
                .or(defaults.map(|d| d.min_bw))
                .unwrap_or(0),
            max_bw: spec
                .max_bandwidth
                .or(defaults.map(|d| d.max_bw))
                .unwrap_or(0),
            flags: spec.flags.unwrap_or(links::LINK_FLAGS),
        };
        if link.min_latency > link.max_latency {
            return Err(self.invalid(format!(
                "{at}.min_latency {} exceeds max_latency {}",
                link.min_latency, link.max_latency
            )));
        }
        if link.min_bw > link.max_bw {
            return Err(self.invalid(format!(
                "{at}.min_bandwidth {} exceeds max_bandwidth {}",
                link.min_bw, link.max_bw
            )));
        }
        Ok(DeclaredLink { link, both })
    }

    /// The KFD io_link type a `type` field names, by number or by name.
    fn link_type(&self, at: &str, kind: &LinkTypeSpec) -> Result<u32, ProfileError> {
        match kind {
            LinkTypeSpec::Number(n) => LINK_TYPES
                .iter()
                .find(|(_, k)| k == n)
                .map(|(_, k)| *k)
                .ok_or_else(|| format!("{n} is not a KFD io_link type")),
            LinkTypeSpec::Name(name) => LINK_TYPES
                .iter()
                .find(|(t, _)| t.eq_ignore_ascii_case(name))
                .map(|(_, k)| *k)
                .ok_or_else(|| format!("{name:?} is not a KFD io_link type")),
        }
        .map_err(|why| {
            let known: Vec<String> = LINK_TYPES
                .iter()
                .map(|(t, k)| format!("{t} ({k})"))
                .collect();
            self.invalid(format!("{at}.type: {why} (known: {})", known.join(", ")))
        })
    }

    /// Records the declared link's directions in `seen` (a direction and
    /// type → who made it); one made before, generated or declared, is an
    /// error saying which knob leaves it to `[[io_links]]`.
    fn check_new_link(
        &self,
        seen: &mut std::collections::BTreeMap<(u32, u32, u32), String>,
        at: &str,
        declared: &DeclaredLink,
    ) -> Result<(), ProfileError> {
        let Link { kind, from, to, .. } = declared.link;
        let mut directed = vec![(from, to)];
        if declared.both {
            directed.push((to, from));
        }
        for (a, b) in directed {
            let Some(other) = seen.insert((a, b, kind), at.to_owned()) else {
                continue;
            };
            let (by, hint) = if other.starts_with("io_links") {
                (format!("declared by {other}"), "")
            } else if a < self.cpus.len() as u32 && b < self.cpus.len() as u32 {
                (
                    other,
                    " (cpu_links_generated = false leaves the CPU-CPU links to \
                     [[io_links]])",
                )
            } else {
                (
                    other,
                    " (io_links_generated = false leaves the GPU links to [[io_links]])",
                )
            };
            return Err(self.invalid(format!(
                "{at}: the type {kind} link from {} to {} is already {by}{hint}",
                self.node_desc(a),
                self.node_desc(b),
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every GPU of the built-in profiles has a serial number of its own.
    #[test]
    fn builtin_gpus_have_distinct_unique_ids() {
        let mut seen = std::collections::BTreeSet::new();
        for name in builtin_names() {
            for g in &Profile::builtin(name).unwrap().gpus {
                assert_ne!(g.unique_id, 0, "{name}: GPU {:#x}", g.gpu_id.0);
                assert!(
                    seen.insert(g.unique_id),
                    "{name}: unique_id {:#x} twice",
                    g.unique_id
                );
            }
        }
    }

    /// mi100x2 with two declared links (top-level keys go before the
    /// first table header).
    fn base() -> String {
        format!(
            "io_links_generated = false\nio_links = [\n\
             {{ type = \"PCIe\", from = \"gpu0\", to = \"cpu0\" }},\n\
             {{ type = \"PCIe\", from = \"gpu1\", to = \"cpu0\", direction = \"one-way\" }},\n]\n{}",
            builtin_text("mi100x2").unwrap()
        )
    }

    /// GEM_CHANGE_HANDLE is off unless an override turns it on.
    #[test]
    fn gem_change_handle_is_off_by_default() {
        let text = builtin_text("mi100").unwrap();
        assert!(!resolve("mi100", text, None).unwrap().gem_change_handle);
        let on = resolve("mi100", text, Some(("o", "gem_change_handle = true\n"))).unwrap();
        assert!(on.gem_change_handle);
    }

    #[test]
    fn override_io_links_replace_the_base_list_whole() {
        let kept = resolve(
            "base",
            &base(),
            Some(("o", "[gpu_defaults]\nfw_version = 60\n")),
        )
        .unwrap();
        assert_eq!(kept.io_links.len(), 2);
        assert!(!kept.io_links_generated);

        // One link in the override: the base's two are gone, not merged.
        let over = "io_links = [{ type = \"XGMI\", from = \"gpu1\", to = \"gpu0\" }]\n";
        let p = resolve("base", &base(), Some(("o", over))).unwrap();
        assert_eq!(p.io_links.len(), 1);
        assert_eq!(p.io_links[0].kind, LinkTypeSpec::Name("XGMI".into()));
        assert_eq!(p.io_links[0].direction, None);
        assert!(
            !p.io_links_generated,
            "the scalar still comes from the base"
        );

        let p = resolve(
            "base",
            &base(),
            Some(("o", "io_links = []\nio_links_generated = true\n")),
        )
        .unwrap();
        assert!(p.io_links.is_empty() && p.io_links_generated);
        let builtin = Profile::builtin("mi100x2").unwrap();
        let n = (p.cpus.len() + p.gpus.len()) as u32;
        assert_eq!(n, (builtin.cpus.len() + builtin.gpus.len()) as u32);
        for node in 0..n {
            assert_eq!(
                links::generated_links_of(&p, node),
                links::generated_links_of(&builtin, node)
            );
        }
    }

    #[test]
    fn type_errors_in_links_name_the_field() {
        let e = resolve(
            "base",
            &base(),
            Some(("o", "io_links = [{ type = \"PCIe\", from = \"gpu0\", to = \"gpu1\", weight = \"x\" }]\n")),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("weight"), "{e}");
        let e = resolve("base", &base(), Some(("o", "io_links = 3\n")))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("o: io_links must be an array of tables"),
            "{e}"
        );
    }
}
