//! The one CRIU image the GPU code reads besides its own: the process tree
//! (`pstree.img`), so that a KFD image can be checked against the processes
//! the images restore.  The format is CRIU's: a `u32` common magic, the
//! image's `u32` magic, then entries, each a `u32` size and a protobuf
//! `PstreeEntry` (`pid` is field 1), all little endian.

use std::collections::BTreeSet;
use std::path::Path;

use prost::Message;

/// `IMG_COMMON_MAGIC` of CRIU's `magic.h`.
const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
/// `PSTREE_MAGIC` of CRIU's `magic.h`.
const PSTREE_MAGIC: u32 = 0x5027_3030;
/// A pstree entry is a few words per thread; a bigger one is damage.
const ENTRY_MAX: usize = 1 << 20;

/// The part of CRIU's `PstreeEntry` read here.
#[derive(Clone, PartialEq, Message)]
struct PstreeEntry {
    #[prost(uint32, tag = "1")]
    pid: u32,
}

/// The pids of the processes `pstree.img` in `dir` restores; `Ok(None)`
/// when the directory has no `pstree.img`.
pub fn pstree_pids(dir: &Path) -> Result<Option<BTreeSet<u32>>, String> {
    let path = dir.join("pstree.img");
    let data = match std::fs::read(&path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    parse_pstree(&data)
        .map(Some)
        .map_err(|why| format!("{}: {why}", path.display()))
}

fn parse_pstree(data: &[u8]) -> Result<BTreeSet<u32>, String> {
    let word = |at: usize| -> Option<u32> {
        data.get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    if word(0) != Some(IMG_COMMON_MAGIC) || word(4) != Some(PSTREE_MAGIC) {
        return Err("not a CRIU process-tree image (bad magic)".into());
    }
    let mut pids = BTreeSet::new();
    let mut at = 8;
    while at < data.len() {
        let size = word(at).ok_or("a truncated entry size")? as usize;
        at += 4;
        if size > ENTRY_MAX {
            return Err(format!("an entry of {size} bytes"));
        }
        let entry = data.get(at..at + size).ok_or("a truncated entry")?;
        let e = PstreeEntry::decode(entry).map_err(|e| format!("an entry: {e}"))?;
        pids.insert(e.pid);
        at += size;
    }
    Ok(pids)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pstree.img of one process (pid 33, threads 33, 38, 39) as CRIU
    /// 4.1.1 wrote it.
    const ONE: [u8; 26] = [
        0x19, 0x43, 0x56, 0x54, 0x30, 0x30, 0x27, 0x50, 0x0e, 0x00, 0x00, 0x00, 0x08, 0x21, 0x10,
        0x00, 0x18, 0x21, 0x20, 0x21, 0x28, 0x21, 0x28, 0x26, 0x28, 0x27,
    ];

    #[test]
    fn criu_pstree_images_read() {
        assert_eq!(parse_pstree(&ONE).unwrap(), BTreeSet::from([33]));
        let mut two = ONE.to_vec();
        two.extend_from_slice(&[4, 0, 0, 0, 0x08, 0x22, 0x10, 0x21]);
        assert_eq!(parse_pstree(&two).unwrap(), BTreeSet::from([33, 34]));
        assert!(parse_pstree(&ONE[..20]).unwrap_err().contains("truncated"));
        let mut bad = ONE;
        bad[4] ^= 1;
        assert!(parse_pstree(&bad).unwrap_err().contains("magic"));
        let d = crate::image::tests::tempdir();
        assert_eq!(pstree_pids(&d).unwrap(), None);
        std::fs::write(d.join("pstree.img"), ONE).unwrap();
        assert_eq!(pstree_pids(&d).unwrap(), Some(BTreeSet::from([33])));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
