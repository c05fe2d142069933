//! The device cgroup as KFD consults it (`kfd_devcgroup_check_permission`):
//! a process gets a pdd only for the GPUs whose render node
//! (`c 226:<render minor>`, read and write) its device cgroup allows.  A
//! container given some of the host's GPUs (runc, a Kubernetes device
//! plugin) is a KFD process with only those GPUs.
//!
//! The emulator reads the cgroup v1 devices controller's `devices.list` of
//! the opener.  Without one (cgroup v2 filters devices with BPF programs,
//! which the emulator cannot run) every GPU is allowed.

use std::path::Path;

/// DRM's character major.
const DRM_MAJOR: u32 = 226;

/// Whether one `devices.list` line (`TYPE MAJOR:MINOR ACCESS`) grants read
/// and write of character device `major:minor`.
fn line_allows(line: &str, major: u32, minor: u32) -> bool {
    let mut it = line.split_whitespace();
    let (Some(kind), Some(nums), Some(access)) = (it.next(), it.next(), it.next()) else {
        return false;
    };
    if kind != "a" && kind != "c" {
        return false;
    }
    let Some((maj, min)) = nums.split_once(':') else {
        return false;
    };
    let num_ok = |s: &str, v: u32| s == "*" || s.parse::<u32>() == Ok(v);
    num_ok(maj, major) && num_ok(min, minor) && access.contains('r') && access.contains('w')
}

/// Whether a `devices.list` grants read and write of render node `minor`.
/// The kernel lists `a *:* rwm` for a cgroup that allows everything and the
/// exceptions it allows otherwise (runc's containers: deny by default).
pub fn list_allows(list: &str, minor: u32) -> bool {
    list.lines().any(|l| line_allows(l, DRM_MAJOR, minor))
}

/// The `devices.list` of process `tgid`, `None` when it has no cgroup v1
/// devices controller.
pub fn devices_list(tgid: u32) -> Option<String> {
    let cg = std::fs::read_to_string(format!("/proc/{tgid}/cgroup")).ok()?;
    let path = cg.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        ctrls.split(',').any(|c| c == "devices").then_some(path)
    })?;
    let file = Path::new("/sys/fs/cgroup/devices")
        .join(path.trim_start_matches('/'))
        .join("devices.list");
    std::fs::read_to_string(file).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_style_lists() {
        assert!(list_allows("a *:* rwm\n", 130));
        let runc = "c 1:3 rwm\nc 5:0 rwm\nc 226:134 rw\nc 226:135 rwm\nc *:* m\n";
        assert!(list_allows(runc, 134));
        assert!(list_allows(runc, 135));
        assert!(!list_allows(runc, 128));
        // Read alone is not enough: KFD asks for read and write.
        assert!(!list_allows("c 226:128 r\n", 128));
        assert!(list_allows("c 226:* rw\n", 200));
        assert!(!list_allows("b 226:128 rwm\n", 128));
        assert!(!list_allows("", 128));
    }
}
