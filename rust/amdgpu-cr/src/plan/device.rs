//! Recognition of GPU device files: `/dev/kfd` and the render nodes, by
//! path as CRIU records them and by file identity.

use std::path::Path;

use crate::ids::RenderMinor;

/// The device a mapping is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceKind {
    Kfd,
    Render(RenderMinor),
}

impl DeviceKind {
    /// Recognises `/dev/kfd` and `/dev/dri/renderD<N>` paths as CRIU records
    /// them: relative to CRIU's root, so the nodes of a task in a chroot
    /// (or below any other root of its own) carry that root in front
    /// (`srv/root/dev/dri/renderD128`).  The node is told by its name and
    /// the directories above it; a leading `//` is collapsed.  Only the
    /// mappings the dump took as GPU ones (by file identity) are looked up.
    pub fn from_path(path: &str) -> Option<Self> {
        let mut up = path.rsplit('/');
        let (name, dir) = (up.next()?, up.next()?);
        if (name, dir) == ("kfd", "dev") {
            return Some(DeviceKind::Kfd);
        }
        let minor = name.strip_prefix("renderD")?;
        if (dir, up.next()?) != ("dri", "dev")
            || minor.is_empty()
            || !minor.bytes().all(|c| c.is_ascii_digit())
        {
            return None;
        }
        minor
            .parse()
            .ok()
            .map(|m| DeviceKind::Render(RenderMinor(m)))
    }
}

/// Whether two `stat`s are the same device file: character devices by
/// rdev (a container's own node of a device is another inode), anything
/// else (an emulated node, a bind mount of one) by device and inode.
pub fn same_file(a: &libc::stat, b: &libc::stat) -> bool {
    let chr = |s: &libc::stat| s.st_mode & libc::S_IFMT == libc::S_IFCHR;
    match (chr(a), chr(b)) {
        (true, true) => a.st_rdev == b.st_rdev,
        (false, false) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}

/// Decides whether a file (an fd or a mapping's file, as `stat`) is
/// `/dev/kfd`, one of the render nodes, or none of ours.  The one place
/// that recognises GPU device files.
pub fn classify_device(
    st: &libc::stat,
    kfd: Option<&libc::stat>,
    render_nodes: &[(RenderMinor, libc::stat)],
) -> Option<DeviceKind> {
    if kfd.is_some_and(|k| same_file(st, k)) {
        return Some(DeviceKind::Kfd);
    }
    render_nodes
        .iter()
        .find(|(_, r)| same_file(st, r))
        .map(|(m, _)| DeviceKind::Render(*m))
}

pub use crate::os::file::{stat_fd, stat_path};

/// The identities of this host's (or namespace's) GPU device files:
/// `<dev>/kfd` and every `<dev>/dri/renderD<N>`.  Missing files are simply
/// absent (a host without AMD GPUs has none, and nothing is "ours").
#[derive(Clone, Default)]
pub struct DeviceIdentities {
    pub kfd: Option<libc::stat>,
    pub render_nodes: Vec<(RenderMinor, libc::stat)>,
}

impl DeviceIdentities {
    /// Stats the device files below `dev` (the product passes `/dev`).
    pub fn probe(dev: &Path) -> Self {
        let kfd = stat_path(&dev.join("kfd")).ok();
        let mut render_nodes = Vec::new();
        if let Ok(rd) = std::fs::read_dir(dev.join("dri")) {
            for ent in rd.flatten() {
                let name = ent.file_name();
                let Some(minor) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("renderD"))
                    .and_then(|m| m.parse::<u32>().ok())
                else {
                    continue;
                };
                if let Ok(st) = stat_path(&ent.path()) {
                    render_nodes.push((RenderMinor(minor), st));
                }
            }
        }
        render_nodes.sort_by_key(|(m, _)| *m);
        DeviceIdentities { kfd, render_nodes }
    }

    /// See [`classify_device`].
    pub fn classify(&self, st: &libc::stat) -> Option<DeviceKind> {
        classify_device(st, self.kfd.as_ref(), &self.render_nodes)
    }
}
