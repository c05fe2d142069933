//! Fault injection for tests: `kfd-emu run --fail OP[:ERRNO[:SKIP[:COUNT]]]`
//! makes the emulated KFD answer a CRIU op with an error, so that the error
//! paths of a checkpoint/restore tool can be tested end to end.
//!
//! * `OP` is a `kfd_criu_op` by name: `PROCESS_INFO`, `CHECKPOINT`,
//!   `UNPAUSE`, `RESTORE` or `RESUME`; or a render-node ioctl of the SDMA
//!   path: `PRIME_FD_TO_HANDLE`, `PRIME_HANDLE_TO_FD`, `GEM_USERPTR`,
//!   `GEM_VA`, `GEM_CLOSE`, `CTX`, `BO_LIST`, `CS` or `WAIT_CS`.  Two
//!   errnos mean more than a refusal there: `CS:ECANCELED` is a GPU reset
//!   blamed on the submitting context (it stays guilty: its later CS are
//!   ECANCELED too, as amdgpu's), `WAIT_CS:ECANCELED` a reset while the
//!   job ran (the fence fails with ECANCELED, the context is guilty), and
//!   `WAIT_CS:ETIME` a wait that times out (answered at once, status 1),
//!   `GEM_WAIT_IDLE:ETIME` a BO still busy at the deadline (status 1).
//!   Every other rule fails the call before it changes anything, so
//!   EAGAIN and EINTR can be retried.
//! * `ERRNO` is the error returned, by name (`EIO`, `EACCES`, ...) or
//!   number; default `EIO`.  `EACCES` is what KFD answers a caller without
//!   `CAP_CHECKPOINT_RESTORE`/`CAP_SYS_ADMIN`.
//! * The first `SKIP` calls of that op succeed (default 0), then `COUNT`
//!   calls fail (default 0: every later call).
//!
//! The op fails before it changes any state, as KFD's argument checks do.
//! The knob lives in the daemon (the runner process): commands run under
//! `kfd-emu run` cannot see or change it, and product code never asks.
//!
//! `kfd-emu run --hold OP:PATH` makes the CRIU op `OP` wait, before it does
//! anything, until the file `PATH` exists; as it starts waiting it writes
//! `PATH.held` (the caller's pid).  A test can so stop a checkpoint/restore
//! tool at a known point (a restored task inside its `RESTORE`), act, and
//! let it go on by creating `PATH`.  Once `PATH` exists no call waits.
//! `OP` may also be `SAVE_WAVES`: PROCESS_INFO waits so after it paused the
//! process, as the shader engine is about to save the waves in flight,
//! without holding the state lock (a dump killed while its waves are
//! being saved).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use kfd_abi::layout::criu_op;

/// One `--fail` rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub op: u32,
    pub errno: i32,
    pub skip: u64,
    /// 0: unlimited.
    pub count: u64,
    /// Calls of `op` seen so far.
    seen: u64,
}

/// Render-node ioctls are ops `DRM_OP | nr` (nr: the DRM request number).
pub const DRM_OP: u32 = 0x100;

/// The op of DRM request number `nr`.
pub const fn drm_op(nr: u32) -> u32 {
    DRM_OP | nr
}

const OPS: [(&str, u32); 21] = [
    ("PROCESS_INFO", criu_op::PROCESS_INFO),
    ("CHECKPOINT", criu_op::CHECKPOINT),
    ("UNPAUSE", criu_op::UNPAUSE),
    ("RESTORE", criu_op::RESTORE),
    ("RESUME", criu_op::RESUME),
    ("GEM_CLOSE", drm_op(0x09)),
    ("PRIME_HANDLE_TO_FD", drm_op(0x2d)),
    ("PRIME_FD_TO_HANDLE", drm_op(0x2e)),
    ("CTX", drm_op(0x42)),
    ("BO_LIST", drm_op(0x43)),
    ("CS", drm_op(0x44)),
    ("GEM_VA", drm_op(0x48)),
    ("WAIT_CS", drm_op(0x49)),
    ("GEM_USERPTR", drm_op(0x51)),
    ("GEM_CREATE", drm_op(0x40)),
    ("GEM_MMAP", drm_op(0x41)),
    ("GEM_METADATA", drm_op(0x46)),
    ("GEM_WAIT_IDLE", drm_op(0x47)),
    ("GEM_OP", drm_op(0x50)),
    ("GEM_LIST_HANDLES", drm_op(0x59)),
    ("GEM_CHANGE_HANDLE", drm_op(0xd2)),
];

const ERRNOS: [(&str, i32); 16] = [
    ("EPERM", libc::EPERM),
    ("ENOENT", libc::ENOENT),
    ("ESRCH", libc::ESRCH),
    ("EINTR", libc::EINTR),
    ("EIO", libc::EIO),
    ("EBADF", libc::EBADF),
    ("EAGAIN", libc::EAGAIN),
    ("ENOMEM", libc::ENOMEM),
    ("EACCES", libc::EACCES),
    ("EINVAL", libc::EINVAL),
    ("EFAULT", libc::EFAULT),
    ("EBUSY", libc::EBUSY),
    ("ENODEV", libc::ENODEV),
    ("ENOSPC", libc::ENOSPC),
    ("ETIME", libc::ETIME),
    ("ECANCELED", libc::ECANCELED),
];

/// The `--hold` point of PROCESS_INFO where the waves in flight are about
/// to be saved (not a CRIU op: no `--fail` rule names it).
pub const SAVE_WAVES: u32 = 0x80;

/// What `--hold` can name besides the CRIU ops.
const HOLD_POINTS: [(&str, u32); 1] = [("SAVE_WAVES", SAVE_WAVES)];

/// The name of a CRIU op (or hold point), for messages.
pub fn op_name(op: u32) -> &'static str {
    OPS.iter()
        .chain(&HOLD_POINTS)
        .find(|(_, v)| *v == op)
        .map_or("unknown op", |(n, _)| n)
}

fn errno_name(e: i32) -> String {
    ERRNOS
        .iter()
        .find(|(_, v)| *v == e)
        .map_or_else(|| e.to_string(), |(n, _)| (*n).to_owned())
}

impl Fault {
    /// Parses `OP[:ERRNO[:SKIP[:COUNT]]]`.
    pub fn parse(spec: &str) -> Result<Fault, String> {
        let bad = |why: String| format!("--fail {spec:?}: {why}");
        let mut parts = spec.split(':');
        let op_s = parts.next().unwrap_or_default();
        let op = OPS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(op_s))
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                let names: Vec<&str> = OPS.iter().map(|(n, _)| *n).collect();
                bad(format!("the op is one of {}", names.join(", ")))
            })?;
        let errno = match parts.next() {
            None | Some("") => libc::EIO,
            Some(e) => match ERRNOS.iter().find(|(n, _)| n.eq_ignore_ascii_case(e)) {
                Some((_, v)) => *v,
                None => e
                    .parse::<i32>()
                    .ok()
                    .filter(|n| (1..4096).contains(n))
                    .ok_or_else(|| bad(format!("{e:?} is no errno name or number")))?,
            },
        };
        let mut num = |what: &str| -> Result<u64, String> {
            match parts.next() {
                None | Some("") => Ok(0),
                Some(v) => v
                    .parse()
                    .map_err(|_| bad(format!("{what} {v:?} is not a number"))),
            }
        };
        let skip = num("SKIP")?;
        let count = num("COUNT")?;
        if parts.next().is_some() {
            return Err(bad("too many fields".into()));
        }
        Ok(Fault {
            op,
            errno,
            skip,
            count,
            seen: 0,
        })
    }

    /// Whether the next call of its op fails; counts the call.
    fn fires(&mut self) -> bool {
        let n = self.seen;
        self.seen += 1;
        n >= self.skip && (self.count == 0 || n - self.skip < self.count)
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.op & DRM_OP != 0 {
            "DRM ioctl"
        } else {
            "CRIU_OP"
        };
        write!(
            f,
            "{kind} {} fails with {}",
            op_name(self.op),
            errno_name(self.errno)
        )?;
        if self.skip > 0 {
            write!(f, " after {} good call(s)", self.skip)?;
        }
        if self.count > 0 {
            write!(f, ", {} time(s)", self.count)?;
        }
        Ok(())
    }
}

static FAULTS: Mutex<Vec<Fault>> = Mutex::new(Vec::new());

/// One `--hold` rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    pub op: u32,
    pub path: PathBuf,
}

impl Hold {
    /// Parses `OP:PATH`.
    pub fn parse(spec: &str) -> Result<Hold, String> {
        let bad = |why: &str| format!("--hold {spec:?}: {why}");
        let (op_s, path) = spec
            .split_once(':')
            .ok_or_else(|| bad("OP:PATH expected"))?;
        let op = OPS
            .iter()
            .chain(&HOLD_POINTS)
            .find(|(n, _)| n.eq_ignore_ascii_case(op_s))
            .map(|(_, v)| *v)
            .filter(|v| v & DRM_OP == 0)
            .ok_or_else(|| bad("unknown op (only CRIU ops and SAVE_WAVES can be held)"))?;
        if path.is_empty() {
            return Err(bad("no PATH"));
        }
        Ok(Hold {
            op,
            path: PathBuf::from(path),
        })
    }

    /// `PATH.held`, written while a call waits.
    pub fn marker(&self) -> PathBuf {
        let mut m = self.path.clone().into_os_string();
        m.push(".held");
        PathBuf::from(m)
    }
}

static HOLDS: Mutex<Vec<Hold>> = Mutex::new(Vec::new());

/// Installs the `--hold` rules (replacing earlier ones).
pub fn install_holds(rules: Vec<Hold>) {
    for r in &rules {
        log::warn!(
            "fault injection: CRIU_OP {} waits until {} exists",
            op_name(r.op),
            r.path.display()
        );
    }
    *HOLDS.lock().unwrap_or_else(|p| p.into_inner()) = rules;
}

/// Called for each CRIU op of process `caller` before the op takes any
/// lock or changes any state: waits while a `--hold` rule for the op has
/// no file yet.
pub fn hold(op: u32, caller: u32) {
    let rule = HOLDS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|r| r.op == op)
        .cloned();
    let Some(rule) = rule else { return };
    if rule.path.exists() {
        return;
    }
    log::warn!(
        "fault injection: CRIU_OP {} of process {caller} waits for {}",
        op_name(op),
        rule.path.display()
    );
    if let Err(e) = std::fs::write(rule.marker(), format!("{caller}\n")) {
        log::error!("fault injection: {}: {e}", rule.marker().display());
    }
    while !rule.path.exists() {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Installs the rules (replacing earlier ones).
pub fn install(rules: Vec<Fault>) {
    for r in &rules {
        log::warn!("fault injection: {r}");
    }
    *FAULTS.lock().unwrap_or_else(|p| p.into_inner()) = rules;
}

/// Called by each CRIU op before it does anything: `Err(errno)` when a
/// rule makes this call fail.  Every rule for the op counts the call.
pub fn check(op: u32) -> Result<(), i32> {
    let mut rules = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    let mut hit = None;
    for r in rules.iter_mut().filter(|r| r.op == op) {
        if r.fires() && hit.is_none() {
            hit = Some(r.errno);
            log::warn!("fault injection: {r}: failing this call");
        }
    }
    hit.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        let f = Fault::parse("CHECKPOINT").unwrap();
        assert_eq!(
            (f.op, f.errno, f.skip, f.count),
            (criu_op::CHECKPOINT, libc::EIO, 0, 0)
        );
        let f = Fault::parse("resume:EACCES:2:1").unwrap();
        assert_eq!(
            (f.op, f.errno, f.skip, f.count),
            (criu_op::RESUME, libc::EACCES, 2, 1)
        );
        let f = Fault::parse("RESTORE:12").unwrap();
        assert_eq!(f.errno, libc::ENOMEM);
        assert_eq!(f.to_string(), "CRIU_OP RESTORE fails with ENOMEM");
        let f = Fault::parse("wait_cs:ETIME").unwrap();
        assert_eq!((f.op, f.errno), (drm_op(0x49), libc::ETIME));
        assert_eq!(f.to_string(), "DRM ioctl WAIT_CS fails with ETIME");
        assert!(
            Hold::parse("CS:/tmp/x").is_err(),
            "render ioctls are not held"
        );
        for bad in [
            "",
            "CHECK",
            "UNPAUSE:EWHAT",
            "UNPAUSE:EIO:x",
            "UNPAUSE:EIO:1:2:3",
            "RESUME:0",
        ] {
            assert!(Fault::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn holds_parse_and_wait_for_their_file() {
        let h = Hold::parse("restore:/tmp/x/go").unwrap();
        assert_eq!(
            (h.op, h.marker()),
            (criu_op::RESTORE, PathBuf::from("/tmp/x/go.held"))
        );
        for bad in ["RESTORE", "RESTORE:", "NOPE:/x"] {
            assert!(Hold::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Hold::parse("save_waves:/x").unwrap().op, SAVE_WAVES);
        assert!(Fault::parse("SAVE_WAVES").is_err(), "no op fails there");
        let tmp = tempfile::Builder::new()
            .prefix("kfd-emu-hold-")
            .tempdir()
            .unwrap();
        let dir = tmp.path();
        let go = dir.join("go");
        install_holds(vec![Hold {
            op: criu_op::UNPAUSE,
            path: go.clone(),
        }]);
        hold(criu_op::RESUME, 1);
        let waiter = std::thread::spawn(|| hold(criu_op::UNPAUSE, 7));
        let marker = dir.join("go.held");
        for _ in 0..500 {
            if marker.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "7\n");
        assert!(!waiter.is_finished(), "waits for its file");
        std::fs::write(&go, "").unwrap();
        waiter.join().unwrap();
        install_holds(Vec::new());
    }

    #[test]
    fn skip_then_count() {
        let mut f = Fault::parse("UNPAUSE:EIO:1:2").unwrap();
        let got: Vec<bool> = (0..5).map(|_| f.fires()).collect();
        assert_eq!(got, [false, true, true, false, false]);
        let mut f = Fault::parse("UNPAUSE").unwrap();
        assert!((0..5).all(|_| f.fires()));
    }
}
