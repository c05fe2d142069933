//! Shared helpers of the in-process device model tests: the test process
//! is the emulated GPU user (process_vm_* on our own pid), replies come
//! back over a channel, and fd arguments are resolved by a table instead
//! of the FUSE transport.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kfd_emu::device::{Caller, Emulator, FdResolver, Replier};

/// A reply sent to a channel.
pub struct Tx(pub Mutex<Sender<Result<Vec<u8>, i32>>>);

impl Replier for Tx {
    fn reply(self: Box<Self>, r: Result<Vec<u8>, i32>) {
        let _ = self.0.lock().unwrap().send(r);
    }
}

/// Where a [`Tx`]'s answer arrives.
pub type Answers = Receiver<Result<Vec<u8>, i32>>;

/// A replier and the channel its answer arrives on.
pub fn replier() -> (Box<dyn Replier>, Answers) {
    let (tx, rx) = channel();
    (Box::new(Tx(Mutex::new(tx))), rx)
}

/// Fd arguments of the test process: fd number → emulated open.
#[derive(Clone, Default)]
pub struct Table(pub Arc<Mutex<HashMap<i32, u64>>>);

impl Table {
    pub fn insert(&self, fd: i32, fh: u64) {
        self.0.lock().unwrap().insert(fd, fh);
    }
}

impl FdResolver for Table {
    fn open_of(&self, _tgid: u32, fd: i32) -> Result<u64, i32> {
        self.0.lock().unwrap().get(&fd).copied().ok_or(libc::EBADF)
    }
}

/// The calling thread as the model's caller.
pub fn me() -> Caller {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    Caller {
        tid,
        tgid: std::process::id(),
    }
}

/// Ioctl `cmd` on open `fh` with `input`, answered in at most `out` bytes
/// (waits up to 5 s for the answer).
pub fn call(
    emu: &Emulator,
    fh: u64,
    c: &Caller,
    cmd: u32,
    input: &[u8],
    out: usize,
) -> Result<Vec<u8>, i32> {
    let (reply, rx) = replier();
    emu.ioctl(fh, c, cmd, 0, input, out as u32, reply);
    rx.recv_timeout(Duration::from_secs(5)).expect("no reply")
}

/// A KFD `_IOWR('K', nr, size)` request number.
pub fn kfd_iowr(nr: u32, size: usize) -> u32 {
    (3 << 30) | ((size as u32) << 16) | (0x4b << 8) | nr
}

/// The effective capabilities of thread `tid`.
pub fn cap_eff(tid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap();
    let v = s.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap();
    u64::from_str_radix(v.trim(), 16).unwrap()
}
