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

/// The dump completed: `dir` holds a whole image.
pub fn clear(dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(dir.join(MARKER)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// `Err` with the reason when `dir` holds an incomplete dump.
pub fn check(dir: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(dir.join(MARKER)) {
        Ok(_) => Err(format!(
            "incomplete dump: {} holds {MARKER}: the dump that wrote these images did not \
             complete (it failed or criu-rocm was killed), so they are not restored",
            dir.display()
        )),
        Err(_) => Ok(()),
    }
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
        clear(&d).unwrap();
        assert!(check(&d).is_ok());
        clear(&d).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}
