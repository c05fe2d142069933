//! Profiles: built-ins, overrides, validation, and the generated topology
//! tree agreeing with the profile.

use std::collections::BTreeMap;

use kfd_abi::ids::{GpuId, RenderMinor};
use kfd_emu::profile::{builtin_names, Profile};
use kfd_emu::topology::{self, IOLINK_HYPERTRANSPORT, IOLINK_PCIE, IOLINK_XGMI};

fn tree(p: &Profile) -> BTreeMap<String, String> {
    topology::generate(p)
        .into_iter()
        .map(|f| (f.path, f.contents))
        .collect()
}

fn prop(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no property {name}"))
        .parse()
        .unwrap()
}

#[test]
fn builtins_load_with_real_part_values() {
    let names: Vec<_> = builtin_names().collect();
    for want in [
        "mi100", "mi100x2", "mi210x4", "mi250x8", "mi300x8", "rx9070xt",
    ] {
        assert!(names.contains(&want), "{want} missing");
    }
    let p = Profile::builtin("mi100").unwrap();
    let g = &p.gpus()[0];
    assert_eq!(
        (g.device_id, g.cu_count, g.gfx_target_version),
        (0x738c, 120, 90008)
    );
    assert_eq!(g.vram_size, 32 << 30);
    let p = Profile::builtin("mi250x8").unwrap();
    assert_eq!(p.gpus().len(), 8);
    let hives: std::collections::BTreeSet<u64> = p.gpus().iter().map(|g| g.hive_id).collect();
    assert_eq!(hives.len(), 2);
    let p = Profile::builtin("mi300x8").unwrap();
    assert!(p
        .gpus()
        .iter()
        .all(|g| g.cu_count == 304 && g.vram_size == 192 << 30));
    // RDNA4: the GPU whose DMA IP is SDMA 7.
    let p = Profile::builtin("rx9070xt").unwrap();
    let g = &p.gpus()[0];
    assert_eq!(
        (
            g.device_id,
            g.pci_revision,
            g.gfx_target_version,
            g.cu_count
        ),
        (0x7550, 0xc0, 120001, 64)
    );
    assert_eq!((g.wave_front_size, g.simd_per_cu), (32, 2));
    assert!(g.dma_user_submission, "the default");
    assert!(!p.to_toml().contains("dma_user_submission"));
    assert!(Profile::builtin("mi999")
        .unwrap_err()
        .to_string()
        .contains("mi100x2"));
}

#[test]
fn all_gpu_ids_distinct_across_profiles() {
    let mut seen = BTreeMap::new();
    for n in builtin_names() {
        for g in Profile::builtin(n).unwrap().gpus() {
            if let Some(other) = seen.insert(g.gpu_id, n) {
                panic!("gpu_id {} in both {other} and {n}", g.gpu_id);
            }
        }
    }
}

#[test]
fn override_changes_ids_minors_vram_firmware() {
    let over = r#"
        [gpu_defaults]
        fw_version = 50
        vram_size = 17179869184
        [[gpus]]
        gpu_id = 0x1111
        drm_render_minor = 140
        [[gpus]]
        gpu_id = 0x2222
    "#;
    let p = Profile::with_override("mi100x2", "over.toml", over).unwrap();
    let base = Profile::builtin("mi100x2").unwrap();
    assert_eq!(p.gpus()[0].gpu_id, GpuId(0x1111));
    assert_eq!(p.gpus()[0].drm_render_minor, RenderMinor(140));
    assert_eq!(p.gpus()[1].gpu_id, GpuId(0x2222));
    assert_eq!(
        p.gpus()[1].drm_render_minor,
        base.gpus()[1].drm_render_minor
    );
    for g in p.gpus() {
        assert_eq!(g.fw_version, 50);
        assert_eq!(g.vram_size, 16 << 30);
        assert_eq!(g.device_id, 0x738c, "untouched fields keep the base value");
    }
    // Truncation, and a full profile round-trips through TOML.
    let p = Profile::with_override("mi210x4", "o", "gpu_count = 2").unwrap();
    assert_eq!(p.gpus().len(), 2);
    let again = Profile::from_toml("dump", &p.to_toml()).unwrap();
    assert_eq!(again, p);
}

#[test]
fn bad_overrides_name_the_field() {
    let e = Profile::with_override("mi100", "o.toml", "[[gpus]]\ngpu_idd = 5\n").unwrap_err();
    assert!(e.to_string().contains("gpu_idd"), "{e}");
    let e = Profile::with_override("mi100x2", "o.toml", "[[gpus]]\n[[gpus]]\ngpu_id = 0x3f2c\n")
        .unwrap_err();
    assert!(e.to_string().contains("duplicate gpu_id"), "{e}");
    let e =
        Profile::with_override("mi100", "o.toml", "[[gpus]]\ndrm_render_minor = 7\n").unwrap_err();
    assert!(e.to_string().contains("outside 128..=255"), "{e}");
    let e = Profile::with_override("mi100", "o.toml", "[[gpus]]\nnuma_node = 3\n").unwrap_err();
    assert!(e.to_string().contains("numa_node 3"), "{e}");
    let e = Profile::from_toml("partial.toml", "name = \"x\"\n").unwrap_err();
    assert!(e.to_string().contains("partial.toml"), "{e}");
}

#[test]
fn topology_tree_matches_profile() {
    for n in builtin_names() {
        let p = Profile::builtin(n).unwrap();
        let t = tree(&p);
        let ncpu = p.cpus.len();
        for (i, c) in p.cpus.iter().enumerate() {
            assert_eq!(t[&format!("nodes/{i}/gpu_id")], "0\n");
            let props = &t[&format!("nodes/{i}/properties")];
            assert_eq!(prop(props, "cpu_cores_count"), u64::from(c.cpu_cores_count));
        }
        for (i, g) in p.gpus().iter().enumerate() {
            let node = ncpu + i;
            assert_eq!(
                t[&format!("nodes/{node}/gpu_id")],
                format!("{}\n", g.gpu_id.0)
            );
            let props = &t[&format!("nodes/{node}/properties")];
            assert_eq!(
                prop(props, "simd_count"),
                u64::from(g.cu_count * g.simd_per_cu)
            );
            assert_eq!(
                prop(props, "drm_render_minor"),
                u64::from(g.drm_render_minor.0)
            );
            assert_eq!(prop(props, "device_id"), u64::from(g.device_id));
            assert_eq!(prop(props, "vendor_id"), 0x1002);
            assert_eq!(prop(props, "hive_id"), g.hive_id);
            assert_eq!(prop(props, "fw_version"), u64::from(g.fw_version));
            assert_eq!(
                prop(props, "num_sdma_engines"),
                u64::from(g.num_sdma_engines)
            );
            let caches = prop(props, "caches_count");
            assert!(t.contains_key(&format!("nodes/{node}/caches/{}/properties", caches - 1)));
            assert!(!t.contains_key(&format!("nodes/{node}/caches/{caches}/properties")));
            let bank = &t[&format!("nodes/{node}/mem_banks/0/properties")];
            assert_eq!(prop(bank, "heap_type"), 1);
            assert_eq!(prop(bank, "size_in_bytes"), g.vram_size);

            // Links: PCIe to its CPU node, XGMI to every hive peer, and
            // io_links_count agrees with the directory.
            let nlinks = prop(props, "io_links_count");
            let mut pcie_to = Vec::new();
            let mut xgmi_to = Vec::new();
            for l in 0..nlinks {
                let lp = &t[&format!("nodes/{node}/io_links/{l}/properties")];
                assert_eq!(prop(lp, "node_from"), node as u64);
                match prop(lp, "type") as u32 {
                    IOLINK_PCIE => pcie_to.push(prop(lp, "node_to")),
                    IOLINK_XGMI => xgmi_to.push(prop(lp, "node_to")),
                    k => panic!("{n}: unexpected link type {k}"),
                }
            }
            assert_eq!(pcie_to, vec![u64::from(g.numa_node)], "{n} gpu {i}");
            let peers: Vec<u64> = p
                .gpus()
                .iter()
                .enumerate()
                .filter(|(j, h)| *j != i && g.hive_id != 0 && h.hive_id == g.hive_id)
                .map(|(j, _)| (ncpu + j) as u64)
                .collect();
            assert_eq!(xgmi_to, peers, "{n} gpu {i}");
        }
    }
    // mi250x8: two hives of four.
    let p = Profile::builtin("mi250x8").unwrap();
    let t = tree(&p);
    assert_eq!(prop(&t["nodes/4/properties"], "io_links_count"), 4);
}

#[test]
fn write_tree_produces_the_sysfs_layout() {
    let p = Profile::builtin("mi210x4").unwrap();
    let tmp = tempfile::Builder::new()
        .prefix("kfd-emu-topo-")
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    topology::write_tree(&p, dir).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("generation_id")).unwrap(),
        "1\n"
    );
    assert!(std::fs::read_to_string(dir.join("system_properties"))
        .unwrap()
        .contains("platform_oem "));
    assert_eq!(
        std::fs::read_to_string(dir.join("nodes/2/gpu_id")).unwrap(),
        format!("{}\n", 0x1e8f)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("nodes/2/name")).unwrap(),
        "gfx90a\n"
    );
    assert!(dir.join("nodes/0/caches").is_dir());
}

/// FNV-1a (64 bit): a digest that stays the same across Rust releases.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The sysfs tree of every built-in profile and of every host override the
/// GPU tests used before profiles could declare io_links, pinned byte for
/// byte: a change to how the tree is made must not change what these
/// machines show.  (To see what changed, diff `kfd-emu topology` output of
/// the old and the new binary.)  The multi-CPU-node trees (mi210x4,
/// mi250x8, mi300x8) changed once on purpose: they gained the p2p_links
/// KFD derives on Linux 5.19 and later; every tree changed once more when
/// each GPU got its own `unique_id`.
#[test]
fn existing_profiles_render_byte_identical() {
    let hosts = concat!(env!("CARGO_MANIFEST_DIR"), "/../../test/gpu/hosts");
    // (profile, override in test/gpu/hosts, bytes, FNV-1a of the tree)
    let pinned: &[(&str, Option<&str>, usize, u64)] = &[
        ("mi100", None, 99551, 0xf490fa3e673ce5b6),
        ("mi100x2", None, 198261, 0x299b9b8ae3421a7f),
        ("mi210x4", None, 323340, 0x782ca2f60c43eb44),
        ("mi250x8", None, 713532, 0xa14205907e5f40e3),
        ("mi300x8", None, 3844879, 0x8f409e7708b72650),
        ("rx9070xt", None, 40193, 0xcb24ea378b49e678),
        (
            "rx9070xt",
            Some("rx9070xt-no-user-sdma"),
            40193,
            0xcb24ea378b49e678,
        ),
        (
            "mi100x2",
            Some("mi100x2-fw-first-older"),
            198261,
            0xf0d567e3725cacd2,
        ),
        (
            "mi100x2",
            Some("mi100x2-fw-second-older"),
            198261,
            0x9703c0796c539a90,
        ),
        (
            "mi100x2",
            Some("mi100x2-old-fw"),
            198261,
            0x91667b9427a63cb5,
        ),
        (
            "mi100x2",
            Some("mi100x2-one-gpu"),
            99551,
            0x0ee9efd848d7ba43,
        ),
        ("mi100x2", Some("mi100x2-other"), 198261, 0xa01a8f7c8904279e),
        (
            "mi100x2",
            Some("mi100x2-small-vram"),
            198261,
            0x15bcdb0023bc0f69,
        ),
        (
            "mi250x8",
            Some("mi250x8-hives-swapped"),
            713534,
            0xb294a2c52f7bca24,
        ),
    ];
    let mut wrong = Vec::new();
    for &(base, over, len, hash) in pinned {
        let p = match over {
            None => Profile::builtin(base).unwrap(),
            Some(f) => {
                let path = format!("{hosts}/{f}.toml");
                let text = std::fs::read_to_string(&path).unwrap();
                Profile::with_override(base, &path, &text).unwrap()
            }
        };
        let r = topology::render(&p);
        if (r.len(), fnv1a(&r)) != (len, hash) {
            wrong.push(format!(
                "({base:?}, {over:?}, {}, {:#018x}),",
                r.len(),
                fnv1a(&r)
            ));
        }
    }
    assert!(wrong.is_empty(), "trees changed:\n{}", wrong.join("\n"));
}

/// (type, node_from, node_to, weight, min_latency, max_latency,
/// min_bandwidth, max_bandwidth, flags) of each io_link of `node`, checking
/// that io_links_count agrees with the directories.
fn links(t: &BTreeMap<String, String>, node: u32) -> Vec<[u64; 9]> {
    link_list(t, node, "io_links")
}

/// The links of `node` under `dir` (`io_links`, `p2p_links`), checking
/// that `<dir>_count` agrees with the directories.
fn link_list(t: &BTreeMap<String, String>, node: u32, dir: &str) -> Vec<[u64; 9]> {
    let n = prop(
        &t[&format!("nodes/{node}/properties")],
        &format!("{dir}_count"),
    );
    assert!(
        !t.contains_key(&format!("nodes/{node}/{dir}/{n}/properties")),
        "node {node}: more {dir} than {dir}_count {n}"
    );
    (0..n)
        .map(|l| {
            let lp = &t[&format!("nodes/{node}/{dir}/{l}/properties")];
            [
                "type",
                "node_from",
                "node_to",
                "weight",
                "min_latency",
                "max_latency",
                "min_bandwidth",
                "max_bandwidth",
                "flags",
            ]
            .map(|k| prop(lp, k))
        })
        .collect()
}

#[test]
fn declared_io_links_replace_the_generated_ones() {
    // One-way links, a GPU-GPU PCIe link with its own numbers, a GPU named
    // by gpu_id, and a CPU with no link at all to the second GPU.
    let over = r#"
        io_links_generated = false
        [[io_links]]
        type = "PCIe"
        from = "gpu0"
        to = "cpu0"
        [[io_links]]
        type = 2
        from = 0xd9b1
        to = "cpu0"
        direction = "one-way"
        [[io_links]]
        type = "pcie"
        from = "gpu1"
        to = "gpu0"
        weight = 40
        min_latency = 5
        max_latency = 9
        min_bandwidth = 100
        max_bandwidth = 32000
        flags = 1
    "#;
    let p = Profile::with_override("mi100x2", "over.toml", over).unwrap();
    let t = tree(&p);
    let pcie = u64::from(IOLINK_PCIE);
    assert_eq!(links(&t, 0), vec![[pcie, 0, 1, 20, 0, 0, 312, 64000, 3]]);
    assert_eq!(
        links(&t, 1),
        vec![
            [pcie, 1, 0, 20, 0, 0, 312, 64000, 3],
            [pcie, 1, 2, 40, 5, 9, 100, 32000, 1],
        ]
    );
    assert_eq!(
        links(&t, 2),
        vec![
            [pcie, 2, 0, 20, 0, 0, 312, 64000, 3],
            [pcie, 2, 1, 40, 5, 9, 100, 32000, 1],
        ]
    );
    // Without GPU links the CPU nodes keep theirs to each other, and no
    // GPU gets p2p_links (KFD derives them from its first io_link).
    let p = Profile::with_override("mi210x4", "o", "io_links_generated = false").unwrap();
    let t = tree(&p);
    let ht = u64::from(IOLINK_HYPERTRANSPORT);
    assert_eq!(links(&t, 0), vec![[ht, 0, 1, 32, 0, 0, 0, 0, 3]]);
    assert_eq!(links(&t, 1), vec![[ht, 1, 0, 32, 0, 0, 0, 0, 3]]);
    for n in 0..6 {
        assert!(p2p_links(&t, n).is_empty(), "node {n}");
        if n >= 2 {
            assert!(links(&t, n).is_empty(), "node {n}");
        }
    }
    // No links at all is a topology too.
    let over = "io_links_generated = false\ncpu_links_generated = false\n";
    let p = Profile::with_override("mi210x4", "o", over).unwrap();
    let t = tree(&p);
    for n in 0..6 {
        assert!(links(&t, n).is_empty(), "node {n}");
        assert!(p2p_links(&t, n).is_empty(), "node {n}");
    }
}

/// (type, node_from, node_to, weight, ..., flags) of each p2p_link of
/// `node`, checking that p2p_links_count agrees with the directories.
fn p2p_links(t: &BTreeMap<String, String>, node: u32) -> Vec<[u64; 9]> {
    link_list(t, node, "p2p_links")
}

/// KFD's indirect links (kfd_create_indirect_link_prop): each GPU to every
/// CPU node beyond its own, through it, and back for large-BAR GPUs.
#[test]
fn p2p_links_are_the_indirect_links_kfd_derives() {
    let p = Profile::builtin("mi210x4").unwrap();
    let t = tree(&p);
    let pcie = u64::from(IOLINK_PCIE);
    // mi210x4: GPUs 2, 3 on CPU node 0, GPUs 4, 5 on CPU node 1, all
    // with CPU-visible VRAM.
    assert_eq!(p2p_links(&t, 2), vec![[pcie, 2, 1, 52, 0, 0, 0, 0, 3]]);
    assert_eq!(p2p_links(&t, 4), vec![[pcie, 4, 0, 52, 0, 0, 0, 0, 3]]);
    assert_eq!(
        p2p_links(&t, 0),
        vec![
            [pcie, 0, 4, 52, 0, 0, 0, 0, 3],
            [pcie, 0, 5, 52, 0, 0, 0, 0, 3]
        ]
    );
    // Small BAR: no link from the other CPU node to the GPU.
    let p = Profile::with_override("mi210x4", "o", "[[gpus]]\nvram_public = false\n").unwrap();
    let t = tree(&p);
    assert_eq!(p2p_links(&t, 2), vec![[pcie, 2, 1, 52, 0, 0, 0, 0, 3]]);
    assert_eq!(p2p_links(&t, 1), vec![[pcie, 1, 3, 52, 0, 0, 0, 0, 3]]);
    // Declared links: derived the same way, from the GPU's first link and
    // the CPU-CPU link (latencies summed, smaller bandwidths).
    let over = r#"
        io_links_generated = false
        io_links = [
          { type = "PCIe", from = "gpu0", to = "cpu0", min_latency = 2, max_latency = 3 },
          { type = "HyperTransport", from = "cpu1", to = "cpu0", direction = "one-way", weight = 21, min_latency = 4, max_latency = 5, min_bandwidth = 100, max_bandwidth = 1000 },
        ]
        cpu_links_generated = false
    "#;
    let p = Profile::with_override("mi210x4", "o", over).unwrap();
    let t = tree(&p);
    assert_eq!(p2p_links(&t, 2), vec![[pcie, 2, 1, 41, 6, 8, 100, 1000, 3]]);
    assert_eq!(p2p_links(&t, 1), vec![[pcie, 1, 2, 41, 6, 8, 100, 1000, 3]]);
    // No CPU-CPU link to go through: the kernel stops there.
    let over = "io_links_generated = false\ncpu_links_generated = false\n\
                io_links = [{ type = \"PCIe\", from = \"gpu0\", to = \"cpu0\" }]\n";
    let p = Profile::with_override("mi210x4", "o", over).unwrap();
    let t = tree(&p);
    for n in 0..6 {
        assert!(p2p_links(&t, n).is_empty(), "node {n}");
    }
    // And a profile can leave them out.
    let p = Profile::with_override("mi210x4", "o", "p2p_links_generated = false\n").unwrap();
    let t = tree(&p);
    for n in 0..6 {
        assert!(p2p_links(&t, n).is_empty(), "node {n}");
    }
}

#[test]
fn declared_io_links_follow_the_generated_ones() {
    let over = r#"
        [[io_links]]
        type = "XGMI"
        from = "gpu1"
        to = 0x3f2c
        max_bandwidth = 200000
    "#;
    let p = Profile::with_override("mi100x2", "over.toml", over).unwrap();
    let t = tree(&p);
    let (pcie, xgmi) = (u64::from(IOLINK_PCIE), u64::from(IOLINK_XGMI));
    assert_eq!(
        links(&t, 0),
        vec![
            [pcie, 0, 1, 20, 0, 0, 312, 64000, 3],
            [pcie, 0, 2, 20, 0, 0, 312, 64000, 3]
        ]
    );
    assert_eq!(
        links(&t, 1),
        vec![
            [pcie, 1, 0, 20, 0, 0, 312, 64000, 3],
            [xgmi, 1, 2, 15, 0, 0, 50000, 200000, 3]
        ]
    );
    assert_eq!(
        links(&t, 2),
        vec![
            [pcie, 2, 0, 20, 0, 0, 312, 64000, 3],
            [xgmi, 2, 1, 15, 0, 0, 50000, 200000, 3]
        ]
    );
    // The resolved profile (what KFD_EMU_STATE_DIR/profile.toml holds)
    // round-trips, links and all.
    let again = Profile::from_toml("dump", &p.to_toml()).unwrap();
    assert_eq!(again, p);
    assert_eq!(tree(&again), t);
    let p = Profile::with_override(
        "mi100x2",
        "o",
        "io_links_generated = false\nio_links = [{ type = \"PCIe\", from = \"gpu0\", to = \"gpu1\", direction = \"one-way\" }]",
    )
    .unwrap();
    assert_eq!(Profile::from_toml("dump", &p.to_toml()).unwrap(), p);
}

#[test]
fn gpu_count_drops_the_links_of_dropped_gpus() {
    let over = r#"
        gpu_count = 1
        io_links_generated = false
        io_links = [
          { type = "PCIe", from = "gpu0", to = "cpu0" },
          { type = "PCIe", from = "gpu1", to = "cpu0" },
          { type = "PCIe", from = "gpu0", to = 0xd9b1 },
        ]
    "#;
    let p = Profile::with_override("mi100x2", "o", over).unwrap();
    assert_eq!(p.gpus().len(), 1);
    assert_eq!(p.io_links.len(), 1);
    let t = tree(&p);
    assert_eq!(links(&t, 0).len(), 1);
    assert_eq!(links(&t, 1).len(), 1);
}

#[test]
fn bad_io_links_name_the_profile_link_and_field() {
    let cases: &[(&str, &[&str])] = &[
        (
            "type = \"NVLink\"\nfrom = \"gpu0\"\nto = \"cpu0\"",
            &[
                "io_links[0].type",
                "\"NVLink\" is not a KFD io_link type",
                "XGMI (11)",
            ],
        ),
        (
            "type = 7\nfrom = \"gpu0\"\nto = \"cpu0\"",
            &["io_links[0].type", "7 is not"],
        ),
        (
            "type = \"PCIe\"\nfrom = \"gpu2\"\nto = \"cpu0\"",
            &["io_links[0].from", "\"gpu2\"", "2 GPU node(s)"],
        ),
        (
            "type = \"PCIe\"\nfrom = \"gpu0\"\nto = \"node0\"",
            &["io_links[0].to", "\"node0\" names no node"],
        ),
        (
            "type = \"PCIe\"\nfrom = \"gpu0\"\nto = \"cpux\"",
            &["io_links[0].to", "decimal index"],
        ),
        (
            "type = \"PCIe\"\nfrom = 0x1234\nto = \"cpu0\"",
            &["io_links[0].from", "gpu_id 0x1234", "no GPU"],
        ),
        (
            "type = \"PCIe\"\nfrom = \"gpu1\"\nto = 0xd9b1",
            &["io_links[0]", "same node", "gpu1 (node 2)"],
        ),
        (
            "type = \"PCIe\"\nfrom = \"gpu0\"\nto = \"gpu1\"\ndirection = \"oneway\"",
            &["io_links[0].direction", "\"oneway\""],
        ),
        (
            "type = \"InfiniBand\"\nfrom = \"gpu0\"\nto = \"gpu1\"",
            &["io_links[0].weight", "required for type 9"],
        ),
        (
            "type = \"PCIe\"\nfrom = \"gpu0\"\nto = \"gpu1\"\nmin_bandwidth = 9\nmax_bandwidth = 8",
            &["io_links[0].min_bandwidth 9 exceeds max_bandwidth 8"],
        ),
        (
            "type = \"PCIe\"\nfrom = \"gpu0\"\nto = \"gpu1\"\nmax_latency = 1\nmin_latency = 2",
            &["io_links[0].min_latency 2 exceeds max_latency 1"],
        ),
        (
            "type = \"PCIe\"\nfrom = \"cpu0\"\nto = \"gpu0\"\ndirection = \"one-way\"",
            &[
                "io_links[0]",
                "link from cpu0 (node 0) to gpu0 (node 1) is already a generated link",
                "io_links_generated = false",
            ],
        ),
        (
            "type = \"PCIe\"\nfrom = \"gpu0\"\nto = \"gpu1\"\nwieght = 3",
            &["o.toml", "io_links[0]: unknown field `wieght`"],
        ),
        (
            "type = \"PCIe\"\nfrom = \"gpu0\"",
            &["o.toml", "io_links[0]: missing field `to`"],
        ),
    ];
    for (link, want) in cases {
        let text = format!("[[io_links]]\n{link}\n");
        let e = Profile::with_override("mi100x2", "o.toml", &text)
            .unwrap_err()
            .to_string();
        // Checks of the resolved profile name it and the file; shape checks
        // of one file name that file.
        assert!(
            e.starts_with("profile mi100x2 (profile mi100x2 + o.toml): ")
                || e.starts_with("o.toml: "),
            "{e}"
        );
        for w in *want {
            assert!(e.contains(w), "{link}: {e:?} lacks {w:?}");
        }
    }
    // A both-ways link repeated by a one-way link the other way.
    let text = "io_links_generated = false\n\
        [[io_links]]\ntype = \"XGMI\"\nfrom = \"gpu0\"\nto = \"gpu1\"\n\
        [[io_links]]\ntype = \"XGMI\"\nfrom = \"gpu1\"\nto = \"gpu0\"\ndirection = \"one-way\"\n";
    let e = Profile::with_override("mi100x2", "o.toml", text)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("profile mi100x2 (profile mi100x2 + o.toml): io_links[1]: the type 11 link from gpu1 (node 2) to gpu0 (node 1) is already declared by io_links[0]"),
        "{e}"
    );
}

#[test]
fn pci_revision_is_optional_and_set_in_the_builtins() {
    // The built-ins carry the revision amdgpu.ids lists for their parts.
    for (name, did, rev) in [
        ("mi100", 0x738c, 0x01),
        ("mi100x2", 0x738c, 0x01),
        ("mi210x4", 0x740f, 0x02),
        ("mi250x8", 0x740c, 0x01),
        ("mi300x8", 0x74a1, 0x00),
        ("rx9070xt", 0x7550, 0xc0),
    ] {
        for g in Profile::builtin(name).unwrap().gpus() {
            assert_eq!((g.device_id, g.pci_revision), (did, rev), "{name}");
        }
    }
    // A complete profile written before the field existed still loads.
    let p = Profile::builtin("mi210x4").unwrap();
    let old: String = p
        .to_toml()
        .lines()
        .filter(|l| !l.starts_with("pci_revision"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!old.contains("pci_revision"));
    let q = Profile::from_toml("old.toml", &old).unwrap();
    assert!(q.gpus().iter().all(|g| g.pci_revision == 0));
    assert_eq!(q.gpus().len(), p.gpus().len());
}

/// The GPU tests' topology-remap hosts (upstream CRIU's scenarios) load
/// over the profile their header names, and each node's io_links_count is
/// its number of io_links.
#[test]
fn topo_remap_hosts_load() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../test/gpu/hosts/topo-remap"
    );
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let base = text
            .split("an override of kfd-emu's ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("{}: names no base profile", path.display()));
        let p = Profile::with_override(base, &path.display().to_string(), &text)
            .unwrap_or_else(|e| panic!("{e}"));
        let t = tree(&p);
        for node in 0..(p.cpus.len() + p.gpus().len()) as u32 {
            links(&t, node);
        }
        n += 1;
    }
    assert_eq!(
        n, 18,
        "nine scenarios, a source and a destination host each"
    );
}
