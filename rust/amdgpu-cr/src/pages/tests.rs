use std::io::{Read, Write};

use super::*;
use crate::image::tests::{sample_kfd, tempdir};

/// Lanes write and read disjoint ranges of one pages file; the result
/// is the file one stream would have written.
#[test]
fn pages_lanes_cover_the_file_in_order() {
    let dir = tempdir();
    let gpu = GpuId(0x42);
    let lens = [3u64, 5, 2];
    let mut ws = PagesWriter::create_lanes(&dir, FileId(1), gpu, &lens).unwrap();
    // Write the lanes in reverse order.
    for (i, w) in ws.iter_mut().enumerate().rev() {
        w.write_all(&vec![b'a' + i as u8; lens[i] as usize])
            .unwrap();
    }
    assert!(ws[1].write_all(b"x").is_err(), "a lane cannot overrun");
    for w in ws {
        w.finish().unwrap();
    }
    let bytes = std::fs::read(dir.join(pages_image_name(FileId(1), gpu))).unwrap();
    assert_eq!(&bytes[..8], &10u64.to_le_bytes());
    assert_eq!(&bytes[8..], b"aaabbbbbcc");
    let rs = PagesReader::open_lanes(&dir, FileId(1), gpu, &[5, 5]).unwrap();
    let got: Vec<Vec<u8>> = rs
        .into_iter()
        .map(|mut r| {
            let mut v = Vec::new();
            r.read_to_end(&mut v).unwrap();
            r.finish().unwrap();
            v
        })
        .collect();
    assert_eq!(got, vec![b"aaabb".to_vec(), b"bbbcc".to_vec()]);
    assert!(
        PagesReader::open_lanes(&dir, FileId(1), gpu, &[5, 6]).is_err(),
        "the lanes must add up to the header"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pages_file_roundtrip_and_checks() {
    let dir = tempdir();
    let gpu = GpuId(0x1a2b);
    let mut w = PagesWriter::create(&dir, FileId(3), gpu, 10).unwrap();
    w.write_all(b"0123456789").unwrap();
    assert!(w.write_all(b"x").is_err());
    w.finish().unwrap();

    let mut r = PagesReader::open(&dir, FileId(3), gpu, 10).unwrap();
    let mut s = String::new();
    r.read_to_string(&mut s).unwrap();
    assert_eq!(s, "0123456789");
    r.finish().unwrap();

    let e = PagesReader::open(&dir, FileId(3), gpu, 11).err().unwrap();
    assert!(matches!(
        e,
        ImageError::PagesSizeMismatch {
            header: 10,
            expected: 11,
            ..
        }
    ));

    let short = PagesWriter::create(&dir, FileId(4), gpu, 10).unwrap();
    assert!(short
        .finish()
        .unwrap_err()
        .to_string()
        .contains("0 bytes written"));

    // A header that agrees with the image but a file cut short.
    let path = dir.join(pages_image_name(FileId(3), gpu));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(12);
    std::fs::write(&path, &bytes).unwrap();
    let e = PagesReader::open(&dir, FileId(3), gpu, 10).err().unwrap();
    assert!(e.to_string().contains("truncated"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Zero blocks become holes whatever the write sizes and lane cuts;
/// the file reads back byte-exact (holes as zeros, not read).
#[test]
fn pages_zero_blocks_are_holes() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempdir();
    let gpu = GpuId(0x77);
    let b = SPARSE_BLOCK as usize;
    // Data, zeros over whole blocks, a lone non-zero byte, zeros to a
    // zero tail that ends mid-block.
    let mut data = vec![0u8; 20 * b + 123];
    data[..b + 5].fill(0xa5);
    data[9 * b + 7] = 1;
    data[15 * b - 1] = 2;
    for (n, (lens, chunk)) in [
        (vec![data.len() as u64], 1 << 20),
        (vec![data.len() as u64], 1000),
        (
            vec![3 * b as u64 + 1, 6 * b as u64, (11 * b + 122) as u64],
            4096,
        ),
        (vec![1, data.len() as u64 - 1], 777),
    ]
    .into_iter()
    .enumerate()
    {
        let id = FileId(10 + n as u32);
        let ws = PagesWriter::create_lanes(&dir, id, gpu, &lens).unwrap();
        let mut start = 0usize;
        let mut zeros = 0;
        for (w, &len) in ws.into_iter().zip(&lens) {
            let mut w = w;
            for c in data[start..start + len as usize].chunks(chunk) {
                w.write_all(c).unwrap();
            }
            start += len as usize;
            let z = w.zero_bytes();
            w.finish().unwrap();
            zeros += z;
        }
        assert!(
            zeros >= 15 * SPARSE_BLOCK,
            "case {n}: {zeros} bytes left as holes"
        );
        let path = dir.join(pages_image_name(id, gpu));
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], &(data.len() as u64).to_le_bytes(), "case {n}");
        assert!(bytes[8..] == data[..], "case {n}: contents");
        let blocks = std::fs::metadata(&path).unwrap().blocks() * 512;
        assert!(
            blocks <= 8 * SPARSE_BLOCK,
            "case {n}: {blocks} bytes on disk"
        );
        let mut r = PagesReader::open(&dir, id, gpu, data.len() as u64).unwrap();
        let mut back = Vec::new();
        r.read_to_end(&mut back).unwrap();
        assert!(back == data, "case {n}: read back");
        assert!(
            r.hole_bytes() >= 10 * SPARSE_BLOCK,
            "case {n}: holes not read"
        );
        r.finish().unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An all-zero BO of 64 MiB costs a block of disk: its file is a hole but
/// for the header, read back as zeros without reading.
#[test]
fn an_all_zero_bo_is_a_hole_but_for_the_header() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempdir();
    let gpu = GpuId(0x77);
    let big = 64u64 << 20;
    let mut w = PagesWriter::create(&dir, FileId(20), gpu, big).unwrap();
    let zero = vec![0u8; 1 << 20];
    for _ in 0..64 {
        w.write_all(&zero).unwrap();
    }
    w.finish().unwrap();
    let path = dir.join(pages_image_name(FileId(20), gpu));
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), big + 8);
    assert!(
        meta.blocks() * 512 <= SPARSE_BLOCK,
        "{} bytes on disk",
        meta.blocks() * 512
    );
    let mut r = PagesReader::open(&dir, FileId(20), gpu, big).unwrap();
    let mut buf = vec![1u8; 1 << 20];
    for _ in 0..64 {
        r.read_exact(&mut buf).unwrap();
        assert!(all_zero(&buf));
    }
    assert_eq!(r.hole_bytes(), big - (SPARSE_BLOCK - 8));
    r.finish().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `hole(len)` leaves the file as writing `len` zeros would, without
/// being given them: the same bytes, holes and count of zero bytes, at
/// any offset in a block, in lanes and compressed too; it cannot overrun.
#[test]
fn a_hole_is_what_writing_its_zeros_would_leave() {
    let dir = tempdir();
    let gpu = GpuId(0x77);
    let b = SPARSE_BLOCK as usize;
    // (data bytes, then zero bytes given as a hole), in turn.
    let runs = [
        (5, 3 * b),
        (b - 13, 2 * b + 13),
        (0, 7),
        (2 * b + 1, b - 1),
        (3, 0),
        (1, 5 * b + 100),
        (b, 2 * b),
    ];
    let data: Vec<u8> = runs
        .iter()
        .flat_map(|&(d, z)| std::iter::repeat_n(0x5a, d).chain(std::iter::repeat_n(0, z)))
        .collect();
    let lens = [(3 * b + 5) as u64, (data.len() - 3 * b - 5) as u64];
    let write = |id, holes| write_runs(&dir, id, gpu, &runs, &data, &lens, holes);
    let by_zeros = write(FileId(30), false);
    let by_holes = write(FileId(31), true);
    assert!(by_holes.0[8..] == data[..], "contents");
    assert_eq!(by_holes, by_zeros, "bytes, zero bytes and disk blocks");
    assert!(by_holes.1 >= 8 * SPARSE_BLOCK, "{} zero bytes", by_holes.1);

    // Compressed: the same file as the zeros written.
    let compressed = |id, holes| write_runs_compressed(&dir, id, gpu, &runs, &data, holes);
    assert!(compressed(FileId(32), true) == compressed(FileId(33), false));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `data` written in two lanes of `lens` bytes as `runs` (data bytes, then
/// zero bytes: given as holes when `holes`, else written): the file's
/// bytes, its zero bytes as the writers counted them, its disk blocks.
fn write_runs(
    dir: &std::path::Path,
    id: FileId,
    gpu: GpuId,
    runs: &[(usize, usize)],
    data: &[u8],
    lens: &[u64; 2],
    holes: bool,
) -> (Vec<u8>, u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let ws = PagesWriter::create_lanes(dir, id, gpu, lens).unwrap();
    let mut zeros = 0;
    let mut at = 0usize;
    let mut lanes = ws.into_iter().zip(lens.iter().copied());
    let (mut w, mut end) = lanes.next().unwrap();
    let mut finished = Vec::new();
    for &(d, z) in runs {
        for (len, hole) in [(d, false), (z, true)] {
            let mut left = len;
            while left > 0 {
                if at as u64 == end {
                    finished.push(w);
                    (w, end) = lanes.next().map(|(w, l)| (w, end + l)).unwrap();
                }
                let n = left.min(end as usize - at);
                if hole && holes {
                    w.hole(n as u64).unwrap();
                } else {
                    w.write_all(&data[at..at + n]).unwrap();
                }
                at += n;
                left -= n;
            }
        }
    }
    assert!(w.hole(1).is_err(), "a hole cannot overrun the lane");
    finished.push(w);
    for w in finished {
        zeros += w.zero_bytes();
        w.finish().unwrap();
    }
    let path = dir.join(pages_image_name(id, gpu));
    let blocks = std::fs::metadata(&path).unwrap().blocks();
    (std::fs::read(&path).unwrap(), zeros, blocks)
}

/// [`write_runs`] into one compressed pages file: its bytes.
fn write_runs_compressed(
    dir: &std::path::Path,
    id: FileId,
    gpu: GpuId,
    runs: &[(usize, usize)],
    data: &[u8],
    holes: bool,
) -> Vec<u8> {
    let c = Compress {
        level: 3,
        threads: Some(1),
    };
    let bos = [(0usize, data.len() as u64)];
    let mut w = PagesWriter::create_compressed(dir, id, gpu, &bos, c).unwrap();
    let mut at = 0;
    for &(d, z) in runs {
        w.write_all(&data[at..at + d]).unwrap();
        if holes {
            w.hole(z as u64).unwrap();
        } else {
            w.write_all(&data[at + d..at + d + z]).unwrap();
        }
        at += d + z;
    }
    w.finish().unwrap();
    std::fs::read(dir.join(pages_image_name(id, gpu))).unwrap()
}

#[test]
fn pages_total_counts_only_content_bos() {
    let m = sample_kfd();
    assert_eq!(
        pages_total("t", &m.bo_entries, GpuId(0x1a2b)).unwrap(),
        0x20_0000
    );
    assert_eq!(
        pages_total("t", &m.bo_entries, GpuId(0x5c3d)).unwrap(),
        0x1000
    );
}

#[test]
fn content_hashes_read_back_from_the_image() {
    let dir = tempdir();
    let img = crate::image::KfdImage::validate("t", sample_kfd()).unwrap();
    img.write(&dir, FileId(5)).unwrap();
    let back = crate::image::KfdImage::read(&dir, FileId(5)).unwrap();
    assert_eq!(
        content_hashes(&back),
        std::collections::BTreeMap::from([(
            0,
            ContentHash {
                value: 7,
                extent: Some(0x10_0000)
            }
        )])
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn names_follow_upstream_patterns() {
    assert_eq!(
        pages_image_name(FileId(7), GpuId(0x1a2)),
        "amdgpu-pages-7-01a2.img"
    );
    assert_eq!(
        pages_image_name(FileId(7), GpuId(0x1a2b3)),
        "amdgpu-pages-7-1a2b3.img"
    );
    assert_eq!(
        pages_image_name(FileId(1 << 31), GpuId(0x1a2b)),
        "amdgpu-pages--2147483648-1a2b.img"
    );
}

/// Writes a compressed pages file of `bos` (index, bytes) and returns its path.
fn write_compressed(
    dir: &std::path::Path,
    bos: &[(usize, Vec<u8>)],
    threads: u32,
    piece: usize,
) -> std::path::PathBuf {
    let sizes: Vec<(usize, u64)> = bos.iter().map(|(i, b)| (*i, b.len() as u64)).collect();
    let c = Compress {
        level: 3,
        threads: Some(threads),
    };
    let mut w = PagesWriter::create_compressed(dir, FileId(2), GpuId(0x42), &sizes, c).unwrap();
    for (_, b) in bos {
        for p in b.chunks(piece) {
            w.write_all(p).unwrap();
        }
    }
    w.finish().unwrap();
    dir.join(pages_image_name(FileId(2), GpuId(0x42)))
}

const ZSTD3: Encoding = Encoding::Zstd {
    level: 3,
    chunk: crate::pages::zstd::CHUNK,
};

fn read_compressed(dir: &std::path::Path, sizes: &[(usize, u64)]) -> std::io::Result<Vec<u8>> {
    let enc = ZSTD3;
    let mut r = PagesReader::open_encoded(dir, FileId(2), GpuId(0x42), sizes, enc, None)
        .map_err(std::io::Error::other)?;
    let mut v = Vec::new();
    r.read_to_end(&mut v)?;
    r.finish().map_err(std::io::Error::other)?;
    Ok(v)
}

fn fp16_like(n: usize, seed: u64) -> Vec<u8> {
    // Small values around 1.0 in fp16: the high byte varies little.
    let mut x = seed | 1;
    (0..n / 2)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v: u16 = 0x3c00 | (x as u16 & 0x01ff);
            v.to_le_bytes()
        })
        .collect()
}

#[test]
fn compressed_pages_round_trip_with_zero_chunks() {
    let dir = tempdir();
    let big = crate::pages::zstd::CHUNK as usize + 3 * 4096;
    let mut a = fp16_like(big, 7);
    a[..crate::pages::zstd::CHUNK as usize].fill(0); // first chunk all zeros
    let bos = vec![(1, a), (4, fp16_like(8192, 9)), (6, vec![0u8; 4096])];
    for threads in [0, 2] {
        let path = write_compressed(&dir, &bos, threads, 100_000);
        let sizes: Vec<(usize, u64)> = bos.iter().map(|(i, b)| (*i, b.len() as u64)).collect();
        let want: Vec<u8> = bos.iter().flat_map(|(_, b)| b.clone()).collect();
        assert_eq!(
            read_compressed(&dir, &sizes).unwrap(),
            want,
            "threads {threads}"
        );
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len < want.len() as u64 / 2, "{len} of {}", want.len());
        // Zero chunks are records of 8 bytes, no frame.
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[8..16], &0u64.to_le_bytes());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damaged_compressed_frames_are_refused_naming_file_gpu_and_bo() {
    let dir = tempdir();
    let bos = vec![(3, fp16_like(1 << 20, 5)), (5, fp16_like(64 << 10, 11))];
    let sizes: Vec<(usize, u64)> = bos.iter().map(|(i, b)| (*i, b.len() as u64)).collect();
    let path = write_compressed(&dir, &bos, 0, 1 << 20);
    let good = std::fs::read(&path).unwrap();
    let n0 = u64::from_le_bytes(good[8..16].try_into().unwrap()) as usize;
    let frame_err = |bytes: &[u8]| -> String {
        std::fs::write(&path, bytes).unwrap();
        match read_compressed(&dir, &sizes) {
            Ok(_) => panic!("damage accepted"),
            Err(e) => e.to_string(),
        }
    };
    // A flipped byte inside the first frame: zstd (or its checksum) refuses.
    for at in [16 + 40, 16 + n0 / 2, 16 + n0 - 2] {
        let mut b = good.clone();
        b[at] ^= 0x5a;
        let e = frame_err(&b);
        assert!(
            e.contains("amdgpu-pages-2-0042.img: GPU 0x0042: bo_entries[3]: the compressed frame"),
            "{at}: {e}"
        );
    }
    // A record claiming more than a frame of its chunk can take.
    let mut b = good.clone();
    b[8..16].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let e = frame_err(&b);
    assert!(
        e.contains("bo_entries[3]") && e.contains("more than a frame"),
        "{e}"
    );
    // Truncated, extended.
    let e = frame_err(&good[..good.len() - 3]);
    assert!(e.contains("truncated"), "{e}");
    let mut b = good.clone();
    b.extend_from_slice(&[1, 2, 3]);
    let e = frame_err(&b);
    assert!(e.contains("3 unexpected bytes"), "{e}");
    // The frames of the two BOs swapped: each decodes to the wrong length.
    let n1 = u64::from_le_bytes(good[16 + n0..24 + n0].try_into().unwrap()) as usize;
    let mut b = good[..8].to_vec();
    b.extend_from_slice(&good[16 + n0..24 + n0 + n1]);
    b.extend_from_slice(&good[8..16 + n0]);
    let e = frame_err(&b);
    assert!(
        e.contains("bo_entries[5]") && e.contains("more than a frame"),
        "{e}"
    );
    // The header's total.
    let mut b = good.clone();
    b[0] ^= 1;
    assert!(frame_err(&b).contains("header says"));
    std::fs::write(&path, &good).unwrap();
    assert!(read_compressed(&dir, &sizes).is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_frame_needing_a_larger_window_is_refused() {
    // A frame written with a 16 MiB window (zstd's own, outside our limit).
    let data = fp16_like(4 << 20, 3);
    let mut c = ::zstd::zstd_safe::CCtx::create();
    c.set_parameter(::zstd::zstd_safe::CParameter::WindowLog(24))
        .unwrap();
    c.set_parameter(::zstd::zstd_safe::CParameter::ContentSizeFlag(false))
        .unwrap();
    let mut frame = vec![0u8; ::zstd::zstd_safe::compress_bound(data.len())];
    let n = c.compress2(&mut frame[..], &data).unwrap();
    frame.truncate(n);
    let dir = tempdir();
    let mut file = (data.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&(n as u64).to_le_bytes());
    file.extend_from_slice(&frame);
    std::fs::write(dir.join(pages_image_name(FileId(2), GpuId(0x42))), &file).unwrap();
    let e = match read_compressed(&dir, &[(0, data.len() as u64)]) {
        Ok(_) => panic!("a frame with a 16 MiB window was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("bo_entries[0]") && e.contains("compressed frame"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn encoding_is_recorded_and_checked() {
    let mut m = sample_kfd();
    assert_eq!(Encoding::of("t", &m).unwrap(), Encoding::Raw);
    Encoding::Zstd {
        level: 7,
        chunk: 1 << 20,
    }
    .record(&mut m);
    assert_eq!(
        Encoding::of("t", &m).unwrap(),
        Encoding::Zstd {
            level: 7,
            chunk: 1 << 20,
        }
    );
    m.pages_compression = Some(9);
    let e = Encoding::of("t", &m).unwrap_err().to_string();
    assert!(e.contains("pages_compression") && e.contains("9"), "{e}");
    m.pages_compression = Some(1);
    m.pages_compression_level = Some(40);
    assert!(Encoding::of("t", &m).is_err());
}

#[test]
fn compressed_pages_are_read_in_lanes_from_their_chunks() {
    let dir = tempdir();
    let chunk = crate::pages::zstd::CHUNK as usize;
    let bos = vec![(1, fp16_like(chunk + 3 * 4096, 1)), (4, fp16_like(8192, 2))];
    write_compressed(&dir, &bos, 0, 1 << 20);
    let sizes: Vec<(usize, u64)> = bos.iter().map(|(i, b)| (*i, b.len() as u64)).collect();
    let want: Vec<u8> = bos.iter().flat_map(|(_, b)| b.clone()).collect();
    let enc = ZSTD3;
    let lens = [chunk as u64, 3 * 4096, 8192];
    let rs =
        PagesReader::open_encoded_lanes(&dir, FileId(2), GpuId(0x42), &sizes, enc, &lens, None)
            .unwrap();
    let mut got = Vec::new();
    for mut r in rs.into_iter().rev() {
        let mut v = Vec::new();
        r.read_to_end(&mut v).unwrap();
        r.finish().unwrap();
        got.splice(0..0, v);
    }
    assert!(got == want, "the lanes read back other bytes");
    let bad = [4096, want.len() as u64 - 4096];
    let e = PagesReader::open_encoded_lanes(&dir, FileId(2), GpuId(0x42), &sizes, enc, &bad, None)
        .err()
        .expect("a lane inside a chunk")
        .to_string();
    assert!(e.contains("chunk"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The bytes of a pages file given through a pipe, as the image streamer
/// gives them, read back by `PagesReader::streamed`.
fn read_streamed(bytes: Vec<u8>, sizes: &[(usize, u64)], enc: Encoding) -> Result<Vec<u8>, String> {
    let (r, w) = crate::os::fd::pipe().unwrap();
    let feeder = std::thread::spawn(move || {
        let _ = std::fs::File::from(w).write_all(&bytes);
    });
    let name = pages_image_name(FileId(2), GpuId(0x42));
    let pipe = crate::stream::Pipe::new(r, &name, std::time::Duration::from_secs(5)).unwrap();
    let got = (|| {
        let mut rd =
            PagesReader::streamed(pipe, GpuId(0x42), sizes, enc).map_err(|e| e.to_string())?;
        let mut v = Vec::new();
        rd.read_to_end(&mut v).map_err(|e| e.to_string())?;
        rd.finish_stream().map_err(|e| e.to_string())?;
        Ok(v)
    })();
    feeder.join().unwrap();
    got
}

#[test]
fn streamed_pages_are_read_in_order_and_their_end_is_checked() {
    let dir = tempdir();
    // Upstream's layout, holes included.
    let mut w = PagesWriter::create(&dir, FileId(2), GpuId(0x42), 3 * 4096).unwrap();
    let mut data = vec![0u8; 3 * 4096];
    data[5000] = 7;
    w.write_all(&data).unwrap();
    w.finish().unwrap();
    let raw = std::fs::read(dir.join(pages_image_name(FileId(2), GpuId(0x42)))).unwrap();
    let sizes = [(0usize, 3 * 4096u64)];
    assert_eq!(
        read_streamed(raw.clone(), &sizes, Encoding::Raw).unwrap(),
        data
    );
    let mut longer = raw.clone();
    longer.push(1);
    let e = read_streamed(longer, &sizes, Encoding::Raw).unwrap_err();
    assert!(e.contains("the stream holds more"), "{e}");
    let e = read_streamed(raw[..raw.len() - 1].to_vec(), &sizes, Encoding::Raw).unwrap_err();
    assert!(!e.is_empty());
    // Compressed: the records read as they come.
    let bos = vec![(1, fp16_like(3 * 4096, 5)), (4, vec![0u8; 8192])];
    let path = write_compressed(&dir, &bos, 2, 5000);
    let sizes: Vec<(usize, u64)> = bos.iter().map(|(i, b)| (*i, b.len() as u64)).collect();
    let want: Vec<u8> = bos.iter().flat_map(|(_, b)| b.clone()).collect();
    let z = std::fs::read(&path).unwrap();
    assert_eq!(read_streamed(z.clone(), &sizes, ZSTD3).unwrap(), want);
    let mut longer = z.clone();
    longer.extend_from_slice(&[0; 3]);
    assert!(read_streamed(longer, &sizes, ZSTD3).is_err());
    // A record claiming more than its frame's bound.
    let mut bad = z;
    bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(read_streamed(bad, &sizes, ZSTD3).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
