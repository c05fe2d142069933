//! The metadata files of streamed images (`--stream`, see
//! [`crate::stream`]): sent after a dump has validated them, fetched
//! before a restore validates them.

use std::collections::BTreeSet;

use crate::stream::Streamer;
use crate::validate::digests::{self, Digests};

/// Dump: sends every file of the staging directory (KFD and render-node
/// images) into the stream, [`digests::FILE`] last: a stream without it is
/// a dump that did not complete, which the restore refuses.  `Err`: why
/// not (the dump then fails).
pub fn send_staging(streamer: &Streamer) -> Result<(), String> {
    let dir = streamer.staging();
    let names: BTreeSet<String> = std::fs::read_dir(&dir)
        .map_err(|e| format!("listing the GPU images staged for the image streamer: {e}"))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n != digests::FILE)
        .collect();
    let last = dir
        .join(digests::FILE)
        .exists()
        .then_some(digests::FILE.to_owned());
    let mut bytes = 0;
    for name in names.iter().chain(last.iter()) {
        bytes += streamer
            .send_staged(name)
            .map_err(|e| format!("{name}: sending it to the image streamer: {e}"))?;
    }
    if !names.is_empty() {
        log::info!(
            "sent {} GPU metadata file(s), {bytes} bytes, to the image streamer",
            names.len() + last.iter().count()
        );
    }
    Ok(())
}

/// Restore: fetches [`digests::FILE`] from the stream, then every file it
/// lists but the pages files (which the GPU memory writer reads from the
/// stream as it copies), into the staging directory, each at most the
/// size the dump recorded.  Called when CRIU's inventory names the AMD GPU
/// plugin: a stream without the digests file is refused (a dump that did
/// not complete, or images in upstream's layout, whose GPU files a stream
/// cannot list).
pub fn fetch_metadata(streamer: &Streamer) -> Result<(), String> {
    const MAX_DIGESTS: u64 = 64 << 20;
    let fetched = streamer
        .fetch(digests::FILE, MAX_DIGESTS)
        .map_err(|e| format!("{}: from the image streamer: {e}", digests::FILE))?;
    if !fetched {
        return Err(format!(
            "{}: the image streamer has none, though inventory.img names the AMD GPU plugin: \
             a dump that did not complete, or images of another layout, whose GPU files a \
             stream cannot list; restore them from an image directory",
            digests::FILE
        ));
    }
    let bytes = std::fs::read(streamer.staging().join(digests::FILE))
        .map_err(|e| format!("{}: {e}", digests::FILE))?;
    let list = Digests::parse(&bytes).map_err(|r| r.to_string())?;
    let mut n = 0;
    for (name, size) in list.metadata_files() {
        match streamer.fetch(name, size) {
            Ok(true) => n += 1,
            Ok(false) => {
                return Err(format!(
                    "{name}: the image streamer has none, though {} lists it",
                    digests::FILE
                ))
            }
            Err(e) => return Err(format!("{name}: from the image streamer: {e}")),
        }
    }
    log::info!(
        "fetched {} and {n} GPU metadata file(s) from the image streamer",
        digests::FILE
    );
    Ok(())
}
