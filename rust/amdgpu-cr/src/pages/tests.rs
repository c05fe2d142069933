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
/// the file reads back byte-exact (holes as zeros, not read), and an
/// all-zero BO costs a block or two of disk.
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
            let z = w.zero_bytes;
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
            r.input.hole_bytes >= 10 * SPARSE_BLOCK,
            "case {n}: holes not read"
        );
        r.finish().unwrap();
    }

    // An all-zero BO of 64 MiB: its file is a hole but for the header.
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
    assert_eq!(r.input.hole_bytes, big - (SPARSE_BLOCK - 8));
    r.finish().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
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
