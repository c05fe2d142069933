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
//! Deviations from upstream 4.1.1, on purpose:
//! * the hive size check is effective (upstream compares sizes that are
//!   never set), and two image hives may share a larger host hive;
//! * `io_links_count` (the raw sysfs count, which counts links to GPUs a
//!   container cannot see) is not compared; the links themselves are;
//! * GPU↔GPU links are checked too (upstream skips PCIe peer links), since
//!   an application may rely on peer access it had;
//! * NUMA choices are backtracked instead of taking the first host CPU.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

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

/// Describes each property of `src` that `dst` fails; empty = compatible.
pub fn property_mismatches(src: &NodeProps, dst: &NodeProps, checks: &Checks) -> Vec<String> {
    let mut out = Vec::new();
    macro_rules! equal {
        ($($f:ident),*) => {$(
            if src.$f != dst.$f {
                out.push(format!("{} {} != {}", stringify!($f), src.$f, dst.$f));
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
        ($($f:ident, $knob:ident, $var:literal);*) => {$(
            if checks.$knob && src.$f > dst.$f {
                out.push(format!("{} {} > {} ({}=0 skips this check)", stringify!($f), src.$f, dst.$f, $var));
            }
        )*};
    }
    at_most!(
        fw_version, fw_version, "KFD_FW_VER_CHECK";
        sdma_fw_version, sdma_fw_version, "KFD_SDMA_FW_VER_CHECK";
        caches_count, caches_count, "KFD_CACHES_COUNT_CHECK";
        num_gws, num_gws, "KFD_NUM_GWS_CHECK";
        vram_size, vram_size, "KFD_VRAM_SIZE_CHECK"
    );
    if checks.capability && src.capability != dst.capability {
        out.push(format!(
            "capability {:#x} != {:#x} (KFD_CAPABILITY_CHECK=0 skips this check)",
            src.capability, dst.capability
        ));
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
    let src_gpus: Vec<&Node> = image.gpus().collect();
    let dst_gpus: Vec<&Node> = host.gpus().collect();
    if src_gpus.len() < dst_gpus.len() {
        return Err(MatchError::TooManyGpus {
            image: src_gpus.len(),
            host: dst_gpus.len(),
        });
    }
    if src_gpus.len() > dst_gpus.len() {
        return Err(MatchError::TooFewGpus {
            image: src_gpus.len(),
            host: dst_gpus.len(),
        });
    }

    // Unary compatibility first: it gives the clearest error.
    let mut candidates: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for s in &src_gpus {
        let mut ok = Vec::new();
        let mut detail = String::new();
        for d in &dst_gpus {
            let bad = property_mismatches(&s.props, &d.props, checks);
            if bad.is_empty() {
                ok.push(d.node_id);
            } else {
                if !detail.is_empty() {
                    detail.push_str("; ");
                }
                let _ = write!(
                    detail,
                    "host GPU {} (node {}): {}",
                    gpu_of(d),
                    d.node_id,
                    bad.join(", ")
                );
            }
        }
        if ok.is_empty() {
            return Err(MatchError::NoCandidate {
                gpu: gpu_of(s),
                node: s.node_id,
                detail,
            });
        }
        candidates.insert(s.node_id, ok);
    }

    let src_hives = image.hives();
    let dst_hives = host.hives();
    let largest = dst_hives.iter().map(Vec::len).max().unwrap_or(0);
    if let Some(h) = src_hives.iter().find(|h| h.len() > largest) {
        return Err(MatchError::HiveTooLarge {
            size: h.len(),
            nodes: h.clone(),
            largest,
        });
    }

    // Place hive members first (largest hive first, members together) so
    // a wrong hive choice fails early; then the other GPUs.
    let mut order: Vec<u32> = Vec::new();
    let mut by_size = src_hives.clone();
    by_size.sort_by_key(|h| std::cmp::Reverse(h.len()));
    for h in &by_size {
        order.extend(h);
    }
    for s in &src_gpus {
        if !order.contains(&s.node_id) {
            order.push(s.node_id);
        }
    }

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
        deepest: 0,
        reasons: Vec::new(),
        more_reasons: 0,
    };
    match search.place(0) {
        Ok(true) => {}
        Ok(false) => {
            let node = order[search.deepest];
            let s = image.node(node).expect("ordered node exists");
            let mut detail = search.reasons.join("; ");
            if search.more_reasons > 0 {
                let _ = write!(detail, "; and {} more", search.more_reasons);
            }
            return Err(MatchError::NoPlacement {
                gpu: gpu_of(s),
                node,
                detail,
            });
        }
        Err(e) => return Err(e),
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
    deepest: usize,
    reasons: Vec<String>,
    more_reasons: usize,
}

impl Search<'_> {
    /// Keeps the distinct reasons why candidates failed at the deepest
    /// level the search reached (the GPU that could not be placed).
    fn note(&mut self, depth: usize, reason: String) {
        if depth > self.deepest {
            self.deepest = depth;
            self.reasons.clear();
            self.more_reasons = 0;
        }
        if depth == self.deepest && !self.reasons.contains(&reason) {
            if self.reasons.len() < MAX_REASONS {
                self.reasons.push(reason);
            } else {
                self.more_reasons += 1;
            }
        }
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
        let used: BTreeSet<u32> = self.gpu_map.values().copied().collect();
        for &d in &self.candidates[&s] {
            self.tick()?;
            if used.contains(&d) {
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
        if !self.checks.numa {
            if options.is_empty() {
                self.note(
                    depth,
                    format!(
                        "host GPU {} (node {d}): no {} link to a CPU",
                        gpu_of(host_d),
                        link_desc(self.image, s, l)
                    ),
                );
                return Ok(false);
            }
            return self.place_cpu_links(depth, s, d, rest);
        }
        if let Some(&c) = self.cpu_map.get(&l.node_to) {
            if options.iter().any(|h| h.node_to == c) {
                return self.place_cpu_links(depth, s, d, rest);
            }
            self.note(depth, format!(
                "host GPU {} (node {d}): not attached to host CPU node {c}, which image CPU node {} (NUMA node of an already placed GPU) maps to (KFD_NUMA_CHECK=0 skips this check)",
                gpu_of(host_d),
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
            self.note(depth, format!(
                "host GPU {} (node {d}): no {} link to a host CPU not already standing in for another image CPU (KFD_NUMA_CHECK=0 skips this check)",
                gpu_of(host_d),
                link_desc(self.image, s, l)
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

fn link_desc(t: &Topology, from: u32, l: &IoLink) -> String {
    let kind = if l.kind == IOLINK_XGMI {
        "XGMI"
    } else {
        "PCIe"
    };
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

    #[test]
    fn smaller_vram_fails_unless_knob_off() {
        let image = single(0x1a2b);
        let mut host = single(0x5c3d);
        host.nodes[1].props.vram_size = 32 << 30;
        let e = match_gpus(&image, &host, &Checks::default())
            .unwrap_err()
            .to_string();
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
        let mut host = single(0x5c3d);
        host.nodes[1].props.fw_version = 149;
        host.nodes[1].props.sdma_fw_version = 18;
        let e = match_gpus(&image, &host, &Checks::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("fw_version 150 > 149") && e.contains("sdma_fw_version 19 > 18"),
            "{e}"
        );
        let checks = Checks {
            fw_version: false,
            ..Checks::default()
        };
        let e = match_gpus(&image, &host, &checks).unwrap_err().to_string();
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
        let mut host = single(0x5c3d);
        host.nodes[1].props.simd_count = 256;
        let e = match_gpus(&image, &host, &Checks::default())
            .unwrap_err()
            .to_string();
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

        let mut host = single(0x5c3d);
        host.nodes[1].props.capability ^= 1;
        let e = match_gpus(&image, &host, &Checks::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("capability"), "{e}");
        assert!(match_gpus(&image, &host, &none).is_ok());
        // io_links_count is not compared (deviation from upstream).
        let mut host = single(0x5c3d);
        host.nodes[1].props.io_links_count = 9;
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
        let e = match_gpus(&image, &pcie_only, &no_numa)
            .unwrap_err()
            .to_string();
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
        let e = match_gpus(&image, &lopsided, &Checks::default())
            .unwrap_err()
            .to_string();
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
        let e = match_gpus(&image, &host, &Checks::default())
            .unwrap_err()
            .to_string();
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
}
