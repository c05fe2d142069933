//! Optional zstd compression of a pages file (`KFD_COMPRESS=zstd[:LEVEL]`).
//!
//! A compressed pages file keeps the `u64 LE` total (Σ BO sizes) and then
//! holds, for every *chunk* of the GPU's content BOs in bucket order, one
//! record: a `u64 LE` length `n`, then `n` bytes of one zstd frame whose
//! content is the chunk's bytes.  `n == 0` is a chunk of zeros (no frame is
//! written: zero extents cost 8 bytes and no compression).  Chunks are the
//! BO's [`HASH_EXTENT`]s (the last one shorter), never spanning two BOs, so
//! a frame is checked against the BO it belongs to.
//!
//! Frames carry their content size and zstd's content checksum, and are
//! written with a window of at most [`WINDOW_LOG`] (2 MiB): the reader
//! streams them with that much memory (and a [`INPUT_BUFFER`]), refusing a
//! frame that needs a larger window, whose record claims more than
//! `compress_bound(chunk)` bytes, or that decodes to more or fewer bytes
//! than its chunk.  Every error names the file, the GPU and the BO
//! (`bo_entries[i]`), in the words `gpu-check` uses ([`FrameError`]).
//!
//! Upstream's amdgpu plugin reads the pages file as raw bytes: it cannot
//! restore a compressed image, which is why compression is off by default.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;

use zstd::zstd_safe::{self, CCtx, CParameter, DCtx, DParameter, InBuffer, OutBuffer};

use super::{all_zero, HASH_EXTENT};
use crate::ids::GpuId;
use crate::image::ImageError;

/// Chunk size: a BO's bytes are compressed in frames of this many bytes.
pub const CHUNK: u64 = HASH_EXTENT;
/// log2 of the largest window a frame may use (written and accepted).
pub const WINDOW_LOG: u32 = 21;
/// Compressed bytes read at a time by the reader.
pub const INPUT_BUFFER: usize = 128 << 10;
/// Memory the reader of one GPU spends besides the copy's own: a zstd
/// window, its block buffer and the input buffer (taken from the budget).
pub const READER_MEMORY: u64 = (1 << WINDOW_LOG) + (256 << 10) + INPUT_BUFFER as u64;
/// Levels accepted (zstd's without `--ultra`).
pub const LEVELS: std::ops::RangeInclusive<i32> = 1..=19;
/// Level when `KFD_COMPRESS=zstd` names none (zstd's default).
pub const DEFAULT_LEVEL: i32 = 3;

/// How a pages file holds the BO bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encoding {
    /// Upstream's layout: the bytes themselves (zero blocks as holes).
    #[default]
    Raw,
    /// zstd frames per chunk, at `level`.
    Zstd { level: i32 },
}

/// `criu_kfd.pages_compression` of a zstd-compressed image.
pub const COMPRESSION_ZSTD: u32 = 1;

impl Encoding {
    /// The encoding a KFD image records (`pages_compression`,
    /// `pages_compression_level`); `file` names the image in errors.
    pub fn of(file: &str, msg: &crate::proto::CriuKfd) -> Result<Self, ImageError> {
        match msg.pages_compression {
            None | Some(0) => Ok(Encoding::Raw),
            Some(COMPRESSION_ZSTD) => {
                let level = msg.pages_compression_level.unwrap_or(DEFAULT_LEVEL);
                if !LEVELS.contains(&level) {
                    return Err(ImageError::invalid(
                        file,
                        "pages_compression_level",
                        format!("{level} is no zstd level criu-rocm writes ({LEVELS:?})"),
                    ));
                }
                Ok(Encoding::Zstd { level })
            }
            Some(c) => Err(ImageError::invalid(
                file,
                "pages_compression",
                format!("{c} is no compression this criu-rocm knows (1 = zstd)"),
            )),
        }
    }

    /// Records this encoding in a KFD image message.
    pub fn record(self, msg: &mut crate::proto::CriuKfd) {
        match self {
            Encoding::Raw => {
                msg.pages_compression = None;
                msg.pages_compression_level = None;
            }
            Encoding::Zstd { level } => {
                msg.pages_compression = Some(COMPRESSION_ZSTD);
                msg.pages_compression_level = Some(level);
            }
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Encoding::Raw => f.write_str("uncompressed"),
            Encoding::Zstd { level } => write!(f, "zstd level {level}"),
        }
    }
}

/// One chunk: bucket index of its BO, start in the BO, length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub bo: usize,
    pub start: u64,
    pub len: u64,
}

/// The chunks of BOs `(bucket index, size)` in file order.
pub fn chunks(bos: &[(usize, u64)]) -> Vec<Chunk> {
    let mut out = Vec::new();
    for &(bo, size) in bos {
        let mut start = 0;
        while start < size {
            let len = (size - start).min(CHUNK);
            out.push(Chunk { bo, start, len });
            start += len;
        }
    }
    out
}

/// The most bytes a frame of a chunk of `len` bytes may take.
pub fn frame_bound(len: u64) -> u64 {
    // Frame header and checksum on top of zstd's bound.
    (zstd_safe::compress_bound(len as usize) as u64).saturating_add(32)
}

/// A damaged compressed frame (or its record), worded as `gpu-check`'s
/// refusal: `FILE: GPU g: bo_entries[i]: REASON`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameError {
    /// The pages file's base name.
    pub file: String,
    pub gpu: GpuId,
    pub bo: usize,
    pub reason: String,
}

impl FrameError {
    /// The refusal's field.
    pub fn field(&self) -> String {
        format!("bo_entries[{}]", self.bo)
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: GPU {}: {}: {}",
            self.file,
            self.gpu,
            self.field(),
            self.reason
        )
    }
}

impl std::error::Error for FrameError {}

fn zerr(code: usize) -> String {
    zstd_safe::get_error_name(code).to_owned()
}

/// Compression settings of a dump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compress {
    pub level: i32,
    /// zstd worker threads (0: compress on the copying thread).
    pub threads: u32,
}

/// The pages file, as the writer buffers it.
type Out = super::out::AlignedOut;

/// Writes the chunk records of a compressed pages file after its header.
pub(super) struct ZstdOut {
    /// Base name, for messages.
    name: String,
    gpu: GpuId,
    /// File offset of the next byte given to the file.
    pos: u64,
    cctx: CCtx<'static>,
    chunks: Vec<Chunk>,
    next: usize,
    /// Bytes of the current chunk still to come.
    left: u64,
    /// Zero bytes of the current chunk held back (no frame begun yet).
    zeros: u64,
    /// File offset of the current frame's length word, once begun.
    frame_at: Option<u64>,
    frame_len: u64,
    buf: Vec<u8>,
    /// Bytes in all-zero chunks (no frame).
    pub zero_bytes: u64,
}

impl ZstdOut {
    pub(super) fn new(
        name: String,
        gpu: GpuId,
        pos: u64,
        bos: &[(usize, u64)],
        c: Compress,
    ) -> io::Result<Self> {
        let mut cctx =
            CCtx::try_create().ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let set = |cctx: &mut CCtx<'static>, p: CParameter| {
            cctx.set_parameter(p)
                .map(drop)
                .map_err(|e| io::Error::other(format!("zstd: {}", zerr(e))))
        };
        set(&mut cctx, CParameter::CompressionLevel(c.level))?;
        set(&mut cctx, CParameter::WindowLog(WINDOW_LOG))?;
        set(&mut cctx, CParameter::ChecksumFlag(true))?;
        set(&mut cctx, CParameter::ContentSizeFlag(true))?;
        if c.threads > 0 {
            set(&mut cctx, CParameter::NbWorkers(c.threads))?;
            // Jobs of 1 MiB: a 32 MiB chunk keeps every worker busy.
            set(&mut cctx, CParameter::JobSize(1 << 20))?;
        }
        Ok(ZstdOut {
            name,
            gpu,
            pos,
            cctx,
            chunks: chunks(bos),
            next: 0,
            left: 0,
            zeros: 0,
            frame_at: None,
            frame_len: 0,
            buf: vec![0u8; zstd_safe::CCtx::out_size()],
            zero_bytes: 0,
        })
    }

    fn emit(&mut self, out: &mut Out, data: &[u8]) -> io::Result<()> {
        out.write_all(data)?;
        self.pos += data.len() as u64;
        Ok(())
    }

    fn zfail(&self, what: &str, code: usize) -> io::Error {
        let c = self.chunks.get(self.next.wrapping_sub(1));
        io::Error::other(format!(
            "{}: GPU {}: BO {}: zstd {what}: {}",
            self.name,
            self.gpu,
            c.map_or(0, |c| c.bo),
            zerr(code)
        ))
    }

    /// Feeds `data` to the frame (ending it when `end`).
    fn feed(&mut self, out: &mut Out, data: &[u8], end: bool) -> io::Result<()> {
        use zstd::zstd_safe::zstd_sys::ZSTD_EndDirective::{ZSTD_e_continue, ZSTD_e_end};
        let mut input = InBuffer::around(data);
        loop {
            let mut buf = std::mem::take(&mut self.buf);
            let mut ob = OutBuffer::around(&mut buf[..]);
            let op = if end { ZSTD_e_end } else { ZSTD_e_continue };
            let r = self.cctx.compress_stream2(&mut ob, &mut input, op);
            let n = ob.pos();
            let res = self.emit(out, &buf[..n]);
            self.buf = buf;
            res?;
            self.frame_len += n as u64;
            let r = r.map_err(|e| self.zfail("compression", e))?;
            if end {
                if r == 0 {
                    return Ok(());
                }
            } else if input.pos == data.len() {
                return Ok(());
            }
        }
    }

    fn begin_frame(&mut self, out: &mut Out, len: u64) -> io::Result<()> {
        self.cctx
            .reset(zstd_safe::ResetDirective::SessionOnly)
            .map_err(|e| self.zfail("reset", e))?;
        self.cctx
            .set_pledged_src_size(Some(len))
            .map_err(|e| self.zfail("pledge", e))?;
        self.frame_at = Some(self.pos);
        self.frame_len = 0;
        self.emit(out, &[0u8; 8])?;
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        while self.zeros > 0 {
            let n = self.zeros.min(ZEROS.len() as u64) as usize;
            self.feed(out, &ZEROS[..n], false)?;
            self.zeros -= n as u64;
        }
        Ok(())
    }

    fn end_chunk(&mut self, out: &mut Out) -> io::Result<()> {
        match self.frame_at.take() {
            None => {
                self.zero_bytes += self.zeros;
                self.zeros = 0;
                self.emit(out, &0u64.to_le_bytes())
            }
            Some(at) => {
                self.feed(out, &[], true)?;
                // The length word is in the file once the buffer is out.
                out.flush()?;
                out.get_ref()
                    .write_all_at(&self.frame_len.to_le_bytes(), at)
            }
        }
    }

    /// Takes the next bytes of the stream (never more than announced).
    pub(super) fn put(&mut self, out: &mut Out, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            if self.left == 0 {
                let Some(c) = self.chunks.get(self.next) else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{}: write past the last BO", self.name),
                    ));
                };
                self.left = c.len;
                self.next += 1;
            }
            let n = self.left.min(buf.len() as u64) as usize;
            let (piece, rest) = buf.split_at(n);
            if self.frame_at.is_none() && all_zero(piece) {
                self.zeros += n as u64;
            } else {
                if self.frame_at.is_none() {
                    self.begin_frame(out, self.chunks[self.next - 1].len)?;
                }
                self.feed(out, piece, false)?;
            }
            self.left -= n as u64;
            if self.left == 0 {
                self.end_chunk(out)?;
            }
            buf = rest;
        }
        Ok(())
    }

    /// Flushes; the file's length is where the writer ended.
    pub(super) fn finish(&mut self, out: &mut Out) -> io::Result<u64> {
        out.flush()?;
        out.get_ref().set_len(self.pos)?;
        Ok(self.pos)
    }
}

/// Walks the chunk records of a compressed pages file from `pos` (after the
/// header): every record's length within its bound and the last record
/// ending at the file's end.  Reads 8 bytes per chunk.  Gives the file
/// offset of each chunk's record, in the order of [`chunks`].
pub(super) fn check_records(
    f: &File,
    file: &str,
    name: &str,
    bos: &[(usize, u64)],
    mut pos: u64,
    len: u64,
) -> Result<Vec<u64>, ImageError> {
    let mut offsets = Vec::new();
    for c in chunks(bos) {
        offsets.push(pos);
        let mut w = [0u8; 8];
        if pos.saturating_add(8) > len {
            return Err(ImageError::Truncated {
                file: file.to_owned(),
                field: "compressed chunk record",
                expected: 8,
                got: len.saturating_sub(pos),
            });
        }
        f.read_exact_at(&mut w, pos)
            .map_err(|e| ImageError::io(file, "read", e))?;
        let n = u64::from_le_bytes(w);
        let bound = frame_bound(c.len);
        if n > bound {
            return Err(ImageError::invalid(
                name,
                format!("bo_entries[{}]", c.bo),
                format!(
                    "the compressed frame of bytes {:#x}..{:#x} at file offset {pos} claims {n} \
                     bytes, more than a frame of {} bytes can take ({bound})",
                    c.start,
                    c.start + c.len,
                    c.len
                ),
            ));
        }
        pos += 8;
        if pos.saturating_add(n) > len {
            return Err(ImageError::Truncated {
                file: file.to_owned(),
                field: "compressed frame",
                expected: n,
                got: len.saturating_sub(pos),
            });
        }
        pos += n;
    }
    if len > pos {
        return Err(ImageError::TrailingData {
            file: file.to_owned(),
            field: "compressed frames",
            extra: len - pos,
        });
    }
    Ok(offsets)
}

/// Reads the BO bytes back from the chunk records (after the header).
pub(super) struct ZstdIn<R> {
    name: String,
    gpu: GpuId,
    input: R,
    /// File offset of the next byte of `input`.
    pos: u64,
    dctx: DCtx<'static>,
    chunks: Vec<Chunk>,
    next: usize,
    /// Output bytes of the current chunk still to give.
    left: u64,
    /// The current chunk is zeros (no frame).
    zero: bool,
    /// Compressed bytes of the current frame not yet read from `input`.
    clen_left: u64,
    /// File offset of the current frame's record.
    frame_at: u64,
    inbuf: Vec<u8>,
    in_pos: usize,
    in_len: usize,
    frame_done: bool,
}

impl<R: Read> ZstdIn<R> {
    pub(super) fn new(
        name: String,
        gpu: GpuId,
        input: R,
        pos: u64,
        chunks: Vec<Chunk>,
    ) -> io::Result<Self> {
        let mut dctx =
            DCtx::try_create().ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        dctx.set_parameter(DParameter::WindowLogMax(WINDOW_LOG))
            .map_err(|e| io::Error::other(format!("zstd: {}", zerr(e))))?;
        Ok(ZstdIn {
            name,
            gpu,
            input,
            pos,
            dctx,
            chunks,
            next: 0,
            left: 0,
            zero: false,
            clen_left: 0,
            frame_at: 0,
            inbuf: vec![0u8; INPUT_BUFFER],
            in_pos: 0,
            in_len: 0,
            frame_done: false,
        })
    }

    fn chunk(&self) -> Chunk {
        self.chunks[self.next - 1]
    }

    fn damaged(&self, why: impl fmt::Display) -> io::Error {
        let c = self.chunk();
        io::Error::new(
            io::ErrorKind::InvalidData,
            FrameError {
                file: self.name.clone(),
                gpu: self.gpu,
                bo: c.bo,
                reason: format!(
                    "the compressed frame of bytes {:#x}..{:#x} at file offset {}: {why}",
                    c.start,
                    c.start + c.len,
                    self.frame_at
                ),
            },
        )
    }

    fn read_full(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match self.input.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.pos += got as u64;
        Ok(got)
    }

    fn start_chunk(&mut self) -> io::Result<()> {
        let Some(&c) = self.chunks.get(self.next) else {
            return Ok(());
        };
        self.next += 1;
        self.frame_at = self.pos;
        let mut w = [0u8; 8];
        if self.read_full(&mut w)? < 8 {
            return Err(self.damaged("its record is cut short (the file is truncated)"));
        }
        let n = u64::from_le_bytes(w);
        self.left = c.len;
        self.zero = n == 0;
        self.clen_left = n;
        self.in_pos = 0;
        self.in_len = 0;
        self.frame_done = false;
        if n > frame_bound(c.len) {
            return Err(self.damaged(format!(
                "claims {n} bytes, more than a frame of {} bytes can take",
                c.len
            )));
        }
        if !self.zero {
            self.dctx
                .reset(zstd_safe::ResetDirective::SessionOnly)
                .map_err(|e| io::Error::other(format!("zstd: {}", zerr(e))))?;
        }
        Ok(())
    }

    /// Refills the input buffer from the frame's bytes.
    fn refill(&mut self) -> io::Result<()> {
        let want = self.clen_left.min(self.inbuf.len() as u64) as usize;
        let mut buf = std::mem::take(&mut self.inbuf);
        let got = self.read_full(&mut buf[..want]);
        self.inbuf = buf;
        let got = got?;
        if got < want {
            return Err(self.damaged("cut short (the file is truncated)"));
        }
        self.clen_left -= got as u64;
        self.in_pos = 0;
        self.in_len = got;
        Ok(())
    }

    /// Decodes into `out` (at most what is left of the chunk); the bytes given.
    fn decode(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.frame_done {
            return Ok(0);
        }
        loop {
            if self.in_pos == self.in_len && self.clen_left > 0 {
                self.refill()?;
            }
            let mut ib = InBuffer::around(&self.inbuf[self.in_pos..self.in_len]);
            let mut ob = OutBuffer::around(&mut out[..]);
            let r = self.dctx.decompress_stream(&mut ob, &mut ib);
            let (used, produced) = (ib.pos, ob.pos());
            self.in_pos += used;
            match r {
                Err(e) => return Err(self.damaged(zerr(e))),
                Ok(0) => self.frame_done = true,
                Ok(_) => {}
            }
            if produced > 0 || self.frame_done {
                return Ok(produced);
            }
            if self.in_pos == self.in_len && self.clen_left == 0 && used == 0 {
                return Err(self.damaged("ends before its frame does"));
            }
        }
    }

    /// Once the chunk's bytes are all out: the frame must end there, with
    /// nothing after it in the record.
    fn end_chunk(&mut self) -> io::Result<()> {
        if self.zero {
            return Ok(());
        }
        if !self.frame_done {
            let mut extra = [0u8; 1];
            if self.decode(&mut extra)? > 0 {
                let len = self.chunk().len;
                return Err(self.damaged(format!("holds more than the {len} bytes of its chunk")));
            }
        }
        let rest = (self.in_len - self.in_pos) as u64 + self.clen_left;
        if rest > 0 {
            return Err(self.damaged(format!("{rest} bytes follow the end of its frame")));
        }
        Ok(())
    }
}

impl<R: Read> Read for ZstdIn<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            self.start_chunk()?;
            if self.left == 0 {
                return Ok(0);
            }
        }
        let want = self.left.min(buf.len() as u64) as usize;
        let n = if self.zero {
            buf[..want].fill(0);
            want
        } else {
            let n = self.decode(&mut buf[..want])?;
            if n == 0 {
                let (len, left) = (self.chunk().len, self.left);
                return Err(self.damaged(format!(
                    "ends after {} of the {len} bytes of its chunk",
                    len - left
                )));
            }
            n
        };
        self.left -= n as u64;
        if self.left == 0 {
            self.end_chunk()?;
        }
        Ok(n)
    }
}
