//! Shared helpers of the in-process device model tests: the test process
//! is the emulated GPU user (process_vm_* on our own pid), replies come
//! back over a channel, and fd arguments are resolved by a table instead
//! of the FUSE transport.

#![allow(dead_code)]

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kfd_emu::device::{Caller, Emulator, FdResolver, NodeKind, Replier};

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

/// An argument struct of `size` bytes; fields of 4 bytes when the offset
/// is not 8-aligned or the value fits the slot after it.
pub fn args(fields: &[(usize, u64)], size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    for &(off, val) in fields {
        if off % 8 == 0 && off + 8 <= size && val > u32::MAX as u64 {
            v[off..off + 8].copy_from_slice(&val.to_le_bytes());
        } else {
            v[off..off + 4].copy_from_slice(&(val as u32).to_le_bytes());
        }
    }
    v
}

/// CREATE_QUEUE arguments as ROCr fills them: a ring of `ring_size` bytes
/// at `ring`, the write and read pointers at `wptr` and `rptr`, 100 % of
/// the queue time, priority 7, and the context save area `ctx` when given
/// (its VA, its size and its control stack's size).
pub fn queue_args(
    gpu: u32,
    ty: u32,
    (ring, ring_size): (u64, u64),
    (wptr, rptr): (u64, u64),
    ctx: Option<(u64, u64, u64)>,
) -> Vec<u8> {
    let mut fields = vec![
        (0, ring),
        (8, wptr),
        (16, rptr),
        (32, ring_size),
        (36, gpu as u64),
        (40, ty as u64),
        (44, 100),
        (48, 7),
    ];
    if let Some((va, size, ctl)) = ctx {
        fields.extend([(72, va), (80, size), (84, ctl)]);
    }
    args(&fields, 88)
}

/// `len` bytes at offset `off` of file `fd`, mapped shared (used only
/// through raw pointers).
pub fn map_fd(fd: RawFd, off: u64, len: usize) -> *mut u8 {
    try_map_fd(fd, off, len)
        .unwrap_or_else(|e| panic!("mmap of {len} bytes at {off:#x}: errno {e}"))
}

/// mmap of `len` bytes of `fd` at `off`, shared: the address, or the errno.
pub fn try_map_fd(fd: RawFd, off: u64, len: usize) -> Result<*mut u8, i32> {
    // SAFETY: a fresh shared mapping at a kernel-chosen address; only used
    // through raw pointers.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            off as i64,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    Ok(p.cast())
}

/// `len` bytes at offset `off` of the emulator's node `node`, mapped
/// shared as a client maps them.
pub fn map_node(emu: &Emulator, node: NodeKind, off: u64, len: usize) -> *mut u8 {
    map_fd(emu.backing_fd(&node).as_raw_fd(), off, len)
}

/// The doorbell at /dev/kfd offset `off` (as CREATE_QUEUE answers it),
/// through a mapping of its 8 KiB slice.
pub fn map_doorbell(emu: &Emulator, off: u64) -> *mut u8 {
    map_node(emu, NodeKind::Kfd, off & !8191, 8192).wrapping_add((off & 8191) as usize)
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
