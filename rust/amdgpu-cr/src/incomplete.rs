//! The mark of a dump that has not completed.
//!
//! The dump writes [`MARKER`] into the image directory before it writes any
//! image and removes it once every image is written, before CRIU's post-dump
//! scripts run (they may carry the directory to another host).  A dump that
//! fails, or a criu-rocm that is killed, leaves it behind, and restore and
//! `gpu-check` refuse such a directory as an "incomplete dump" instead of
//! trying to make sense of partial images.

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The marker's file name in the image directory.
pub const MARKER: &str = "criu-rocm-dump-incomplete";

/// Marks `dir` as holding a dump in progress (`pid`: the dumping criu).
pub fn mark(dir: &Path, pid: u32) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(dir.join(MARKER))?;
    writeln!(
        f,
        "criu-rocm (pid {pid}) started a dump into this directory and did not complete it:\n\
         it failed, or criu-rocm was killed.  The images here are partial; criu-rocm restore\n\
         and gpu-check refuse them.  Dump again."
    )
}

/// Heading of the reasons [`refused`] adds to the marker.
const REFUSED: &str = "The dump's own validation refused these images, as their restore would:";

/// The dump wrote every image but its validation refused them (`why`, a
/// refusal a line): the reasons go into the marker, which stays, for
/// restore and `gpu-check` to show.
pub fn refused(dir: &Path, why: &str) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join(MARKER))?;
    writeln!(f, "{REFUSED}\n{why}")
}

/// The dump completed: `dir` holds a whole image.
pub fn clear(dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(dir.join(MARKER)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// `Err` with the reason when `dir` holds an incomplete dump.
pub fn check(dir: &Path) -> Result<(), String> {
    let path = dir.join(MARKER);
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(());
    }
    let mut why = format!(
        "incomplete dump: {} holds {MARKER}: the dump that wrote these images did not \
         complete (it failed or criu-rocm was killed), so they are not restored",
        dir.display()
    );
    // What the dump's validation said, when it refused (the first lines).
    let text = crate::image::read_whole(&path, Some(64 << 10)).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    if let Some((_, reasons)) = text.split_once(REFUSED) {
        why.push_str("; the dump's validation refused them: ");
        why.push_str(
            &reasons
                .trim()
                .lines()
                .take(8)
                .collect::<Vec<_>>()
                .join("; "),
        );
    }
    Err(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_until_cleared() {
        let d = crate::image::tests::tempdir();
        assert!(check(&d).is_ok());
        mark(&d, 42).unwrap();
        let why = check(&d).unwrap_err();
        assert!(why.starts_with("incomplete dump: "), "{why}");
        assert!(std::fs::read_to_string(d.join(MARKER))
            .unwrap()
            .contains("pid 42"));
        refused(&d, "mm-5.img: vmas: 9 VMAs, more than the 8\nfiles.img: x").unwrap();
        let why = check(&d).unwrap_err();
        assert!(
            why.ends_with(
                "the dump's validation refused them: mm-5.img: vmas: 9 VMAs, more than the 8; \
                 files.img: x"
            ),
            "{why}"
        );
        clear(&d).unwrap();
        assert!(check(&d).is_ok());
        clear(&d).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}
