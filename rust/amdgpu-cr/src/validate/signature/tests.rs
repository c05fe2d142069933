use super::*;
use ed25519_dalek::pkcs8::{spki::der::pem::LineEnding, EncodePrivateKey, EncodePublicKey};

fn key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

/// A dump directory with a GPU image, a CRIU image and a log.
fn dump_dir(root: &Path, name: &str) -> PathBuf {
    let d = root.join(name);
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("amdgpu-kfd-5.img"), b"kfd image").unwrap();
    std::fs::write(d.join("pages-1.img"), vec![7u8; 3 << 20]).unwrap();
    std::fs::write(d.join("dump.log"), b"not covered").unwrap();
    d
}

fn reasons(r: &[Refusal]) -> Vec<String> {
    r.iter().map(|r| r.to_string()).collect()
}

#[test]
fn a_signed_directory_verifies_and_logs_do_not_count() {
    let t = tempfile::tempdir().unwrap();
    let d = dump_dir(t.path(), "d");
    assert_eq!(sign(&d, &key(1)).unwrap(), (2, 9 + (3 << 20)));
    std::fs::write(d.join("dump.log"), b"written on after the signature").unwrap();
    assert_eq!(
        reasons(&verify(&d, &key(1).verifying_key())),
        Vec::<String>::new()
    );
    assert_eq!(signer(&d), Some(key_name(&key(1).verifying_key())));
}

#[test]
fn every_change_to_an_image_file_is_named() {
    let t = tempfile::tempdir().unwrap();
    let d = dump_dir(t.path(), "d");
    sign(&d, &key(1)).unwrap();
    let vk = key(1).verifying_key();
    // Same size, one byte changed, deep inside a large file.
    let mut pages = std::fs::read(d.join("pages-1.img")).unwrap();
    pages[2 << 20] ^= 1;
    std::fs::write(d.join("pages-1.img"), &pages).unwrap();
    assert_eq!(
        reasons(&verify(&d, &vk)),
        ["pages-1.img: sha256: differs from the signed digest"]
    );
    std::fs::write(d.join("pages-1.img"), b"short").unwrap();
    assert_eq!(
        reasons(&verify(&d, &vk)),
        ["pages-1.img: size: 5 bytes, signed as 3145728"]
    );
    std::fs::remove_file(d.join("pages-1.img")).unwrap();
    std::fs::write(d.join("core-9.img"), b"added").unwrap();
    assert_eq!(
        reasons(&verify(&d, &vk)),
        [
            "core-9.img: not covered by the signature",
            "pages-1.img: signed, but missing"
        ]
    );
}

#[test]
fn links_and_other_files_by_image_names_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let d = dump_dir(t.path(), "d");
    sign(&d, &key(1)).unwrap();
    let vk = key(1).verifying_key();
    std::fs::rename(d.join("pages-1.img"), t.path().join("elsewhere")).unwrap();
    std::os::unix::fs::symlink("../elsewhere", d.join("pages-1.img")).unwrap();
    std::fs::create_dir(d.join("core-2.img")).unwrap();
    assert_eq!(
        reasons(&verify(&d, &vk)),
        [
            "core-2.img: not covered by the signature",
            "pages-1.img: reading it: a symbolic link, not a file"
        ]
    );
    let e = sign(&d, &key(1)).unwrap_err().to_string();
    assert_eq!(e, "core-2.img: not a regular file");
}

#[test]
fn a_wrong_key_an_edited_list_or_no_signature_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let d = dump_dir(t.path(), "d");
    let vk = key(1).verifying_key();
    assert_eq!(
        reasons(&verify(&d, &vk)),
        ["amdgpu-signature.img: missing: CRIU_ROCM_VERIFY_KEY requires signed images"]
    );
    sign(&d, &key(2)).unwrap();
    let r = reasons(&verify(&d, &vk));
    assert_eq!(r.len(), 1);
    assert!(
        r[0].starts_with("amdgpu-signature.img: key: signed by ed25519:"),
        "{r:?}"
    );
    // Someone re-lists a changed file under the right key's name: the
    // signature no longer verifies.
    sign(&d, &key(1)).unwrap();
    std::fs::write(d.join("amdgpu-kfd-5.img"), b"hostile").unwrap();
    let text = std::fs::read_to_string(d.join(FILE)).unwrap();
    let (size, sha) = open_regular(&d.join("amdgpu-kfd-5.img"))
        .and_then(hash_file)
        .unwrap();
    let edited: String = text
        .lines()
        .map(|l| match l.starts_with("file amdgpu-kfd-5.img ") {
            true => format!("file amdgpu-kfd-5.img {size} sha256:{}\n", hex(&sha)),
            false => format!("{l}\n"),
        })
        .collect();
    std::fs::write(d.join(FILE), edited).unwrap();
    assert_eq!(
        reasons(&verify(&d, &vk)),
        ["amdgpu-signature.img: signature: does not verify"]
    );
}

#[test]
fn a_fifo_or_a_huge_file_by_the_signature_s_name_is_refused_at_once() {
    let t = tempfile::tempdir().unwrap();
    let d = dump_dir(t.path(), "d");
    let path = std::ffi::CString::new(d.join(FILE).to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let vk = key(1).verifying_key();
    assert_eq!(
        reasons(&verify(&d, &vk)),
        ["amdgpu-signature.img: reading it: not a regular file"]
    );
    assert_eq!(signer(&d), None);
    std::fs::remove_file(d.join(FILE)).unwrap();
    let f = std::fs::File::create(d.join(FILE)).unwrap();
    f.set_len(MAX_FILE + 1).unwrap();
    assert_eq!(
        reasons(&verify(&d, &vk)),
        ["amdgpu-signature.img: reading it: larger than 16777216 bytes"]
    );
}

#[test]
fn malformed_signature_files_name_the_line() {
    let cases: [(&str, &str); 5] = [
        ("", "line 1: no signature line"),
        ("x\nsignature ed25519:00\n", "line 1: the first line is not"),
        (
            "criu-rocm image signature 1\nkey ed25519:zz\nsignature ed25519:00\n",
            "line 2: not \"key ed25519:<64 hex digits>\"",
        ),
        (
            &format!(
                "criu-rocm image signature 1\nkey ed25519:{}\nfile ../x.img 1 sha256:{}\nsignature ed25519:00\n",
                "a".repeat(64),
                "b".repeat(64)
            ),
            "line 3: \"../x.img\" is not a file it may list once",
        ),
        (
            &format!(
                "criu-rocm image signature 1\nkey ed25519:{}\nsignature ed25519:00\n",
                "a".repeat(64)
            ),
            "line 3: not \"signature ed25519:<128 hex digits>\"",
        ),
    ];
    for (text, want) in cases {
        let r = parse(text.as_bytes()).err().unwrap().to_string();
        assert!(r.contains(want), "{text:?}: {r}");
    }
}

#[test]
fn parents_are_verified_and_named() {
    let t = tempfile::tempdir().unwrap();
    let parent = dump_dir(t.path(), "pre");
    let child = dump_dir(t.path(), "dump");
    std::os::unix::fs::symlink("../pre", child.join(PARENT_LINK)).unwrap();
    sign(&parent, &key(1)).unwrap();
    sign(&child, &key(1)).unwrap();
    let vk = key(1).verifying_key();
    assert!(verify(&child, &vk).is_empty());
    std::fs::write(parent.join("amdgpu-kfd-5.img"), b"changed!!").unwrap();
    assert_eq!(
        reasons(&verify(&child, &vk)),
        ["parent/amdgpu-kfd-5.img: sha256: differs from the signed digest"]
    );
    std::fs::write(parent.join("amdgpu-kfd-5.img"), b"kfd image").unwrap();
    assert!(verify(&child, &vk).is_empty());
    // Another signed pre-dump of the same key put in the parent's place.
    let other = dump_dir(t.path(), "other");
    std::fs::write(other.join("pages-1.img"), b"other pages").unwrap();
    sign(&other, &key(1)).unwrap();
    std::fs::remove_file(child.join(PARENT_LINK)).unwrap();
    std::os::unix::fs::symlink("../other", child.join(PARENT_LINK)).unwrap();
    assert_eq!(
        reasons(&verify(&child, &vk)),
        [
            "amdgpu-signature.img: parent: parent/amdgpu-signature.img is not the parent's \
          signature signed with it"
        ]
    );
    // A real directory named parent, unsigned: CRIU opens it all the same.
    std::fs::remove_file(child.join(PARENT_LINK)).unwrap();
    std::fs::create_dir(child.join(PARENT_LINK)).unwrap();
    std::fs::copy(parent.join("pages-1.img"), child.join("parent/pages-1.img")).unwrap();
    let r = reasons(&verify(&child, &vk));
    assert!(
        r.len() == 1
            && r[0].starts_with(
                "amdgpu-signature.img: parent: parent/amdgpu-signature.img: No such file"
            ),
        "{r:?}"
    );
    // A parent added to a directory signed without one.
    let lone = dump_dir(t.path(), "lone");
    sign(&lone, &key(1)).unwrap();
    std::os::unix::fs::symlink("../pre", lone.join(PARENT_LINK)).unwrap();
    assert_eq!(
        reasons(&verify(&lone, &vk)),
        [
            "amdgpu-signature.img: parent: the directory has parent images (parent) the \
          signature does not name"
        ]
    );
    // Signing on top of unsigned parent images fails the dump.
    dump_dir(t.path(), "unsigned");
    let on_top = dump_dir(t.path(), "on-top");
    std::os::unix::fs::symlink("../unsigned", on_top.join(PARENT_LINK)).unwrap();
    let e = sign(&on_top, &key(1)).unwrap_err().to_string();
    assert!(
        e.starts_with("parent/amdgpu-signature.img: No such file"),
        "{e}"
    );
}

#[test]
fn keys_are_read_from_openssl_pem_files() {
    let t = tempfile::tempdir().unwrap();
    let k = key(3);
    let private = t.path().join("key.pem");
    let public = t.path().join("pub.pem");
    std::fs::write(&private, k.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes()).unwrap();
    std::fs::write(
        &public,
        k.verifying_key().to_public_key_pem(LineEnding::LF).unwrap(),
    )
    .unwrap();
    let p = private.to_str().unwrap();
    assert_eq!(parse_sign_key(p).unwrap().to_bytes(), k.to_bytes());
    assert_eq!(
        parse_verify_key(public.to_str().unwrap()).unwrap(),
        k.verifying_key()
    );
    let e = parse_verify_key(p).unwrap_err().to_string();
    assert!(
        e.contains("CRIU_ROCM_VERIFY_KEY") && e.contains("not an Ed25519 public key"),
        "{e}"
    );
    let e = parse_sign_key("/nonexistent/key.pem")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/nonexistent/key.pem") && e.contains("reading it"),
        "{e}"
    );
}

#[test]
fn key_paths_must_be_absolute_and_readable_as_text() {
    use std::os::unix::ffi::OsStrExt;
    const VAR: &str = "CRIU_ROCM_TEST_SIGNATURE_KEY_PATH";
    std::env::remove_var(VAR);
    assert_eq!(key_path(VAR).unwrap(), None);
    std::env::set_var(VAR, "keys/pub.pem");
    let e = key_path(VAR).unwrap_err().to_string();
    assert!(e.contains("not an absolute path"), "{e}");
    std::env::set_var(VAR, std::ffi::OsStr::from_bytes(b"/keys/\xff.pem"));
    let e = key_path(VAR).unwrap_err().to_string();
    assert!(e.contains("not valid UTF-8"), "{e}");
    std::env::set_var(VAR, "/keys/pub.pem");
    assert_eq!(key_path(VAR).unwrap().as_deref(), Some("/keys/pub.pem"));
    std::env::remove_var(VAR);
}

#[test]
fn a_required_signature_digest_names_one_dump() {
    let t = tempfile::tempdir().unwrap();
    let old = dump_dir(t.path(), "old");
    sign(&old, &key(1)).unwrap();
    let new = dump_dir(t.path(), "new");
    std::fs::write(new.join("amdgpu-kfd-5.img"), b"kfd image, later").unwrap();
    sign(&new, &key(1)).unwrap();
    let digest = signature_digest(&new).unwrap();
    let want = crate::env::parse_signature_digest(&digest).unwrap();
    let req = Required {
        key: key(1).verifying_key(),
        signature: Some(want),
    };
    assert_eq!(reasons(&verify_required(&new, &req)), Vec::<String>::new());
    // The older dump, signed with the same key, verifies without the
    // digest and is refused with it.
    let any = Required {
        signature: None,
        ..req.clone()
    };
    assert_eq!(reasons(&verify_required(&old, &any)), Vec::<String>::new());
    let r = reasons(&verify_required(&old, &req));
    assert!(
        r.len() == 1
            && r[0].starts_with("amdgpu-signature.img: its SHA-256 is ")
            && r[0].contains(&format!(
                "not the {digest} CRIU_ROCM_VERIFY_SIGNATURE requires"
            )),
        "{r:?}"
    );
    // The key is still checked: the digest of a file signed by another.
    let other = dump_dir(t.path(), "other");
    sign(&other, &key(2)).unwrap();
    let by_other = Required {
        key: key(1).verifying_key(),
        signature: Some(
            crate::env::parse_signature_digest(&signature_digest(&other).unwrap()).unwrap(),
        ),
    };
    let r = reasons(&verify_required(&other, &by_other));
    assert!(r.len() == 1 && r[0].contains("key: signed by"), "{r:?}");
    for bad in ["sha256:12", "md5:00", &digest[7..]] {
        let e = crate::env::parse_signature_digest(bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("CRIU_ROCM_VERIFY_SIGNATURE"), "{e}");
    }
}

#[test]
fn images_others_can_write_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let set = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let t = tempfile::tempdir().unwrap();
    let d = dump_dir(t.path(), "d");
    sign(&d, &key(1)).unwrap();
    let vk = key(1).verifying_key();
    assert_eq!(reasons(&verify(&d, &vk)), Vec::<String>::new());
    // A file group or others may write: its bytes could change after the
    // check.
    set(&d.join("pages-1.img"), 0o646);
    assert_eq!(
        reasons(&verify(&d, &vk)),
        [
            "pages-1.img: reading it: writable by group or others (mode 646): it could change \
          after the check"
        ]
    );
    set(&d.join("pages-1.img"), 0o644);
    // The directory: files could be swapped.
    set(&d, 0o775);
    let r = reasons(&verify(&d, &vk));
    assert!(
        r.len() == 1
            && r[0].contains("the image directory is writable by group or others (mode 775)"),
        "{r:?}"
    );
    set(&d, 0o755);
    // A directory above it others write to, without the sticky bit: the
    // image directory could be renamed away and another put in its place.
    set(t.path(), 0o777);
    let r = reasons(&verify(&d, &vk));
    assert!(
        r.len() == 1
            && r[0].contains(&format!(
                "its ancestor {} is writable by group or others (mode 777)",
                t.path().canonicalize().unwrap().display()
            )),
        "{r:?}"
    );
    // Sticky (as /tmp): others cannot rename our entries.
    set(t.path(), 0o1777);
    assert_eq!(reasons(&verify(&d, &vk)), Vec::<String>::new());
    // A parent directory others may write to is refused as "parent/".
    let child = dump_dir(t.path(), "child");
    std::os::unix::fs::symlink("../d", child.join(PARENT_LINK)).unwrap();
    sign(&child, &key(1)).unwrap();
    set(&d, 0o757);
    let r = reasons(&verify(&child, &vk));
    assert!(
        r.len() == 1 && r[0].starts_with("parent/: the image directory is writable"),
        "{r:?}"
    );
    set(&d, 0o755);
    set(t.path(), 0o700);
}

#[test]
fn network_and_fuse_filesystems_are_told_apart() {
    assert_eq!(untrusted_type(0x6573_5546), Some("FUSE"));
    assert_eq!(untrusted_type(0x6969), Some("NFS"));
    // CIFS' magic as a signed 32-bit f_type (sign extended) and as it is.
    assert_eq!(untrusted_type(0xff53_4d42_u32 as i32 as i64), Some("CIFS"));
    assert_eq!(untrusted_type(0xff53_4d42), Some("CIFS"));
    // ext4, tmpfs, XFS, btrfs.
    for t in [0xef53, 0x0102_1994, 0x5846_5342, 0x9123_683e] {
        assert_eq!(untrusted_type(t), None, "{t:#x}");
    }
    let t = tempfile::tempdir().unwrap();
    assert_eq!(untrusted_filesystem(t.path()).unwrap(), None);
}
