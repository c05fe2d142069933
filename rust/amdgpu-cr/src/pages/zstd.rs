//! Optional zstd compression of a pages file (`KFD_COMPRESS=zstd[:LEVEL]`).
//!
//! A compressed pages file keeps the `u64 LE` total (Σ BO sizes) and then
//! holds, for every *chunk* of the GPU's content BOs in bucket order, one
//! record: a `u64 LE` length `n`, then `n` bytes of one zstd frame whose
//! content is the chunk's bytes.  `n == 0` is a chunk of zeros (no frame is
//! written: zero extents cost 8 bytes and no compression), or, in an
//! incremental dump, a chunk left to the parent (`parent_extents`).  Chunks
//! are a BO's runs of `pages_compression_chunk` bytes (the last one
//! shorter), never spanning two BOs, so a frame is checked against the BO
//! it belongs to.  Dumps now write chunks of [`CHUNK`] (2 MiB, the content
//! extent: a chunk is an extent, so a compressed image can be an
//! incremental dump's parent and its extents are read on their own);
//! images of extension version 4 and 5 have no such field and chunks of
//! [`CHUNK_BEFORE_V6`] (32 MiB).
//!
//! A dump compresses in its copy lanes: each lane compresses whole chunks
//! into memory ([`FrameEncoder`], single-threaded zstd) and
//! [`ZstdPagesFile`] places their records in chunk order.  The memory of
//! every compressor and decompressor is part of the dump's budget
//! (`KFD_MAX_BUFFER_SIZE`): [`compressor_memory`], [`decompressor_memory`].
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
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use zstd::zstd_safe::{self, CCtx, CParameter, DCtx, DParameter, InBuffer, OutBuffer};

use super::{all_zero, CONTENT_EXTENT, HASH_EXTENT};
use crate::ids::GpuId;
use crate::image::{FileId, ImageError};

/// Chunk size a dump writes: a BO's bytes are compressed in frames of this
/// many bytes (`pages_compression_chunk`).
pub const CHUNK: u64 = CONTENT_EXTENT;
/// Chunk size of images that record none (extension versions 4 and 5).
pub const CHUNK_BEFORE_V6: u64 = HASH_EXTENT;
/// The largest chunk a reader accepts.
pub const MAX_CHUNK: u64 = HASH_EXTENT;
/// log2 of the largest window a frame may use (written and accepted).
pub const WINDOW_LOG: u32 = 21;
/// Compressed bytes read at a time by the reader.
pub const INPUT_BUFFER: usize = 128 << 10;
/// Levels accepted, and the level when `KFD_COMPRESS=zstd` names none (the
/// knob's, defined with it so that the knobs use nothing above them).
pub use crate::env::{ZSTD_DEFAULT_LEVEL as DEFAULT_LEVEL, ZSTD_LEVELS as LEVELS};

/// How a pages file holds the BO bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encoding {
    /// Upstream's layout: the bytes themselves (zero blocks as holes).
    #[default]
    Raw,
    /// zstd frames per chunk of `chunk` bytes, at `level`.
    Zstd { level: i32, chunk: u64 },
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
                let chunk = msg.pages_compression_chunk.unwrap_or(CHUNK_BEFORE_V6);
                if !(4096..=MAX_CHUNK).contains(&chunk) || !chunk.is_multiple_of(4096) {
                    return Err(ImageError::invalid(
                        file,
                        "pages_compression_chunk",
                        format!(
                            "{chunk} is no chunk size criu-rocm reads (a multiple of 4096 up to \
                             {MAX_CHUNK})"
                        ),
                    ));
                }
                Ok(Encoding::Zstd { level, chunk })
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
                msg.pages_compression_chunk = None;
            }
            Encoding::Zstd { level, chunk } => {
                msg.pages_compression = Some(COMPRESSION_ZSTD);
                msg.pages_compression_level = Some(level);
                msg.pages_compression_chunk = Some(chunk);
            }
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Encoding::Raw => f.write_str("uncompressed"),
            Encoding::Zstd { level, .. } => write!(f, "zstd level {level}"),
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

/// The chunks of `chunk` bytes of BOs `(bucket index, size)` in file
/// order.
pub fn chunks(bos: &[(usize, u64)], chunk: u64) -> Vec<Chunk> {
    let chunk = chunk.max(1);
    let mut out = Vec::new();
    for &(bo, size) in bos {
        let mut start = 0;
        while start < size {
            let len = (size - start).min(chunk);
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
    /// Compressing copy lanes per GPU (`None`: the CPU cores shared out
    /// among the GPUs; 0 is taken as 1).
    pub threads: Option<u32>,
}

/// Memory one compressor (a copy lane's) holds: zstd's own estimate of a
/// streaming context at `level` for frames of at most [`CHUNK`] bytes with
/// a window of at most [`WINDOW_LOG`], and the buffer a whole frame and
/// its record's length word are made in.
pub fn compressor_memory(level: i32) -> u64 {
    // SAFETY: a pure function of its argument.
    let est = unsafe { zstd_safe::zstd_sys::ZSTD_estimateCStreamSize_usingCParams(cparams(level)) };
    est as u64 + 8 + frame_bound(CHUNK)
}

/// zstd's parameters at `level` for a frame of [`CHUNK`] bytes, its window
/// at most [`WINDOW_LOG`].
fn cparams(level: i32) -> zstd_safe::zstd_sys::ZSTD_compressionParameters {
    // SAFETY: a pure function of its arguments.
    let mut cp = unsafe { zstd_safe::zstd_sys::ZSTD_getCParams(level, CHUNK, 0) };
    cp.windowLog = cp.windowLog.min(WINDOW_LOG);
    cp
}

/// Memory one decompressor holds: zstd's estimate of a streaming context
/// for a window of [`WINDOW_LOG`], and its input buffer.
pub fn decompressor_memory() -> u64 {
    // SAFETY: a pure function of its argument.
    let est = unsafe { zstd_safe::zstd_sys::ZSTD_estimateDStreamSize(1 << WINDOW_LOG) };
    est as u64 + INPUT_BUFFER as u64
}

/// Compresses one chunk at a time into a frame held whole in memory (at
/// most [`CHUNK`] bytes of input, so at most [`frame_bound`] of output),
/// behind 8 bytes left for the record's length word.  A chunk of zeros
/// makes no frame.
pub struct FrameEncoder {
    cctx: CCtx<'static>,
    /// Length word, then the frame.
    rec: Vec<u8>,
    len: u64,
    /// Zero bytes held back (no frame begun yet).
    zeros: u64,
    begun: bool,
}

impl FrameEncoder {
    pub fn new(level: i32) -> io::Result<Self> {
        let mut cctx =
            CCtx::try_create().ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let set = |cctx: &mut CCtx<'static>, p: CParameter| {
            cctx.set_parameter(p)
                .map(drop)
                .map_err(|e| io::Error::other(format!("zstd: {}", zerr(e))))
        };
        set(&mut cctx, CParameter::CompressionLevel(level))?;
        // The window of the level's parameters for a chunk (what
        // compressor_memory counts), never more than a reader takes.
        set(&mut cctx, CParameter::WindowLog(cparams(level).windowLog))?;
        set(&mut cctx, CParameter::ChecksumFlag(true))?;
        set(&mut cctx, CParameter::ContentSizeFlag(true))?;
        Ok(FrameEncoder {
            cctx,
            rec: Vec::with_capacity((8 + frame_bound(CHUNK)) as usize),
            len: 0,
            zeros: 0,
            begun: false,
        })
    }

    /// Starts a chunk of `len` bytes (at most [`CHUNK`]).
    pub fn begin(&mut self, len: u64) {
        self.rec.clear();
        self.rec.extend_from_slice(&[0u8; 8]);
        self.len = len;
        self.zeros = 0;
        self.begun = false;
    }

    fn feed(&mut self, data: &[u8], end: bool) -> Result<(), String> {
        use zstd::zstd_safe::zstd_sys::ZSTD_EndDirective::{ZSTD_e_continue, ZSTD_e_end};
        let mut input = InBuffer::around(data);
        loop {
            let pos = self.rec.len();
            if self.rec.capacity() == pos {
                return Err("the frame outgrew its bound".into());
            }
            let mut ob = OutBuffer::around_pos(&mut self.rec, pos);
            let op = if end { ZSTD_e_end } else { ZSTD_e_continue };
            let r = self.cctx.compress_stream2(&mut ob, &mut input, op);
            let r = r.map_err(zerr)?;
            if end {
                if r == 0 {
                    return Ok(());
                }
            } else if input.pos == data.len() {
                return Ok(());
            }
        }
    }

    fn start_frame(&mut self) -> Result<(), String> {
        self.cctx
            .reset(zstd_safe::ResetDirective::SessionOnly)
            .map_err(zerr)?;
        self.cctx
            .set_pledged_src_size(Some(self.len))
            .map_err(zerr)?;
        self.begun = true;
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        while self.zeros > 0 {
            let n = self.zeros.min(ZEROS.len() as u64) as usize;
            self.feed(&ZEROS[..n], false)?;
            self.zeros -= n as u64;
        }
        Ok(())
    }

    /// Takes the chunk's next bytes.
    pub fn put(&mut self, data: &[u8]) -> Result<(), String> {
        if !self.begun && all_zero(data) {
            self.zeros += data.len() as u64;
            return Ok(());
        }
        if !self.begun {
            self.start_frame()?;
        }
        self.feed(data, false)
    }

    /// Ends the chunk: its record (length word and frame; the word alone,
    /// 0, for a chunk of zeros).
    pub fn end(&mut self) -> Result<&[u8], String> {
        if self.begun {
            self.feed(&[], true)?;
        }
        let n = (self.rec.len() - 8) as u64;
        self.rec[..8].copy_from_slice(&n.to_le_bytes());
        Ok(&self.rec)
    }

    /// The record of a chunk left out: its length word, 0.
    pub fn skip(&mut self) -> &[u8] {
        self.rec.clear();
        self.rec.extend_from_slice(&[0u8; 8]);
        &self.rec
    }
}

/// Where the next record goes.
struct Place {
    /// Index of the next chunk to place.
    next: usize,
    /// Its record's file offset.
    pos: u64,
    failed: bool,
}

/// A compressed pages file written by several copy lanes at once: each
/// lane compresses whole chunks ([`FrameEncoder`]) and hands their records
/// to [`ZstdPagesFile::place`], which puts them in chunk order (a lane
/// whose chunk comes next waits for the records before it).
pub struct ZstdPagesFile {
    file: super::out::OutFile,
    /// The path, for messages.
    shown: String,
    name: String,
    gpu: GpuId,
    chunks: Vec<Chunk>,
    place: Mutex<Place>,
    turn: Condvar,
    zero_bytes: AtomicU64,
}

impl ZstdPagesFile {
    /// Creates `amdgpu-pages-<id>-<gpu>.img` in `dir` for the content BOs
    /// `bos` (bucket index, size) in chunks of `chunk` bytes, and writes its
    /// size word.
    pub fn create(
        dir: &Path,
        id: FileId,
        gpu: GpuId,
        bos: &[(usize, u64)],
        chunk: u64,
    ) -> Result<Self, ImageError> {
        let name = super::pages_image_name(id, gpu);
        let path = dir.join(&name);
        let shown = path.display().to_string();
        let total = bos
            .iter()
            .try_fold(0u64, |t, &(_, l)| t.checked_add(l))
            .ok_or_else(|| ImageError::invalid(&name, "size", "BO sizes overflow"))?;
        let file = super::out::OutFile::create(&path, &name)
            .map_err(|e| ImageError::io(&shown, "create", e))?;
        file.write_all_at(&total.to_le_bytes(), 0)
            .map_err(|e| ImageError::io(&shown, "write header", e))?;
        Ok(ZstdPagesFile {
            file,
            shown,
            name,
            gpu,
            chunks: chunks(bos, chunk),
            place: Mutex::new(Place {
                next: 0,
                pos: 8,
                failed: false,
            }),
            turn: Condvar::new(),
            zero_bytes: AtomicU64::new(0),
        })
    }

    /// The file's chunks, in order.
    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// The file's path, for messages.
    pub fn file(&self) -> &str {
        &self.shown
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Place> {
        self.place.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the record of chunk `idx` after those of the chunks before it,
    /// waiting for them; fails when another lane failed ([`Self::fail`]).
    pub fn place(&self, idx: usize, rec: &[u8]) -> io::Result<()> {
        let at = {
            let mut p = self.lock();
            while p.next != idx && !p.failed {
                p = self.turn.wait(p).unwrap_or_else(|e| e.into_inner());
            }
            if p.failed {
                return Err(io::Error::other(format!(
                    "{}: stopped: another copy lane of GPU {} failed",
                    self.name, self.gpu
                )));
            }
            let at = p.pos;
            p.pos += rec.len() as u64;
            p.next += 1;
            if self.file.is_pipe() {
                // A pipe takes the records in order: written before the
                // next lane's turn.  On failure the caller stops the
                // other lanes (Self::fail).
                let r = self.file.write_all_at(rec, at);
                self.turn.notify_all();
                drop(p);
                self.count_zero(idx, rec);
                return r;
            }
            self.turn.notify_all();
            at
        };
        self.count_zero(idx, rec);
        // On failure the caller stops the other lanes (Self::fail).
        self.file.write_all_at(rec, at)
    }

    /// Counts chunk `idx`'s bytes as zeros when its record is a bare
    /// length word.
    fn count_zero(&self, idx: usize, rec: &[u8]) {
        if rec.len() == 8 {
            if let Some(c) = self.chunks.get(idx) {
                self.zero_bytes.fetch_add(c.len, Ordering::Relaxed);
            }
        }
    }

    /// Stops the other lanes (their next [`Self::place`] fails); whether
    /// one had already failed.
    pub fn fail(&self) -> bool {
        let was = std::mem::replace(&mut self.lock().failed, true);
        self.turn.notify_all();
        was
    }

    /// Once every record is placed: cuts the file at its end.  Gives the
    /// bytes in chunks written as a bare length word (zeros, or left to a
    /// parent).
    pub fn finish(&self) -> Result<u64, ImageError> {
        let (next, pos) = {
            let p = self.lock();
            (p.next, p.pos)
        };
        if next != self.chunks.len() {
            return Err(ImageError::invalid(
                &self.shown,
                "contents",
                format!("{next} of {} compressed chunks written", self.chunks.len()),
            ));
        }
        self.file
            .set_len(pos)
            .map_err(|e| ImageError::io(&self.shown, "ftruncate", e))?;
        if let (Some(sent), Some(s)) = (self.file.piped(), crate::stream::active()) {
            s.note_sent(&self.name, sent);
        }
        Ok(self.zero_bytes.load(Ordering::Relaxed))
    }
}

/// One writer of a whole compressed pages file, in order (tests, and
/// [`super::PagesWriter::create_compressed`]).
pub(super) struct ZstdOut {
    file: ZstdPagesFile,
    enc: FrameEncoder,
    next: usize,
    /// Bytes of the current chunk still to come.
    left: u64,
    pub zero_bytes: u64,
}

impl ZstdOut {
    pub(super) fn new(file: ZstdPagesFile, level: i32) -> io::Result<Self> {
        Ok(ZstdOut {
            file,
            enc: FrameEncoder::new(level)?,
            next: 0,
            left: 0,
            zero_bytes: 0,
        })
    }

    /// Takes the next bytes of the stream (never more than announced).
    pub(super) fn put(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            if self.left == 0 {
                let Some(c) = self.file.chunks.get(self.next) else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{}: write past the last BO", self.file.name),
                    ));
                };
                self.left = c.len;
                self.enc.begin(c.len);
            }
            let n = self.left.min(buf.len() as u64) as usize;
            let (piece, rest) = buf.split_at(n);
            let zfail = |e: String| io::Error::other(format!("zstd compression: {e}"));
            self.enc.put(piece).map_err(zfail)?;
            self.left -= n as u64;
            if self.left == 0 {
                let rec = self.enc.end().map_err(zfail)?;
                self.file.place(self.next, rec)?;
                self.next += 1;
            }
            buf = rest;
        }
        Ok(())
    }

    /// Cuts the file at its end.
    pub(super) fn finish(&mut self) -> io::Result<()> {
        self.zero_bytes = self
            .file
            .finish()
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(())
    }
}

/// Walks the chunk records (of `chunk` bytes) of a compressed pages file
/// from `pos` (after the header): every record's length within its bound
/// and the last record ending at the file's end.  Reads 8 bytes per chunk.
/// Gives the file offset of each chunk's record, in the order of
/// [`chunks`].
pub fn check_records(
    f: &File,
    file: &str,
    name: &str,
    bos: &[(usize, u64)],
    chunk: u64,
    mut pos: u64,
    len: u64,
) -> Result<Vec<u64>, ImageError> {
    let mut offsets = Vec::new();
    for c in chunks(bos, chunk) {
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
pub struct ZstdIn<R> {
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
    pub fn new(
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

    /// What the records are read from.
    pub fn input_mut(&mut self) -> &mut R {
        &mut self.input
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

#[cfg(test)]
mod memory_tests {
    use super::*;

    /// zstd's own estimate bounds what a compressor and a decompressor
    /// hold after frames of a whole chunk and of a few pages, at every
    /// level a dump may use.
    #[test]
    fn the_memory_estimates_bound_the_contexts() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let data: Vec<u8> = (0..CHUNK)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if i % 3 == 0 {
                    x as u8
                } else {
                    (i >> 9) as u8
                }
            })
            .collect();
        for level in LEVELS {
            let mut enc = FrameEncoder::new(level).unwrap();
            let mut frames = Vec::new();
            for len in [CHUNK as usize, 12288] {
                enc.begin(len as u64);
                enc.put(&data[..len]).unwrap();
                frames.push(enc.end().unwrap()[8..].to_vec());
            }
            let held = enc.cctx.sizeof() as u64 + enc.rec.capacity() as u64;
            assert!(
                held <= compressor_memory(level),
                "level {level}: {held} > {}",
                compressor_memory(level)
            );
            let mut dctx = DCtx::create();
            dctx.set_parameter(DParameter::WindowLogMax(WINDOW_LOG))
                .unwrap();
            let mut out = vec![0u8; CHUNK as usize];
            for f in &frames {
                let n = dctx.decompress(&mut out[..], f).unwrap();
                assert!(out[..n] == data[..n]);
            }
            let held = dctx.sizeof() as u64 + INPUT_BUFFER as u64;
            assert!(held <= decompressor_memory(), "level {level}: {held}");
        }
    }
}
