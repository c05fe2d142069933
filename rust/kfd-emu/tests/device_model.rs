//! In-process tests of the device model: the test process is the emulated
//! GPU user (process_vm_* on our own pid), fd arguments are resolved by a
//! table instead of the FUSE transport.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kfd_emu::device::uapi::{alloc, criu_op, kfd as nr, queue_type};
use kfd_emu::device::{Caller, Emulator, FdResolver, NodeKind, Replier};
use kfd_emu::profile::Profile;

struct Tx(Mutex<Sender<Result<Vec<u8>, i32>>>);
impl Replier for Tx {
    fn reply(self: Box<Self>, r: Result<Vec<u8>, i32>) {
        let _ = self.0.lock().unwrap().send(r);
    }
}

#[derive(Clone, Default)]
struct Table(Arc<Mutex<HashMap<i32, u64>>>);
impl FdResolver for Table {
    fn open_of(&self, _tgid: u32, fd: i32) -> Result<u64, i32> {
        self.0.lock().unwrap().get(&fd).copied().ok_or(libc::EBADF)
    }
}

fn me() -> Caller {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    Caller {
        tid,
        tgid: std::process::id(),
    }
}

fn iowr(nr: u32, size: usize) -> u32 {
    (3 << 30) | ((size as u32) << 16) | (0x4b << 8) | nr
}

struct Dev {
    emu: Emulator,
    fds: Table,
    minor: u32,
    gpu_id: u32,
}

impl Dev {
    fn new(over: &str) -> Dev {
        let p = if over.is_empty() {
            Profile::builtin("mi100").unwrap()
        } else {
            Profile::with_override("mi100", "test", over).unwrap()
        };
        let fds = Table::default();
        let emu = Emulator::with_resolver(&p, Box::new(fds.clone())).unwrap();
        Dev {
            emu,
            fds,
            minor: p.gpus()[0].drm_render_minor.0,
            gpu_id: p.gpus()[0].gpu_id.0,
        }
    }

    fn start(&self, c: &Caller, n: u32, input: &[u8]) -> Receiver<Result<Vec<u8>, i32>> {
        let (tx, rx) = channel();
        self.emu.ioctl(
            self.fh_kfd(c),
            c,
            iowr(n, input.len()),
            0,
            input,
            input.len() as u32,
            Box::new(Tx(Mutex::new(tx))),
        );
        rx
    }

    fn fh_kfd(&self, _c: &Caller) -> u64 {
        KFD_FH.with(|f| f.get())
    }

    fn call_fh(&self, fh: u64, c: &Caller, n: u32, input: &[u8]) -> Result<Vec<u8>, i32> {
        let (tx, rx) = channel();
        self.emu.ioctl(
            fh,
            c,
            iowr(n, input.len()),
            0,
            input,
            input.len() as u32,
            Box::new(Tx(Mutex::new(tx))),
        );
        rx.recv_timeout(Duration::from_secs(5)).expect("no reply")
    }

    fn call(&self, n: u32, input: &[u8]) -> Result<Vec<u8>, i32> {
        self.call_fh(self.fh_kfd(&me()), &me(), n, input)
    }

    /// Opens /dev/kfd and the render node, acquires the VM.
    fn setup(&self) -> (u64, u64) {
        let kfd = self.emu.open(&NodeKind::Kfd, &me()).unwrap();
        KFD_FH.with(|f| f.set(kfd));
        let render = self
            .emu
            .open(&NodeKind::Render { minor: self.minor }, &me())
            .unwrap();
        self.fds.0.lock().unwrap().insert(900, render);
        self.call(
            nr::ACQUIRE_VM,
            &args(&[(0, 900), (4, self.gpu_id as u64)], 8),
        )
        .unwrap();
        (kfd, render)
    }

    fn alloc(&self, va: u64, size: u64, flags: u32, offset_in: u64) -> Result<(u64, u64), i32> {
        let a = args(
            &[
                (0, va),
                (8, size),
                (24, offset_in),
                (32, self.gpu_id as u64),
                (36, flags as u64),
            ],
            40,
        );
        let out = self.call(nr::ALLOC_MEMORY_OF_GPU, &a)?;
        Ok((u64_at(&out, 16), u64_at(&out, 24)))
    }

    fn map_node(&self, node: NodeKind, off: u64, len: usize) -> *mut u8 {
        let fd = self.emu.backing_fd(&node);
        // SAFETY: a fresh shared mapping of the emulator's memfd, used only
        // through raw pointer copies in this test.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off as i64,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as *mut u8
    }
}

thread_local! {
    static KFD_FH: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// An argument struct of `size` bytes; fields of 4 bytes when the offset
/// is not 8-aligned or the value fits the slot after it.
fn args(fields: &[(usize, u64)], size: usize) -> Vec<u8> {
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

fn a64(fields: &[(usize, u64)], size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    for &(off, val) in fields {
        v[off..off + 8].copy_from_slice(&val.to_le_bytes());
    }
    v
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}

// SAFETY (for the helpers below): p points into a live test mapping of at
// least off+4/8 bytes.
unsafe fn wr32(p: *mut u8, off: usize, v: u32) {
    // SAFETY: see above.
    unsafe { std::ptr::write_volatile(p.add(off) as *mut u32, v) }
}
unsafe fn rd32(p: *mut u8, off: usize) -> u32 {
    // SAFETY: see above.
    unsafe { std::ptr::read_volatile(p.add(off) as *const u32) }
}

#[test]
fn version_apertures_and_access_rules() {
    let d = Dev::new("");
    d.setup();
    let v = d.call(nr::GET_VERSION, &[0; 8]).unwrap();
    assert_eq!((u32_at(&v, 0), u32_at(&v, 4)), (1, 11));
    // Unknown nr.
    assert_eq!(d.call(0x70, &[0; 8]), Err(libc::EINVAL));
    // Another process on our fd.
    let other = Caller {
        tid: me().tid,
        tgid: 1,
    };
    assert_eq!(
        d.call_fh(d.fh_kfd(&me()), &other, nr::GET_VERSION, &[0; 8]),
        Err(libc::EBADF)
    );
    // CRIU_OP from a non-tracer of another process.
    assert_eq!(
        d.call_fh(d.fh_kfd(&me()), &other, nr::CRIU_OP, &[0; 56]),
        Err(libc::EBADF)
    );
    // Apertures: count, then the array.
    let n = d.call(nr::GET_PROCESS_APERTURES_NEW, &[0; 16]).unwrap();
    assert_eq!(u32_at(&n, 8), 1);
    let mut ap = vec![0u8; 56];
    let a = a64(&[(0, ap.as_mut_ptr() as u64), (8, 1)], 16);
    d.call(nr::GET_PROCESS_APERTURES_NEW, &a).unwrap();
    assert_eq!(u32_at(&ap, 48), d.gpu_id);
    assert!(u64_at(&ap, 32) < u64_at(&ap, 40));
    let bad = a64(&[(0, 8), (8, 1)], 16);
    assert_eq!(
        d.call(nr::GET_PROCESS_APERTURES_NEW, &bad),
        Err(libc::EFAULT)
    );
    // A short struct is zero-extended: GET_VERSION with 4 bytes answers 4.
    assert_eq!(d.call(nr::GET_VERSION, &[0; 4]).unwrap().len(), 4);
}

#[test]
fn acquire_vm_rules() {
    let d = Dev::new("");
    d.setup();
    // Same file again: fine; another render open: EBUSY; not a render: EINVAL.
    d.call(nr::ACQUIRE_VM, &args(&[(0, 900), (4, d.gpu_id as u64)], 8))
        .unwrap();
    let r2 = d
        .emu
        .open(&NodeKind::Render { minor: d.minor }, &me())
        .unwrap();
    d.fds.0.lock().unwrap().insert(901, r2);
    assert_eq!(
        d.call(nr::ACQUIRE_VM, &args(&[(0, 901), (4, d.gpu_id as u64)], 8)),
        Err(libc::EBUSY)
    );
    d.fds.0.lock().unwrap().insert(902, d.fh_kfd(&me()));
    assert_eq!(
        d.call(nr::ACQUIRE_VM, &args(&[(0, 902), (4, d.gpu_id as u64)], 8)),
        Err(libc::EINVAL)
    );
    assert_eq!(
        d.call(nr::ACQUIRE_VM, &args(&[(0, 903), (4, d.gpu_id as u64)], 8)),
        Err(libc::EBADF)
    );
    assert_eq!(
        d.call(nr::ACQUIRE_VM, &args(&[(0, 900), (4, 0x1234)], 8)),
        Err(libc::EINVAL)
    );
}

#[test]
fn memory_alloc_map_free_and_vram_exhaustion() {
    let d = Dev::new("[[gpus]]\nvram_size = 67108864\n");
    // Before ACQUIRE_VM, allocations fail.
    let kfd = d.emu.open(&NodeKind::Kfd, &me()).unwrap();
    KFD_FH.with(|f| f.set(kfd));
    assert_eq!(
        d.alloc(0x1000_0000, 4096, alloc::VRAM, 0),
        Err(libc::EINVAL)
    );
    let render = d
        .emu
        .open(&NodeKind::Render { minor: d.minor }, &me())
        .unwrap();
    d.fds.0.lock().unwrap().insert(900, render);
    d.call(nr::ACQUIRE_VM, &args(&[(0, 900), (4, d.gpu_id as u64)], 8))
        .unwrap();

    let (h1, off1) = d
        .alloc(0x1000_0000, 32 << 20, alloc::VRAM | alloc::PUBLIC, 0)
        .unwrap();
    assert_eq!(h1 >> 32, d.gpu_id as u64);
    assert!(off1 >= 4 << 30 && off1 < 1 << 63 && off1 % 4096 == 0);
    let (_h2, off2) = d.alloc(0x2000_0000, 32 << 20, alloc::VRAM, 0).unwrap();
    assert!(off2 >= off1 + (32 << 20));
    // Full.
    assert_eq!(
        d.alloc(0x3000_0000, 4096, alloc::VRAM, 0),
        Err(libc::ENOMEM)
    );
    let avail = d
        .call(nr::AVAILABLE_MEMORY, &args(&[(8, d.gpu_id as u64)], 16))
        .unwrap();
    assert_eq!(u64_at(&avail, 0), 0);
    // GTT is not VRAM.
    let (hg, _) = d.alloc(0x3000_0000, 4096, alloc::GTT, 0).unwrap();
    // Overlapping VA, bad sizes, two types at once, unaligned VA.
    assert_eq!(d.alloc(0x3000_0000, 4096, alloc::GTT, 0), Err(libc::EINVAL));
    assert_eq!(
        d.alloc(0x4000_0000, 4096, alloc::DOORBELL, 0),
        Err(libc::EINVAL)
    );
    assert_eq!(
        d.alloc(0x4000_0000, 8192, alloc::MMIO_REMAP, 0),
        Err(libc::EINVAL)
    );
    assert_eq!(
        d.alloc(0x4000_0000, 4096, alloc::GTT | alloc::VRAM, 0),
        Err(libc::EINVAL)
    );
    assert_eq!(d.alloc(0x4000_0100, 4096, alloc::GTT, 0), Err(libc::EINVAL));
    assert_eq!(d.alloc(0x4000_0000, 0, alloc::GTT, 0), Err(libc::EINVAL));
    // Doorbell and MMIO offsets: on /dev/kfd's memfd, below 2^63, distinct.
    let (_, dboff) = d.alloc(0x5000_0000, 8192, alloc::DOORBELL, 0).unwrap();
    let (_, mmoff) = d.alloc(0x5001_0000, 4096, alloc::MMIO_REMAP, 0).unwrap();
    assert!(dboff < 1 << 62 && mmoff < 1 << 62 && dboff != mmoff);
    // USERPTR: must be readable memory of the caller.
    let mut buf = vec![0u8; 3 * 4096];
    let up = (buf.as_mut_ptr() as u64 + 4095) & !4095;
    let (_, uoff) = d.alloc(0x6000_0000, 8192, alloc::USERPTR, up).unwrap();
    assert_eq!(uoff, up);
    assert_eq!(
        d.alloc(0x6100_0000, 4096, alloc::USERPTR, 0x1000),
        Err(libc::EFAULT)
    );

    // CPU writes through the render memfd are what the GPU sees.
    let p = d.map_node(NodeKind::Render { minor: d.minor }, off1, 4096);
    // SAFETY: p maps 4096 bytes.
    unsafe { wr32(p, 0, 0xabcd) };

    // MAP: device array with a bad id stops at n_success.
    let ids = [d.gpu_id, 0xdead];
    let m = args(&[(0, h1), (8, ids.as_ptr() as u64), (16, 2)], 24);
    let m = {
        let mut m = m;
        m[0..8].copy_from_slice(&h1.to_le_bytes());
        m[8..16].copy_from_slice(&(ids.as_ptr() as u64).to_le_bytes());
        m
    };
    assert_eq!(d.call(nr::MAP_MEMORY_TO_GPU, &m), Err(libc::EINVAL));
    let mut m1 = m.clone();
    m1[16..20].copy_from_slice(&1u32.to_le_bytes());
    let out = d.call(nr::MAP_MEMORY_TO_GPU, &m1).unwrap();
    assert_eq!(u32_at(&out, 20), 1);
    let mut bad = m1.clone();
    bad[0..8].copy_from_slice(&(h1 + 77).to_le_bytes());
    assert_eq!(d.call(nr::MAP_MEMORY_TO_GPU, &bad), Err(libc::EINVAL));
    let mut badp = m1.clone();
    badp[8..16].copy_from_slice(&8u64.to_le_bytes());
    assert_eq!(d.call(nr::MAP_MEMORY_TO_GPU, &badp), Err(libc::EFAULT));
    d.call(nr::UNMAP_MEMORY_FROM_GPU, &m1).unwrap();
    assert_eq!(d.call(nr::UNMAP_MEMORY_FROM_GPU, &m1), Err(libc::EINVAL));

    // Free gives VRAM back; a freed handle is gone.
    d.call(nr::FREE_MEMORY_OF_GPU, &h1.to_le_bytes()).unwrap();
    assert_eq!(
        d.call(nr::FREE_MEMORY_OF_GPU, &h1.to_le_bytes()),
        Err(libc::EINVAL)
    );
    d.call(nr::FREE_MEMORY_OF_GPU, &hg.to_le_bytes()).unwrap();
    d.alloc(0x1000_0000, 16 << 20, alloc::VRAM, 0).unwrap();
    // The last release frees the process' VRAM.
    d.emu.release(kfd);
    let kfd = d.emu.open(&NodeKind::Kfd, &me()).unwrap();
    KFD_FH.with(|f| f.set(kfd));
    let avail = d
        .call(nr::AVAILABLE_MEMORY, &args(&[(8, d.gpu_id as u64)], 16))
        .unwrap();
    assert_eq!(u64_at(&avail, 0), 64 << 20);
}
