//! The thunk's (libhsakmt's) shared bookkeeping in `/dev/shm`: what a dump
//! records of it and what a restore recreates.

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

    /// Recreates the file with the recorded size, magic and mode (0666
    /// when none was recorded) when it is missing in the restored task's
    /// mount namespace; the rest of its contents (thunk counters) is not
    /// saved, as upstream.  CRIU then finds the file as the process had it
    /// mapped, mode included.  An existing file is left alone.  Returns
    /// whether it was created.
    pub fn recreate(&self, path: &Path) -> io::Result<bool> {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        if self.size == 0 {
            return Ok(false);
        }
        if path.exists() {
            return Ok(false);
        }
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
            Ok(_) => Ok(true),
            Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e.error),
        }
    }
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
