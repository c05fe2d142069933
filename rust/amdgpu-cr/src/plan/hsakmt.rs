//! The thunk's (libhsakmt's) shared bookkeeping in `/dev/shm`: what a dump
//! records of it and what a restore recreates.

use std::fs::File;
use std::io;
use std::path::Path;

/// Facts about the thunk's (libhsakmt's) shared bookkeeping recorded at
/// dump: `/dev/shm/hsakmt_shared_mem` (size, first word, mode) and the
/// mode of its semaphore `/dev/shm/sem.hsakmt_semaphore`.  Modes are
/// permission bits, 0 when not recorded (images of upstream or of older
/// criu-rocm).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedMem {
    pub size: u64,
    pub magic: u32,
    pub mode: u32,
    pub semaphore_mode: u32,
}

/// Where the thunk (libhsakmt) keeps its shared bookkeeping.
pub const HSAKMT_SHM: &str = "/dev/shm/hsakmt_shared_mem";

/// The file behind the thunk's semaphore (glibc keeps named semaphores in
/// `/dev/shm/sem.<name>`).
pub const HSAKMT_SEMAPHORE_FILE: &str = "/dev/shm/sem.hsakmt_semaphore";

/// Mode the thunk asks for when it creates either file.
const THUNK_MODE: u32 = 0o666;

fn permission_bits(path: &Path) -> io::Result<u32> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Ok(m) => Ok(m.permissions().mode() & 0o7777),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

fn mode_or_default(mode: u32) -> u32 {
    if mode == 0 {
        THUNK_MODE
    } else {
        mode
    }
}

impl SharedMem {
    /// Records the size, first 32-bit word (little endian) and mode of the
    /// thunk's shared memory file `shm` and the mode of its semaphore file
    /// `sem` (both read through the dumped task's root); size 0 when the
    /// shared memory does not exist.
    pub fn probe(shm: &Path, sem: &Path) -> io::Result<Self> {
        use std::io::Read;
        let semaphore_mode = permission_bits(sem)?;
        let mut f = match std::fs::File::open(shm) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(SharedMem {
                    semaphore_mode,
                    ..SharedMem::default()
                })
            }
            Err(e) => return Err(e),
        };
        let md = f.metadata()?;
        let mut word = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            match f.read(&mut word[got..])? {
                0 => break,
                n => got += n,
            }
        }
        use std::os::unix::fs::PermissionsExt;
        Ok(SharedMem {
            size: md.len(),
            magic: u32::from_le_bytes(word),
            mode: md.permissions().mode() & 0o7777,
            semaphore_mode,
        })
    }

    /// The file at `path` opened, recreated first with the recorded size,
    /// magic and mode (0666 when none was recorded) when it is missing in
    /// the restored task's mount namespace; the rest of its contents (thunk
    /// counters) is not saved, as upstream.  An existing file is left
    /// alone.  `None` when the process had no such file; otherwise the file
    /// and whether it was created.
    ///
    /// The file returned is the one checked or made here, whatever happens
    /// to the name afterwards: libhsakmt removes the name whenever one of
    /// its processes closes KFD, and another ROCm program may make a new
    /// one.  CRIU opens the task's fd and mapping of the file through it.
    pub fn open_or_recreate(&self, path: &Path) -> io::Result<Option<(File, bool)>> {
        if self.size == 0 {
            return Ok(None);
        }
        for _ in 0..VANISH_RETRIES {
            match File::open(path) {
                Ok(f) => return Ok(Some((f, false))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            if let Some(f) = self.create(path)? {
                return Ok(Some((f, true)));
            }
        }
        Err(vanished(path))
    }

    /// Creates the file whole, or `None` when another one took the name
    /// meanwhile.
    fn create(&self, path: &Path) -> io::Result<Option<File>> {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        // Built under a random name of its own (`tempfile`: created
        // exclusively, removed on any error) and moved into place whole,
        // never over an existing file: the other restored processes of a
        // tree recreate the same file at the same time, and one that found
        // it half made (size 0) would fail CRIU's size check of the
        // restored mapping.
        let mode = mode_or_default(self.mode);
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::Builder::new()
            .prefix(".criu-rocm-")
            .tempfile_in(dir)?;
        // Neither the restorer's umask nor tempfile's 0600 is the mode.
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(mode))?;
        tmp.as_file().set_len(self.size)?;
        let n = self.size.min(4) as usize;
        tmp.write_all(&self.magic.to_le_bytes()[..n])?;
        match tmp.persist_noclobber(path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(e.error),
        }
    }
}

/// How often a file whose name disappears between its creation (or
/// check) and its opening is looked at again before giving up: every
/// round means another process removed it in that window.
const VANISH_RETRIES: usize = 64;

fn vanished(path: &Path) -> io::Error {
    io::Error::other(format!(
        "{} was removed again each of {VANISH_RETRIES} times right after it was found or made",
        path.display()
    ))
}

/// Name of the thunk's POSIX semaphore guarding its shared memory.
pub const HSAKMT_SEMAPHORE: &std::ffi::CStr = c"/hsakmt_semaphore";

/// Makes sure the named POSIX semaphore exists, created with value 1 (as
/// the thunk creates it) and the permission bits `mode` (0666 when 0) on
/// its file `file`, without changing an existing one.  Returns whether it
/// was created.
pub fn ensure_semaphore(name: &std::ffi::CStr, file: &Path, mode: u32) -> io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    let mode = mode_or_default(mode);
    if !crate::os::file::create_semaphore(name, mode, 1)? {
        return Ok(false);
    }
    // sem_open applied our umask.
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode))?;
    Ok(true)
}

/// [`ensure_semaphore`], and its file `file` opened: the semaphore made
/// or found here, whatever happens to the name afterwards (see
/// [`SharedMem::open_or_recreate`]).  Returns the file and whether the
/// semaphore was created.
pub fn open_semaphore(name: &std::ffi::CStr, file: &Path, mode: u32) -> io::Result<(File, bool)> {
    for _ in 0..VANISH_RETRIES {
        let created = ensure_semaphore(name, file, mode)?;
        match File::open(file) {
            Ok(f) => return Ok((f, created)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Err(vanished(file))
}
