//! amdgpu-cr: the GPU checkpoint/restore logic of criu-rocm.
//!
//! This crate is policy without a C boundary: the `criu-gpu` static library
//! translates CRIU's hook calls into calls of this crate.  Pieces:
//!
//! * [`image`] and [`proto`]: the image files (names, framing, messages,
//!   validation) — wire compatible with CRIU 4.2.1's amdgpu plugin;
//! * [`pages`]: the pages files (BO contents): their format, writer and
//!   reader, holes for zero blocks, the per-BO content hashes;
//! * [`topology`]: the KFD sysfs topology model and parser, and its
//!   conversion to and from image device entries;
//! * [`matcher`]: user gpu_id → host gpu_id mapping at restore;
//! * [`env`](mod@env): the environment knobs;
//! * [`copy`]: BO content copy engines (CPU mapping, SDMA) and the per-GPU
//!   parallel workers;
//! * [`plan`]: dump and restore plans, the VMA fix-up table, device
//!   recognition, the thunk's shared memory;
//! * [`privdata`]: read-only checks of the kernel's CRIU blob;
//! * [`validate`]: the one validation of an image directory that the
//!   restore and `gpu-check` share, and the dump's digests of its files;
//! * [`error`]: the crate error and its errno;
//! * [`testhook`]: a stop at a named log line, for tests only.

pub mod bo;
pub mod copy;
pub mod criu_images;
pub mod env;
pub mod error;
pub mod ids;
pub mod image;
pub mod incomplete;
pub mod matcher;
pub mod os;
pub mod pages;
pub mod plan;
pub mod privdata;
pub mod proto;
pub mod session;
pub mod stream;
pub mod testhook;
pub mod topology;
pub mod units;
pub mod validate;

// The scratch directories of the unit tests, as of the test binaries.
#[cfg(test)]
#[path = "../../test-support/scratch.rs"]
mod scratch;

pub use error::Error;

use std::path::Path;

/// Restore step "which host GPU takes over which image GPU": rebuilds the
/// image's topology, parses the host's below `sysfs_nodes` (the product
/// passes [`topology::SYSFS_NODES`]) and matches them under `checks`
/// (normally [`env::Checks::from_env`]).  Returns the map and the host
/// topology (for render minors).
pub fn match_image_to_host(
    image: &image::KfdImage,
    sysfs_nodes: &Path,
    checks: &env::Checks,
) -> Result<(matcher::GpuMap, topology::Topology), Error> {
    match_image_to_usable(image, sysfs_nodes, checks, |_| true)
}

/// As [`match_image_to_host`], onto the host GPUs `usable` accepts only:
/// the topology may list GPUs the restored process cannot reach (a
/// container given some of the host's GPUs sees them all in sysfs).
pub fn match_image_to_usable(
    image: &image::KfdImage,
    sysfs_nodes: &Path,
    checks: &env::Checks,
    usable: impl Fn(&topology::Node) -> bool,
) -> Result<(matcher::GpuMap, topology::Topology), Error> {
    let src = topology::Topology::from_image_entries(&image.msg.device_entries)?;
    let mut host = topology::Topology::parse_sysfs(sysfs_nodes)?;
    host.retain_gpus(usable);
    let map = matcher::match_gpus(&src, &host, checks)?;
    Ok((map, host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::GpuId;
    use crate::topology::tests::{write_tree, FakeNode};
    use crate::topology::IOLINK_PCIE;

    /// Dump on one sysfs tree, restore on another whose GPU has a new id.
    #[test]
    fn image_from_one_host_matches_another() {
        let props =
            "simd_count 120\nvendor_id 4098\ndevice_id 29631\nfw_version 2\ndrm_render_minor 128\n";
        let dump_root = image::tests::tempdir();
        let nodes = |gpu_id| {
            [
                FakeNode {
                    id: 0,
                    gpu_id: 0,
                    props: "cpu_cores_count 8\n",
                    vram: None,
                    links: &[(IOLINK_PCIE, 1)],
                },
                FakeNode {
                    id: 1,
                    gpu_id,
                    props,
                    vram: Some((1, 16 << 30)),
                    links: &[(IOLINK_PCIE, 0)],
                },
            ]
        };
        write_tree(&dump_root, &nodes(0x1a2b));
        let restore_root = image::tests::tempdir();
        write_tree(&restore_root, &nodes(0x5c3d));

        let dump_host = topology::Topology::parse_sysfs(&dump_root).unwrap();
        let ckpt = plan::CheckpointData {
            pid: 1,
            devices: vec![plan::DeviceBucket {
                user: GpuId(0x1a2b),
                actual: GpuId(0x1a2b),
            }],
            bos: vec![],
            num_objects: 0,
            priv_data: vec![1; 8],
        };
        let p = plan::plan_dump(&dump_host, &ckpt, plan::SharedMem::default()).unwrap();
        let img = p
            .finish_image(&Default::default(), crate::pages::Encoding::Raw)
            .unwrap();
        let (map, host) =
            match_image_to_host(&img, &restore_root, &env::Checks::default()).unwrap();
        assert_eq!(map.get(GpuId(0x1a2b)), Some(GpuId(0x5c3d)));
        assert_eq!(host.gpus().count(), 1);
        let e = match_image_to_host(&img, &restore_root.join("missing"), &env::Checks::default())
            .unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        std::fs::remove_dir_all(&dump_root).unwrap();
        std::fs::remove_dir_all(&restore_root).unwrap();
    }
}
