//! `amdgpu-signature.img`: an Ed25519 signature over the SHA-256 of every
//! image file of a dump, so that a restore can require that the images
//! come from a holder of the key (see Documentation/image-format.md,
//! "Signed images").  Off unless a key is given: the dump signs when
//! `CRIU_ROCM_SIGN_KEY` names a private key, the restore and `gpu-check`
//! require a valid signature when `CRIU_ROCM_VERIFY_KEY` names a public
//! key.  Keys are PEM files as OpenSSL writes them (`openssl genpkey
//! -algorithm ed25519`, `openssl pkey -pubout`).
//!
//! `amdgpu-digests.img` finds damage; anyone can recompute it.  The
//! signature covers every `*.img` file of the directory, CRIU's own images
//! as well as the GPU ones (contents included: the pages files are hashed
//! whole), and the dump's parent directories each carry their own.  Text,
//! one line per file, the signature last over every byte before it:
//!
//! ```text
//! criu-rocm image signature 1
//! key ed25519:<public key, 64 hex digits>
//! file amdgpu-kfd-5.img 12714 sha256:<64 hex digits>
//! file pages-1.img 8192 sha256:<64 hex digits>
//! signature ed25519:<128 hex digits>
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use sha2::{Digest, Sha256};

use super::chain::PARENT_LINK;
use super::Refusal;
use crate::env::{knob, unhex, EnvError};
pub use crate::env::{SIGN_KEY_VAR, VERIFY_KEY_VAR, VERIFY_SIGNATURE_VAR};

/// The file's name in the image directory.
pub const FILE: &str = "amdgpu-signature.img";
/// Its first line.
const HEADER: &str = "criu-rocm image signature 1";

/// Whether the signature covers the directory entry `name`: every image
/// file but the signature itself (logs and CRIU's stats are not read by a
/// restore, and a dump's log is still being written when it signs).
fn covered(name: &str) -> bool {
    name.ends_with(".img") && name != FILE
}

fn key_error(var: &'static str, path: &str, reason: impl std::fmt::Display) -> EnvError {
    EnvError::Invalid {
        var,
        value: path.to_owned(),
        reason: reason.to_string(),
    }
}

fn read_pem(var: &'static str, path: &str) -> Result<String, EnvError> {
    let f = open_regular(Path::new(path))
        .map_err(|e| key_error(var, path, format!("reading it: {e}")))?;
    let md = f
        .metadata()
        .map_err(|e| key_error(var, path, format!("reading it: {e}")))?;
    // A key anyone else could have written decides nothing.
    if let Err(why) = only_ours(&md, false) {
        return Err(key_error(var, path, why));
    }
    let mut pem = String::new();
    f.take(MAX_FILE)
        .read_to_string(&mut pem)
        .map_err(|e| key_error(var, path, format!("reading it: {e}")))?;
    Ok(pem)
}

/// Whether only root and this process' user can change what `md`
/// describes: owned by one of them and writable by neither group nor
/// others (`sticky_ok`: a sticky directory others may write to, in which
/// they cannot rename or remove our entries, e.g. `/tmp`).  The reason
/// when not.
fn only_ours(md: &std::fs::Metadata, sticky_ok: bool) -> Result<(), String> {
    if md.uid() != 0 && md.uid() != euid() {
        return Err(format!("owned by uid {}, not by root or us", md.uid()));
    }
    let sticky = md.is_dir() && md.mode() & libc::S_ISVTX != 0;
    if md.mode() & 0o022 != 0 && !(sticky_ok && sticky) {
        return Err(format!(
            "writable by group or others (mode {:o})",
            md.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Filesystems whose owners and modes say nothing about who can change
/// the files, by `statfs` type: a FUSE daemon serves any bytes under any
/// owner (and with `allow_other` to every user), an NFS, SMB or 9P server
/// changes files behind the client's cache and maps owners its own way.
const UNTRUSTED_FILESYSTEMS: [(i64, &str); 6] = [
    (0x6573_5546, "FUSE"),
    (0x6969, "NFS"),
    (0xff53_4d42_u32 as i64, "CIFS"),
    (0xfe53_4d42_u32 as i64, "SMB2"),
    (0x517b, "SMB"),
    (0x0102_1997, "9P"),
];

/// The kind of filesystem `dir` is on when it is one of
/// [`UNTRUSTED_FILESYSTEMS`].
fn untrusted_filesystem(dir: &Path) -> std::io::Result<Option<&'static str>> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: an all-zero statfs is a valid value of the plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statfs.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(untrusted_type(st.f_type as i64))
}

fn untrusted_type(f_type: i64) -> Option<&'static str> {
    // f_type is a signed word on some ABIs: compare its low 32 bits.
    UNTRUSTED_FILESYSTEMS
        .iter()
        .find(|(t, _)| *t as u32 == f_type as u32)
        .map(|(_, name)| *name)
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The key file a knob names: an absolute path (CRIU changes into its
/// work directory, by default the image directory, before the GPU code
/// reads it, so a relative one would be looked up among the images), in
/// any encoding but one that cannot be read back as text (refused rather
/// than taken as unset).
fn key_path(var: &'static str) -> Result<Option<String>, EnvError> {
    let value = match knob(var) {
        Some(v) => v,
        None => match std::env::var_os(var) {
            Some(raw) => {
                let shown = raw.to_string_lossy().into_owned();
                return Err(key_error(var, &shown, "not valid UTF-8"));
            }
            None => return Ok(None),
        },
    };
    if !Path::new(&value).is_absolute() {
        return Err(key_error(
            var,
            &value,
            "not an absolute path (CRIU reads it from inside its work directory)",
        ));
    }
    Ok(Some(value))
}

/// The dump's signing key, when `CRIU_ROCM_SIGN_KEY` names one.
pub fn sign_key_from_env() -> Result<Option<SigningKey>, EnvError> {
    key_path(SIGN_KEY_VAR)?
        .map(|p| parse_sign_key(&p))
        .transpose()
}

/// What a restore requires of the images' signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Required {
    /// `CRIU_ROCM_VERIFY_KEY`: the key that signed them.
    pub key: VerifyingKey,
    /// `CRIU_ROCM_VERIFY_SIGNATURE`: the SHA-256 of the signature file
    /// itself, which names every image file's digest and the parent's
    /// signature: one dump, no older one signed with the same key.
    pub signature: Option<[u8; 32]>,
}

/// What a restore requires, when `CRIU_ROCM_VERIFY_KEY` names a key.  A
/// required signature digest without a key is refused: it would be
/// checked against nothing anyone signed.
pub fn verify_key_from_env() -> Result<Option<Required>, EnvError> {
    let signature = match knob(VERIFY_SIGNATURE_VAR) {
        Some(v) => Some(crate::env::parse_signature_digest(&v)?),
        None if std::env::var_os(VERIFY_SIGNATURE_VAR).is_some() => {
            return Err(key_error(VERIFY_SIGNATURE_VAR, "", "not valid UTF-8"));
        }
        None => None,
    };
    let Some(path) = key_path(VERIFY_KEY_VAR)? else {
        return match signature {
            Some(_) => Err(EnvError::Invalid {
                var: VERIFY_SIGNATURE_VAR,
                value: knob(VERIFY_SIGNATURE_VAR).unwrap_or_default(),
                reason: format!("set without {VERIFY_KEY_VAR}, the key the images are signed with"),
            }),
            None => Ok(None),
        };
    };
    Ok(Some(Required {
        key: parse_verify_key(&path)?,
        signature,
    }))
}

/// Reads a PKCS#8 PEM Ed25519 private key from `path`.
pub fn parse_sign_key(path: &str) -> Result<SigningKey, EnvError> {
    let pem = read_pem(SIGN_KEY_VAR, path)?;
    SigningKey::from_pkcs8_pem(&pem).map_err(|e| {
        key_error(
            SIGN_KEY_VAR,
            path,
            format!("not an Ed25519 private key in PKCS#8 PEM: {e}"),
        )
    })
}

/// Reads an SPKI PEM Ed25519 public key from `path`.
pub fn parse_verify_key(path: &str) -> Result<VerifyingKey, EnvError> {
    let pem = read_pem(VERIFY_KEY_VAR, path)?;
    VerifyingKey::from_public_key_pem(&pem).map_err(|e| {
        key_error(
            VERIFY_KEY_VAR,
            path,
            format!("not an Ed25519 public key in PEM: {e}"),
        )
    })
}

/// `ed25519:` and the key's bytes in hex: how images and logs name a key.
pub fn key_name(key: &VerifyingKey) -> String {
    format!("ed25519:{}", hex(key.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Opens a regular file for reading, never through a symbolic link and
/// never blocking on a FIFO or device planted under its name.
fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => std::io::Error::other("a symbolic link, not a file"),
            _ => e,
        })?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(f)
}

/// The most a signature or key file may hold: 16 MiB, some 150000
/// image files' lines.
const MAX_FILE: u64 = 16 << 20;

/// The signature file of `dir`, read whole within [`MAX_FILE`].
fn read_signature(dir: &Path) -> std::io::Result<Vec<u8>> {
    let f = open_regular(&dir.join(FILE))?;
    if f.metadata()?.len() > MAX_FILE {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_FILE} bytes"
        )));
    }
    let mut bytes = Vec::new();
    f.take(MAX_FILE).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The image file `path` for verifying: one only root and we can change
/// (else the bytes hashed need not be the bytes CRIU reads later).
fn open_ours(path: &Path) -> std::io::Result<std::fs::File> {
    let f = open_regular(path)?;
    only_ours(&f.metadata()?, false)
        .map_err(|why| std::io::Error::other(format!("{why}: it could change after the check")))?;
    Ok(f)
}

/// Size and SHA-256 of one file, read once.
fn hash_file(mut f: std::fs::File) -> std::io::Result<(u64, [u8; 32])> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok((size, h.finalize().into()));
        }
        size += n as u64;
        h.update(&buf[..n]);
    }
}

/// The covered files of `dir`, by name.
fn covered_files(dir: &Path) -> std::io::Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for e in std::fs::read_dir(dir)? {
        // Every type: a symbolic link or a directory by an image's name
        // is refused by [`open_regular`], not skipped.
        if let Ok(name) = e?.file_name().into_string() {
            if covered(&name) {
                names.insert(name);
            }
        }
    }
    Ok(names)
}

/// Signs the image files of `dir` with `key`: writes [`FILE`] (through a
/// temporary file renamed into place, so a killed dump leaves no half
/// signature).  Returns the number of files and bytes covered.
pub fn sign(dir: &Path, key: &SigningKey) -> std::io::Result<(usize, u64)> {
    let mut text = format!("{HEADER}\nkey {}\n", key_name(&key.verifying_key()));
    // Bound to the parent's signature, so that no other signed parent can
    // be put in its place.
    if let Some(parent) = parent_of(dir).map_err(std::io::Error::other)? {
        let sig = read_signature(&parent).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("{PARENT_LINK}/{FILE}: {e} (a signed dump needs signed parent images)"),
            )
        })?;
        let _ = writeln!(text, "parent sha256:{}", hex(&Sha256::digest(&sig)));
    }
    let mut bytes = 0;
    let names = covered_files(dir)?;
    for name in &names {
        let (size, sha) = open_regular(&dir.join(name))
            .and_then(hash_file)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{name}: {e}")))?;
        bytes += size;
        let _ = writeln!(text, "file {name} {size} sha256:{}", hex(&sha));
    }
    let sig = key.sign(text.as_bytes());
    let _ = writeln!(text, "signature ed25519:{}", hex(&sig.to_bytes()));
    let mut tmp = tempfile::Builder::new()
        .prefix(".amdgpu-signature-")
        .tempfile_in(dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(dir.join(FILE)).map_err(|e| e.error)?;
    Ok((names.len(), bytes))
}

/// The directory CRIU takes parent images from: `parent` as a link or a
/// directory; `None` when there is none.  Anything else by that name is
/// an error, never "no parent": CRIU would still open it.
fn parent_of(dir: &Path) -> Result<Option<PathBuf>, String> {
    let path = dir.join(PARENT_LINK);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{PARENT_LINK}: {e}")),
        Ok(md) if md.file_type().is_symlink() => std::fs::read_link(&path)
            .map(|t| Some(dir.join(t)))
            .map_err(|e| format!("{PARENT_LINK}: {e}")),
        Ok(md) if md.is_dir() => Ok(Some(path)),
        Ok(_) => Err(format!(
            "{PARENT_LINK}: neither a directory nor a link to one"
        )),
    }
}

/// A parsed, not yet verified, signature file.
struct Signed {
    key: [u8; 32],
    /// The SHA-256 of the parent directory's signature file.
    parent: Option<[u8; 32]>,
    files: BTreeMap<String, (u64, [u8; 32])>,
    /// The bytes the signature covers.
    body: Vec<u8>,
    signature: [u8; 64],
}

fn malformed(line: usize, what: &str) -> Refusal {
    Refusal::new(FILE, None, format!("line {line}"), what.to_owned())
}

/// `prefix` and `N` bytes in hex, the whole of `s`.
fn fixed<const N: usize>(s: &str, prefix: &str, line: usize) -> Result<[u8; N], Refusal> {
    s.strip_prefix(prefix)
        .and_then(unhex)
        .and_then(|v| <[u8; N]>::try_from(v).ok())
        .ok_or_else(|| malformed(line, &format!("not \"{prefix}<{} hex digits>\"", N * 2)))
}

/// Reads the lines of a signature file, in the order [`sign`] writes them.
fn parse(bytes: &[u8]) -> Result<Signed, Refusal> {
    let text = std::str::from_utf8(bytes).map_err(|_| malformed(1, "not text"))?;
    let body_end = text
        .rfind("signature ")
        .filter(|&i| i > 0 && text.as_bytes()[i - 1] == b'\n')
        .ok_or_else(|| malformed(1, "no signature line"))?;
    let mut lines = text[..body_end]
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l));
    if lines.next().map(|(_, l)| l) != Some(HEADER) {
        return Err(malformed(1, &format!("the first line is not {HEADER:?}")));
    }
    let key = match lines.next() {
        Some((n, l)) => fixed::<32>(l, "key ed25519:", n)?,
        None => return Err(malformed(2, "no key line")),
    };
    let mut lines = lines.peekable();
    let parent = match lines.peek() {
        Some(&(n, l)) if l.starts_with("parent ") => {
            lines.next();
            Some(fixed::<32>(l, "parent sha256:", n)?)
        }
        _ => None,
    };
    let mut files = BTreeMap::new();
    for (n, l) in lines {
        let mut f = l.split(' ');
        let (Some("file"), Some(name), Some(size), Some(sha), None) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return Err(malformed(n, "not \"file NAME SIZE sha256:HEX\""));
        };
        let size = size
            .parse::<u64>()
            .map_err(|_| malformed(n, "the size is not a number"))?;
        let sha = fixed::<32>(sha, "sha256:", n)?;
        if !covered(name)
            || name.contains('/')
            || files.insert(name.to_owned(), (size, sha)).is_some()
        {
            return Err(malformed(
                n,
                &format!("{name:?} is not a file it may list once"),
            ));
        }
    }
    let sig_line = text[body_end..].trim_end_matches('\n');
    let n = text[..body_end].lines().count() + 1;
    if sig_line.contains('\n') {
        return Err(malformed(n + 1, "text after the signature line"));
    }
    let signature = fixed::<64>(sig_line, "signature ed25519:", n)?;
    Ok(Signed {
        key,
        parent,
        files,
        body: bytes[..body_end].to_vec(),
        signature,
    })
}

/// Checks the signature of `dir` (and of each parent directory its
/// `parent` link leads to) against `key`: the file verifies, was made
/// with that key, and lists exactly the directory's image files with
/// their sizes and SHA-256.  Every refusal names the file ("parent/NAME"
/// for a parent's).
pub fn verify(dir: &Path, key: &VerifyingKey) -> Vec<Refusal> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    let mut next = Some(Place {
        dir: dir.to_path_buf(),
        depth: 0,
    });
    while let Some(place) = next.take() {
        match place.dir.canonicalize() {
            Ok(canon) => {
                if !seen.insert(canon) {
                    out.push(place.refuse("", "", "a parent of itself"));
                    break;
                }
            }
            Err(e) => {
                out.push(place.refuse("", "", format!("cannot be resolved: {e}")));
                break;
            }
        }
        let (refusals, parent) = place.verify(key);
        out.extend(refusals);
        next = parent;
    }
    out
}

/// [`verify`] with what a restore requires: first, when a signature
/// digest is required, that `dir`'s signature file is that one (its
/// parents are bound to it through their digests in it).
pub fn verify_required(dir: &Path, req: &Required) -> Vec<Refusal> {
    if let Some(want) = &req.signature {
        let got = read_signature(dir).map(|b| <[u8; 32]>::from(Sha256::digest(&b)));
        let why = match got {
            Ok(g) if g == *want => None,
            Ok(g) => Some(format!(
                "its SHA-256 is {}, not the sha256:{} {VERIFY_SIGNATURE_VAR} requires: \
                 another dump signed with the same key (an older one?)",
                hex(&g),
                hex(want)
            )),
            Err(e) => Some(format!("reading it: {e}")),
        };
        if let Some(why) = why {
            return vec![Refusal::new(FILE, None, "", why)];
        }
    }
    verify(dir, &req.key)
}

/// The SHA-256 of `dir`'s signature file as [`VERIFY_SIGNATURE_VAR`]
/// takes it (`sha256:<hex>`), when it has one.
pub fn signature_digest(dir: &Path) -> Option<String> {
    read_signature(dir)
        .ok()
        .map(|b| format!("sha256:{}", hex(&Sha256::digest(&b))))
}

/// A directory of the chain: the dump's own (depth 0) or a parent.
struct Place {
    dir: PathBuf,
    depth: usize,
}

impl Place {
    /// A refusal naming `file` as the chain's other messages do:
    /// "parent/", "parent/parent/", ... before a parent's files.
    fn refuse(&self, file: &str, field: &str, reason: impl Into<String>) -> Refusal {
        Refusal {
            file: format!("{}{file}", "parent/".repeat(self.depth)),
            gpu: None,
            field: field.to_owned(),
            reason: reason.into(),
        }
    }

    /// This directory's refusals, and the parent to verify next (none
    /// once this one is refused: its list of files is not to be trusted).
    fn verify(&self, key: &VerifyingKey) -> (Vec<Refusal>, Option<Place>) {
        if let Err(r) = self.check_owners() {
            return (vec![r], None);
        }
        let refuse = |field: &str, why: String| (vec![self.refuse(FILE, field, why)], None);
        let bytes = match read_signature(&self.dir) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return refuse(
                    "",
                    format!("missing: {VERIFY_KEY_VAR} requires signed images"),
                );
            }
            Err(e) => return refuse("", format!("reading it: {e}")),
        };
        let signed = match parse(&bytes) {
            Ok(s) => s,
            Err(r) => return refuse(&r.field, r.reason),
        };
        if signed.key != *key.as_bytes() {
            let why = format!(
                "signed by ed25519:{}, not by the required {}",
                hex(&signed.key),
                key_name(key)
            );
            return refuse("key", why);
        }
        let sig = Signature::from_bytes(&signed.signature);
        if key.verify(&signed.body, &sig).is_err() {
            return refuse("signature", "does not verify".into());
        }
        let parent = match self.check_parent(signed.parent) {
            Ok(p) => p,
            Err(why) => return refuse("parent", why),
        };
        (self.check_files(&signed.files), parent)
    }

    /// The directory and every directory above it: no one but root and
    /// us can put other files in place of the ones verified, or another
    /// directory in place of this one, after the check (directories above
    /// may be sticky ones others write to, like `/tmp`).  The files
    /// themselves are checked as they are hashed ([`open_ours`]).
    fn check_owners(&self) -> Result<(), Refusal> {
        let refuse = |path: &Path, what: &str, why: String| {
            let file = match self.depth {
                0 => path.display().to_string(),
                _ => "parent/".repeat(self.depth),
            };
            Refusal {
                file,
                gpu: None,
                field: String::new(),
                reason: format!("{what} {why}: the images could change after the check"),
            }
        };
        let canon = self
            .dir
            .canonicalize()
            .map_err(|e| refuse(&self.dir, "the image directory", e.to_string()))?;
        match untrusted_filesystem(&canon) {
            Ok(None) => {}
            Ok(Some(fs)) => {
                return Err(refuse(
                    &canon,
                    "the image directory is",
                    format!(
                        "on a {fs} filesystem, whose owners and modes do not tell who can \
                         change its files"
                    ),
                ))
            }
            Err(e) => {
                return Err(refuse(
                    &canon,
                    "the image directory's filesystem",
                    format!("cannot be told: {e}"),
                ))
            }
        }
        for (i, d) in canon.ancestors().enumerate() {
            let what = match i {
                0 => "the image directory is".to_owned(),
                _ => format!("its ancestor {} is", d.display()),
            };
            std::fs::metadata(d)
                .map_err(|e| e.to_string())
                .and_then(|md| only_ours(&md, i > 0))
                .map_err(|why| refuse(&canon, &what, why))?;
        }
        Ok(())
    }

    /// The parent CRIU will read against the one the signature names.
    fn check_parent(&self, signed: Option<[u8; 32]>) -> Result<Option<Place>, String> {
        let dir = parent_of(&self.dir)?;
        match (signed, dir) {
            (None, None) => Ok(None),
            (Some(_), None) => Err("names parent images, but the directory has none".into()),
            (None, Some(_)) => Err(format!(
                "the directory has parent images ({PARENT_LINK}) the signature does not name"
            )),
            (Some(want), Some(dir)) => {
                let got = read_signature(&dir)
                    .map(|b| <[u8; 32]>::from(Sha256::digest(&b)))
                    .map_err(|e| format!("{PARENT_LINK}/{FILE}: {e}"))?;
                if got != want {
                    return Err(format!(
                        "{PARENT_LINK}/{FILE} is not the parent's signature signed with it"
                    ));
                }
                Ok(Some(Place {
                    dir,
                    depth: self.depth + 1,
                }))
            }
        }
    }

    /// The directory's image files against the signed list.
    fn check_files(&self, listed: &BTreeMap<String, (u64, [u8; 32])>) -> Vec<Refusal> {
        let present = match covered_files(&self.dir) {
            Ok(p) => p,
            Err(e) => return vec![self.refuse(FILE, "", format!("listing the directory: {e}"))],
        };
        let mut out: Vec<Refusal> = present
            .iter()
            .filter(|n| !listed.contains_key(*n))
            .map(|n| self.refuse(n, "", "not covered by the signature"))
            .collect();
        for (name, &(size, sha)) in listed {
            let why = match open_ours(&self.dir.join(name)).and_then(hash_file) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    Some(("", "signed, but missing".to_owned()))
                }
                Err(e) => Some(("", format!("reading it: {e}"))),
                Ok((s, _)) if s != size => Some(("size", format!("{s} bytes, signed as {size}"))),
                Ok((_, h)) if h != sha => Some(("sha256", "differs from the signed digest".into())),
                Ok(_) => None,
            };
            if let Some((field, reason)) = why {
                out.push(self.refuse(name, field, reason));
            }
        }
        out
    }
}

/// The note a restore and `gpu-check` print of `dir`'s signature once it
/// passed [`verify`] (with a required key, which the first check of a
/// restore and `gpu-check` run before anything else), or when no key is
/// required and the images are signed all the same.
pub fn note(dir: &Path, required: Option<&Required>) -> Option<String> {
    match required {
        Some(req) => Some(format!(
            "the images are signed by the required {} ({VERIFY_SIGNATURE_VAR} {}{})",
            key_name(&req.key),
            signature_digest(dir).unwrap_or_default(),
            if req.signature.is_some() {
                ", required"
            } else {
                ""
            }
        )),
        None => signer(dir).map(|k| {
            format!("the images are signed by {k}; {VERIFY_KEY_VAR} is unset, so not checked")
        }),
    }
}

/// The key a directory's signature names, when it has one that parses:
/// for the note a restore without a required key prints.
pub fn signer(dir: &Path) -> Option<String> {
    let bytes = read_signature(dir).ok()?;
    parse(&bytes)
        .ok()
        .map(|s| format!("ed25519:{}", hex(&s.key)))
}

#[cfg(test)]
mod tests;
