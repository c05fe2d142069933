//! The io_links a profile describes: link types, the values of generated
//! links, and the links the profile generates for a node.  The topology
//! (`crate::topology`) writes them out; the profile loader validates
//! declared links against them.

use super::Profile;

/// io_link types.
pub const IOLINK_HYPERTRANSPORT: u32 = 1;
pub const IOLINK_PCIE: u32 = 2;
pub const IOLINK_XGMI: u32 = 11;

/// A directed io_link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub kind: u32,
    pub from: u32,
    pub to: u32,
    pub weight: u32,
    pub min_latency: u32,
    pub max_latency: u32,
    pub min_bw: u32,
    pub max_bw: u32,
    pub flags: u32,
}

impl Link {
    /// The same link in the other direction.
    pub fn reversed(&self) -> Link {
        Link {
            from: self.to,
            to: self.from,
            ..*self
        }
    }
}

/// The `flags` of every generated link (and default of declared ones):
/// enabled (1) and non-coherent (2), as the emulator always wrote them.
pub const LINK_FLAGS: u32 = 3;

/// Weight and bandwidths of the generated links of a type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkDefaults {
    pub weight: u32,
    pub min_bw: u32,
    pub max_bw: u32,
}

/// The values generated links of type `kind` have (None: the generator
/// makes no link of that type).
pub fn link_defaults(kind: u32) -> Option<LinkDefaults> {
    let (weight, min_bw, max_bw) = match kind {
        IOLINK_HYPERTRANSPORT => (32, 0, 0),
        IOLINK_PCIE => (20, 312, 64_000),
        IOLINK_XGMI => (15, 50_000, 100_000),
        _ => return None,
    };
    Some(LinkDefaults {
        weight,
        min_bw,
        max_bw,
    })
}

fn default_link(kind: u32, from: u32, to: u32) -> Link {
    let d = link_defaults(kind).expect("a generated link type");
    Link {
        kind,
        from,
        to,
        weight: d.weight,
        min_latency: 0,
        max_latency: 0,
        min_bw: d.min_bw,
        max_bw: d.max_bw,
        flags: LINK_FLAGS,
    }
}

/// The generated links of node `node_id`, in sysfs order: PCIe and XGMI
/// unless `io_links_generated = false`, HyperTransport between CPU nodes
/// unless `cpu_links_generated = false`.
pub fn generated_links_of(p: &Profile, node_id: u32) -> Vec<Link> {
    let ncpu = p.cpus.len() as u32;
    let mut out = Vec::new();
    if node_id < ncpu {
        if p.io_links_generated {
            for (i, g) in p.gpus.iter().enumerate() {
                if g.numa_node == node_id {
                    out.push(default_link(IOLINK_PCIE, node_id, p.gpu_node_id(i)));
                }
            }
        }
        if p.cpu_links_generated {
            for other in 0..ncpu {
                if other != node_id {
                    out.push(default_link(IOLINK_HYPERTRANSPORT, node_id, other));
                }
            }
        }
    } else if p.io_links_generated {
        let gi = (node_id - ncpu) as usize;
        let g = &p.gpus[gi];
        out.push(default_link(IOLINK_PCIE, node_id, g.numa_node));
        if g.hive_id != 0 {
            for (j, peer) in p.gpus.iter().enumerate() {
                if j != gi && peer.hive_id == g.hive_id {
                    out.push(default_link(IOLINK_XGMI, node_id, p.gpu_node_id(j)));
                }
            }
        }
    }
    out
}
