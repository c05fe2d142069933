//! The KFD topology in sysfs (`/sys/class/kfd/kfd/topology/nodes/N/`): which nodes are GPUs,
//! their gpu_ids and render minors.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use kfd_abi::ids::{GpuId, RenderMinor};

use crate::error::{Error, Result};

/// Where the kernel (and kfd-emu, inside its namespace) publishes the topology.
pub const DEFAULT_ROOT: &str = "/sys/class/kfd/kfd/topology";

/// One topology node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The directory number N.
    pub node_id: u32,
    /// `None` for CPU nodes (gpu_id 0).
    pub gpu_id: Option<GpuId>,
    /// `properties`, name to value.
    pub properties: BTreeMap<String, u64>,
}

impl Node {
    /// A property by name.
    pub fn property(&self, name: &str) -> Option<u64> {
        self.properties.get(name).copied()
    }

    /// The node's render minor (GPU nodes only).
    pub fn render_minor(&self) -> Option<RenderMinor> {
        self.gpu_id?;
        let m = self.property("drm_render_minor")?;
        u32::try_from(m).ok().map(RenderMinor)
    }
}

fn read_text(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|source| Error::TopologyIo {
        path: path.to_owned(),
        source,
    })
}

/// Parses a `properties` file: one `name value` pair per non-empty line.
pub fn parse_properties(path: &Path, text: &str) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut it = line.split_whitespace();
        let bad = |msg: &str| Error::Topology {
            path: path.to_owned(),
            msg: format!("line {}: {msg}: {line:?}", i + 1),
        };
        let (Some(name), Some(value), None) = (it.next(), it.next(), it.next()) else {
            return Err(bad("expected `name value`"));
        };
        let value: u64 = value
            .parse()
            .map_err(|_| bad("value is not an unsigned integer"))?;
        out.insert(name.to_owned(), value);
    }
    Ok(out)
}

fn read_node(dir: &Path, node_id: u32) -> Result<Node> {
    let gpu_id_path = dir.join("gpu_id");
    let text = read_text(&gpu_id_path)?;
    let raw: u32 = text.trim().parse().map_err(|_| Error::Topology {
        path: gpu_id_path.clone(),
        msg: format!("gpu_id {:?} is not an unsigned 32-bit integer", text.trim()),
    })?;
    let props_path = dir.join("properties");
    let properties = parse_properties(&props_path, &read_text(&props_path)?)?;
    let node = Node {
        node_id,
        gpu_id: (raw != 0).then_some(GpuId(raw)),
        properties,
    };
    if node.gpu_id.is_some() && node.render_minor().is_none() {
        return Err(Error::Topology {
            path: props_path,
            msg: format!("GPU node {node_id} (gpu_id {raw}) has no usable drm_render_minor"),
        });
    }
    Ok(node)
}

/// Reads every node under `root/nodes`, in node order. Nodes the caller may not read (a
/// device cgroup hides them) are skipped, as the thunk does; malformed ones are errors.
pub fn read_nodes(root: &Path) -> Result<Vec<Node>> {
    let nodes_dir = root.join("nodes");
    let entries = fs::read_dir(&nodes_dir).map_err(|source| Error::TopologyIo {
        path: nodes_dir.clone(),
        source,
    })?;
    let mut ids = Vec::new();
    for e in entries {
        let e = e.map_err(|source| Error::TopologyIo {
            path: nodes_dir.clone(),
            source,
        })?;
        if let Some(id) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let dir: PathBuf = nodes_dir.join(id.to_string());
        match read_node(&dir, id) {
            Ok(n) => out.push(n),
            Err(Error::TopologyIo { source, .. })
                if source.kind() == io::ErrorKind::PermissionDenied => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Scratch(tempfile::TempDir);

    impl Scratch {
        fn new(tag: &str) -> Self {
            let dir = tempfile::Builder::new()
                .prefix(&format!("kfd-client-{tag}-"))
                .tempdir()
                .unwrap();
            Self(dir)
        }
        fn write(&self, rel: &str, text: &str) {
            let p = self.0.path().join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
    }

    #[test]
    fn reads_cpu_and_gpu_nodes_in_numeric_order() {
        let t = Scratch::new("ok");
        t.write("nodes/0/gpu_id", "0\n");
        t.write(
            "nodes/0/properties",
            "cpu_cores_count 8\ndrm_render_minor 0\n",
        );
        for (n, id, minor) in [(1, 56234, 128), (10, 4660, 129)] {
            t.write(&format!("nodes/{n}/gpu_id"), &format!("{id}\n"));
            t.write(
                &format!("nodes/{n}/properties"),
                &format!("simd_count 240\ndrm_render_minor {minor}\n\n"),
            );
        }
        t.write("nodes/README", "not a node");
        let nodes = read_nodes(t.0.path()).unwrap();
        assert_eq!(
            nodes.iter().map(|n| n.node_id).collect::<Vec<_>>(),
            [0, 1, 10]
        );
        assert_eq!(nodes[0].gpu_id, None);
        assert_eq!(nodes[0].render_minor(), None);
        assert_eq!(nodes[1].gpu_id, Some(GpuId(56234)));
        assert_eq!(nodes[1].render_minor(), Some(RenderMinor(128)));
        assert_eq!(nodes[2].render_minor(), Some(RenderMinor(129)));
        assert_eq!(nodes[2].property("simd_count"), Some(240));
    }

    #[test]
    fn malformed_files_are_named() {
        let t = Scratch::new("bad");
        t.write("nodes/0/gpu_id", "12\n");
        t.write(
            "nodes/0/properties",
            "simd_count 4\ndrm_render_minor lots\n",
        );
        let e = read_nodes(t.0.path()).unwrap_err().to_string();
        assert!(e.contains("nodes/0/properties: line 2"), "{e}");

        t.write("nodes/0/properties", "simd_count 4\n");
        let e = read_nodes(t.0.path()).unwrap_err().to_string();
        assert!(e.contains("has no usable drm_render_minor"), "{e}");

        t.write("nodes/0/gpu_id", "-1\n");
        let e = read_nodes(t.0.path()).unwrap_err().to_string();
        assert!(e.contains("nodes/0/gpu_id: gpu_id \"-1\""), "{e}");
    }

    #[test]
    fn missing_root_keeps_errno() {
        let e = read_nodes(Path::new("/nonexistent/kfd/topology")).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOENT));
        assert!(e
            .to_string()
            .starts_with("/nonexistent/kfd/topology/nodes: "));
    }
}
