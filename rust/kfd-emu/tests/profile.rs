//! Profiles: built-ins, overrides, validation, and the generated topology
//! tree agreeing with the profile.

use std::collections::BTreeMap;

use kfd_emu::profile::{builtin_names, GpuId, Profile, RenderMinor};
use kfd_emu::topology::{self, IOLINK_PCIE, IOLINK_XGMI};

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
    for want in ["mi100", "mi100x2", "mi210x4", "mi250x8", "mi300x8"] {
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
    let dir = std::env::temp_dir().join(format!("kfd-emu-topo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    topology::write_tree(&p, &dir).unwrap();
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
    std::fs::remove_dir_all(&dir).unwrap();
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
/// the old and the new binary.)
#[test]
fn existing_profiles_render_byte_identical() {
    let hosts = concat!(env!("CARGO_MANIFEST_DIR"), "/../../test/gpu/hosts");
    // (profile, override in test/gpu/hosts, bytes, FNV-1a of the tree)
    let pinned: &[(&str, Option<&str>, usize, u64)] = &[
        ("mi100", None, 99533, 0xd93ffd5df86ca985),
        ("mi100x2", None, 198225, 0x5d1ef6953e990f4c),
        ("mi210x4", None, 321352, 0x0d79d3fe61078ffe),
        ("mi250x8", None, 701923, 0x7040156e0a8855e9),
        ("mi300x8", None, 3840704, 0x3b0d230afb0243d8),
        (
            "mi100x2",
            Some("mi100x2-fw-first-older"),
            198225,
            0xca7f9f99a827b9fd,
        ),
        (
            "mi100x2",
            Some("mi100x2-fw-second-older"),
            198225,
            0xb23e1fd62a6f0da3,
        ),
        (
            "mi100x2",
            Some("mi100x2-old-fw"),
            198225,
            0xaf106072ddf2274e,
        ),
        (
            "mi100x2",
            Some("mi100x2-one-gpu"),
            99533,
            0xdf0e3de035ec6f38,
        ),
        ("mi100x2", Some("mi100x2-other"), 198225, 0xa8b494ffa21e68ca),
        (
            "mi100x2",
            Some("mi100x2-small-vram"),
            198225,
            0x039dae5337ad564a,
        ),
        (
            "mi250x8",
            Some("mi250x8-hives-swapped"),
            701924,
            0x5b322ffc65bd2d10,
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
