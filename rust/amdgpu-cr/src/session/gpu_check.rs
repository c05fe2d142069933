//! `criu-rocm gpu-check DIR`: whether the GPU images in DIR can be restored
//! on this host, judged and worded here; the C boundary only prints the
//! lines and returns the status.

use std::path::Path;

use super::incomplete;
use super::restore::{self, RestoreOptions};

/// Where a line of the report goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The report proper.
    Out,
    /// Why the check itself could not run.
    Err,
}

/// What gpu-check prints, line by line, and its verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuCheck {
    pub lines: Vec<(Stream, String)>,
    /// 0: restorable (or no GPU state); else a positive errno: `ENODEV`
    /// not restorable here, `EINVAL` incomplete images, another errno when
    /// the check could not run.
    pub errno: i32,
}

impl GpuCheck {
    fn failed(line: String, errno: i32) -> Self {
        GpuCheck {
            lines: vec![(Stream::Err, format!("criu-rocm gpu-check: {line}"))],
            errno,
        }
    }
}

/// Checks the images of `dir` with the knobs of the environment
/// ([`restore::dry_run`]) and words the verdict.
pub fn gpu_check(dir: &Path) -> GpuCheck {
    let opts = match RestoreOptions::from_env() {
        Ok(o) => o,
        Err(e) => return GpuCheck::failed(e.to_string(), e.errno()),
    };
    if let Some(refused) = refused_unread(dir, &opts) {
        return refused;
    }
    match restore::dry_run(dir, &opts) {
        Ok(run) => verdict(dir, &run),
        Err(e) => GpuCheck::failed(format!("{}: {e}", dir.display()), e.errno()),
    }
}

/// The refusals that come before any image is parsed: an incomplete dump,
/// and (with a verification key) images that are not the signed ones.
fn refused_unread(dir: &Path, opts: &RestoreOptions) -> Option<GpuCheck> {
    let d = dir.display();
    if let Err(why) = incomplete::check(dir) {
        return Some(GpuCheck {
            lines: vec![(Stream::Out, format!("{d}: NOT restorable: {why}"))],
            errno: libc::EINVAL,
        });
    }
    // The signature first: nothing of an image it refuses is parsed.
    let refusals = crate::validate::signature::verify_required(dir, opts.verify_key.as_ref()?);
    if refusals.is_empty() {
        return None;
    }
    let mut lines: Vec<_> = refusals
        .iter()
        .map(|r| (Stream::Out, format!("{d}: NOT restorable here: {r}")))
        .collect();
    lines.push((
        Stream::Out,
        format!(
            "{d}: not the signed images ({} reason(s) above)",
            refusals.len()
        ),
    ));
    Some(GpuCheck {
        lines,
        errno: libc::EINVAL,
    })
}

/// The dry run's verdict: its warning and notes, then one line per KFD
/// image and per other reason, then the sum.
fn verdict(dir: &Path, run: &restore::DryRun) -> GpuCheck {
    let d = dir.display();
    let mut lines = Vec::new();
    let mut out = |l: String| lines.push((Stream::Out, l));
    if let Some(w) = &run.report.warning {
        out(format!("{d}: warning: {w}"));
    }
    for n in &run.report.notes {
        out(format!("{d}: note: {n}"));
    }
    let entries = &run.entries;
    let others = &run.report.other;
    if entries.is_empty() && others.is_empty() && !run.report.has_gpu_state {
        out(format!(
            "{d}: no GPU state in these images; nothing GPU-specific to check"
        ));
        return GpuCheck { lines, errno: 0 };
    }
    let mut bad = 0;
    for e in entries {
        let who = match e.pid {
            Some(pid) => format!("pid {pid} (KFD image {})", e.id),
            None => format!("KFD image {}", e.id),
        };
        match &e.verdict {
            Ok(map) => out(format!("{who}: restorable: {map}")),
            Err(why) => {
                bad += 1;
                out(format!("{who}: NOT restorable here: {why}"));
            }
        }
    }
    for r in others {
        bad += 1;
        out(format!("{d}: NOT restorable here: {r}"));
    }
    let errno = if bad == 0 {
        out(format!(
            "{d}: all {} GPU process(es) can be restored on this host",
            entries.len()
        ));
        0
    } else {
        out(format!(
            "{d}: cannot be restored on this host ({bad} reason(s) above; {} KFD image(s))",
            entries.len()
        ));
        libc::ENODEV
    };
    GpuCheck { lines, errno }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory without GPU images: nothing to check, status 0; one that
    /// cannot be listed: the check could not run, with the errno.
    #[test]
    fn no_gpu_state_and_unreadable_directories() {
        let dir = crate::image::tests::tempdir();
        let c = gpu_check(&dir);
        assert_eq!(c.errno, 0, "{c:?}");
        assert_eq!(c.lines.len(), 1, "{c:?}");
        assert!(
            c.lines[0].1.contains("no GPU state in these images"),
            "{c:?}"
        );
        let gone = dir.join("nonexistent");
        let c = gpu_check(&gone);
        assert_eq!(c.errno, libc::ENOENT, "{c:?}");
        assert!(c.lines.iter().all(|(s, _)| *s == Stream::Err), "{c:?}");
        assert!(c.lines[0].1.starts_with("criu-rocm gpu-check: "), "{c:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
