//! Restore-time GPU matching: which host GPU takes over each GPU of the
//! image (user gpu_id → host gpu_id).
//!
//! A host GPU can take over an image GPU when
//! * the properties that must be equal are equal, and the knob-controlled
//!   ones pass (see [`Checks`]);
//! * every valid io link of the image GPU is matched on the host: a link to
//!   a GPU must lead to the GPU that peer was mapped to, a link to a CPU to
//!   some CPU (with `KFD_NUMA_CHECK`, to the CPU that image CPU is mapped
//!   to, CPUs being mapped one to one); XGMI may not become PCIe and a
//!   bidirectional link must stay bidirectional;
//! * the GPUs of one image XGMI hive land in one host hive.
//!
//! The search backtracks over all choices (including which host CPU an image
//! CPU becomes), bounded by a step budget.
//!
//! A refusal names the property that fails.  It names a `KFD_*_CHECK` knob
//! only when turning that knob off (alone, or with the others it names)
//! lets this host take the image: the match is tried again without the
//! checks that rejected a candidate during the search.
//!
//! Deviations from upstream 4.2.1, on purpose:
//! * the hive size check is effective (upstream compares sizes that are
//!   never set), and two image hives may share a larger host hive;
//! * `io_links_count` (the raw sysfs count, which counts links to GPUs a
//!   container cannot see) is not compared; the links themselves are;
//! * GPU↔GPU links are checked too (upstream skips PCIe peer links), since
//!   an application may rely on peer access it had;
//! * NUMA choices are backtracked instead of taking the first host CPU.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};

use crate::env::Checks;
use crate::ids::GpuId;
use crate::topology::{IoLink, Node, NodeProps, Topology, IOLINK_XGMI};

/// Steps after which the search gives up (a pathological topology).
const STEP_BUDGET: u64 = 2_000_000;

/// Distinct failure reasons quoted in a [`MatchError::NoPlacement`].
const MAX_REASONS: usize = 8;

/// The result: user gpu_id (image) → actual gpu_id (host).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuMap {
    map: BTreeMap<GpuId, GpuId>,
}

impl GpuMap {
    pub fn new(map: BTreeMap<GpuId, GpuId>) -> Self {
        GpuMap { map }
    }

    /// The host GPU of image GPU `user`.
    pub fn get(&self, user: GpuId) -> Option<GpuId> {
        self.map.get(&user).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (GpuId, GpuId)> + '_ {
        self.map.iter().map(|(a, b)| (*a, *b))
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Why no mapping exists.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MatchError {
    #[error("the image has {image} GPUs but this host shows only {host}")]
    TooFewGpus { image: usize, host: usize },
    #[error("the image has {image} GPUs but this host shows {host}: KFD restores a process only onto as many GPUs as it had (limit the visible GPUs, e.g. with a device cgroup)")]
    TooManyGpus { image: usize, host: usize },
    #[error("GPU {gpu} (node {node}): no host GPU matches: {detail}")]
    NoCandidate {
        gpu: GpuId,
        node: u32,
        detail: String,
    },
    #[error("XGMI hive of {size} GPUs (image nodes {nodes:?}) does not fit: the largest host hive has {largest} GPUs")]
    HiveTooLarge {
        size: usize,
        nodes: Vec<u32>,
        largest: usize,
    },
    #[error("GPU {gpu} (node {node}): no host GPU keeps its links and hive: {detail}")]
    NoPlacement {
        gpu: GpuId,
        node: u32,
        detail: String,
    },
    #[error("GPU matching gave up after {0} steps")]
    SearchLimit(u64),
}

/// A check that a `KFD_*_CHECK` variable turns off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Knob {
    FwVersion,
    SdmaFwVersion,
    CachesCount,
    NumGws,
    VramSize,
    Numa,
    Capability,
}

impl Knob {
    /// The environment variable.
    pub fn var(self) -> &'static str {
        match self {
            Knob::FwVersion => "KFD_FW_VER_CHECK",
            Knob::SdmaFwVersion => "KFD_SDMA_FW_VER_CHECK",
            Knob::CachesCount => "KFD_CACHES_COUNT_CHECK",
            Knob::NumGws => "KFD_NUM_GWS_CHECK",
            Knob::VramSize => "KFD_VRAM_SIZE_CHECK",
            Knob::Numa => "KFD_NUMA_CHECK",
            Knob::Capability => "KFD_CAPABILITY_CHECK",
        }
    }

    /// What the check looks at.
    fn what(self) -> &'static str {
        match self {
            Knob::FwVersion => "fw_version",
            Knob::SdmaFwVersion => "sdma_fw_version",
            Knob::CachesCount => "caches_count",
            Knob::NumGws => "num_gws",
            Knob::VramSize => "vram_size",
            Knob::Numa => "NUMA",
            Knob::Capability => "capability",
        }
    }

    fn disable(self, c: &mut Checks) {
        let slot = match self {
            Knob::FwVersion => &mut c.fw_version,
            Knob::SdmaFwVersion => &mut c.sdma_fw_version,
            Knob::CachesCount => &mut c.caches_count,
            Knob::NumGws => &mut c.num_gws,
            Knob::VramSize => &mut c.vram_size,
            Knob::Numa => &mut c.numa,
            Knob::Capability => &mut c.capability,
        };
        *slot = false;
    }
}

/// One property of an image GPU that a host GPU fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// `fw_version 65 > 60`.
    pub what: String,
    /// The knob that turns this check off, if any.
    pub knob: Option<Knob>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

/// Describes each property of `src` that `dst` fails; empty = compatible.
pub fn property_mismatches(src: &NodeProps, dst: &NodeProps, checks: &Checks) -> Vec<Mismatch> {
    let mut out = Vec::new();
    macro_rules! equal {
        ($($f:ident),*) => {$(
            if src.$f != dst.$f {
                out.push(Mismatch {
                    what: format!("{} {} != {}", stringify!($f), src.$f, dst.$f),
                    knob: None,
                });
            }
        )*};
    }
    equal!(
        simd_count,
        mem_banks_count,
        max_waves_per_simd,
        lds_size_in_kb,
        wave_front_size,
        array_count,
        simd_arrays_per_engine,
        cu_per_simd_array,
        simd_per_cu,
        max_slots_scratch_cu,
        vendor_id,
        device_id,
        num_sdma_engines,
        num_sdma_xgmi_engines,
        num_sdma_queues_per_engine,
        num_cp_queues,
        vram_public
    );
    macro_rules! at_most {
        ($($f:ident, $check:ident, $knob:ident);*) => {$(
            if checks.$check && src.$f > dst.$f {
                out.push(Mismatch {
                    what: format!("{} {} > {}", stringify!($f), src.$f, dst.$f),
                    knob: Some(Knob::$knob),
                });
            }
        )*};
    }
    at_most!(
        fw_version, fw_version, FwVersion;
        sdma_fw_version, sdma_fw_version, SdmaFwVersion;
        caches_count, caches_count, CachesCount;
        num_gws, num_gws, NumGws;
        vram_size, vram_size, VramSize
    );
    if checks.capability && src.capability != dst.capability {
        out.push(Mismatch {
            what: format!("capability {:#x} != {:#x}", src.capability, dst.capability),
            knob: Some(Knob::Capability),
        });
    }
    out
}

/// Finds a host GPU for every image GPU.  `image` carries user gpu_ids,
/// `host` actual ones.  The counts must be equal: KFD's RESTORE requires
/// the restoring process to have exactly as many GPUs as the image, and it
/// gets one for every GPU the host topology lets it see (GPUs a device
/// cgroup denies are unreadable in sysfs and absent from `host`).
pub fn match_gpus(
    image: &Topology,
    host: &Topology,
    checks: &Checks,
) -> Result<GpuMap, MatchError> {
    match_counted(image, host, checks, Count::Equal)
}

/// [`match_gpus`] for image GPUs that need not take every host GPU: each
/// gets one of its own, the others stay unused (the GPUs of render files
/// without KFD, `session/render_gpu.rs`).  The search takes the image GPUs
/// in node order and each one's host GPUs in node order, so the placement
/// it finds is the first in that order: where giving each image GPU the
/// first host GPU left that accepts it places them all, it is that one.
pub(crate) fn match_gpus_into(
    image: &Topology,
    host: &Topology,
    checks: &Checks,
) -> Result<GpuMap, MatchError> {
    match_counted(image, host, checks, Count::AtMost)
}

/// How many host GPUs the image GPUs must take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Count {
    /// Every one (a KFD process is restored onto as many GPUs as it had).
    Equal,
    /// Any number: a host GPU may stay unused.
    AtMost,
}

fn match_counted(
    image: &Topology,
    host: &Topology,
    checks: &Checks,
    count: Count,
) -> Result<GpuMap, MatchError> {
    let mut fired = BTreeSet::new();
    match match_with(image, host, checks, count, &mut fired) {
        Ok(map) => Ok(map),
        Err(e @ (MatchError::NoCandidate { .. } | MatchError::NoPlacement { .. })) => {
            match knobs_that_help(image, host, checks, count, &fired) {
                Some(knobs) => Err(e.with_hint(&knob_hint(&knobs))),
                None => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// A minimal set of knobs whose turning off lets the match succeed,
/// starting from `fired` (the checks that rejected some candidate); None
/// when no set of knobs does.
fn knobs_that_help(
    image: &Topology,
    host: &Topology,
    checks: &Checks,
    count: Count,
    fired: &BTreeSet<Knob>,
) -> Option<Vec<Knob>> {
    if fired.is_empty() {
        return None;
    }
    let succeeds = |off: &BTreeSet<Knob>| {
        let mut c = *checks;
        for k in off {
            k.disable(&mut c);
        }
        match_with(image, host, &c, count, &mut BTreeSet::new()).is_ok()
    };
    // Turning a check off can let the search reach checks it never got to
    // before: add the knobs that fire then, until it succeeds or no new
    // knob fires.
    let mut off = fired.clone();
    loop {
        let mut c = *checks;
        for k in &off {
            k.disable(&mut c);
        }
        let mut more = BTreeSet::new();
        if match_with(image, host, &c, count, &mut more).is_ok() {
            break;
        }
        let before = off.len();
        off.extend(more);
        if off.len() == before {
            return None;
        }
    }
    for k in off.clone() {
        off.remove(&k);
        if !succeeds(&off) {
            off.insert(k);
        }
    }
    Some(off.into_iter().collect())
}

fn knob_hint(knobs: &[Knob]) -> String {
    let vars: Vec<String> = knobs.iter().map(|k| format!("{}=0", k.var())).collect();
    let whats: Vec<&str> = knobs.iter().map(|k| k.what()).collect();
    if knobs.len() == 1 {
        format!(
            "; with {} (which skips the {} check) this host would take the image",
            vars[0], whats[0]
        )
    } else {
        format!(
            "; with {} together (which skip the {} checks) this host would take the image",
            vars.join(" and "),
            whats.join(" and ")
        )
    }
}

impl MatchError {
    fn with_hint(self, hint: &str) -> Self {
        match self {
            MatchError::NoCandidate { gpu, node, detail } => MatchError::NoCandidate {
                gpu,
                node,
                detail: detail + hint,
            },
            MatchError::NoPlacement { gpu, node, detail } => MatchError::NoPlacement {
                gpu,
                node,
                detail: detail + hint,
            },
            e => e,
        }
    }
}

/// [`match_gpus`] without the knob hint; adds the knobs whose checks
/// rejected a candidate to `fired`.
fn match_with(
    image: &Topology,
    host: &Topology,
    checks: &Checks,
    count: Count,
    fired: &mut BTreeSet<Knob>,
) -> Result<GpuMap, MatchError> {
    let src_gpus: Vec<&Node> = image.gpus().collect();
    let dst_gpus: Vec<&Node> = host.gpus().collect();
    if count == Count::Equal {
        check_gpu_count(src_gpus.len(), dst_gpus.len())?;
    }
    // Unary compatibility first: it gives the clearest error.
    let candidates = candidates(&src_gpus, &dst_gpus, checks, fired)?;
    let src_hives = image.hives();
    let dst_hives = host.hives();
    check_hive_sizes(&src_hives, &dst_hives)?;
    let order = placement_order(&src_hives, &src_gpus);
    let hive_index = |hives: &[Vec<u32>], node: u32| hives.iter().position(|h| h.contains(&node));
    let mut search = Search {
        image,
        host,
        checks,
        candidates: &candidates,
        order: &order,
        src_hive: order
            .iter()
            .map(|&n| (n, hive_index(&src_hives, n)))
            .collect(),
        dst_hive: dst_gpus
            .iter()
            .map(|d| (d.node_id, hive_index(&dst_hives, d.node_id)))
            .collect(),
        gpu_map: BTreeMap::new(),
        cpu_map: BTreeMap::new(),
        steps: 0,
        failed: Reasons::default(),
        taken: Reasons::default(),
        fired,
    };
    if !search.place(0)? {
        return Err(search.no_placement());
    }
    let map = search
        .gpu_map
        .iter()
        .map(|(s, d)| {
            let s = gpu_of(image.node(*s).expect("mapped image node"));
            let d = gpu_of(host.node(*d).expect("mapped host node"));
            (s, d)
        })
        .collect();
    Ok(GpuMap { map })
}

fn check_gpu_count(image: usize, host: usize) -> Result<(), MatchError> {
    match image.cmp(&host) {
        std::cmp::Ordering::Less => Err(MatchError::TooManyGpus { image, host }),
        std::cmp::Ordering::Greater => Err(MatchError::TooFewGpus { image, host }),
        std::cmp::Ordering::Equal => Ok(()),
    }
}

/// Image GPU node → the host GPU nodes whose properties it accepts; the
/// first image GPU that none accepts is an error naming every refusal.
fn candidates(
    src_gpus: &[&Node],
    dst_gpus: &[&Node],
    checks: &Checks,
    fired: &mut BTreeSet<Knob>,
) -> Result<BTreeMap<u32, Vec<u32>>, MatchError> {
    let mut candidates = BTreeMap::new();
    for s in src_gpus {
        let (ok, detail) = accepting(s, dst_gpus, checks, fired);
        if ok.is_empty() {
            return Err(MatchError::NoCandidate {
                gpu: gpu_of(s),
                node: s.node_id,
                detail,
            });
        }
        candidates.insert(s.node_id, ok);
    }
    Ok(candidates)
}

/// The nodes of the host GPUs of `dst_gpus` whose properties accept image
/// GPU `s` under `checks`, and why each other one does not ("host GPU
/// 0x5c3d (node 1): simd_count 304 != 256; ...").  Adds the knobs whose
/// checks rejected one to `fired`.
fn accepting(
    s: &Node,
    dst_gpus: &[&Node],
    checks: &Checks,
    fired: &mut BTreeSet<Knob>,
) -> (Vec<u32>, String) {
    let mut ok = Vec::new();
    let mut detail = String::new();
    for d in dst_gpus {
        let bad = property_mismatches(&s.props, &d.props, checks);
        fired.extend(bad.iter().filter_map(|m| m.knob));
        if bad.is_empty() {
            ok.push(d.node_id);
            continue;
        }
        if !detail.is_empty() {
            detail.push_str("; ");
        }
        let _ = write!(
            detail,
            "host GPU {} (node {}): {}",
            gpu_of(d),
            d.node_id,
            bad.iter()
                .map(|m| m.what.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    (ok, detail)
}

/// Why each GPU of `host` whose properties do not accept image GPU `s`
/// does not, as [`MatchError::NoCandidate`] says it; empty when all do.
pub(crate) fn property_refusals(s: &Node, host: &Topology, checks: &Checks) -> String {
    let dst_gpus: Vec<&Node> = host.gpus().collect();
    accepting(s, &dst_gpus, checks, &mut BTreeSet::new()).1
}

fn check_hive_sizes(src_hives: &[Vec<u32>], dst_hives: &[Vec<u32>]) -> Result<(), MatchError> {
    let largest = dst_hives.iter().map(Vec::len).max().unwrap_or(0);
    match src_hives.iter().find(|h| h.len() > largest) {
        Some(h) => Err(MatchError::HiveTooLarge {
            size: h.len(),
            nodes: h.clone(),
            largest,
        }),
        None => Ok(()),
    }
}

/// Hive members first (largest hive first, members together) so a wrong
/// hive choice fails early; then the other GPUs.
fn placement_order(src_hives: &[Vec<u32>], src_gpus: &[&Node]) -> Vec<u32> {
    let mut order: Vec<u32> = Vec::new();
    let mut by_size = src_hives.to_vec();
    by_size.sort_by_key(|h| std::cmp::Reverse(h.len()));
    for h in &by_size {
        order.extend(h);
    }
    for s in src_gpus {
        if !order.contains(&s.node_id) {
            order.push(s.node_id);
        }
    }
    order
}

fn gpu_of(n: &Node) -> GpuId {
    n.gpu_id.unwrap_or_default()
}

struct Search<'a> {
    image: &'a Topology,
    host: &'a Topology,
    checks: &'a Checks,
    candidates: &'a BTreeMap<u32, Vec<u32>>,
    order: &'a [u32],
    src_hive: BTreeMap<u32, Option<usize>>,
    dst_hive: BTreeMap<u32, Option<usize>>,
    /// image node → host node, for GPUs.
    gpu_map: BTreeMap<u32, u32>,
    /// image CPU node → host CPU node (only with the NUMA check).
    cpu_map: BTreeMap<u32, u32>,
    steps: u64,
    /// Why candidates failed their hive or links.
    failed: Reasons,
    /// Candidates another image GPU had: quoted only when no candidate
    /// failed otherwise (image GPUs left more than host GPUs accept).
    taken: Reasons,
    /// Knobs whose checks rejected a candidate.
    fired: &'a mut BTreeSet<Knob>,
}

/// The distinct reasons why candidates failed at the deepest level of the
/// search that one did (the GPU that could not be placed).
#[derive(Default)]
struct Reasons {
    deepest: usize,
    list: Vec<String>,
    more: usize,
}

impl Reasons {
    fn note(&mut self, depth: usize, reason: String) {
        if depth > self.deepest {
            self.deepest = depth;
            self.list.clear();
            self.more = 0;
        }
        if depth == self.deepest && !self.list.contains(&reason) {
            if self.list.len() < MAX_REASONS {
                self.list.push(reason);
            } else {
                self.more += 1;
            }
        }
    }
}

impl Search<'_> {
    /// The error when no placement was found: the GPU the search could not
    /// place and why each of its candidates failed.
    fn no_placement(&self) -> MatchError {
        let r = if self.failed.list.is_empty() {
            &self.taken
        } else {
            &self.failed
        };
        let node = self.order[r.deepest];
        let s = self.image.node(node).expect("ordered node exists");
        let mut detail = r.list.join("; ");
        if r.more > 0 {
            let _ = write!(detail, "; and {} more", r.more);
        }
        MatchError::NoPlacement {
            gpu: gpu_of(s),
            node,
            detail,
        }
    }

    /// Keeps why a candidate failed at `depth`.
    fn note(&mut self, depth: usize, reason: String) {
        self.failed.note(depth, reason);
    }

    fn tick(&mut self) -> Result<(), MatchError> {
        self.steps += 1;
        if self.steps > STEP_BUDGET {
            return Err(MatchError::SearchLimit(STEP_BUDGET));
        }
        Ok(())
    }

    fn place(&mut self, depth: usize) -> Result<bool, MatchError> {
        let Some(&s) = self.order.get(depth) else {
            return Ok(true);
        };
        let used: BTreeMap<u32, u32> = self.gpu_map.iter().map(|(&s, &d)| (d, s)).collect();
        for &d in &self.candidates[&s] {
            self.tick()?;
            if let Some(&other) = used.get(&d) {
                let host = self.host.node(d).expect("candidate exists");
                let image = self.image.node(other).expect("placed node exists");
                self.taken.note(
                    depth,
                    format!(
                        "host GPU {} (node {d}): taken by image GPU {}",
                        gpu_of(host),
                        gpu_of(image)
                    ),
                );
                continue;
            }
            if let Err(why) = self.hive_ok(s, d).and_then(|()| self.gpu_links_ok(s, d)) {
                let host = self.host.node(d).expect("candidate exists");
                self.note(
                    depth,
                    format!("host GPU {} (node {d}): {why}", gpu_of(host)),
                );
                continue;
            }
            self.gpu_map.insert(s, d);
            let src = self.image.node(s).expect("ordered node exists");
            let cpu_links: Vec<IoLink> = self
                .image
                .valid_links(src)
                .filter(|l| !self.image.node(l.node_to).is_some_and(Node::is_gpu))
                .copied()
                .collect();
            if self.place_cpu_links(depth, s, d, &cpu_links)? {
                return Ok(true);
            }
            self.gpu_map.remove(&s);
        }
        Ok(false)
    }

    /// Same XGMI hive as the already placed members of `s`'s hive.
    fn hive_ok(&self, s: u32, d: u32) -> Result<(), String> {
        let Some(sh) = self.src_hive[&s] else {
            return Ok(());
        };
        let Some(dh) = self.dst_hive[&d] else {
            return Err("not in an XGMI hive".into());
        };
        for (&other, &target) in &self.gpu_map {
            if self.src_hive[&other] == Some(sh) && self.dst_hive[&target] != Some(dh) {
                return Err(format!(
                    "in another XGMI hive than the host GPU of image node {other}"
                ));
            }
        }
        Ok(())
    }

    /// Links between `s` and already placed GPUs, in both directions.
    fn gpu_links_ok(&self, s: u32, d: u32) -> Result<(), String> {
        let src = self.image.node(s).expect("exists");
        for l in self.image.valid_links(src) {
            if let Some(&peer) = self.gpu_map.get(&l.node_to) {
                self.link_present(s, l, d, peer)?;
            }
        }
        for (&other, &target) in &self.gpu_map {
            let o = self.image.node(other).expect("exists");
            for l in o.links.iter().filter(|l| l.node_to == s) {
                self.link_present(other, l, target, d)?;
            }
        }
        Ok(())
    }

    /// Whether host node `from` has a link to `to` that can stand in for
    /// image link `l` (which leaves image node `l_from`).
    fn link_present(&self, l_from: u32, l: &IoLink, from: u32, to: u32) -> Result<(), String> {
        let host_from = self.host.node(from).expect("exists");
        if host_from
            .links
            .iter()
            .any(|h| h.node_to == to && self.link_match(l_from, l, from, h))
        {
            Ok(())
        } else {
            Err(format!(
                "no {} link from host node {from} to host node {to} (image has one from node {l_from} to node {})",
                link_desc(self.image, l_from, l),
                l.node_to
            ))
        }
    }

    /// XGMI may not become PCIe; bidirectional must stay bidirectional.
    fn link_match(&self, s_from: u32, s: &IoLink, d_from: u32, d: &IoLink) -> bool {
        if !self.host.link_valid(d) {
            return false;
        }
        let s_gpu = self.image.node(s.node_to).is_some_and(Node::is_gpu);
        let d_gpu = self.host.node(d.node_to).is_some_and(Node::is_gpu);
        if s_gpu != d_gpu {
            return false;
        }
        if s.kind == IOLINK_XGMI && d.kind != IOLINK_XGMI {
            return false;
        }
        !self.image.link_bidirectional(s_from, s) || self.host.link_bidirectional(d_from, d)
    }

    /// The links host node `d` has to CPUs, for a refusal.
    fn cpu_links_desc(&self, d: u32) -> String {
        let node = self.host.node(d).expect("exists");
        let links: Vec<String> = self
            .host
            .valid_links(node)
            .filter(|h| !self.host.node(h.node_to).is_some_and(Node::is_gpu))
            .map(|h| {
                let dir = if self.host.link_bidirectional(d, h) {
                    "bidirectional"
                } else {
                    "one-way"
                };
                format!("{dir} {} to CPU node {}", kind_name(h.kind), h.node_to)
            })
            .collect();
        if links.is_empty() {
            "it has no link to a CPU".into()
        } else {
            format!("its links to CPUs: {}", links.join(", "))
        }
    }

    fn place_cpu_links(
        &mut self,
        depth: usize,
        s: u32,
        d: u32,
        links: &[IoLink],
    ) -> Result<bool, MatchError> {
        let Some((l, rest)) = links.split_first() else {
            return self.place(depth + 1);
        };
        self.tick()?;
        let host_d = self.host.node(d).expect("exists");
        let options: Vec<IoLink> = host_d
            .links
            .iter()
            .filter(|h| self.link_match(s, l, d, h))
            .copied()
            .collect();
        if options.is_empty() {
            // No host CPU could stand in, NUMA or not.
            self.note(
                depth,
                format!(
                    "host GPU {} (node {d}): no {} link to a CPU ({})",
                    gpu_of(host_d),
                    link_desc(self.image, s, l),
                    self.cpu_links_desc(d)
                ),
            );
            return Ok(false);
        }
        if !self.checks.numa {
            return self.place_cpu_links(depth, s, d, rest);
        }
        let cpus: Vec<String> = options.iter().map(|h| h.node_to.to_string()).collect();
        if let Some(&c) = self.cpu_map.get(&l.node_to) {
            if options.iter().any(|h| h.node_to == c) {
                return self.place_cpu_links(depth, s, d, rest);
            }
            self.fired.insert(Knob::Numa);
            self.note(depth, format!(
                "host GPU {} (node {d}): NUMA: its {} link(s) to a CPU lead to host CPU node(s) {}, not to host CPU node {c}, which stands in for image CPU node {} (the NUMA node of an already placed GPU)",
                gpu_of(host_d),
                link_desc(self.image, s, l),
                cpus.join(", "),
                l.node_to
            ));
            return Ok(false);
        }
        let taken: BTreeSet<u32> = self.cpu_map.values().copied().collect();
        let free: Vec<u32> = options
            .iter()
            .map(|h| h.node_to)
            .filter(|c| !taken.contains(c))
            .collect();
        if free.is_empty() {
            self.fired.insert(Knob::Numa);
            self.note(depth, format!(
                "host GPU {} (node {d}): NUMA: its {} link(s) to a CPU lead only to host CPU node(s) {}, which already stand in for other image CPU nodes",
                gpu_of(host_d),
                link_desc(self.image, s, l),
                cpus.join(", ")
            ));
            return Ok(false);
        }
        for c in free {
            self.cpu_map.insert(l.node_to, c);
            if self.place_cpu_links(depth, s, d, rest)? {
                return Ok(true);
            }
            self.cpu_map.remove(&l.node_to);
        }
        Ok(false)
    }
}

fn kind_name(kind: u32) -> &'static str {
    if kind == IOLINK_XGMI {
        "XGMI"
    } else {
        "PCIe"
    }
}

/// What a host link must be to stand in for image link `l`.
fn link_desc(t: &Topology, from: u32, l: &IoLink) -> String {
    let kind = kind_name(l.kind);
    if t.link_bidirectional(from, l) {
        format!("bidirectional {kind}")
    } else {
        kind.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::tests::{cpu, gpu};
    use crate::topology::IOLINK_PCIE;

    const P: u32 = IOLINK_PCIE;
    const X: u32 = IOLINK_XGMI;

    fn m(pairs: &[(u32, u32)]) -> GpuMap {
        GpuMap::new(pairs.iter().map(|&(a, b)| (GpuId(a), GpuId(b))).collect())
    }

    fn single(gpu_id: u32) -> Topology {
        Topology::new(vec![cpu(0, &[(P, 1)]), gpu(1, gpu_id, &[(P, 0)])])
    }

    /// A one-GPU host (GPU 0x5c3d) whose GPU properties `f` changed.
    fn host_with(f: impl FnOnce(&mut NodeProps)) -> Topology {
        let mut host = single(0x5c3d);
        f(&mut host.nodes[1].props);
        host
    }

    /// Why `host` cannot take `image` with `checks`, in words (panics when it can).
    fn refusal(image: &Topology, host: &Topology, checks: &Checks) -> String {
        match_gpus(image, host, checks).unwrap_err().to_string()
    }

    #[test]
    fn same_host_identity() {
        let t = single(0x1a2b);
        assert_eq!(
            match_gpus(&t, &t, &Checks::default()).unwrap(),
            m(&[(0x1a2b, 0x1a2b)])
        );
    }

    #[test]
    fn different_ids_and_order() {
        // Two GPU models; the host lists them in the other order, new ids.
        let mut a = gpu(1, 0x1111, &[(P, 0)]);
        a.props.device_id = 0x7000;
        let b = gpu(2, 0x2222, &[(P, 0)]);
        let image = Topology::new(vec![cpu(0, &[(P, 1), (P, 2)]), a.clone(), b.clone()]);
        let mut ha = a;
        ha.node_id = 2;
        ha.gpu_id = Some(GpuId(0xaaaa));
        ha.links = vec![IoLink {
            kind: P,
            node_to: 0,
        }];
        let mut hb = b;
        hb.node_id = 1;
        hb.gpu_id = Some(GpuId(0xbbbb));
        let host = Topology::new(vec![cpu(0, &[(P, 1), (P, 2)]), hb, ha]);
        assert_eq!(
            match_gpus(&image, &host, &Checks::default()).unwrap(),
            m(&[(0x1111, 0xaaaa), (0x2222, 0xbbbb)])
        );
    }

    #[test]
    fn fewer_gpus_fail() {
        let image = Topology::new(vec![
            cpu(0, &[(P, 1), (P, 2)]),
            gpu(1, 0x1111, &[(P, 0)]),
            gpu(2, 0x2222, &[(P, 0)]),
        ]);
        let e = match_gpus(&image, &single(0x3333), &Checks::default()).unwrap_err();
        assert_eq!(e, MatchError::TooFewGpus { image: 2, host: 1 });
    }

    /// Two image GPUs that only one host GPU accepts: the refusal names
    /// the one left without, and why that host GPU does not do for it.
    #[test]
    fn a_host_gpu_another_image_gpu_took_is_named_taken() {
        let image = Topology::new(vec![
            cpu(0, &[(P, 1), (P, 2)]),
            gpu(1, 0x1, &[(P, 0)]),
            gpu(2, 0x2, &[(P, 0)]),
        ]);
        let mut old = gpu(2, 0xb, &[(P, 0)]);
        old.props.fw_version = 100;
        let host = Topology::new(vec![cpu(0, &[(P, 1), (P, 2)]), gpu(1, 0xa, &[(P, 0)]), old]);
        let e = refusal(&image, &host, &Checks::default());
        assert!(
            e.starts_with(
                "GPU 0x0002 (node 2): no host GPU keeps its links and hive: host GPU 0x000a \
                 (node 1): taken by image GPU 0x0001; with KFD_FW_VER_CHECK=0"
            ),
            "{e}"
        );
    }

    /// Fewer image GPUs than host GPUs: [`match_gpus`] refuses, while
    /// [`match_gpus_into`] gives each the first host GPU (in node order)
    /// that accepts it and leaves the others one each.
    #[test]
    fn into_leaves_host_gpus_unused_in_node_order() {
        let mut small = gpu(1, 0x1, &[]);
        small.props.vram_size = 16 << 30;
        let image = Topology::new(vec![small, gpu(2, 0x2, &[])]);
        let mut tiny = gpu(1, 0xa, &[(P, 0)]);
        tiny.props.vram_size = 16 << 30;
        let host = Topology::new(vec![
            cpu(0, &[(P, 1), (P, 2), (P, 3)]),
            tiny,
            gpu(2, 0xb, &[(P, 0)]),
            gpu(3, 0xc, &[(P, 0)]),
        ]);
        assert_eq!(
            match_gpus(&image, &host, &Checks::default()).unwrap_err(),
            MatchError::TooManyGpus { image: 2, host: 3 }
        );
        assert_eq!(
            match_gpus_into(&image, &host, &Checks::default()).unwrap(),
            m(&[(0x1, 0xa), (0x2, 0xb)])
        );
        // The first image GPU fits only the host's last: the second takes
        // the first host GPU left that accepts it.
        let mut big = gpu(3, 0xc, &[(P, 0)]);
        big.props.vram_size = 128 << 30;
        let mut first = gpu(1, 0x1, &[]);
        first.props.vram_size = 128 << 30;
        let image = Topology::new(vec![first, gpu(2, 0x2, &[])]);
        let host = Topology::new(vec![
            host.nodes[0].clone(),
            host.nodes[1].clone(),
            host.nodes[2].clone(),
            big,
        ]);
        assert_eq!(
            match_gpus_into(&image, &host, &Checks::default()).unwrap(),
            m(&[(0x1, 0xc), (0x2, 0xb)])
        );
    }

    #[test]
    fn smaller_vram_fails_unless_knob_off() {
        let image = single(0x1a2b);
        let host = host_with(|p| p.vram_size = 32 << 30);
        let e = refusal(&image, &host, &Checks::default());
        assert!(
            e.contains("GPU 0x1a2b (node 1): no host GPU matches")
                && e.contains("host GPU 0x5c3d (node 1): vram_size 68719476736 > 34359738368"),
            "{e}"
        );
        let checks = Checks {
            vram_size: false,
            ..Checks::default()
        };
        assert_eq!(
            match_gpus(&image, &host, &checks).unwrap(),
            m(&[(0x1a2b, 0x5c3d)])
        );
    }

    #[test]
    fn older_fw_fails_unless_knob_off() {
        let image = single(0x1a2b);
        let mut host = host_with(|p| {
            p.fw_version = 149;
            p.sdma_fw_version = 18;
        });
        let e = refusal(&image, &host, &Checks::default());
        assert!(
            e.contains("fw_version 150 > 149") && e.contains("sdma_fw_version 19 > 18"),
            "{e}"
        );
        let checks = Checks {
            fw_version: false,
            ..Checks::default()
        };
        let e = refusal(&image, &host, &checks);
        assert!(
            !e.contains(" fw_version") && e.contains("sdma_fw_version"),
            "{e}"
        );
        let checks = Checks {
            fw_version: false,
            sdma_fw_version: false,
            ..Checks::default()
        };
        assert!(match_gpus(&image, &host, &checks).is_ok());
        // Newer firmware on the host is fine.
        host.nodes[1].props.fw_version = 151;
        host.nodes[1].props.sdma_fw_version = 20;
        assert!(match_gpus(&image, &host, &Checks::default()).is_ok());
    }

    #[test]
    fn always_equal_properties_and_capability() {
        let image = single(0x1a2b);
        let host = host_with(|p| p.simd_count = 256);
        let e = refusal(&image, &host, &Checks::default());
        assert!(e.contains("simd_count 304 != 256"), "{e}");
        // No knob can lift an always-equal property.
        let none = Checks {
            fw_version: false,
            sdma_fw_version: false,
            caches_count: false,
            num_gws: false,
            vram_size: false,
            numa: false,
            capability: false,
        };
        assert!(match_gpus(&image, &host, &none).is_err());

        let host = host_with(|p| p.capability ^= 1);
        let e = refusal(&image, &host, &Checks::default());
        assert!(e.contains("capability"), "{e}");
        assert!(match_gpus(&image, &host, &none).is_ok());
        // io_links_count is not compared (deviation from upstream).
        let host = host_with(|p| p.io_links_count = 9);
        assert!(match_gpus(&image, &host, &Checks::default()).is_ok());
    }

    /// Two hives of two GPUs each, every GPU on its own CPU by hive.
    fn two_hives(ids: [u32; 4], swap: bool) -> Topology {
        // Hive A = nodes 2,3 on CPU 0; hive B = nodes 4,5 on CPU 1.
        let (ca, cb) = if swap { (1, 0) } else { (0, 1) };
        Topology::new(vec![
            cpu(0, &[]),
            cpu(1, &[]),
            gpu(2, ids[0], &[(P, ca), (X, 3)]),
            gpu(3, ids[1], &[(P, ca), (X, 2)]),
            gpu(4, ids[2], &[(P, cb), (X, 5)]),
            gpu(5, ids[3], &[(P, cb), (X, 4)]),
        ])
    }

    fn assert_hives_kept(image: &Topology, host: &Topology, map: &GpuMap) {
        for h in image.hives() {
            let targets: BTreeSet<Option<usize>> = h
                .iter()
                .map(|n| {
                    let user = image.node(*n).unwrap().gpu_id.unwrap();
                    let node = host.gpu(map.get(user).unwrap()).unwrap().node_id;
                    host.hives().iter().position(|hh| hh.contains(&node))
                })
                .collect();
            assert_eq!(targets.len(), 1, "hive {h:?} split: {map:?}");
            assert!(!targets.contains(&None));
        }
    }

    #[test]
    fn hives_swapped() {
        // The host lists its hives on the other CPUs and with new ids; the
        // device model tells which host hive must take which image hive.
        let mut image = two_hives([0x11, 0x12, 0x21, 0x22], false);
        let mut host = two_hives([0xa1, 0xa2, 0xb1, 0xb2], true);
        for n in [4, 5] {
            image
                .nodes
                .iter_mut()
                .find(|x| x.node_id == n)
                .unwrap()
                .props
                .device_id = 0x9999;
        }
        for n in [2, 3] {
            host.nodes
                .iter_mut()
                .find(|x| x.node_id == n)
                .unwrap()
                .props
                .device_id = 0x9999;
        }
        let map = match_gpus(&image, &host, &Checks::default()).unwrap();
        assert_eq!(map.len(), 4);
        assert_eq!(map.get(GpuId(0x21)).map(|g| g.0 & 0xf0), Some(0xa0));
        assert_eq!(map.get(GpuId(0x11)).map(|g| g.0 & 0xf0), Some(0xb0));
        assert_hives_kept(&image, &host, &map);
    }

    #[test]
    fn hive_must_not_be_split_or_dropped() {
        let image = two_hives([0x11, 0x12, 0x21, 0x22], false);
        // Host: same four GPUs but the XGMI links pair them across CPUs, so
        // each host hive spans both CPUs — NUMA makes it impossible.
        let host = Topology::new(vec![
            cpu(0, &[]),
            cpu(1, &[]),
            gpu(2, 0xa1, &[(P, 0), (X, 4)]),
            gpu(3, 0xa2, &[(P, 0), (X, 5)]),
            gpu(4, 0xb1, &[(P, 1), (X, 2)]),
            gpu(5, 0xb2, &[(P, 1), (X, 3)]),
        ]);
        let e = match_gpus(&image, &host, &Checks::default()).unwrap_err();
        assert!(matches!(e, MatchError::NoPlacement { .. }), "{e}");
        let no_numa = Checks {
            numa: false,
            ..Checks::default()
        };
        let map = match_gpus(&image, &host, &no_numa).unwrap();
        assert_hives_kept(&image, &host, &map);

        // XGMI replaced by PCIe only: never.
        let pcie_only = Topology::new(vec![
            cpu(0, &[]),
            cpu(1, &[]),
            gpu(2, 0xa1, &[(P, 0), (P, 3)]),
            gpu(3, 0xa2, &[(P, 0), (P, 2)]),
            gpu(4, 0xb1, &[(P, 1), (P, 5)]),
            gpu(5, 0xb2, &[(P, 1), (P, 4)]),
        ]);
        let e = refusal(&image, &pcie_only, &no_numa);
        assert!(e.contains("XGMI hive of 2 GPUs"), "{e}");
    }

    #[test]
    fn hive_size_check_is_effective() {
        // Image: one hive of four. Host: two hives of two.
        let image = Topology::new(vec![
            cpu(0, &[]),
            gpu(1, 0x11, &[(P, 0), (X, 2), (X, 3), (X, 4)]),
            gpu(2, 0x12, &[(P, 0), (X, 1), (X, 3), (X, 4)]),
            gpu(3, 0x13, &[(P, 0), (X, 1), (X, 2), (X, 4)]),
            gpu(4, 0x14, &[(P, 0), (X, 1), (X, 2), (X, 3)]),
        ]);
        let host = two_hives([0xa1, 0xa2, 0xb1, 0xb2], false);
        let e = match_gpus(
            &image,
            &host,
            &Checks {
                numa: false,
                ..Checks::default()
            },
        )
        .unwrap_err();
        assert_eq!(
            e,
            MatchError::HiveTooLarge {
                size: 4,
                nodes: vec![1, 2, 3, 4],
                largest: 2
            }
        );
    }

    #[test]
    fn numa_groups_stay_together() {
        // Image: GPUs 0x11,0x12 on CPU 0 and 0x21,0x22 on CPU 1.
        let image = Topology::new(vec![
            cpu(0, &[]),
            cpu(1, &[]),
            gpu(2, 0x11, &[(P, 0)]),
            gpu(3, 0x12, &[(P, 0)]),
            gpu(4, 0x21, &[(P, 1)]),
            gpu(5, 0x22, &[(P, 1)]),
        ]);
        // Host: interleaved: nodes 2,4 on CPU 1, nodes 3,5 on CPU 0.
        let host = Topology::new(vec![
            cpu(0, &[]),
            cpu(1, &[]),
            gpu(2, 0xa, &[(P, 1)]),
            gpu(3, 0xb, &[(P, 0)]),
            gpu(4, 0xc, &[(P, 1)]),
            gpu(5, 0xd, &[(P, 0)]),
        ]);
        let map = match_gpus(&image, &host, &Checks::default()).unwrap();
        let cpu_of = |g: GpuId| host.gpu(g).unwrap().links[0].node_to;
        assert_eq!(
            cpu_of(map.get(GpuId(0x11)).unwrap()),
            cpu_of(map.get(GpuId(0x12)).unwrap())
        );
        assert_eq!(
            cpu_of(map.get(GpuId(0x21)).unwrap()),
            cpu_of(map.get(GpuId(0x22)).unwrap())
        );
        assert_ne!(
            cpu_of(map.get(GpuId(0x11)).unwrap()),
            cpu_of(map.get(GpuId(0x21)).unwrap())
        );

        // Host with three GPUs on one CPU: NUMA check fails, off succeeds.
        let lopsided = Topology::new(vec![
            cpu(0, &[]),
            cpu(1, &[]),
            gpu(2, 0xa, &[(P, 0)]),
            gpu(3, 0xb, &[(P, 0)]),
            gpu(4, 0xc, &[(P, 0)]),
            gpu(5, 0xd, &[(P, 1)]),
        ]);
        let e = refusal(&image, &lopsided, &Checks::default());
        assert!(e.contains("KFD_NUMA_CHECK=0"), "{e}");
        let no_numa = Checks {
            numa: false,
            ..Checks::default()
        };
        assert_eq!(match_gpus(&image, &lopsided, &no_numa).unwrap().len(), 4);
    }

    #[test]
    fn backtracks_out_of_a_greedy_dead_end() {
        // Image GPU 0x1 fits both host GPUs, 0x2 only host GPU 0xa (more
        // VRAM): a greedy first choice 0x1→0xa would strand 0x2.
        let mut g1 = gpu(1, 0x1, &[(P, 0)]);
        g1.props.vram_size = 16 << 30;
        let mut g2 = gpu(2, 0x2, &[(P, 0)]);
        g2.props.vram_size = 64 << 30;
        let image = Topology::new(vec![cpu(0, &[]), g1, g2]);
        let mut ha = gpu(1, 0xa, &[(P, 0)]);
        ha.props.vram_size = 64 << 30;
        let mut hb = gpu(2, 0xb, &[(P, 0)]);
        hb.props.vram_size = 32 << 30;
        let host = Topology::new(vec![cpu(0, &[]), ha, hb]);
        assert_eq!(
            match_gpus(&image, &host, &Checks::default()).unwrap(),
            m(&[(0x1, 0xb), (0x2, 0xa)])
        );
    }

    #[test]
    fn bidirectional_links_need_bidirectional_links() {
        let image = Topology::new(vec![cpu(0, &[(P, 1)]), gpu(1, 0x1, &[(P, 0)])]);
        // Host GPU links to the CPU but the CPU has no link back.
        let host = Topology::new(vec![cpu(0, &[]), gpu(1, 0xa, &[(P, 0)])]);
        let e = refusal(&image, &host, &Checks::default());
        assert!(e.contains("bidirectional PCIe"), "{e}");
        // The reverse (more links on the host) is fine.
        assert!(match_gpus(&host, &image, &Checks::default()).is_ok());
    }

    #[test]
    fn dangling_image_links_are_ignored_but_extra_host_gpus_are_not() {
        // A link to a node the image does not hold is invalid → ignored.
        let image = Topology::new(vec![cpu(0, &[(P, 1)]), gpu(1, 0x1, &[(P, 0), (X, 9)])]);
        let host = Topology::new(vec![cpu(0, &[(P, 1)]), gpu(1, 0xa, &[(P, 0)])]);
        assert_eq!(
            match_gpus(&image, &host, &Checks::default()).unwrap(),
            m(&[(0x1, 0xa)])
        );
        let bigger = Topology::new(vec![
            cpu(0, &[(P, 1), (P, 2)]),
            gpu(1, 0xa, &[(P, 0)]),
            gpu(2, 0xb, &[(P, 0)]),
        ]);
        let e = match_gpus(&image, &bigger, &Checks::default()).unwrap_err();
        assert_eq!(e, MatchError::TooManyGpus { image: 1, host: 2 });
        assert!(e.to_string().contains("device cgroup"));
    }

    /// 8 GPUs in one fully connected XGMI hive, four per CPU.
    fn mi300(ids: [u32; 8], cpu_of: impl Fn(u32) -> u32) -> Topology {
        let mut nodes = vec![cpu(0, &[]), cpu(1, &[])];
        for (i, id) in ids.iter().enumerate() {
            let n = i as u32 + 2;
            let mut links = vec![(P, cpu_of(n))];
            links.extend((2..10).filter(|&o| o != n).map(|o| (X, o)));
            nodes.push(gpu(n, *id, &links));
        }
        for c in 0..2 {
            let n = &mut nodes[c as usize];
            n.links = (2..10)
                .filter(|&g| cpu_of(g) == c)
                .map(|g| IoLink {
                    kind: P,
                    node_to: g,
                })
                .collect();
        }
        Topology::new(nodes)
    }

    #[test]
    fn eight_gpu_hive_scales() {
        let image = mi300([1, 2, 3, 4, 5, 6, 7, 8], |n| (n - 2) / 4);
        // The host attaches GPUs to CPUs alternately.
        let host = mi300([11, 12, 13, 14, 15, 16, 17, 18], |n| n % 2);
        let t = std::time::Instant::now();
        let map = match_gpus(&image, &host, &Checks::default()).unwrap();
        assert_eq!(map.len(), 8);
        assert_hives_kept(&image, &host, &map);
        // An impossible NUMA layout (5 + 3) must fail within the budget.
        let lopsided = mi300([11, 12, 13, 14, 15, 16, 17, 18], |n| u32::from(n >= 7));
        let e = match_gpus(&image, &lopsided, &Checks::default()).unwrap_err();
        assert!(e.to_string().len() < 2000, "{e}");
        assert!(
            matches!(
                e,
                MatchError::NoPlacement { .. } | MatchError::SearchLimit(_)
            ),
            "{e}"
        );
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            t.elapsed()
        );
    }

    /// One host GPU whose only CPU link is one-way, for an image GPU whose
    /// CPU link is bidirectional (issue 14).
    #[test]
    fn one_way_cpu_link_is_refused_for_that_reason_numa_or_not() {
        let image = Topology::new(vec![
            cpu(0, &[(P, 1), (P, 2)]),
            gpu(1, 0x1, &[(P, 0)]),
            gpu(2, 0x2, &[(P, 0)]),
        ]);
        // Host GPU 0xb has a link to CPU 0, but CPU 0 none back.
        let host = Topology::new(vec![
            cpu(0, &[(P, 1)]),
            gpu(1, 0xa, &[(P, 0)]),
            gpu(2, 0xb, &[(P, 0)]),
        ]);
        for numa in [true, false] {
            let checks = Checks {
                numa,
                ..Checks::default()
            };
            let e = refusal(&image, &host, &checks);
            assert!(
                e.contains("host GPU 0x000b (node 2): no bidirectional PCIe link to a CPU (its links to CPUs: one-way PCIe to CPU node 0)"),
                "numa {numa}: {e}"
            );
            assert!(!e.contains("KFD_"), "numa {numa}: {e}");
            assert!(!e.contains("NUMA"), "numa {numa}: {e}");
        }
        // No CPU link at all.
        let host = Topology::new(vec![
            cpu(0, &[(P, 1)]),
            gpu(1, 0xa, &[(P, 0)]),
            gpu(2, 0xb, &[]),
        ]);
        let e = refusal(&image, &host, &Checks::default());
        assert!(e.contains("host GPU 0x000b (node 2): no bidirectional PCIe link to a CPU (it has no link to a CPU)"), "{e}");
        assert!(!e.contains("KFD_"), "{e}");
    }

    #[test]
    fn knobs_are_named_only_when_they_change_the_outcome() {
        // Less VRAM only: the knob would let the restore proceed.
        let image = single(0x1a2b);
        let mut host = host_with(|p| p.vram_size = 32 << 30);
        let e = refusal(&image, &host, &Checks::default());
        assert!(
            e.ends_with("vram_size 68719476736 > 34359738368; with KFD_VRAM_SIZE_CHECK=0 (which skips the vram_size check) this host would take the image"),
            "{e}"
        );
        // Less VRAM and another device: the knob would change nothing.
        host.nodes[1].props.device_id = 0x7000;
        let e = refusal(&image, &host, &Checks::default());
        assert!(
            e.contains("device_id 29857 != 28672") && e.contains("vram_size"),
            "{e}"
        );
        assert!(!e.contains("KFD_"), "{e}");
        // Older firmware and less VRAM: both knobs, together.
        let host = host_with(|p| {
            p.vram_size = 32 << 30;
            p.fw_version = 100;
        });
        let e = refusal(&image, &host, &Checks::default());
        assert!(
            e.ends_with("; with KFD_FW_VER_CHECK=0 and KFD_VRAM_SIZE_CHECK=0 together (which skip the fw_version and vram_size checks) this host would take the image"),
            "{e}"
        );
        // A knob reached only once another is off: image GPUs on CPUs 0
        // and 1, host GPUs both on CPU 0 and one with less VRAM.
        let image = Topology::new(vec![
            cpu(0, &[(P, 2)]),
            cpu(1, &[(P, 3)]),
            gpu(2, 0x1, &[(P, 0)]),
            gpu(3, 0x2, &[(P, 1)]),
        ]);
        let mut small = gpu(3, 0xb, &[(P, 0)]);
        small.props.vram_size = 32 << 30;
        let host = Topology::new(vec![
            cpu(0, &[(P, 2), (P, 3)]),
            cpu(1, &[]),
            gpu(2, 0xa, &[(P, 0)]),
            small,
        ]);
        let e = refusal(&image, &host, &Checks::default());
        assert!(
            e.ends_with("with KFD_VRAM_SIZE_CHECK=0 and KFD_NUMA_CHECK=0 together (which skip the vram_size and NUMA checks) this host would take the image"),
            "{e}"
        );
    }

    #[test]
    fn numa_refusal_names_numa_and_the_knob() {
        // Image GPUs on CPUs 0 and 1; host GPUs both on CPU 0.
        let image = Topology::new(vec![
            cpu(0, &[(P, 2)]),
            cpu(1, &[(P, 3)]),
            gpu(2, 0x1, &[(P, 0)]),
            gpu(3, 0x2, &[(P, 1)]),
        ]);
        let host = Topology::new(vec![
            cpu(0, &[(P, 2), (P, 3)]),
            cpu(1, &[]),
            gpu(2, 0xa, &[(P, 0)]),
            gpu(3, 0xb, &[(P, 0)]),
        ]);
        let e = refusal(&image, &host, &Checks::default());
        assert!(
            e.contains("NUMA: its bidirectional PCIe link(s) to a CPU lead only to host CPU node(s) 0, which already stand in for other image CPU nodes")
                && e.ends_with("with KFD_NUMA_CHECK=0 (which skips the NUMA check) this host would take the image"),
            "{e}"
        );
    }

    /// Upstream CRIU 4.2.1's topology-remap scenarios
    /// (plugins/amdgpu/tests/test_topology_remap.c): the same nodes and
    /// links, built here.  gpu_ids as upstream's: 0xA0HG / 0xB0HG (image /
    /// host, hive H, GPU G).  test/gpu/hosts/topo-remap/ has them as
    /// kfd-emu profiles for the end-to-end restore tests.
    mod remap {
        use super::*;

        const D0: u32 = 0xd000;
        const D1: u32 = 0xd001;

        fn link(t: &mut [Node], from: u32, kind: u32, to: u32) {
            let n = t.iter_mut().find(|n| n.node_id == from).unwrap();
            n.links.push(IoLink { kind, node_to: to });
        }

        /// `ncpu` CPU nodes, then one GPU per device id, no links.
        fn machine(ncpu: u32, prefix: u32, devices: &[u32]) -> Vec<Node> {
            let mut t: Vec<Node> = (0..ncpu).map(|c| cpu(c, &[])).collect();
            for (i, dev) in devices.iter().enumerate() {
                let i = i as u32;
                // 8-GPU machines number the second hive 0x..14-0x..17.
                let id = prefix
                    + if devices.len() == 8 && i >= 4 {
                        0x10 + i
                    } else {
                        i
                    };
                let mut g = gpu(ncpu + i, id, &[]);
                g.props.device_id = *dev;
                t.push(g);
            }
            t
        }

        /// GPU `i` of an 8-GPU machine to CPU `i & 1`, and back if `both`.
        fn to_cpu(t: &mut [Node], i: u32, both: bool) {
            link(t, i + 2, P, i & 1);
            if both {
                link(t, i & 1, P, i + 2);
            }
        }

        /// XGMI between every two of `nodes`.
        fn hive(t: &mut [Node], nodes: std::ops::Range<u32>) {
            for a in nodes.clone() {
                for b in nodes.clone().filter(|&b| b != a) {
                    link(t, a, X, b);
                }
            }
        }

        /// PCIe from each of `from` to each of `to` (not to itself).
        fn pcie(t: &mut [Node], from: std::ops::Range<u32>, to: std::ops::Range<u32>) {
            for a in from {
                for b in to.clone().filter(|&b| b != a) {
                    link(t, a, P, b);
                }
            }
        }

        fn two_hives(t: &mut [Node]) {
            hive(t, 2..6);
            hive(t, 6..10);
        }

        /// A host of `devices` GPUs (two CPUs for eight, else one), node
        /// ids from `prefix`, linked by `add`.
        fn build(prefix: u32, devices: &[u32], add: &dyn Fn(&mut [Node])) -> Topology {
            let ncpu = if devices.len() == 8 { 2 } else { 1 };
            let mut t = machine(ncpu, prefix, devices);
            add(&mut t);
            Topology::new(t)
        }

        /// Scenario 0: two hives of different models, full P2P PCIe.
        fn full(t: &mut [Node]) {
            (0..8).for_each(|i| to_cpu(t, i, true));
            two_hives(t);
            pcie(t, 2..6, 6..10);
            pcie(t, 6..10, 2..6);
        }

        /// Scenarios 1, 2: GPUs 6 and 7 link to their CPU one way; hive 0
        /// has peer links only to GPUs 4 and 5.
        fn partial(t: &mut [Node]) {
            (0..8).for_each(|i| to_cpu(t, i, i < 6));
            two_hives(t);
            pcie(t, 2..6, 6..8);
            pcie(t, 6..10, 2..6);
        }

        /// Scenarios 3, 4: every GPU links to its CPU one way; the CPUs
        /// link back to one GPU each (nodes given).
        fn one_back(c0: u32, c1: u32) -> impl Fn(&mut [Node]) {
            move |t: &mut [Node]| {
                (0..8).for_each(|i| to_cpu(t, i, false));
                two_hives(t);
                link(t, 0, P, c0);
                link(t, 1, P, c1);
            }
        }

        /// Scenario 5: one hive and four GPUs on PCIe only, all peers
        /// linked.
        fn one_hive(t: &mut [Node]) {
            (0..8).for_each(|i| to_cpu(t, i, true));
            hive(t, 2..6);
            pcie(t, 2..6, 6..10);
            pcie(t, 6..10, 6..10);
            pcie(t, 6..10, 2..6);
        }

        /// Scenarios 6, 8: five GPUs on one CPU; `peers[g]` = the nodes GPU
        /// node g + 1 has PCIe links to.
        fn five(peers: [&'static [u32]; 5]) -> impl Fn(&mut [Node]) {
            move |t: &mut [Node]| {
                for g in 1..6 {
                    link(t, g, P, 0);
                    link(t, 0, P, g);
                }
                for (g, to) in peers.iter().enumerate() {
                    for &p in *to {
                        link(t, g as u32 + 1, P, p);
                    }
                }
            }
        }

        /// [`five`]'s peers when every GPU links to the four others.
        const PEERS4: [&[u32]; 5] = [
            &[2, 3, 4],
            &[1, 3, 4],
            &[1, 2, 4],
            &[1, 2, 3],
            &[1, 2, 3, 4],
        ];

        /// Scenario 7: a hive on one-way CPU links; four GPUs without any
        /// link, a second hive on the host.
        fn bare(second_hive: bool) -> impl Fn(&mut [Node]) {
            move |t: &mut [Node]| {
                (0..4).for_each(|i| to_cpu(t, i, false));
                hive(t, 2..6);
                if second_hive {
                    hive(t, 6..10);
                }
            }
        }

        pub(super) fn scenario(n: u32) -> (Topology, Topology) {
            let (a, b) = (0xa000, 0xb000);
            let mixed = [D0, D0, D0, D0, D1, D1, D1, D1];
            let swapped = [D1, D1, D1, D1, D0, D0, D0, D0];
            let same = [D0; 8];
            let peers4 = PEERS4;
            match n {
                0 => (build(a, &mixed, &full), build(b, &swapped, &full)),
                1 => (build(a, &same, &partial), build(b, &same, &partial)),
                2 => (build(a, &mixed, &partial), build(b, &swapped, &partial)),
                3 => (
                    build(a, &mixed, &one_back(4, 9)),
                    build(b, &mixed, &one_back(2, 7)),
                ),
                4 => (
                    build(a, &mixed, &one_back(4, 9)),
                    build(b, &mixed, &one_back(2, 6)),
                ),
                5 => (build(a, &same, &one_hive), build(b, &same, &one_hive)),
                6 => (
                    build(a, &[D0, D0, D1, D0, D1], &five(peers4)),
                    build(b, &[D0, D1, D0, D0, D1], &five(peers4)),
                ),
                7 => (build(a, &same, &bare(false)), build(b, &same, &bare(true))),
                8 => (
                    build(
                        a,
                        &[D0; 5],
                        &five([&[2, 3], &[1, 3], &[1, 2], &[1, 2, 3], &[1, 2, 3]]),
                    ),
                    build(b, &[D0; 5], &five(peers4)),
                ),
                _ => unreachable!(),
            }
        }
    }

    /// Which host GPUs each image GPU may land on, per upstream scenario
    /// that is restorable: (image gpu_ids, host gpu_ids they go to, as a set).
    fn remap_expected(n: u32) -> Vec<(Vec<u32>, Vec<u32>)> {
        let r = |a: std::ops::RangeInclusive<u32>| a.collect::<Vec<u32>>();
        match n {
            // The hives swap places, so that the models match.
            0 => vec![
                (r(0xa000..=0xa003), r(0xb014..=0xb017)),
                (r(0xa014..=0xa017), r(0xb000..=0xb003)),
            ],
            // The GPUs with one-way CPU links, and the peer links of
            // hive 0, pin everything to its like.
            1 => vec![
                (r(0xa000..=0xa003), r(0xb000..=0xb003)),
                (r(0xa014..=0xa015), r(0xb014..=0xb015)),
                (r(0xa016..=0xa017), r(0xb016..=0xb017)),
            ],
            3 => vec![
                (vec![0xa002], vec![0xb000]),
                (vec![0xa017], vec![0xb015]),
                (r(0xa000..=0xa003), r(0xb000..=0xb003)),
                (r(0xa014..=0xa017), r(0xb014..=0xb017)),
            ],
            5 | 7 => vec![
                (r(0xa000..=0xa003), r(0xb000..=0xb003)),
                (r(0xa014..=0xa017), r(0xb014..=0xb017)),
            ],
            6 => vec![(vec![0xa002], vec![0xb001]), (vec![0xa004], vec![0xb004])],
            // The three mutually linked GPUs need three of the host's four.
            8 => vec![(r(0xa000..=0xa002), r(0xb000..=0xb003))],
            _ => unreachable!(),
        }
    }

    #[test]
    fn upstream_remap_scenarios_that_restore() {
        for n in [0, 1, 3, 5, 6, 7, 8] {
            let (image, host) = remap::scenario(n);
            let map = match_gpus(&image, &host, &Checks::default())
                .unwrap_or_else(|e| panic!("scenario {n}: {e}"));
            assert_eq!(map.len(), image.gpus().count(), "scenario {n}");
            assert_hives_kept(&image, &host, &map);
            for (from, to) in remap_expected(n) {
                for f in from {
                    let t = map.get(GpuId(f)).unwrap().0;
                    assert!(to.contains(&t), "scenario {n}: {f:#x} -> {t:#x}: {map:?}");
                }
            }
        }
    }

    #[test]
    fn upstream_remap_scenarios_that_are_refused_say_why() {
        // 2: image hive 0 (all bidirectional CPU links) must go to the
        // host hive of its model, where two GPUs link to their CPU one way.
        // 4: no host GPU of the second model has a bidirectional CPU link.
        for n in [2, 4] {
            let (image, host) = remap::scenario(n);
            for numa in [true, false] {
                let checks = Checks {
                    numa,
                    ..Checks::default()
                };
                let e = match_gpus(&image, &host, &checks).unwrap_err();
                assert!(matches!(e, MatchError::NoPlacement { .. }), "{n}: {e}");
                let e = e.to_string();
                assert!(
                    e.contains("no bidirectional PCIe link to a CPU (its links to CPUs: one-way PCIe to CPU node"),
                    "scenario {n}, numa {numa}: {e}"
                );
                assert!(!e.contains("KFD_"), "scenario {n}, numa {numa}: {e}");
            }
        }
    }
}
