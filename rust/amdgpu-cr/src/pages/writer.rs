//! [`PagesWriter`]: writes a pages file, leaving zero blocks as holes.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::out::{AlignedOut, OutFile};
use super::zstd::{Compress, ZstdOut, ZstdPagesFile};
use super::{all_zero, pages_image_name, SPARSE_BLOCK};
use crate::ids::GpuId;
use crate::image::{FileId, ImageError};

/// A pages writer's buffer unless the memory budget gives it less.
const WRITE_BUFFER: usize = 1 << 20;

/// Writes one GPU's pages file (or one lane's range of it): the size word,
/// then the BO bytes, the whole file in upstream's layout.  The file is
/// sized to its end when created, and every file block
/// ([`SPARSE_BLOCK`]) whose bytes are all zero is seeked past rather than
/// written, so it stays a hole: it costs no disk blocks and reads as zeros,
/// to upstream's plugin as to us.  A compressed file (see [`super::zstd`])
/// takes the bytes as chunk records instead.
pub struct PagesWriter {
    file: String,
    total: u64,
    written: u64,
    sink: Sink,
}

/// Where a [`PagesWriter`]'s bytes go.
enum Sink {
    Sparse(Sparse),
    Zstd(Box<ZstdOut>),
}

/// The bytes in upstream's layout, zero blocks left as holes.
struct Sparse {
    out: AlignedOut,
    /// File offset of the next byte given to the writer.
    off: u64,
    /// The bytes of the current file block given so far (from the block's
    /// start, or from the lane's start for a lane that starts mid-block).
    partial: Vec<u8>,
    /// Zero bytes held back: `out` is this far behind `off - partial`.
    skip: u64,
    /// Bytes left as holes.
    zero_bytes: u64,
}

impl Sparse {
    /// Writes `f` from file offset `off` on, through a buffer of `buffer`
    /// bytes.
    fn new(f: impl Into<OutFile>, off: u64, buffer: usize) -> Self {
        Sparse {
            out: AlignedOut::new(f, off, buffer),
            off,
            partial: Vec::with_capacity(SPARSE_BLOCK as usize),
            skip: 0,
            zero_bytes: 0,
        }
    }

    /// Takes `len` zero bytes without being given them: the file blocks
    /// the range covers whole are seeked past (holes, as written zero
    /// blocks are); the zeros that share a block with the bytes before or
    /// after it join that block.
    fn hole(&mut self, len: u64) -> io::Result<()> {
        let head = ((SPARSE_BLOCK - self.off % SPARSE_BLOCK) % SPARSE_BLOCK).min(len);
        self.put(&ZEROS[..head as usize])?;
        let rest = len - head;
        let whole = rest - rest % SPARSE_BLOCK;
        // `put` of `whole` zeros, without looking at them.
        self.skip += whole;
        self.zero_bytes += whole;
        self.off += whole;
        self.put(&ZEROS[..(rest - whole) as usize])
    }

    /// Writes the last block (a zero tail is left as the hole the file was
    /// created with; a pipe gets it as zeros) and flushes.
    fn finish(&mut self) -> io::Result<()> {
        self.end_block()?;
        self.out.end(self.off)
    }

    /// Writes `data` at `off - partial - data.len()`, after the zeros held
    /// back (left as holes).  The bytes go through `out`'s buffer, placed
    /// at their file offset's place in the page, so that the kernel's copy
    /// into the page cache runs aligned (see [`super::out`]).
    fn emit(&mut self, data: &[u8]) -> io::Result<()> {
        if self.skip > 0 {
            self.out.skip(self.skip)?;
            self.skip = 0;
        }
        self.out.write_all(data)
    }

    /// Writes or skips the bytes of the current block.
    fn end_block(&mut self) -> io::Result<()> {
        if self.partial.is_empty() {
            return Ok(());
        }
        let block = std::mem::take(&mut self.partial);
        if all_zero(&block) {
            self.skip += block.len() as u64;
            self.zero_bytes += block.len() as u64;
        } else {
            self.emit(&block)?;
        }
        self.partial = block;
        self.partial.clear();
        Ok(())
    }

    /// Takes all of `buf` at `off`: whole zero blocks are skipped, the
    /// rest written in runs; a block begun but not ended waits in
    /// `partial`.
    fn put(&mut self, mut buf: &[u8]) -> io::Result<()> {
        let into_block = self.off % SPARSE_BLOCK;
        if into_block != 0 || !self.partial.is_empty() {
            let take = ((SPARSE_BLOCK - into_block) as usize).min(buf.len());
            self.partial.extend_from_slice(&buf[..take]);
            buf = &buf[take..];
            self.off += take as u64;
            if self.off.is_multiple_of(SPARSE_BLOCK) {
                self.end_block()?;
            }
        }
        let whole = buf.len() - buf.len() % SPARSE_BLOCK as usize;
        let mut run = 0; // start of the run of data blocks not yet written
        let mut at = 0;
        while at < whole {
            let next = at + SPARSE_BLOCK as usize;
            if all_zero(&buf[at..next]) {
                if run < at {
                    self.emit(&buf[run..at])?;
                }
                self.skip += SPARSE_BLOCK;
                self.zero_bytes += SPARSE_BLOCK;
                run = next;
            }
            at = next;
        }
        if run < whole {
            self.emit(&buf[run..whole])?;
        }
        self.partial.extend_from_slice(&buf[whole..]);
        self.off += buf.len() as u64;
        Ok(())
    }
}

/// A block of zeros, for holes.
static ZEROS: [u8; SPARSE_BLOCK as usize] = [0; SPARSE_BLOCK as usize];

impl PagesWriter {
    /// Creates `amdgpu-pages-<id>-<gpu>.img` in `dir` for `total` bytes.
    pub fn create(dir: &Path, id: FileId, gpu: GpuId, total: u64) -> Result<Self, ImageError> {
        Self::create_with(dir, id, gpu, total, WRITE_BUFFER)
    }

    fn create_with(
        dir: &Path,
        id: FileId,
        gpu: GpuId,
        total: u64,
        buffer: usize,
    ) -> Result<Self, ImageError> {
        let name = pages_image_name(id, gpu);
        let path = dir.join(&name);
        let file = path.display().to_string();
        let f = OutFile::create(&path, &name).map_err(|e| ImageError::io(&file, "create", e))?;
        // The whole file is a hole at first: what is never written reads
        // as zeros (a pipe gets its zeros in order).
        if !f.is_pipe() {
            f.set_len(total.saturating_add(8))
                .map_err(|e| ImageError::io(&file, "ftruncate", e))?;
        }
        let mut sparse = Sparse::new(f, 0, buffer);
        sparse
            .put(&total.to_le_bytes())
            .map_err(|e| ImageError::io(&file, "write header", e))?;
        Ok(PagesWriter {
            file,
            total,
            written: 0,
            sink: Sink::Sparse(sparse),
        })
    }

    /// Creates the pages file for the sum of `lens` and returns one writer
    /// per lane: lane `i` writes the `lens[i]` bytes that follow the lanes
    /// before it, so lanes can run in parallel.
    pub fn create_lanes(
        dir: &Path,
        id: FileId,
        gpu: GpuId,
        lens: &[u64],
    ) -> Result<Vec<Self>, ImageError> {
        Self::create_lanes_buffered(dir, id, gpu, lens, WRITE_BUFFER)
    }

    /// [`PagesWriter::create_lanes`] with write buffers of `buffer` bytes
    /// (part of the memory budget, see `env::lane_split`).
    pub fn create_lanes_buffered(
        dir: &Path,
        id: FileId,
        gpu: GpuId,
        lens: &[u64],
        buffer: usize,
    ) -> Result<Vec<Self>, ImageError> {
        let name = pages_image_name(id, gpu);
        let total = lens
            .iter()
            .try_fold(0u64, |t, &l| t.checked_add(l))
            .ok_or_else(|| ImageError::invalid(&name, "size", "lane sizes overflow"))?;
        if lens.len() > 1 && crate::stream::active().is_some() {
            return Err(ImageError::invalid(
                &name,
                "size",
                "a streamed pages file is written by one copy lane",
            ));
        }
        let mut first = Self::create_with(dir, id, gpu, total, buffer)?;
        let Some((&len0, rest)) = lens.split_first() else {
            return Ok(vec![first]);
        };
        first.total = len0;
        let path = dir.join(name);
        let mut out = vec![first];
        let mut start = len0;
        for &len in rest {
            let file = out[0].file.clone();
            let f = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
                .map_err(|e| ImageError::io(&file, "open", e))?;
            out.push(PagesWriter {
                file,
                total: len,
                written: 0,
                sink: Sink::Sparse(Sparse::new(f, 8 + start, buffer)),
            });
            start += len;
        }
        Ok(out)
    }

    /// Creates the compressed pages file of the content BOs `bos` (bucket
    /// index, size) in `dir` (see [`super::zstd`]), in chunks of
    /// [`super::zstd::CHUNK`], written in order by this one writer (a dump
    /// compresses in lanes through [`super::zstd::ZstdPagesFile`]).
    pub fn create_compressed(
        dir: &Path,
        id: FileId,
        gpu: GpuId,
        bos: &[(usize, u64)],
        c: Compress,
    ) -> Result<Self, ImageError> {
        let f = ZstdPagesFile::create(dir, id, gpu, bos, super::zstd::CHUNK)?;
        let file = f.file().to_owned();
        let total = f.chunks().iter().map(|c| c.len).sum();
        let z = ZstdOut::new(f, c.level).map_err(|e| ImageError::io(&file, "zstd", e))?;
        Ok(PagesWriter {
            file,
            total,
            written: 0,
            sink: Sink::Zstd(Box::new(z)),
        })
    }

    /// The file's path, for messages.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// Bytes so far left as holes (a compressed file: zero chunks).
    pub fn zero_bytes(&self) -> u64 {
        match &self.sink {
            Sink::Sparse(s) => s.zero_bytes,
            Sink::Zstd(z) => z.zero_bytes,
        }
    }

    /// Takes `len` zero bytes without being given them: an incremental
    /// dump's extent that the parent holds.  The file blocks the range
    /// covers whole are seeked past (holes, as written zero blocks are);
    /// the zeros that share a block with the bytes before or after it join
    /// that block.  A compressed file takes them as data.
    pub fn hole(&mut self, len: u64) -> io::Result<()> {
        self.room(len)?;
        match &mut self.sink {
            Sink::Sparse(s) => s.hole(len)?,
            Sink::Zstd(z) => {
                let mut left = len;
                while left > 0 {
                    let n = left.min(SPARSE_BLOCK);
                    z.put(&ZEROS[..n as usize])?;
                    left -= n;
                }
            }
        }
        self.written += len;
        Ok(())
    }

    /// Whether `len` more bytes fit in what the header announced.
    fn room(&self, len: u64) -> io::Result<()> {
        if len > self.total - self.written {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: write past the {} bytes announced in the header",
                    self.file, self.total
                ),
            ));
        }
        Ok(())
    }

    /// Checks that exactly the announced bytes were written and flushes.
    pub fn finish(mut self) -> Result<u64, ImageError> {
        if self.written != self.total {
            return Err(ImageError::invalid(
                &self.file,
                "contents",
                format!(
                    "{} bytes written, header announced {}",
                    self.written, self.total
                ),
            ));
        }
        let (r, what) = match &mut self.sink {
            Sink::Sparse(s) => (s.finish(), "flush"),
            Sink::Zstd(z) => (z.finish(), "write"),
        };
        r.map_err(|e| ImageError::io(&self.file, what, e))?;
        Ok(self.written)
    }
}

impl Write for PagesWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.room(buf.len() as u64)?;
        match &mut self.sink {
            Sink::Sparse(s) => s.put(buf)?,
            Sink::Zstd(z) => z.put(buf)?,
        }
        self.written += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.sink {
            Sink::Sparse(s) => s.out.flush(),
            // Whole chunks are written as they fill; `finish` writes the
            // last.
            Sink::Zstd(_) => Ok(()),
        }
    }
}
