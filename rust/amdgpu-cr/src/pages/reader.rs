//! [`PagesReader`]: reads a pages file back, its holes as zeros.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::pages_image_name;
use super::zstd::{check_records, chunks, Chunk, Encoding, ZstdIn};
use crate::ids::GpuId;
use crate::image::{FileId, ImageError};
use crate::stream::Pipe;

/// Extents of an incremental dump's pages file that are holes (or zero
/// chunk records) there and read from an ancestor's pages file instead
/// (built by the validation of the dump's chain of parents, which depends
/// on this module and not the other way round): sorted, disjoint ranges
/// of the file's uncompressed layout, each with where its bytes come from.
#[derive(Debug, Default)]
pub struct Overlay {
    /// (start in this file's layout, length, source).
    ranges: Vec<(u64, u64, Source)>,
}

/// Where an overlaid range's bytes are.
#[derive(Debug, Clone)]
pub enum Source {
    /// The bytes themselves, from this offset of an uncompressed file.
    Raw { file: Arc<File>, at: u64 },
    /// Inside the frame of a compressed file's chunk record.
    Frame {
        file: Arc<File>,
        /// The pages file's name (as messages show it) and GPU.
        name: String,
        gpu: GpuId,
        /// File offset of the chunk's record.
        record: u64,
        chunk: Chunk,
        /// Where the range starts in the chunk.
        skip: u64,
    },
}

impl Overlay {
    /// Adds a range read from an uncompressed file; `finish` sorts them.
    pub fn push(&mut self, start: u64, len: u64, src: Arc<File>, src_start: u64) {
        self.push_source(
            start,
            len,
            Source::Raw {
                file: src,
                at: src_start,
            },
        );
    }

    /// Adds a range; `finish` sorts them.
    pub fn push_source(&mut self, start: u64, len: u64, src: Source) {
        self.ranges.push((start, len, src));
    }

    /// Sorts the ranges (which must not overlap).
    pub fn finish(&mut self) {
        self.ranges.sort_by_key(|r| r.0);
    }

    /// Bytes taken from ancestors.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.1).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether a range is read from a compressed file (a reader then holds
    /// a decompressor for it).
    pub fn has_frames(&self) -> bool {
        self.ranges
            .iter()
            .any(|r| matches!(r.2, Source::Frame { .. }))
    }

    /// The index of the range holding `pos`, or the start of the next one
    /// (`u64::MAX`: none).
    fn at(&self, pos: u64) -> Result<usize, u64> {
        let i = self.ranges.partition_point(|r| r.0 + r.1 <= pos);
        match self.ranges.get(i) {
            Some(r) if r.0 <= pos => Ok(i),
            Some(r) => Err(r.0),
            None => Err(u64::MAX),
        }
    }
}

/// Reads a shared file from a position on, with `pread`.
struct ReadAt {
    file: Arc<File>,
    pos: u64,
}

impl Read for ReadAt {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// The decoder of the frame an overlaid range is being read from: (range
/// index, bytes of the range given so far, decoder).
type FrameCursor = (usize, u64, Box<ZstdIn<ReadAt>>);

impl Overlay {
    /// Fills `buf` with the bytes of range `i` from `off` in it.
    fn read_range(
        &self,
        i: usize,
        off: u64,
        buf: &mut [u8],
        cur: &mut Option<FrameCursor>,
    ) -> io::Result<()> {
        let early = || {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the parent's pages file ends early",
            )
        };
        match &self.ranges[i].2 {
            Source::Raw { file, at } => {
                let mut got = 0;
                while got < buf.len() {
                    let n = file.read_at(&mut buf[got..], at + off + got as u64)?;
                    if n == 0 {
                        return Err(early());
                    }
                    got += n;
                }
                Ok(())
            }
            Source::Frame {
                file,
                name,
                gpu,
                record,
                chunk,
                skip,
            } => {
                if !matches!(cur, Some((j, done, _)) if *j == i && *done == off) {
                    // The decoder of the last frame goes first: two at once
                    // would hold more than the budget counts.
                    *cur = None;
                    let input = ReadAt {
                        file: file.clone(),
                        pos: *record,
                    };
                    let mut z = ZstdIn::new(name.clone(), *gpu, input, *record, vec![*chunk])?;
                    io::copy(&mut (&mut z).take(skip + off), &mut io::sink())?;
                    *cur = Some((i, off, Box::new(z)));
                }
                let Some((_, done, z)) = cur.as_mut() else {
                    unreachable!("set above")
                };
                z.read_exact(buf).map_err(|e| match e.kind() {
                    io::ErrorKind::UnexpectedEof => early(),
                    _ => e,
                })?;
                *done += buf.len() as u64;
                Ok(())
            }
        }
    }
}

/// A pages file read from a position on, with its holes told apart from
/// its data (`SEEK_DATA`/`SEEK_HOLE`): a hole is given as zeros without a
/// read, data is read with `pread`.  On a file system that cannot tell,
/// the whole file is data (the kernel's default answer), which reads the
/// same bytes.
#[derive(Debug)]
pub struct SparseFile {
    file: Input,
    /// The file's length when opened.
    len: u64,
    pos: u64,
    /// `pos..data_end` is known to be data.
    data_end: u64,
    /// `pos..hole_end` is known to be a hole.
    hole_end: u64,
    /// Bytes given as zeros without reading (for statistics and tests).
    pub hole_bytes: u64,
}

/// What a [`SparseFile`] reads.
#[derive(Debug)]
enum Input {
    File(File),
    /// The file's pipe from the image streamer: read in order, all data.
    Pipe(Pipe),
}

impl SparseFile {
    /// Reads `file` from byte `pos`.
    pub fn at(file: File, pos: u64) -> io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(SparseFile {
            file: Input::File(file),
            len,
            pos,
            data_end: pos,
            hole_end: pos,
            hole_bytes: 0,
        })
    }

    /// Reads the pipe `p` from its start: all data, its length unknown
    /// until it ends.
    pub fn pipe(p: Pipe) -> Self {
        SparseFile {
            file: Input::Pipe(p),
            len: u64::MAX,
            pos: 0,
            data_end: u64::MAX,
            hole_end: 0,
            hole_bytes: 0,
        }
    }

    /// Whether nothing follows what was read (a file: nothing is checked
    /// here, its length was).
    pub fn at_end(&mut self) -> io::Result<bool> {
        match &mut self.file {
            Input::File(_) => Ok(true),
            Input::Pipe(p) => p.at_end(),
        }
    }

    fn lseek(&self, whence: libc::c_int) -> io::Result<Option<u64>> {
        let Input::File(file) = &self.file else {
            return Ok(None);
        };
        let off = libc::off_t::try_from(self.pos)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: lseek on an fd this value owns; it only moves the file
        // position, which this reader never relies on (it reads with pread).
        let r = unsafe { libc::lseek(file.as_raw_fd(), off, whence) };
        if r < 0 {
            let e = io::Error::last_os_error();
            // ENXIO: no data (or no hole) at or after pos, i.e. pos is at
            // or past the end.
            return match e.raw_os_error() {
                Some(libc::ENXIO) => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(r as u64))
    }

    /// Learns what lies at `pos`: a hole up to `hole_end` or data up to
    /// `data_end`.
    fn probe(&mut self) -> io::Result<()> {
        match self.lseek(libc::SEEK_DATA)? {
            Some(d) if d > self.pos => self.hole_end = d,
            Some(_) => {
                // Data at pos; SEEK_HOLE always finds one (the end of file
                // counts as a hole).
                self.data_end = self.lseek(libc::SEEK_HOLE)?.unwrap_or(u64::MAX);
            }
            // Past the last data: a hole to the end of file, or pos at or
            // past it (where read gives end of file).
            None if self.pos < self.len => self.hole_end = self.len,
            None => self.data_end = u64::MAX,
        }
        Ok(())
    }
}

impl Read for SparseFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.pos >= self.data_end && self.pos >= self.hole_end {
            self.probe()?;
        }
        let n = if self.pos < self.hole_end {
            let n = (self.hole_end - self.pos).min(buf.len() as u64) as usize;
            buf[..n].fill(0);
            self.hole_bytes += n as u64;
            n
        } else {
            let n = (self.data_end - self.pos).min(buf.len() as u64) as usize;
            match &mut self.file {
                Input::File(f) => f.read_at(&mut buf[..n], self.pos)?,
                Input::Pipe(p) => p.read(&mut buf[..n])?,
            }
        };
        self.pos += n as u64;
        Ok(n)
    }
}

/// Reads one GPU's pages file, checking its header against the BO sizes
/// (from a file, a [`SparseFile`]: its holes are not read).
pub struct PagesReader<R> {
    file: String,
    input: Src<R>,
    total: u64,
    consumed: u64,
    /// Ranges read from an ancestor's pages file (incremental dumps), at
    /// `pos` in the file's uncompressed layout.
    overlay: Option<Arc<Overlay>>,
    pos: u64,
    frame: Option<FrameCursor>,
}

/// Where a reader's bytes come from.
enum Src<R> {
    /// The bytes themselves.
    Raw(R),
    /// Compressed chunk records.
    Zstd(Box<ZstdIn<R>>),
}

impl PagesReader<SparseFile> {
    /// Bytes given as zeros without reading (holes), for tests.
    #[cfg(test)]
    pub(super) fn hole_bytes(&self) -> u64 {
        match &self.input {
            Src::Raw(f) => f.hole_bytes,
            Src::Zstd(_) => 0,
        }
    }

    /// Opens the pages file of `gpu` whose content BOs are `bos` (bucket
    /// index, size, in bucket order) and whose encoding the KFD image
    /// records: [`PagesReader::open`] for upstream's layout; for a
    /// compressed file, also walks its chunk records (8 bytes read per
    /// chunk), so that a damaged record or a truncated file is refused
    /// before any byte is copied.  The ranges of `overlay` (an incremental
    /// dump's) are read from ancestors.
    pub fn open_encoded(
        dir: &Path,
        id: FileId,
        gpu: GpuId,
        bos: &[(usize, u64)],
        encoding: Encoding,
        overlay: Option<Arc<Overlay>>,
    ) -> Result<Self, ImageError> {
        let name = pages_image_name(id, gpu);
        let total = bos
            .iter()
            .try_fold(0u64, |t, &(_, l)| t.checked_add(l))
            .ok_or_else(|| ImageError::invalid(&name, "size", "BO sizes overflow"))?;
        let Encoding::Zstd { chunk, .. } = encoding else {
            return Self::open_with(dir, id, gpu, total, overlay);
        };
        let path: PathBuf = dir.join(&name);
        let file = path.display().to_string();
        let f = File::open(&path).map_err(|e| ImageError::io(&file, "open", e))?;
        let walk = f.try_clone().map_err(|e| ImageError::io(&file, "dup", e))?;
        let f = SparseFile::at(f, 0).map_err(|e| ImageError::io(&file, "fstat", e))?;
        let len = f.len;
        let mut reader = PagesReader::new(file.clone(), f, gpu, total)?;
        check_records(&walk, &file, &name, bos, chunk, 8, len)?;
        let Src::Raw(input) = reader.input else {
            unreachable!("new() gives a raw reader")
        };
        let z = ZstdIn::new(name, gpu, input, 8, chunks(bos, chunk))
            .map_err(|e| ImageError::io(&file, "zstd", e))?;
        reader.input = Src::Zstd(Box::new(z));
        reader.overlay = overlay.filter(|o| !o.is_empty());
        Ok(reader)
    }

    /// [`PagesReader::open_encoded`] once per lane, as
    /// [`PagesReader::open_lanes`] does: lane `i` reads the `lens[i]` bytes
    /// that follow the lanes before it.  In a compressed file every lane
    /// must start and end at a chunk boundary (each of its own records is
    /// found by the walk of all of them).
    pub fn open_encoded_lanes(
        dir: &Path,
        id: FileId,
        gpu: GpuId,
        bos: &[(usize, u64)],
        encoding: Encoding,
        lens: &[u64],
        overlay: Option<Arc<Overlay>>,
    ) -> Result<Vec<Self>, ImageError> {
        let Encoding::Zstd { chunk, .. } = encoding else {
            return Self::open_lanes_with(dir, id, gpu, lens, overlay);
        };
        let overlay = overlay.filter(|o| !o.is_empty());
        let name = pages_image_name(id, gpu);
        let total = bos
            .iter()
            .try_fold(0u64, |t, &(_, l)| t.checked_add(l))
            .ok_or_else(|| ImageError::invalid(&name, "size", "BO sizes overflow"))?;
        if lens.iter().try_fold(0u64, |t, &l| t.checked_add(l)) != Some(total) {
            return Err(ImageError::invalid(
                &name,
                "size",
                "the copy lanes do not add up to the BOs",
            ));
        }
        let path: PathBuf = dir.join(&name);
        let file = path.display().to_string();
        let f = File::open(&path).map_err(|e| ImageError::io(&file, "open", e))?;
        let f = SparseFile::at(f, 0).map_err(|e| ImageError::io(&file, "fstat", e))?;
        let len = f.len;
        let head = PagesReader::new(file.clone(), f, gpu, total)?;
        let Src::Raw(first) = head.input else {
            unreachable!("new() gives a raw reader")
        };
        let Input::File(walk) = &first.file else {
            unreachable!("opened from a file")
        };
        let offsets = check_records(walk, &file, &name, bos, chunk, 8, len)?;
        let all = chunks(bos, chunk);
        let mut out = Vec::with_capacity(lens.len());
        let mut c = 0;
        let mut start = 0;
        for &l in lens {
            let from = c;
            let mut got = 0u64;
            while got < l && c < all.len() {
                got += all[c].len;
                c += 1;
            }
            if got != l {
                return Err(ImageError::invalid(
                    &name,
                    "size",
                    format!("a copy lane of {l} bytes does not end at a compressed chunk's end"),
                ));
            }
            let pos = offsets.get(from).copied().unwrap_or(len);
            let f = File::open(&path).map_err(|e| ImageError::io(&file, "open", e))?;
            let input = SparseFile::at(f, pos).map_err(|e| ImageError::io(&file, "fstat", e))?;
            let z = ZstdIn::new(name.clone(), gpu, input, pos, all[from..c].to_vec())
                .map_err(|e| ImageError::io(&file, "zstd", e))?;
            out.push(PagesReader {
                file: file.clone(),
                input: Src::Zstd(Box::new(z)),
                total: l,
                consumed: 0,
                overlay: overlay.clone(),
                pos: 8 + start,
                frame: None,
            });
            start += l;
        }
        Ok(out)
    }
}

impl PagesReader<SparseFile> {
    /// Reads the pages file of `gpu` from its pipe from the image streamer
    /// (see [`crate::stream`]): its size word against the content BOs
    /// `bos` (bucket index, size), then in order; a compressed file's
    /// records are checked as they come (each within its bound).  The end
    /// of the stream is checked by [`Self::finish_stream`].
    pub fn streamed(
        p: Pipe,
        gpu: GpuId,
        bos: &[(usize, u64)],
        encoding: Encoding,
    ) -> Result<Self, ImageError> {
        let name = p.name().to_owned();
        let total = bos
            .iter()
            .try_fold(0u64, |t, &(_, l)| t.checked_add(l))
            .ok_or_else(|| ImageError::invalid(&name, "size", "BO sizes overflow"))?;
        let mut reader = PagesReader::new(name.clone(), SparseFile::pipe(p), gpu, total)?;
        if let Encoding::Zstd { chunk, .. } = encoding {
            let Src::Raw(input) = reader.input else {
                unreachable!("new() gives a raw reader")
            };
            let z = ZstdIn::new(name.clone(), gpu, input, 8, chunks(bos, chunk))
                .map_err(|e| ImageError::io(&name, "zstd", e))?;
            reader.input = Src::Zstd(Box::new(z));
        }
        Ok(reader)
    }

    /// [`Self::finish`], and for a streamed file that nothing follows.
    pub fn finish_stream(mut self) -> Result<u64, ImageError> {
        let input = match &mut self.input {
            Src::Raw(r) => r,
            Src::Zstd(z) => z.input_mut(),
        };
        let pos = match &input.file {
            Input::Pipe(p) => p.pos(),
            Input::File(_) => 0,
        };
        if !input
            .at_end()
            .map_err(|e| ImageError::io(&self.file, "read", e))?
        {
            return Err(ImageError::invalid(
                &self.file,
                "contents",
                format!("the stream holds more than the file's {pos} bytes"),
            ));
        }
        self.finish()
    }

    /// Opens `amdgpu-pages-<id>-<gpu>.img` in `dir`; `expected` is the Σ of
    /// the sizes of that GPU's content BOs in the KFD image.
    pub fn open(dir: &Path, id: FileId, gpu: GpuId, expected: u64) -> Result<Self, ImageError> {
        Self::open_with(dir, id, gpu, expected, None)
    }

    /// [`Self::open`], the ranges of `overlay` read from ancestors.
    pub fn open_with(
        dir: &Path,
        id: FileId,
        gpu: GpuId,
        expected: u64,
        overlay: Option<Arc<Overlay>>,
    ) -> Result<Self, ImageError> {
        let path: PathBuf = dir.join(pages_image_name(id, gpu));
        let file = path.display().to_string();
        let f = File::open(&path).map_err(|e| ImageError::io(&file, "open", e))?;
        let f = SparseFile::at(f, 0).map_err(|e| ImageError::io(&file, "fstat", e))?;
        let len = f.len;
        let mut reader = PagesReader::new(file.clone(), f, gpu, expected)?;
        reader.overlay = overlay.filter(|o| !o.is_empty());
        let want = expected.saturating_add(8);
        if len < want {
            return Err(ImageError::Truncated {
                file,
                field: "BO contents",
                expected,
                got: len.saturating_sub(8),
            });
        }
        if len > want {
            return Err(ImageError::TrailingData {
                file,
                field: "BO contents",
                extra: len - want,
            });
        }
        Ok(reader)
    }
}

impl PagesReader<SparseFile> {
    /// Opens the pages file (checked as by [`PagesReader::open`] against
    /// the sum of `lens`) once per lane: lane `i` reads the `lens[i]` bytes
    /// that follow the lanes before it.
    pub fn open_lanes(
        dir: &Path,
        id: FileId,
        gpu: GpuId,
        lens: &[u64],
    ) -> Result<Vec<Self>, ImageError> {
        Self::open_lanes_with(dir, id, gpu, lens, None)
    }

    /// [`Self::open_lanes`], the ranges of `overlay` read from ancestors.
    pub fn open_lanes_with(
        dir: &Path,
        id: FileId,
        gpu: GpuId,
        lens: &[u64],
        overlay: Option<Arc<Overlay>>,
    ) -> Result<Vec<Self>, ImageError> {
        let total = lens
            .iter()
            .try_fold(0u64, |t, &l| t.checked_add(l))
            .ok_or_else(|| {
                ImageError::invalid(&pages_image_name(id, gpu), "size", "lane sizes overflow")
            })?;
        let mut first = Self::open_with(dir, id, gpu, total, overlay.clone())?;
        let Some((&len0, rest)) = lens.split_first() else {
            return Ok(vec![first]);
        };
        first.total = len0;
        let path = dir.join(pages_image_name(id, gpu));
        let mut out = vec![first];
        let mut start = len0;
        for &len in rest {
            let file = out[0].file.clone();
            let f = File::open(&path).map_err(|e| ImageError::io(&file, "open", e))?;
            let input =
                SparseFile::at(f, 8 + start).map_err(|e| ImageError::io(&file, "fstat", e))?;
            out.push(PagesReader {
                file,
                input: Src::Raw(input),
                total: len,
                consumed: 0,
                overlay: overlay.clone(),
                pos: 8 + start,
                frame: None,
            });
            start += len;
        }
        Ok(out)
    }
}

impl<R: Read> PagesReader<R> {
    /// Wraps a stream positioned at the header (e.g. from an image streamer).
    pub fn new(file: String, mut input: R, gpu: GpuId, expected: u64) -> Result<Self, ImageError> {
        let mut head = [0u8; 8];
        read_exact_or_truncated(&mut input, &mut head, &file, "size header")?;
        let header = u64::from_le_bytes(head);
        if header != expected {
            return Err(ImageError::PagesSizeMismatch {
                file,
                gpu,
                header,
                expected,
            });
        }
        Ok(PagesReader {
            file,
            input: Src::Raw(input),
            total: header,
            consumed: 0,
            overlay: None,
            pos: 8,
            frame: None,
        })
    }

    /// The file's path, for messages.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// Checks that every announced byte was consumed.
    pub fn finish(self) -> Result<u64, ImageError> {
        if self.consumed != self.total {
            return Err(ImageError::invalid(
                &self.file,
                "contents",
                format!(
                    "{} of {} bytes consumed by the restore",
                    self.consumed, self.total
                ),
            ));
        }
        Ok(self.consumed)
    }
}

impl<R: Read> Read for PagesReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let room = self.total - self.consumed;
        let mut want = (buf.len() as u64).min(room) as usize;
        if want == 0 {
            return Ok(0);
        }
        let over = match &self.overlay {
            None => None,
            Some(o) => match o.at(self.pos) {
                Ok(i) => {
                    let r = &o.ranges[i];
                    want = want.min((r.0 + r.1 - self.pos) as usize);
                    Some((i, self.pos - r.0))
                }
                Err(next) => {
                    want = want.min((next - self.pos).min(want as u64) as usize);
                    None
                }
            },
        };
        // The file's own bytes there: a hole or a zero chunk record when
        // overlaid, replaced by the ancestor's.
        let n = match &mut self.input {
            Src::Raw(r) => r.read(&mut buf[..want])?,
            Src::Zstd(z) => z.read(&mut buf[..want])?,
        };
        if let (Some((i, off)), Some(o)) = (over, &self.overlay) {
            o.read_range(i, off, &mut buf[..n], &mut self.frame)?;
        }
        self.consumed += n as u64;
        self.pos += n as u64;
        Ok(n)
    }
}

fn read_exact_or_truncated(
    r: &mut impl Read,
    buf: &mut [u8],
    file: &str,
    field: &'static str,
) -> Result<(), ImageError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(ImageError::Truncated {
                    file: file.to_owned(),
                    field,
                    expected: buf.len() as u64,
                    got: got as u64,
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ImageError::io(file, "read", e)),
        }
    }
    Ok(())
}
