//! CRIU's image streamer (`--stream`): the GPU image files through it.
//!
//! With `--stream` CRIU opens every image file through the streamer's
//! socket (`streamer-capture.sock` at dump, `streamer-serve.sock` at
//! restore, in the image directory): one request naming the file, one pipe
//! per file, written or read once from start to end.  The streamer serves
//! each file once.  The C side opens the pipes (CRIU's `img_streamer_open`,
//! under CRIU's lock of the socket); the core gets them through the
//! [`Opener`] given to [`start`].
//!
//! What goes where:
//!
//! * The pages files are written and read through their pipes as they are
//!   copied, in order: one copy lane per GPU, zero blocks written as zeros
//!   (a pipe has no holes), compressed records placed in order
//!   ([`Pipe::write_at`] refuses to go back).
//! * The metadata files (KFD and render-node images, `amdgpu-digests.img`:
//!   a few hundred bytes per BO) are kept in a private tmpfs mounted
//!   nowhere ([`Streamer::staging`]), which the rest of the core uses as
//!   the image directory.  The dump validates them there and sends them
//!   after the pages files, `amdgpu-digests.img` last; the restore fetches
//!   them first (the digests file names the others), and validates them
//!   before any task exists or any device is opened.  The pages files are
//!   checked as they are read (size word, records, end of stream, BO
//!   hashes), before any restored task runs.
//!
//! The streamer is process-wide: CRIU's `--stream` is (one criu process
//! runs one dump or restore).  A restored task, a fork of criu main,
//! inherits it.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::os::fd::{poll_one, set_nonblocking};

/// Opens a file through the streamer: the pipe's end of this process
/// (write end at dump, read end at restore), or `None` when the streamer
/// has no such file (restore).
pub type Opener = Box<dyn Fn(&str) -> io::Result<Option<OwnedFd>> + Send + Sync>;

/// The streamer of this process and the staging directory of its GPU
/// metadata.
pub struct Streamer {
    open: Opener,
    stall: Duration,
    staging: OwnedFd,
    /// Bytes sent per pages file (dump), for the digests.
    sent: Mutex<BTreeMap<String, u64>>,
}

static ACTIVE: RwLock<Option<Arc<Streamer>>> = RwLock::new(None);

/// Makes `open` this process' streamer, with a new staging directory;
/// `stall`: how long a pipe may take or give nothing.
pub fn start(open: Opener, stall: Duration) -> io::Result<Arc<Streamer>> {
    let staging = crate::os::file::private_tmpfs()?;
    let s = Arc::new(Streamer {
        open,
        stall,
        staging,
        sent: Mutex::new(BTreeMap::new()),
    });
    *ACTIVE.write().unwrap_or_else(|e| e.into_inner()) = Some(s.clone());
    Ok(s)
}

/// This process' streamer, when it streams.
pub fn active() -> Option<Arc<Streamer>> {
    ACTIVE.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Forgets the streamer (its staging directory goes with the last fd).
pub fn stop() {
    ACTIVE.write().unwrap_or_else(|e| e.into_inner()).take();
}

impl Streamer {
    /// The staging directory's fd.
    pub fn staging_fd(&self) -> BorrowedFd<'_> {
        self.staging.as_fd()
    }

    /// The staging directory, as a path of this process.
    pub fn staging(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.staging.as_raw_fd()))
    }

    pub fn stall(&self) -> Duration {
        self.stall
    }

    /// Dump: a new file `name` in the stream.
    pub fn create(&self, name: &str) -> io::Result<Pipe> {
        match (self.open)(name)? {
            Some(fd) => Pipe::new(fd, name, self.stall),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("the image streamer did not take {name}"),
            )),
        }
    }

    /// Restore: file `name` of the stream (`None`: it has none).
    pub fn open(&self, name: &str) -> io::Result<Option<Pipe>> {
        (self.open)(name)?
            .map(|fd| Pipe::new(fd, name, self.stall))
            .transpose()
    }

    /// Restore: the read end of file `name`'s pipe, as the streamer gave
    /// it (`None`: it has no such file).
    pub fn open_raw(&self, name: &str) -> io::Result<Option<OwnedFd>> {
        (self.open)(name)
    }

    /// Dump: sends the staged file `name` into the stream; its size.
    pub fn send_staged(&self, name: &str) -> io::Result<u64> {
        let mut f = std::fs::File::open(self.staging().join(name))?;
        let mut out = self.create(name)?;
        let n = io::copy(&mut f, &mut out)?;
        out.flush()?;
        Ok(n)
    }

    /// Restore: fetches file `name` of the stream whole into the staging
    /// directory, refusing more than `max` bytes; `false`: the stream has
    /// no such file.
    pub fn fetch(&self, name: &str, max: u64) -> io::Result<bool> {
        let Some(mut input) = self.open(name)? else {
            return Ok(false);
        };
        let mut bytes = Vec::new();
        (&mut input).take(max).read_to_end(&mut bytes)?;
        if bytes.len() as u64 == max && !input.at_end()? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{name}: more than the {max} bytes the dump recorded"),
            ));
        }
        crate::image::write_whole(&self.staging().join(name), &bytes)?;
        Ok(true)
    }

    /// Dump: records that `bytes` of pages file `name` were sent.
    pub fn note_sent(&self, name: &str, bytes: u64) {
        self.sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned(), bytes);
    }

    /// Dump: the bytes sent of pages file `name`.
    pub fn sent(&self, name: &str) -> Option<u64> {
        self.sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .copied()
    }
}

/// This process' end of one file's pipe: written or read from start to
/// end, each wait for the streamer bounded by the stall time.
#[derive(Debug)]
pub struct Pipe {
    fd: OwnedFd,
    name: String,
    stall: Duration,
    /// Bytes written or read so far.
    pos: u64,
}

/// A block of zeros, for the holes a pipe cannot have.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

impl Pipe {
    /// Wraps `fd`, the pipe's end of file `name` (made non-blocking).
    pub fn new(fd: OwnedFd, name: &str, stall: Duration) -> io::Result<Self> {
        set_nonblocking(fd.as_fd())?;
        Ok(Pipe {
            fd,
            name: name.to_owned(),
            stall,
            pos: 0,
        })
    }

    /// The file's name in the stream.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes written or read so far.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Waits until the streamer takes or gives bytes.
    fn wait(&self, events: libc::c_short, what: &str) -> io::Result<()> {
        if poll_one(self.fd.as_fd(), events, self.stall)? {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the image streamer {what} no byte of {} for {} s ({})",
                self.name,
                self.stall.as_secs(),
                crate::env::STREAM_TIMEOUT_VAR
            ),
        ))
    }

    /// Writes `buf` at file offset `at`, the bytes between the end so far
    /// and `at` as zeros; a pipe cannot go back.
    pub fn write_at(&mut self, buf: &[u8], at: u64) -> io::Result<()> {
        self.pad_to(at)?;
        if at != self.pos {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: a write at offset {at} after offset {} (a stream is written in order)",
                    self.name, self.pos
                ),
            ));
        }
        self.write_all(buf)
    }

    /// Writes zeros up to file offset `end`.
    pub fn pad_to(&mut self, end: u64) -> io::Result<()> {
        while self.pos < end {
            let n = (end - self.pos).min(ZEROS.len() as u64) as usize;
            self.write_all(&ZEROS[..n])?;
        }
        Ok(())
    }

    /// Whether the file ends here (the streamer closed the pipe).
    pub fn at_end(&mut self) -> io::Result<bool> {
        let mut b = [0u8; 1];
        Ok(self.read(&mut b)? == 0)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            match crate::os::fd::write_once(self.fd.as_fd(), buf) {
                Ok(n) => {
                    self.pos += n as u64;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.wait(libc::POLLOUT, "took")?
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        format!(
                            "the image streamer closed {} after {} bytes",
                            self.name, self.pos
                        ),
                    ))
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            // SAFETY: read fills at most `buf.len()` bytes of our buffer.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                self.pos += n as u64;
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => self.wait(libc::POLLIN, "gave")?,
                io::ErrorKind::Interrupted => {}
                _ => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (OwnedFd, OwnedFd) {
        crate::os::fd::pipe().unwrap()
    }

    #[test]
    fn writes_in_order_with_zeros_between() {
        let (r, w) = pipe();
        let mut out = Pipe::new(w, "f", Duration::from_secs(5)).unwrap();
        let reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            std::fs::File::from(r).read_to_end(&mut v).unwrap();
            v
        });
        out.write_at(b"ab", 0).unwrap();
        out.write_at(b"cd", 100_000).unwrap();
        assert!(out.write_at(b"x", 5).is_err());
        out.pad_to(100_010).unwrap();
        drop(out);
        let v = reader.join().unwrap();
        assert_eq!(v.len(), 100_010);
        assert_eq!(&v[..2], b"ab");
        assert!(v[2..100_000].iter().all(|&b| b == 0));
        assert_eq!(&v[100_000..100_002], b"cd");
    }

    #[test]
    fn a_streamer_that_stops_taking_times_out() {
        let (_r, w) = pipe();
        let mut out = Pipe::new(w, "amdgpu-pages-5-1e8f.img", Duration::from_secs(1)).unwrap();
        let e = out.write_all(&vec![1u8; 1 << 20]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("amdgpu-pages-5-1e8f.img"), "{e}");
    }

    #[test]
    fn a_streamer_that_dies_breaks_the_pipe() {
        // SAFETY: ignoring SIGPIPE, as CRIU does, turns the signal into EPIPE.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let (r, w) = pipe();
        drop(r);
        let mut out = Pipe::new(w, "f", Duration::from_secs(1)).unwrap();
        let e = out.write_all(b"x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn reads_to_the_end() {
        let (r, w) = pipe();
        let mut input = Pipe::new(r, "f", Duration::from_secs(5)).unwrap();
        std::fs::File::from(w).write_all(b"xyz").unwrap();
        let mut b = [0u8; 3];
        input.read_exact(&mut b).unwrap();
        assert!(input.at_end().unwrap());
        assert_eq!(input.pos(), 3);
    }
}
