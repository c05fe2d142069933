//! In-process tests of the device model: the test process is the emulated
//! GPU user (process_vm_* on our own pid), fd arguments are resolved by a
//! table instead of the FUSE transport.

// The tests poke shared mappings of the emulator's memfds; one SAFETY note
// per block covers all accesses to the same live mapping.
#![allow(clippy::multiple_unsafe_ops_per_block)]

use std::os::fd::AsRawFd;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kfd_emu::device::uapi::{alloc, criu_op, kfd as nr, queue_type};
use kfd_emu::device::{Caller, Emulator, NodeKind, Replier};
use kfd_emu::profile::Profile;

mod model;
use model::{args, kfd_iowr, map_doorbell, me, replier, Table, Tx};

/// Another thread of this process, parked forever: the caller of waits the
/// test leaves pending while it goes on issuing ioctls (a thread is in one
/// ioctl at a time, and the device model relies on that).
fn waiter() -> Caller {
    static TID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let tid = *TID.get_or_init(|| {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            loop {
                std::thread::park();
            }
        });
        rx.recv().unwrap()
    });
    Caller {
        tid,
        tgid: std::process::id(),
    }
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
        let emu = Emulator::new(&p, Box::new(fds.clone())).unwrap();
        Dev {
            emu,
            fds,
            minor: p.gpus()[0].drm_render_minor.0,
            gpu_id: p.gpus()[0].gpu_id.0,
        }
    }

    fn start(&self, c: &Caller, n: u32, input: &[u8]) -> Receiver<Result<Vec<u8>, i32>> {
        let (reply, rx) = replier();
        self.emu.ioctl(
            self.fh_kfd(c),
            c,
            kfd_iowr(n, input.len()),
            0,
            input,
            input.len() as u32,
            reply,
        );
        rx
    }

    fn fh_kfd(&self, _c: &Caller) -> u64 {
        KFD_FH.with(|f| f.get())
    }

    fn call_fh(&self, fh: u64, c: &Caller, n: u32, input: &[u8]) -> Result<Vec<u8>, i32> {
        model::call(
            &self.emu,
            fh,
            c,
            kfd_iowr(n, input.len()),
            input,
            input.len(),
        )
    }

    fn call(&self, n: u32, input: &[u8]) -> Result<Vec<u8>, i32> {
        self.call_fh(self.fh_kfd(&me()), &me(), n, input)
    }

    /// Opens /dev/kfd (the file the calls go to) and the render node, as
    /// fd `render_fd`; returns both file handles.
    fn open_nodes(&self, render_fd: i32) -> (u64, u64) {
        let kfd = self.emu.open(&NodeKind::Kfd, &me()).unwrap();
        KFD_FH.with(|f| f.set(kfd));
        let render = self
            .emu
            .open(&NodeKind::Render { minor: self.minor }, &me())
            .unwrap();
        self.fds.insert(render_fd, render);
        (kfd, render)
    }

    /// Opens /dev/kfd and the render node, acquires the VM.
    fn setup(&self) -> (u64, u64) {
        let (kfd, render) = self.open_nodes(900);
        self.call(
            nr::ACQUIRE_VM,
            &args(&[(0, 900), (4, self.gpu_id as u64)], 8),
        )
        .unwrap();
        (kfd, render)
    }

    /// The process "dies" (its /dev/kfd open `kfd` released) and comes back
    /// as a restored one: /dev/kfd and the render node (fd 950) opened
    /// afresh, before any RESTORE.
    fn reopen_as_restored(&self, kfd: u64) {
        self.emu.release(kfd);
        self.open_nodes(950);
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

    /// MAP_MEMORY_TO_GPU of BO `handle` on the GPU, as KFD needs before
    /// the GPU (its SDMA engine) can reach the BO.
    fn map_gpu(&self, handle: u64) {
        self.call(nr::MAP_MEMORY_TO_GPU, &map_args(handle, &[self.gpu_id]))
            .unwrap();
    }

    /// `size` bytes of fresh anonymous memory of this process as a
    /// USERPTR BO at GPU VA `va`, mapped on the GPU (ROCr's system memory).
    fn user_mem(&self, va: u64, size: usize) -> *mut u8 {
        // SAFETY: a fresh anonymous mapping, only used through raw
        // pointers (and by the emulator through process_vm_*).
        let user = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(user, libc::MAP_FAILED);
        let (h, _) = self
            .alloc(va, size as u64, alloc::USERPTR, user as u64)
            .unwrap();
        self.map_gpu(h);
        user as *mut u8
    }

    fn map_node(&self, node: NodeKind, off: u64, len: usize) -> *mut u8 {
        model::map_node(&self.emu, node, off, len)
    }
}

thread_local! {
    static KFD_FH: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// CREATE_QUEUE arguments as ROCr fills them: the ring at `RING_VA`, the
/// write and read pointers at `CTL_VA + 8` and `CTL_VA`, 100 % of the
/// queue time, priority 7.
fn queue_args(gpu: u32, ty: u32, ring_size: u64) -> Vec<u8> {
    model::queue_args(gpu, ty, (RING_VA, ring_size), (CTL_VA + 8, CTL_VA), None)
}

/// MAP/UNMAP_MEMORY_TO_GPU arguments for `handle` on `gpus`.  The id
/// array is leaked: the model reads it from this process' memory.
fn map_args(handle: u64, gpus: &[u32]) -> Vec<u8> {
    let ids: &'static [u32] = Vec::leak(gpus.to_vec());
    a64(
        &[
            (0, handle),
            (8, ids.as_ptr() as u64),
            (16, gpus.len() as u64),
        ],
        24,
    )
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
    unsafe { std::ptr::write_volatile(p.wrapping_add(off) as *mut u32, v) }
}
unsafe fn rd32(p: *mut u8, off: usize) -> u32 {
    // SAFETY: see above.
    unsafe { std::ptr::read_volatile(p.wrapping_add(off) as *const u32) }
}

#[test]
fn version_apertures_and_access_rules() {
    let d = Dev::new("");
    d.setup();
    let v = d.call(nr::GET_VERSION, &[0; 8]).unwrap();
    assert_eq!((u32_at(&v, 0), u32_at(&v, 4)), (1, 18));
    // Unknown nr.
    assert_eq!(d.call(0x70, &[0; 8]), Err(libc::ENOTTY));
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
    d.fds.insert(901, r2);
    assert_eq!(
        d.call(nr::ACQUIRE_VM, &args(&[(0, 901), (4, d.gpu_id as u64)], 8)),
        Err(libc::EBUSY)
    );
    d.fds.insert(902, d.fh_kfd(&me()));
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
    // Before ACQUIRE_VM, allocations fail: the device cannot be bound.
    let kfd = d.emu.open(&NodeKind::Kfd, &me()).unwrap();
    KFD_FH.with(|f| f.set(kfd));
    assert_eq!(
        d.alloc(0x1000_0000, 4096, alloc::VRAM, 0),
        Err(libc::ENODEV)
    );
    let render = d
        .emu
        .open(&NodeKind::Render { minor: d.minor }, &me())
        .unwrap();
    d.fds.insert(900, render);
    d.call(nr::ACQUIRE_VM, &args(&[(0, 900), (4, d.gpu_id as u64)], 8))
        .unwrap();

    let (h1, off1) = d
        .alloc(0x1000_0000, 32 << 20, alloc::VRAM | alloc::PUBLIC, 0)
        .unwrap();
    assert_eq!(h1 >> 32, d.gpu_id as u64);
    assert!((4 << 30..1 << 62).contains(&off1) && off1 % 4096 == 0);
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
    // No BO behind a handle of a known device: KFD's IDR miss, ENOMEM;
    // a handle naming no device: EINVAL.
    assert_eq!(d.call(nr::MAP_MEMORY_TO_GPU, &bad), Err(libc::ENOMEM));
    assert_eq!(d.call(nr::UNMAP_MEMORY_FROM_GPU, &bad), Err(libc::ENOMEM));
    bad[4..8].copy_from_slice(&0xdeadu32.to_le_bytes());
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

/// KFD's process is the mm's: a process that opens /dev/kfd with the pid
/// of one that exited before the release of its file arrived (FUSE sends
/// it asynchronously; a restore takes the dumped pid) is a new process,
/// without the old one's memory, and the late release does not end it.
#[test]
fn a_new_process_with_an_exited_ones_pid_starts_afresh() {
    let d = Dev::new("[[gpus]]\nvram_size = 67108864\n");
    let mut p = GpuProc::spawn(&d, 910);
    let (c, old) = (p.c, p.kfd);
    let avail = args(&[(8, d.gpu_id as u64)], 16);
    let a = args(
        &[
            (0, 0x1000_0000),
            (8, 16 << 20),
            (32, d.gpu_id as u64),
            (36, alloc::VRAM as u64),
        ],
        40,
    );
    p.call(&d, nr::ALLOC_MEMORY_OF_GPU, &a).unwrap();
    let out = p.call(&d, nr::AVAILABLE_MEMORY, &avail).unwrap();
    assert_eq!(u64_at(&out, 0), 48 << 20);
    // The process exits; its files' releases have not been handled yet.
    p.child.kill().unwrap();
    p.child.wait().unwrap();

    // Another process with that pid (here: one the model cannot find,
    // which cannot be the one that opened) opens /dev/kfd.
    let new = d.emu.open(&NodeKind::Kfd, &c).unwrap();
    let out = d.call_fh(new, &c, nr::AVAILABLE_MEMORY, &avail).unwrap();
    assert_eq!(
        u64_at(&out, 0),
        64 << 20,
        "the new process holds the old one's VRAM"
    );
    assert_eq!(
        d.call_fh(old, &c, nr::AVAILABLE_MEMORY, &avail),
        Err(libc::EBADF),
        "the old process' open still works"
    );
    // The late releases end nothing of the new process.
    d.emu.release(old);
    d.call_fh(new, &c, nr::AVAILABLE_MEMORY, &avail).unwrap();
    d.emu.release(new);
}

const RING_VA: u64 = 0x1000_0000;
const CTL_VA: u64 = 0x1001_0000;
const SRC_VA: u64 = 0x2000_0000;
const DST_VA: u64 = 0x3000_0000;
const SIG_VA: u64 = 0x4000_0000;
const RING_SIZE: u64 = 4096;

/// An SDMA queue with its ring, control words, two VRAM buffers and a
/// signal page, all mapped like a client maps them.
struct Rig {
    ring: *mut u8,
    ctl: *mut u8,
    src: *mut u8,
    dst: *mut u8,
    sig: *mut u8,
    doorbell: *mut u8,
    wptr: u64,
    event: u32,
    handles: Vec<(u64, u64)>,
}

impl Rig {
    fn new(d: &Dev) -> Rig {
        Rig::build(d, true)
    }

    /// `give_page`: the first signal event hands KFD the rig's signal page
    /// (false when the process already gave one).
    fn build(d: &Dev, give_page: bool) -> Rig {
        let mut handles = Vec::new();
        let mut m = |va, size, flags| {
            let (h, off) = d.alloc(va, size, flags, 0).unwrap();
            d.map_gpu(h);
            handles.push((h, off));
            d.map_node(NodeKind::Render { minor: d.minor }, off, size as usize)
        };
        let ring = m(RING_VA, RING_SIZE, alloc::GTT);
        let ctl = m(CTL_VA, 4096, alloc::GTT);
        let src = m(SRC_VA, 65536, alloc::VRAM);
        let dst = m(DST_VA, 65536, alloc::VRAM);
        let sig = m(SIG_VA, 32768, alloc::GTT);
        let sig_handle = if give_page { handles[4].0 } else { 0 };
        let ev = d
            .call(nr::CREATE_EVENT, &args(&[(0, sig_handle), (16, 1)], 32))
            .unwrap();
        let event = u32_at(&ev, 24);
        assert_eq!(u32_at(&ev, 28), event);
        assert_eq!(event, 1, "the first signal event (KFD keeps id 0)");
        let q = d
            .call(
                nr::CREATE_QUEUE,
                &queue_args(d.gpu_id, queue_type::SDMA, RING_SIZE),
            )
            .unwrap();
        let dbo = u64_at(&q, 24);
        assert!(dbo < 1 << 63);
        let doorbell = map_doorbell(&d.emu, dbo);
        Rig {
            ring,
            ctl,
            src,
            dst,
            sig,
            doorbell,
            wptr: 0,
            event,
            handles,
        }
    }

    fn push(&mut self, dws: &[u32]) {
        for &dw in dws {
            // SAFETY: the ring mapping is RING_SIZE bytes.
            unsafe { wr32(self.ring, (self.wptr % RING_SIZE) as usize, dw) };
            self.wptr += 4;
        }
    }

    fn kick(&self) {
        // SAFETY: doorbell points at an 8-byte slot of a live mapping.
        unsafe { std::ptr::write_volatile(self.doorbell as *mut u64, self.wptr) };
    }

    fn rptr(&self) -> u64 {
        // SAFETY: ctl maps 4096 bytes; rptr is its first u64.
        unsafe { std::ptr::read_volatile(self.ctl as *const u64) }
    }

    fn wait_rptr(&self, want: u64) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            if self.rptr() == want {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }
}

fn lo(v: u64) -> u32 {
    v as u32
}
fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

fn wait_args(ids: &[u32], all: bool, timeout: u32) -> (Vec<u8>, Vec<u8>) {
    let mut evs = vec![0u8; 48 * ids.len()];
    for (i, id) in ids.iter().enumerate() {
        evs[i * 48 + 40..i * 48 + 44].copy_from_slice(&id.to_le_bytes());
    }
    let mut a = vec![0u8; 24];
    a[0..8].copy_from_slice(&(evs.as_ptr() as u64).to_le_bytes());
    a[8..12].copy_from_slice(&(ids.len() as u32).to_le_bytes());
    a[12..16].copy_from_slice(&(all as u32).to_le_bytes());
    a[16..20].copy_from_slice(&timeout.to_le_bytes());
    (a, evs)
}

#[test]
fn sdma_packets_events_and_waits() {
    let d = Dev::new("");
    d.setup();
    let mut r = Rig::new(&d);
    for i in 0..1024 {
        // SAFETY: src maps 65536 bytes.
        unsafe { wr32(r.src, i * 4, 0x1000_0000 + i as u32) };
    }
    // Park a wait on the event before the GPU signals it.
    let (wa, _evs) = wait_args(&[r.event], false, u32::MAX);
    let waiting = d.start(&waiter(), nr::WAIT_EVENTS, &wa);
    assert!(
        waiting.recv_timeout(Duration::from_millis(100)).is_err(),
        "wait answered early"
    );

    r.push(&[
        1,
        4096 - 1,
        0,
        lo(SRC_VA),
        hi(SRC_VA),
        lo(DST_VA),
        hi(DST_VA),
    ]);
    r.push(&[
        11 | 2 << 30,
        lo(DST_VA + 8192),
        hi(DST_VA + 8192),
        0xdead_beef,
        256 - 1,
    ]);
    r.push(&[2, lo(DST_VA + 16384), hi(DST_VA + 16384), 3 - 1, 7, 8, 9]);
    r.push(&[2 << 16, 0x55, 0x66]);
    r.push(&[5, lo(CTL_VA + 16), hi(CTL_VA + 16), 0x1234]);
    let slot = SIG_VA + r.event as u64 * 8;
    r.push(&[5, lo(slot), hi(slot), 1]);
    r.push(&[6, 0]);
    r.kick();
    assert!(
        r.wait_rptr(r.wptr),
        "rptr {:#x} != wptr {:#x}",
        r.rptr(),
        r.wptr
    );
    // SAFETY: offsets inside the mapped BOs.
    unsafe {
        assert_eq!(rd32(r.dst, 0), 0x1000_0000);
        assert_eq!(rd32(r.dst, 4092), 0x1000_0000 + 1023);
        assert_eq!(rd32(r.dst, 4096), 0);
        assert_eq!(rd32(r.dst, 8192), 0xdead_beef);
        assert_eq!(rd32(r.dst, 8192 + 252), 0xdead_beef);
        assert_eq!(rd32(r.dst, 8192 + 256), 0);
        assert_eq!(
            (rd32(r.dst, 16384), rd32(r.dst, 16388), rd32(r.dst, 16392)),
            (7, 8, 9)
        );
        assert_eq!(rd32(r.ctl, 16), 0x1234);
    }
    let out = waiting
        .recv_timeout(Duration::from_secs(2))
        .expect("TRAP did not wake the wait")
        .unwrap();
    assert_eq!(u32_at(&out, 20), 0);
    // The interrupt path re-armed the slot (after the read pointer's
    // write-back, before the wait's answer).
    // SAFETY: inside the signal page's mapping.
    unsafe {
        assert_eq!(
            std::ptr::read_volatile(r.sig.add(r.event as usize * 8) as *const u64),
            u64::MAX
        );
    }
    // Auto-reset: consumed by the waiter.
    let (wa, _e) = wait_args(&[r.event], false, 20);
    let t = Instant::now();
    let out = d.call(nr::WAIT_EVENTS, &wa).unwrap();
    assert_eq!(u32_at(&out, 20), 1);
    assert!(t.elapsed() >= Duration::from_millis(20));
    // SET_EVENT with nobody waiting stays signalled until one wait.
    d.call(nr::SET_EVENT, &r.event.to_le_bytes()).unwrap();
    assert_eq!(u32_at(&d.call(nr::WAIT_EVENTS, &wa).unwrap(), 20), 0);
    assert_eq!(u32_at(&d.call(nr::WAIT_EVENTS, &wa).unwrap(), 20), 1);
    // Manual-reset event and wait-all.
    let ev2 = u32_at(
        &d.call(nr::CREATE_EVENT, &args(&[(16, 0)], 32)).unwrap(),
        24,
    );
    let (wall, _e2) = wait_args(&[r.event, ev2], true, u32::MAX);
    let w = d.start(&waiter(), nr::WAIT_EVENTS, &wall);
    d.call(nr::SET_EVENT, &ev2.to_le_bytes()).unwrap();
    assert!(
        w.recv_timeout(Duration::from_millis(50)).is_err(),
        "wait-all answered with one event"
    );
    d.call(nr::SET_EVENT, &r.event.to_le_bytes()).unwrap();
    assert_eq!(
        u32_at(
            &w.recv_timeout(Duration::from_secs(2)).unwrap().unwrap(),
            20
        ),
        0
    );
    // ev2 is manual-reset: still signalled; RESET clears it.
    let (w2, _e3) = wait_args(&[ev2], false, 0);
    assert_eq!(u32_at(&d.call(nr::WAIT_EVENTS, &w2).unwrap(), 20), 0);
    d.call(nr::RESET_EVENT, &ev2.to_le_bytes()).unwrap();
    assert_eq!(u32_at(&d.call(nr::WAIT_EVENTS, &w2).unwrap(), 20), 1);
    // Bad ids and pointers.
    assert_eq!(
        d.call(nr::SET_EVENT, &777u32.to_le_bytes()),
        Err(libc::EINVAL)
    );
    let (wb, _e4) = wait_args(&[777], false, 0);
    assert_eq!(d.call(nr::WAIT_EVENTS, &wb), Err(libc::EINVAL));
    let mut wp = w2.clone();
    wp[0..8].copy_from_slice(&16u64.to_le_bytes());
    assert_eq!(d.call(nr::WAIT_EVENTS, &wp), Err(libc::EFAULT));
    d.call(nr::DESTROY_EVENT, &ev2.to_le_bytes()).unwrap();
    assert_eq!(
        d.call(nr::DESTROY_EVENT, &ev2.to_le_bytes()),
        Err(libc::EINVAL)
    );

    // An unknown packet halts the queue; nothing after it runs.
    let before = r.rptr();
    r.push(&[0x7f]);
    r.push(&[5, lo(CTL_VA + 24), hi(CTL_VA + 24), 0x99]);
    r.kick();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(r.rptr(), before);
    // SAFETY: inside ctl.
    assert_eq!(unsafe { rd32(r.ctl, 24) }, 0);
}

/// A reply with the transport's request id, as FUSE replies have.
struct TxId(Mutex<Sender<Result<Vec<u8>, i32>>>, u64);
impl Replier for TxId {
    fn reply(self: Box<Self>, r: Result<Vec<u8>, i32>) {
        let _ = self.0.lock().unwrap().send(r);
    }
    fn request_id(&self) -> Option<u64> {
        Some(self.1)
    }
}

/// An interrupt (the transport's FUSE_INTERRUPT) takes a parked wait out
/// of the model at once: a SET_EVENT of an auto-reset event before the
/// thread retries stays signalled for the retry.
#[test]
fn interrupted_wait_leaves_the_model_at_once() {
    let d = Dev::new("");
    d.setup();
    let ev = d
        .call(nr::CREATE_EVENT, &args(&[(16, 1)], 32))
        .expect("auto-reset signal event");
    let event = u32_at(&ev, 24);
    let (wa, _evs) = wait_args(&[event], false, u32::MAX);
    let (tx, parked) = channel();
    let w = waiter();
    d.emu.ioctl(
        d.fh_kfd(&me()),
        &w,
        kfd_iowr(nr::WAIT_EVENTS, wa.len()),
        0,
        &wa,
        wa.len() as u32,
        Box::new(TxId(Mutex::new(tx), 77)),
    );
    assert!(parked.recv_timeout(Duration::from_millis(50)).is_err());
    assert!(d.emu.interrupt(&NodeKind::Kfd, 77));
    assert_eq!(
        parked.recv_timeout(Duration::from_millis(100)),
        Ok(Err(libc::EINTR)),
        "the interrupted wait is answered EINTR by the model"
    );
    d.call(nr::SET_EVENT, &event.to_le_bytes()).unwrap();
    // The retry (same thread) finds the event signalled.
    let (wa0, _e0) = wait_args(&[event], false, 0);
    let retry = d.start(&w, nr::WAIT_EVENTS, &wa0);
    let out = retry.recv_timeout(Duration::from_secs(2)).unwrap().unwrap();
    assert_eq!(u32_at(&out, 20), 0, "the SET_EVENT was lost");
    // Unknown id: a completed wait whose answer is on its way wins.
    assert!(d.emu.interrupt(&NodeKind::Kfd, 78));
    // Render nodes never park: the transport answers.
    assert!(!d.emu.interrupt(&NodeKind::Render { minor: d.minor }, 77));
}

const BIG_SRC_VA: u64 = 0x1_0000_0000;
const BIG_DST_VA: u64 = 0x2_0000_0000;
const BIG: u64 = 4 << 20;
const COPIES: u64 = 63;

/// Queues `COPIES` linear copies of 4 MiB (the largest packet) from the
/// big source into consecutive 4 MiB slices of the big destination, then a
/// FENCE writing `fence` at CTL_VA + 32: 64 packets, one engine pass.
fn push_big_job(r: &mut Rig, fence: u32) {
    for i in 0..COPIES {
        let dst = BIG_DST_VA + i * BIG;
        r.push(&[
            1,
            (BIG - 1) as u32,
            0,
            lo(BIG_SRC_VA),
            hi(BIG_SRC_VA),
            lo(dst),
            hi(dst),
        ]);
    }
    r.push(&[5, lo(CTL_VA + 32), hi(CTL_VA + 32), fence]);
    r.kick();
}

/// Waits until the engine has written the first destination word of a
/// job (the copy is under way).
fn wait_copy_started(dst: *mut u8, want: u32) {
    let t = Instant::now();
    // SAFETY: dst maps the big destination.
    while unsafe { rd32(dst, 0) } != want {
        assert!(t.elapsed() < Duration::from_secs(10), "copy never started");
        std::hint::spin_loop();
    }
}

/// Packet operands are GPU VAs reached through the queue's GPU VM: a
/// range may span adjacent BOs and USERPTR memory, and only BOs mapped on
/// the GPU count.  A packet touching anything else faults and halts the
/// queue: nothing after it runs.
#[test]
fn sdma_operands_go_through_the_gpu_vm() {
    const A: u64 = 0x5000_0000;
    const U: u64 = 0x6000_0000;
    const C: u64 = 0x7000_0000;
    let d = Dev::new("");
    d.setup();
    let mut r = Rig::new(&d);
    let render = NodeKind::Render { minor: d.minor };
    // Two adjacent VRAM BOs, each mapped.
    let (ha, offa) = d.alloc(A, 8192, alloc::VRAM, 0).unwrap();
    let (hb, offb) = d.alloc(A + 8192, 8192, alloc::VRAM, 0).unwrap();
    d.map_gpu(ha);
    d.map_gpu(hb);
    let (pa, pb) = (
        d.map_node(render, offa, 8192),
        d.map_node(render, offb, 8192),
    );
    for i in 0..2048 {
        // SAFETY: both map 8192 bytes.
        unsafe {
            wr32(pa, i * 4, 0xa000_0000 | i as u32);
            wr32(pb, i * 4, 0xb000_0000 | i as u32);
        }
    }
    let user = d.user_mem(U, 8192);

    // 8 KiB straddling the two BOs, to the destination; then 64 bytes of
    // it into the USERPTR memory at an offset; then back from there.
    r.push(&[
        1,
        8192 - 1,
        0,
        lo(A + 4096),
        hi(A + 4096),
        lo(DST_VA),
        hi(DST_VA),
    ]);
    r.push(&[
        1,
        63,
        0,
        lo(DST_VA + 4092),
        hi(DST_VA + 4092),
        lo(U + 0x100),
        hi(U + 0x100),
    ]);
    r.push(&[
        1,
        63,
        0,
        lo(U + 0x100),
        hi(U + 0x100),
        lo(DST_VA + 0x8000),
        hi(DST_VA + 0x8000),
    ]);
    r.kick();
    assert!(r.wait_rptr(r.wptr), "rptr {:#x} != {:#x}", r.rptr(), r.wptr);
    // SAFETY: offsets inside dst (65536 bytes) and user (8192 bytes).
    unsafe {
        assert_eq!(rd32(r.dst, 0), 0xa000_0000 | 1024);
        assert_eq!(rd32(r.dst, 4092), 0xa000_0000 | 2047);
        assert_eq!(rd32(r.dst, 4096), 0xb000_0000);
        assert_eq!(rd32(r.dst, 8188), 0xb000_0000 | 1023);
        assert_eq!(rd32(user, 0x100), 0xa000_0000 | 2047);
        assert_eq!(rd32(user, 0x104), 0xb000_0000);
        assert_eq!(rd32(r.dst, 0x8000), 0xa000_0000 | 2047);
        assert_eq!(rd32(r.dst, 0x8000 + 60), 0xb000_0000 | 14);
    }

    // A BO allocated but not mapped on the GPU, and one unmapped again,
    // are not reachable: the copy faults, the queue halts before the FENCE.
    let (hc, _) = d.alloc(C, 4096, alloc::VRAM, 0).unwrap();
    d.map_gpu(hc);
    d.call(nr::UNMAP_MEMORY_FROM_GPU, &map_args(hc, &[d.gpu_id]))
        .unwrap();
    let before = r.rptr();
    r.push(&[1, 15, 0, lo(C), hi(C), lo(DST_VA), hi(DST_VA)]);
    r.push(&[5, lo(CTL_VA + 24), hi(CTL_VA + 24), 0x77]);
    r.kick();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(r.rptr(), before, "the faulting packet completed");
    // SAFETY: inside ctl.
    let after = unsafe { rd32(r.ctl, 24) };
    assert_eq!(after, 0, "a packet after the fault ran");
}

/// SDMA 4.x packet encoders for the tests, written from the field
/// definitions (offset, mask, shift) of the kernel's
/// vega10_sdma_pkt_open.h, not from the emulator's decoder.
mod pkt {
    pub fn header(op: u32, sub_op: u32) -> u32 {
        (op & 0xff) | (sub_op & 0xff) << 8
    }

    /// SDMA_PKT_POLL_REGMEM: HEADER hdp_flush (bit 26), func (30..28),
    /// mem_poll (31); ADDR_LO/HI; VALUE; MASK; DW5 interval (15..0),
    /// retry_count (27..16).
    #[allow(clippy::too_many_arguments)]
    pub fn poll_regmem(
        mem_poll: bool,
        hdp_flush: bool,
        func: u32,
        addr: u64,
        value: u32,
        mask: u32,
        interval: u32,
        retry_count: u32,
    ) -> Vec<u32> {
        vec![
            header(8, 0) | (hdp_flush as u32) << 26 | (func & 7) << 28 | (mem_poll as u32) << 31,
            addr as u32,
            (addr >> 32) as u32,
            value,
            mask,
            (interval & 0xffff) | (retry_count & 0xfff) << 16,
        ]
    }

    /// SDMA_PKT_ATOMIC: HEADER loop (bit 16), atomic_op (31..25);
    /// ADDR_LO/HI; SRC_DATA_LO/HI; CMP_DATA_LO/HI; LOOP_INTERVAL (12..0).
    pub fn atomic(atomic_op: u32, looping: bool, addr: u64, src: u64, cmp: u64) -> Vec<u32> {
        vec![
            header(10, 0) | (looping as u32) << 16 | (atomic_op & 0x7f) << 25,
            addr as u32,
            (addr >> 32) as u32,
            src as u32,
            (src >> 32) as u32,
            cmp as u32,
            (cmp >> 32) as u32,
            128,
        ]
    }

    /// SDMA_PKT_TIMESTAMP_GET(_GLOBAL): WRITE_ADDR_LO write_addr_31_3
    /// (mask 0x1FFFFFFF, shift 3), WRITE_ADDR_HI.
    pub fn timestamp_get(sub_op: u32, addr: u64) -> Vec<u32> {
        vec![
            header(13, sub_op),
            ((addr as u32 >> 3) & 0x1fff_ffff) << 3,
            (addr >> 32) as u32,
        ]
    }

    /// SDMA_PKT_TIMESTAMP_SET: INIT_DATA_LO/HI.
    pub fn timestamp_set(v: u64) -> Vec<u32> {
        vec![header(13, 0), v as u32, (v >> 32) as u32]
    }

    /// SDMA_PKT_CONSTANT_FILL: HEADER fillsize (31..30); DST_ADDR_LO/HI;
    /// DATA; COUNT (21..0).
    pub fn const_fill(fillsize: u32, dst: u64, data: u32, count: u32) -> Vec<u32> {
        vec![
            header(11, 0) | fillsize << 30,
            dst as u32,
            (dst >> 32) as u32,
            data,
            count & 0x3f_ffff,
        ]
    }

    /// One side of SDMA_PKT_COPY_LINEAR_SUBWIN: base, x/y/z offsets,
    /// pitch and slice pitch, in elements.
    pub struct Side {
        pub base: u64,
        pub x: u32,
        pub y: u32,
        pub z: u32,
        pub pitch: u32,
        pub slice: u32,
    }

    /// SDMA_PKT_COPY_LINEAR_SUBWIN (sub-op 4): HEADER elementsize (31..29);
    /// SRC_ADDR_LO/HI; DW_3 src_x (13..0), src_y (29..16); DW_4 src_z
    /// (10..0), src_pitch (31..13); DW_5 src_slice_pitch (27..0); the
    /// same for dst; DW_11 rect_x (13..0), rect_y (29..16); DW_12 rect_z
    /// (10..0).  Pitches, slices and rect sizes are stored minus one (as
    /// ROCr's BuildCopyRectCommand does).
    pub fn copy_subwin(log2_elem: u32, src: &Side, dst: &Side, rect: (u32, u32, u32)) -> Vec<u32> {
        let mut v = vec![header(1, 4) | log2_elem << 29];
        for s in [src, dst] {
            v.extend_from_slice(&[
                s.base as u32,
                (s.base >> 32) as u32,
                s.x | s.y << 16,
                s.z | (s.pitch - 1) << 13,
                s.slice - 1,
            ]);
        }
        v.push((rect.0 - 1) | (rect.1 - 1) << 16);
        v.push(rect.2 - 1);
        v
    }

    pub fn fence(addr: u64, data: u32) -> Vec<u32> {
        vec![header(5, 0), addr as u32, (addr >> 32) as u32, data]
    }

    pub fn copy_linear(src: u64, dst: u64, bytes: u32) -> Vec<u32> {
        vec![
            header(1, 0),
            bytes - 1,
            0,
            src as u32,
            (src >> 32) as u32,
            dst as u32,
            (dst >> 32) as u32,
        ]
    }

    pub fn trap(ctx: u32) -> Vec<u32> {
        vec![header(6, 0), ctx & 0x0fff_ffff]
    }
}

impl Rig {
    /// The u32 at byte `off` of the control BO.
    fn ctl32(&self, off: usize) -> u32 {
        // SAFETY: ctl maps 4096 bytes; callers stay inside.
        unsafe { rd32(self.ctl, off) }
    }

    fn set_ctl32(&self, off: usize, v: u32) {
        // SAFETY: as in ctl32.
        unsafe { wr32(self.ctl, off, v) }
    }

    /// The u64 at byte `off` of the control BO, as two u32 halves.
    fn ctl64(&self, off: usize) -> u64 {
        self.ctl32(off) as u64 | (self.ctl32(off + 4) as u64) << 32
    }

    fn set_ctl64(&self, off: usize, v: u64) {
        self.set_ctl32(off, v as u32);
        self.set_ctl32(off + 4, (v >> 32) as u32);
    }

    /// Rings the doorbell and waits until the engine consumed everything.
    fn run(&self) {
        self.kick();
        assert!(
            self.wait_rptr(self.wptr),
            "rptr {:#x} != wptr {:#x}",
            self.rptr(),
            self.wptr
        );
    }

    /// Rings the doorbell; the engine must stop at ring position `at`.
    fn run_stops_at(&self, at: u64) {
        self.kick();
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(self.rptr(), at, "the queue did not stop where expected");
    }
}

/// POLL_REGMEM on memory waits (each pass one retry) until the masked
/// compare holds; a finite retry count runs out and the engine goes on;
/// the HDP flush forms (the kernel's, ROCr's) complete at once; a poll of
/// another register halts the queue.
#[test]
fn sdma_poll_regmem() {
    let d = Dev::new("");
    d.setup();
    let mut r = Rig::new(&d);
    const W: u64 = CTL_VA + 0x100;
    // == 5 on the whole word, forever.
    r.push(&pkt::poll_regmem(true, false, 3, W, 5, u32::MAX, 4, 0xfff));
    r.push(&pkt::fence(CTL_VA + 0x104, 1));
    let at = r.wptr - 4 * 4;
    r.run_stops_at(at - 6 * 4);
    assert_eq!(r.ctl32(0x104), 0);
    r.set_ctl32(0x100, 4);
    r.run_stops_at(at - 6 * 4);
    r.set_ctl32(0x100, 5);
    r.run();
    assert_eq!(r.ctl32(0x104), 1);

    // >= 3 on the low 16 bits: 0x1_0002 fails, 0x0_0007 passes.
    r.set_ctl32(0x100, 0x1_0002);
    r.push(&pkt::poll_regmem(true, false, 5, W, 3, 0xffff, 4, 0xfff));
    r.push(&pkt::fence(CTL_VA + 0x104, 2));
    r.run_stops_at(r.wptr - 10 * 4);
    r.set_ctl32(0x100, 0x2_0007);
    r.run();
    assert_eq!(r.ctl32(0x104), 2);

    // != 0 with 3 retries on a word that stays 0: the engine gives up and
    // runs the fence.
    r.set_ctl32(0x100, 0);
    r.push(&pkt::poll_regmem(true, false, 4, W, 0, u32::MAX, 4, 3));
    r.push(&pkt::fence(CTL_VA + 0x104, 3));
    r.run();
    assert_eq!(r.ctl32(0x104), 3);

    // The kernel's HDP flush (sdma_v4_0_ring_emit_hdp_flush: register
    // poll with hdp_flush, == on the flush-done bit) and ROCr's gfx9 HDP
    // flush packet complete at once.
    r.push(&pkt::poll_regmem(
        false,
        true,
        3,
        0x5106 << 2 | (0x5107u64 << 2) << 32,
        1 << 2,
        1 << 2,
        10,
        0xfff,
    ));
    r.push(&[0x8, 0x0, 0x8000_0000, 0x0, 0x0, 0x0]);
    r.push(&pkt::fence(CTL_VA + 0x104, 4));
    r.run();
    assert_eq!(r.ctl32(0x104), 4);

    // A poll of another register is not modelled: the queue halts there.
    let at = r.wptr;
    r.push(&pkt::poll_regmem(
        false,
        false,
        3,
        0x1234 << 2,
        1,
        1,
        10,
        0xfff,
    ));
    r.push(&pkt::fence(CTL_VA + 0x104, 5));
    r.run_stops_at(at);
    assert_eq!(r.ctl32(0x104), 4);
}

/// USERPTR memory of the test process, read and written as 64-bit words.
struct UserWords {
    p: *mut u8,
    len: usize,
}

impl UserWords {
    /// `len` bytes at `va`, allocated as a USERPTR BO on `d`.
    fn new(d: &Dev, va: u64, len: usize) -> UserWords {
        UserWords {
            p: d.user_mem(va, len),
            len,
        }
    }

    fn get(&self, off: usize) -> u64 {
        assert!(
            off + 8 <= self.len,
            "word {off:#x} outside {:#x} bytes",
            self.len
        );
        // SAFETY: inside the mapping (checked above).
        unsafe { rd64(self.p, off) }
    }

    fn set(&self, off: usize, v: u64) {
        assert!(
            off + 8 <= self.len,
            "word {off:#x} outside {:#x} bytes",
            self.len
        );
        // SAFETY: inside the mapping (checked above).
        unsafe { wr64(self.p, off, v) }
    }
}

/// ATOMIC applies its TC_OP operation atomically, on VRAM/GTT and on
/// USERPTR memory: ROCr's completion-signal decrement (ADD64 of -1), the
/// plain (non-returning) forms, 32-bit compare-and-swap, signed and
/// unsigned min/max, INC/DEC wrap rules; a looping CMPSWAP waits until
/// the compare succeeds.
#[test]
fn sdma_atomics() {
    const U: u64 = 0x6000_0000;
    let d = Dev::new("");
    d.setup();
    let mut r = Rig::new(&d);
    let user = UserWords::new(&d, U, 4096);
    // TC_OP codes (gfx9): ADD_RTN_64 0x2f, ADD_64 0x6f, CMPSWAP_RTN_32
    // 0x08, SUB_32 0x50, SMIN_RTN_32 0x11, UMAX_RTN_64 0x34, INC_RTN_32
    // 0x18, DEC_RTN_32 0x19, CMPSWAP_RTN_64 0x28.
    user.set(0, 2);
    r.set_ctl64(0x200, 10);
    r.set_ctl64(0x208, 0x1111);
    r.set_ctl32(0x210, 100);
    r.set_ctl32(0x214, (-5i32) as u32);
    r.set_ctl64(0x218, 7);
    r.set_ctl32(0x220, 9);
    r.set_ctl32(0x224, 0);
    r.push(&pkt::atomic(0x2f, false, U, u64::MAX, 0));
    r.push(&pkt::atomic(0x6f, false, CTL_VA + 0x200, 5, 0));
    r.push(&pkt::atomic(0x08, false, CTL_VA + 0x208, 0x2222, 0x1111));
    r.push(&pkt::atomic(0x08, false, CTL_VA + 0x20c, 0x3333, 0x1)); // compare fails
    r.push(&pkt::atomic(0x50, false, CTL_VA + 0x210, 30, 0));
    r.push(&pkt::atomic(
        0x11,
        false,
        CTL_VA + 0x214,
        (-7i32) as u32 as u64,
        0,
    ));
    r.push(&pkt::atomic(0x34, false, CTL_VA + 0x218, 3, 0));
    r.push(&pkt::atomic(0x18, false, CTL_VA + 0x220, 9, 0)); // 9 >= 9: wraps to 0
    r.push(&pkt::atomic(0x19, false, CTL_VA + 0x224, 4, 0)); // 0: reloads 4
    r.run();
    assert_eq!(user.get(0), 1, "ROCr's signal decrement on USERPTR memory");
    assert_eq!(r.ctl64(0x200), 15);
    assert_eq!(r.ctl64(0x208), 0x2222);
    assert_eq!(r.ctl32(0x20c), 0, "a failed compare must not write");
    assert_eq!(r.ctl32(0x210), 70);
    assert_eq!(r.ctl32(0x214) as i32, -7);
    assert_eq!(r.ctl64(0x218), 7);
    assert_eq!((r.ctl32(0x220), r.ctl32(0x224)), (0, 4));

    // Looping CMPSWAP64: waits until the word equals the compare value.
    user.set(8, 1);
    let at = r.wptr;
    r.push(&pkt::atomic(0x28, true, U + 8, 0xabcd, 0x77));
    r.push(&pkt::fence(CTL_VA + 0x230, 1));
    r.run_stops_at(at);
    user.set(8, 0x77);
    r.run();
    assert_eq!(user.get(8), 0xabcd);
    assert_eq!(r.ctl32(0x230), 1);

    // A float atomic (FMIN_RTN_32, 0x02) is not modelled: the queue halts.
    let at = r.wptr;
    r.push(&pkt::atomic(0x02, false, CTL_VA + 0x240, 1, 0));
    r.run_stops_at(at);
}

/// TIMESTAMP_GET_GLOBAL writes the GPU clock GET_CLOCK_COUNTERS reads,
/// monotonic, at the 8-aligned address; TIMESTAMP_SET loads the engine's
/// local counter that TIMESTAMP_GET then reads.
#[test]
fn sdma_timestamps() {
    let d = Dev::new("");
    d.setup();
    let mut r = Rig::new(&d);
    let clock = || {
        let out = d
            .call(nr::GET_CLOCK_COUNTERS, &args(&[(32, d.gpu_id as u64)], 40))
            .unwrap();
        u64_at(&out, 0)
    };
    let t0 = clock();
    r.push(&pkt::timestamp_get(2, CTL_VA + 0x300));
    // Bits 2..0 of the address dword are not part of the address.
    r.push(&[
        pkt::header(13, 2),
        (CTL_VA + 0x328 + 4) as u32,
        (CTL_VA >> 32) as u32,
    ]);
    r.push(&pkt::timestamp_set(1_000_000));
    r.push(&pkt::timestamp_get(1, CTL_VA + 0x310));
    r.run();
    let t1 = clock();
    let (a, b) = (r.ctl64(0x300), r.ctl64(0x328));
    assert!(t0 <= a && a <= b && b <= t1, "{t0} {a} {b} {t1}");
    assert_eq!(r.ctl32(0x330), 0, "written at the unaligned address");
    let local = r.ctl64(0x310);
    assert!(
        (1_000_000..1_000_000 + (t1 - t0) + 1).contains(&local),
        "local timestamp {local}"
    );
}

/// CONST_FILL fills (count >> fillsize) + 1 elements: ROCr's dword
/// fills store (dwords - 1) * 4, the kernel's byte fills bytes - 1.
#[test]
fn sdma_const_fill_counts() {
    let d = Dev::new("");
    d.setup();
    let mut r = Rig::new(&d);
    // SAFETY: dst maps 65536 bytes.
    unsafe {
        for i in 0..64 {
            wr32(r.dst, i * 4, 0x5555_5555);
        }
    }
    r.push(&pkt::const_fill(2, DST_VA, 0xcafe_f00d, (10 - 1) * 4));
    r.push(&pkt::const_fill(0, DST_VA + 0x80, 0x1234_56ab, 6 - 1));
    r.run();
    // SAFETY: dst maps 65536 bytes.
    unsafe {
        assert_eq!(rd32(r.dst, 36), 0xcafe_f00d);
        assert_eq!(rd32(r.dst, 40), 0x5555_5555, "fill ran past 10 dwords");
        assert_eq!(rd32(r.dst, 0x80), 0xabab_abab);
        assert_eq!(rd32(r.dst, 0x84), 0x5555_abab);
    }
}

/// COPY_LINEAR_SUB_WIND copies a 3-D box of elements between pitched
/// layouts (ROCr's hsa_amd_memory_async_copy_rect).
#[test]
fn sdma_copy_sub_window() {
    let d = Dev::new("");
    d.setup();
    let mut r = Rig::new(&d);
    // Source: 4-byte elements, pitch 16, slice 16 * 8; value = z<<16|y<<8|x.
    for z in 0..3u32 {
        for y in 0..8u32 {
            for x in 0..16u32 {
                let off = ((z * 128 + y * 16 + x) * 4) as usize;
                // SAFETY: inside src (65536 bytes).
                unsafe { wr32(r.src, off, z << 16 | y << 8 | x) };
            }
        }
    }
    let src = pkt::Side {
        base: SRC_VA,
        x: 1,
        y: 2,
        z: 1,
        pitch: 16,
        slice: 128,
    };
    let dst = pkt::Side {
        base: DST_VA,
        x: 2,
        y: 0,
        z: 0,
        pitch: 8,
        slice: 40,
    };
    r.push(&pkt::copy_subwin(2, &src, &dst, (3, 2, 2)));
    r.run();
    for z in 0..2u32 {
        for y in 0..5u32 {
            for x in 0..8u32 {
                let off = ((z * 40 + y * 8 + x) * 4) as usize;
                // SAFETY: inside dst.
                let v = unsafe { rd32(r.dst, off) };
                let inside = (2..5).contains(&x) && y < 2;
                let want = if inside {
                    (z + 1) << 16 | (y + 2) << 8 | (x - 2 + 1)
                } else {
                    0
                };
                assert_eq!(v, want, "dst element z={z} y={y} x={x}");
            }
        }
    }
}

/// What ROCr 5.2's BlitSdma::SubmitCommand puts on the ring for an async
/// copy with one dependency and an interrupt signal: two POLL_REGMEMs on
/// the dependency (high, then low dword == 0), TIMESTAMP_GET_GLOBAL, the
/// gfx9 HDP flush, COPY_LINEAR, TIMESTAMP_GET_GLOBAL, ATOMIC ADD64 -1 on
/// the completion signal, FENCE of the event id into the event's mailbox
/// slot, TRAP with the event id.  Signals live in USERPTR memory, as
/// ROCr's system-pool allocations do.
#[test]
fn sdma_rocr_async_copy_sequence() {
    const U: u64 = 0x6000_0000;
    let d = Dev::new("");
    d.setup();
    let mut r = Rig::new(&d);
    let user = UserWords::new(&d, U, 4096);
    // SAFETY: src maps 65536 bytes.
    unsafe { wr32(r.src, 0, 0x600d_c0de) };
    user.set(0, 1); // dependency signal: not done yet
    user.set(64, 1); // completion signal
    let (wa, _evs) = wait_args(&[r.event], false, u32::MAX);
    let waiting = d.start(&waiter(), nr::WAIT_EVENTS, &wa);
    let slot = SIG_VA + r.event as u64 * 8;
    r.push(&pkt::poll_regmem(
        true,
        false,
        3,
        U + 4,
        0,
        u32::MAX,
        4,
        0xfff,
    ));
    r.push(&pkt::poll_regmem(true, false, 3, U, 0, u32::MAX, 4, 0xfff));
    r.push(&pkt::timestamp_get(2, U + 128));
    r.push(&[0x8, 0x0, 0x8000_0000, 0x0, 0x0, 0x0]);
    r.push(&pkt::copy_linear(SRC_VA, U + 256, 4));
    r.push(&pkt::timestamp_get(2, U + 136));
    r.push(&pkt::atomic(0x2f, false, U + 64, u64::MAX, 0));
    r.push(&pkt::fence(slot, r.event));
    r.push(&pkt::trap(r.event));
    r.run_stops_at(6 * 4 * 2 - 6 * 4);
    user.set(0, 0);
    r.run();
    assert_eq!(user.get(256) as u32, 0x600d_c0de);
    assert_eq!(user.get(64), 0, "completion signal not decremented");
    assert!(user.get(128) != 0 && user.get(128) <= user.get(136));
    let out = waiting
        .recv_timeout(Duration::from_secs(2))
        .expect("the TRAP did not wake the wait")
        .unwrap();
    assert_eq!(u32_at(&out, 20), 0);
}

/// The SDMA time KFD's `sdma_<gpu_id>` shows, as the live sysfs files
/// would: the engine's time on the process' queues as of the last sample
/// (the live files' tick), forgotten when the process closes /dev/kfd.
#[test]
fn sdma_time_shows_when_sampled_and_goes_with_the_process() {
    let d = Dev::new("");
    let (kfd, _) = d.setup();
    let mut r = Rig::new(&d);
    // 64 copies of 64 KiB: well over a microsecond of the engine's time.
    for _ in 0..64 {
        r.push(&pkt::copy_linear(SRC_VA, DST_VA, 65536));
    }
    r.run();
    let sdma_us = |d: &Dev| {
        let s = d.emu.sysfs_snapshot();
        let p = s.procs.iter().find(|p| p.pid == std::process::id());
        p.and_then(|p| p.gpus.iter().find(|g| g.gpu_id == d.gpu_id))
            .map(|g| g.sdma_us)
    };
    assert_eq!(sdma_us(&d), Some(0), "shown before it was sampled");
    d.emu.sample_activity();
    assert!(sdma_us(&d) > Some(0), "{:?} after a sample", sdma_us(&d));
    // The process closes /dev/kfd; the next with its pid starts from
    // nothing, whenever the next sample is taken.
    d.emu.release(kfd);
    assert_eq!(sdma_us(&d), None);
    let again = d.emu.open(&NodeKind::Kfd, &me()).unwrap();
    d.emu.sample_activity();
    assert_eq!(sdma_us(&d), Some(0), "the ended process' time");
    d.emu.release(again);
}

/// A TRAP signals an event only through its mailbox, as KFD's interrupt
/// handler does: the slot of the TRAP's context id written → that event
/// alone; otherwise (no such slot written) every event whose slot was
/// written; never an event whose slot nobody wrote.
#[test]
fn sdma_trap_needs_the_mailbox_write() {
    let d = Dev::new("");
    d.setup();
    let mut r = Rig::new(&d);
    let a = r.event;
    let b = u32_at(
        &d.call(nr::CREATE_EVENT, &args(&[(16, 1)], 32)).unwrap(),
        24,
    );
    let slot = |e: u32| SIG_VA + e as u64 * 8;
    let slot_value = |r: &Rig, e: u32| {
        // SAFETY: inside the 32 KiB signal page mapping.
        unsafe { std::ptr::read_volatile(r.sig.add(e as usize * 8) as *const u64) }
    };
    let fired = |e: u32| {
        let (w, _evs) = wait_args(&[e], false, 0);
        u32_at(&d.call(nr::WAIT_EVENTS, &w).unwrap(), 20) == 0
    };
    // No mailbox write: nothing fires.
    r.push(&pkt::trap(a));
    r.run();
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        !fired(a),
        "a TRAP without a mailbox write signalled its event"
    );
    // Both mailboxes written, TRAP names a: only a fires; b stays pending.
    r.push(&pkt::fence(slot(a), a));
    r.push(&pkt::fence(slot(b), b));
    r.push(&pkt::trap(a));
    r.run();
    assert!(fired(a));
    assert!(!fired(b), "the TRAP's own event was found: others wait");
    assert_eq!(slot_value(&r, a), u64::MAX, "a's slot re-armed");
    assert_ne!(slot_value(&r, b), u64::MAX);
    // A context id whose slot was not written: b is found by the scan.
    r.push(&pkt::trap(a));
    r.run();
    assert!(fired(b));
    assert!(!fired(a));
    assert_eq!(slot_value(&r, b), u64::MAX);
}

/// The thunk hands KFD the dGPU signal page BO with its first
/// CREATE_EVENT, whatever the event type: ROCr's first event is a memory
/// exception event.  KFD takes the page then; the signal events created
/// later live in it, so an SDMA FENCE to the slot address the thunk
/// computes from the BO, then a TRAP, signals them.
#[test]
fn signal_page_from_a_non_signal_first_event() {
    const PAGE_VA: u64 = 0x4800_0000;
    let d = Dev::new("");
    d.setup();
    let (h, off) = d.alloc(PAGE_VA, 32768, alloc::GTT, 0).unwrap();
    d.map_gpu(h);
    let page = d.map_node(NodeKind::Render { minor: d.minor }, off, 32768);
    // A memory exception event (type 8) carrying the page handle.
    let mem_ev = d
        .call(nr::CREATE_EVENT, &args(&[(0, h), (12, 8)], 32))
        .unwrap();
    assert!(u32_at(&mem_ev, 24) >= 0x8000_0000);
    assert_eq!(
        u64_at(&mem_ev, 0),
        0,
        "no events page offset for a non-signal event"
    );
    // SAFETY: page maps 32768 bytes.
    let slot0 = unsafe { std::ptr::read_volatile(page as *const u64) };
    assert_eq!(slot0, u64::MAX, "KFD sets every slot unsignaled");
    // A second page is refused.
    assert_eq!(
        d.call(nr::CREATE_EVENT, &args(&[(0, h), (16, 1)], 32)),
        Err(libc::EINVAL)
    );
    let mut r = Rig::build(&d, false);
    let ev = r.event;
    r.push(&pkt::fence(PAGE_VA + ev as u64 * 8, ev));
    r.push(&pkt::trap(ev));
    r.run();
    let (w, _evs) = wait_args(&[ev], false, 1000);
    assert_eq!(
        u32_at(&d.call(nr::WAIT_EVENTS, &w).unwrap(), 20),
        0,
        "the TRAP did not find the mailbox in the thunk's page"
    );
}

/// An SDMA access outside the GPU's VM is a GPU page fault: the queue
/// halts and, as KFD reports faults, every memory event fires with the
/// fault as exception data, which the wait copies to the caller's event
/// array (ROCr prints "Memory access fault by GPU node-N ... Page not
/// present" from it and aborts).
#[test]
fn sdma_page_fault_signals_memory_events() {
    let d = Dev::new("");
    d.setup();
    let mut r = Rig::new(&d);
    let mem_ev = u32_at(
        &d.call(nr::CREATE_EVENT, &args(&[(12, 8)], 32)).unwrap(),
        24,
    );
    let (wa, evs) = wait_args(&[mem_ev], false, u32::MAX);
    let waiting = d.start(&waiter(), nr::WAIT_EVENTS, &wa);
    let at = r.wptr;
    r.push(&pkt::copy_linear(0x7000_1234, DST_VA, 64));
    r.run_stops_at(at);
    let out = waiting
        .recv_timeout(Duration::from_secs(2))
        .expect("the page fault did not signal the memory event")
        .unwrap();
    assert_eq!(u32_at(&out, 20), 0);
    // SAFETY: evs is the 48-byte event array the model wrote into.
    let data: Vec<u8> = (0..32)
        .map(|i| unsafe { std::ptr::read_volatile(evs.as_ptr().add(i)) })
        .collect();
    assert_eq!(u32_at(&data, 0), 1, "NotPresent");
    assert_eq!((u32_at(&data, 4), u32_at(&data, 8)), (0, 0));
    assert_eq!(u64_at(&data, 16), 0x7000_1000, "the faulting page");
    assert_eq!(u32_at(&data, 24), d.gpu_id);
}

/// Packets the engine does not execute halt the queue at them: another
/// opcode (SEM), another sub-op (COPY_TILED), byte swapping.
#[test]
fn sdma_unsupported_packets_halt() {
    for bad in [
        vec![pkt::header(7, 0), 0, 0, 0],
        vec![pkt::header(1, 1), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        {
            let mut c = pkt::copy_linear(SRC_VA, DST_VA, 4);
            c[2] = 1 << 16;
            c
        },
    ] {
        let d = Dev::new("");
        d.setup();
        let mut r = Rig::new(&d);
        r.push(&pkt::fence(CTL_VA + 0x100, 1));
        let at = r.wptr;
        r.push(&bad);
        r.push(&pkt::fence(CTL_VA + 0x100, 2));
        r.run_stops_at(at);
        assert_eq!(r.ctl32(0x100), 1, "packet {:#x?}", bad);
    }
}

/// The SDMA engine moves the bytes of a large copy without the global
/// state lock: an ioctl of another process completes while the copy runs.
/// Ioctls of the copying process that free its memory wait for the pass.
#[test]
fn large_sdma_copy_does_not_stall_other_processes() {
    let d = Dev::new("");
    d.setup();
    let mut r = Rig::new(&d);
    let render = NodeKind::Render { minor: d.minor };
    let (src_h, src_off) = d.alloc(BIG_SRC_VA, BIG, alloc::VRAM, 0).unwrap();
    let (dst_h, dst_off) = d.alloc(BIG_DST_VA, BIG * COPIES, alloc::VRAM, 0).unwrap();
    d.map_gpu(src_h);
    d.map_gpu(dst_h);
    let src = d.map_node(render, src_off, BIG as usize);
    let dst = d.map_node(render, dst_off, (BIG * COPIES) as usize);
    for i in 0..(BIG as usize / 4) {
        // SAFETY: src maps BIG bytes.
        unsafe { wr32(src, i * 4, 0x5000_0000 | i as u32) };
    }
    let fence = |r: &Rig| {
        // SAFETY: ctl maps 4096 bytes.
        unsafe { rd32(r.ctl, 32) }
    };

    // Another process, with its own KFD context.
    let other = Caller {
        tid: me().tid,
        tgid: 0x7fff_0001,
    };
    let other_fh = d.emu.open(&NodeKind::Kfd, &other).unwrap();
    let avail = args(&[(8, d.gpu_id as u64)], 16);

    let t0 = Instant::now();
    push_big_job(&mut r, 1);
    wait_copy_started(dst, 0x5000_0000);
    let started = t0.elapsed();
    let t = Instant::now();
    d.call_fh(other_fh, &other, nr::AVAILABLE_MEMORY, &avail)
        .unwrap();
    let ioctl = t.elapsed();
    let fence_at_ioctl = fence(&r);
    assert!(r.wait_rptr(r.wptr), "the job did not finish");
    let job = t0.elapsed();
    println!(
        "copy of {} MiB: started after {started:?}, done after {job:?}; \
         other process' ioctl took {ioctl:?}",
        (COPIES * BIG) >> 20
    );
    assert_eq!(
        fence_at_ioctl, 0,
        "the other process' ioctl waited for the whole copy ({ioctl:?})"
    );
    assert_eq!(fence(&r), 1);
    let last = ((COPIES - 1) * BIG) as usize;
    for i in [0, 1, BIG as usize / 4 - 1] {
        // SAFETY: inside the last 4 MiB slice of dst.
        assert_eq!(unsafe { rd32(dst, last + i * 4) }, 0x5000_0000 | i as u32);
    }

    // Freeing memory the copy may use waits for the pass in flight.
    // SAFETY: dst maps BIG * COPIES bytes.
    unsafe { wr32(dst, 0, 0) };
    push_big_job(&mut r, 2);
    wait_copy_started(dst, 0x5000_0000);
    d.call(nr::FREE_MEMORY_OF_GPU, &a64(&[(0, dst_h)], 8))
        .unwrap();
    assert_eq!(fence(&r), 2, "FREE_MEMORY ran while the pass used the BO");
    d.emu.release(other_fh);
}

#[test]
fn queue_limits_and_bad_queue_args() {
    let d = Dev::new("[[gpus]]\nnum_sdma_engines = 1\nnum_sdma_xgmi_engines = 0\nnum_sdma_queues_per_engine = 1\n");
    d.setup();
    let q = |t: u32| queue_args(d.gpu_id, t, 4096);
    let first = d.call(nr::CREATE_QUEUE, &q(queue_type::SDMA)).unwrap();
    assert_eq!(
        d.call(nr::CREATE_QUEUE, &q(queue_type::SDMA)),
        Err(libc::ENOMEM)
    );
    let c = d
        .call(nr::CREATE_QUEUE, &q(queue_type::COMPUTE_AQL))
        .unwrap();
    assert_ne!(u32_at(&c, 52), u32_at(&first, 52));
    assert_ne!(u64_at(&c, 24), u64_at(&first, 24));
    // An unknown type: KFD lets the kernel-internal ENOTSUPP (524) out.
    assert_eq!(d.call(nr::CREATE_QUEUE, &q(9)), Err(524));
    let mut bad = q(0);
    bad[32..36].copy_from_slice(&3000u32.to_le_bytes());
    assert_eq!(d.call(nr::CREATE_QUEUE, &bad), Err(libc::EINVAL));
    let mut bad = q(0);
    bad[36..40].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(d.call(nr::CREATE_QUEUE, &bad), Err(libc::EINVAL));
    let upd = args(
        &[
            (0, RING_VA),
            (8, u32_at(&c, 52) as u64),
            (12, 8192),
            (16, 50),
            (20, 3),
        ],
        24,
    );
    d.call(nr::UPDATE_QUEUE, &upd).unwrap();
    let mut upd_bad = upd.clone();
    upd_bad[8..12].copy_from_slice(&999u32.to_le_bytes());
    assert_eq!(d.call(nr::UPDATE_QUEUE, &upd_bad), Err(libc::EFAULT));
    d.call(
        nr::DESTROY_QUEUE,
        &first[52..56]
            .iter()
            .copied()
            .chain([0; 4])
            .collect::<Vec<_>>(),
    )
    .unwrap();
    assert_eq!(
        d.call(
            nr::DESTROY_QUEUE,
            &first[52..56]
                .iter()
                .copied()
                .chain([0; 4])
                .collect::<Vec<_>>()
        ),
        Err(libc::EINVAL)
    );
    d.call(nr::CREATE_QUEUE, &q(queue_type::SDMA)).unwrap();
}

#[allow(clippy::too_many_arguments)]
fn criu(
    op: u32,
    devs: u64,
    bos: u64,
    privp: u64,
    priv_size: u64,
    nd: u32,
    nb: u32,
    no: u32,
    pid: u32,
) -> Vec<u8> {
    let mut a = vec![0u8; 56];
    a[0..8].copy_from_slice(&devs.to_le_bytes());
    a[8..16].copy_from_slice(&bos.to_le_bytes());
    a[16..24].copy_from_slice(&privp.to_le_bytes());
    a[24..32].copy_from_slice(&priv_size.to_le_bytes());
    a[32..36].copy_from_slice(&nd.to_le_bytes());
    a[36..40].copy_from_slice(&nb.to_le_bytes());
    a[40..44].copy_from_slice(&no.to_le_bytes());
    a[44..48].copy_from_slice(&pid.to_le_bytes());
    a[48..52].copy_from_slice(&op.to_le_bytes());
    a
}

/// PROCESS_INFO's answer: the private data size, then the device, BO and
/// object counts.
fn info_sizes(info: &[u8]) -> (u64, u32, u32, u32) {
    (
        u64_at(info, 24),
        u32_at(info, 32),
        u32_at(info, 36),
        u32_at(info, 40),
    )
}

/// PROCESS_INFO of the test process on `d`, as `info_sizes` reads it.
fn process_info(d: &Dev) -> (u64, u32, u32, u32) {
    let info = d
        .call(
            nr::CRIU_OP,
            &criu(criu_op::PROCESS_INFO, 0, 0, 0, 0, 0, 0, 0, 0),
        )
        .unwrap();
    info_sizes(&info)
}

#[test]
fn criu_checkpoint_unpause_restore_resume() {
    let d = Dev::new("");
    let (kfd, _render) = d.setup();
    let mut r = Rig::new(&d);
    r.push(&[5, lo(CTL_VA + 16), hi(CTL_VA + 16), 1]);
    r.kick();
    assert!(r.wait_rptr(r.wptr));

    assert_eq!(
        d.call(nr::CRIU_OP, &criu(criu_op::UNPAUSE, 0, 0, 0, 0, 0, 0, 0, 0)),
        Err(libc::EINVAL)
    );
    let info = d
        .call(
            nr::CRIU_OP,
            &criu(criu_op::PROCESS_INFO, 0, 0, 0, 0, 0, 0, 0, 0),
        )
        .unwrap();
    let (psize, nd, nb, no) = info_sizes(&info);
    assert_eq!((nd, nb, no), (1, 5, 2));
    // KFD's sizes: a 512-byte SDMA MQD, no control stack.
    assert_eq!(psize, 8 + 8 + 5 * 272 + (120 + 512) + 64);
    assert_ne!(u32_at(&info, 44), 0);

    // Paused: the ring does not move.
    r.push(&[5, lo(CTL_VA + 16), hi(CTL_VA + 16), 2]);
    r.kick();
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: inside ctl.
    assert_eq!(unsafe { rd32(r.ctl, 16) }, 1);

    let mut devs = vec![0u8; 16];
    let mut bos = vec![0u8; 48 * nb as usize];
    let mut blob = vec![0u8; psize as usize];
    let (dp, bp, pp) = (
        devs.as_mut_ptr() as u64,
        bos.as_mut_ptr() as u64,
        blob.as_mut_ptr() as u64,
    );
    assert_eq!(
        d.call(
            nr::CRIU_OP,
            &criu(criu_op::CHECKPOINT, dp, bp, 0, psize, nd, nb, no, 0)
        ),
        Err(libc::EINVAL)
    );
    assert_eq!(
        d.call(
            nr::CRIU_OP,
            &criu(criu_op::CHECKPOINT, dp, bp, pp, psize, nd, nb - 1, no, 0)
        ),
        Err(libc::EINVAL)
    );
    d.call(
        nr::CRIU_OP,
        &criu(criu_op::CHECKPOINT, dp, bp, pp, psize, nd, nb, no, 0),
    )
    .unwrap();
    assert_eq!((u32_at(&devs, 0), u32_at(&devs, 4)), (d.gpu_id, d.gpu_id));
    for (i, (h, off)) in r.handles.iter().enumerate() {
        let b = &bos[i * 48..(i + 1) * 48];
        assert_eq!(u64_at(b, 16), *off);
        assert_eq!(u32_at(b, 32), d.gpu_id);
        assert_eq!(u32_at(b, 40), 0xffff_ffff);
        // BO priv: idr_handle matches the handle's low bits.
        assert_eq!(u32_at(&blob, 16 + i * 272 + 8), *h as u32);
    }
    d.call(nr::CRIU_OP, &criu(criu_op::UNPAUSE, 0, 0, 0, 0, 0, 0, 0, 0))
        .unwrap();
    assert!(r.wait_rptr(r.wptr), "queue did not continue after UNPAUSE");
    assert_eq!(
        d.call(
            nr::CRIU_OP,
            &criu(criu_op::CHECKPOINT, dp, bp, pp, psize, nd, nb, no, 0)
        ),
        Err(libc::EINVAL)
    );

    // The queue holds the GPU's GWS: KFD's queue record says so.
    d.call(nr::ALLOC_QUEUE_GWS, &args(&[(0, 0), (4, 1)], 16))
        .unwrap();
    // A CU mask: KFD's MQD holds it, ours too (MQD version 2).
    let mask = [0xf0f0_f0f0u32, 0x0f0f_0f0f];
    d.call(
        nr::SET_CU_MASK,
        &args(&[(0, 0), (4, 64), (8, mask.as_ptr() as u64)], 16),
    )
    .unwrap();
    // Checkpoint again for the restore, then the process "dies".
    let (psize, ..) = process_info(&d);
    assert_eq!(psize, 8 + 8 + 5 * 272 + (120 + 512) + 64);
    let mut blob = vec![0u8; psize as usize];
    let pp = blob.as_mut_ptr() as u64;
    d.call(
        nr::CRIU_OP,
        &criu(criu_op::CHECKPOINT, dp, bp, pp, psize, nd, nb, no, 0),
    )
    .unwrap();
    assert_eq!(u32_at(&blob, 16 + 5 * 272 + 92), 1, "queue record's gws");
    let mqd = 16 + 5 * 272 + 120;
    assert_eq!(u32_at(&blob, 16 + 5 * 272 + 112), 512, "mqd_size");
    assert_eq!(u32_at(&blob, 16 + 5 * 272 + 68), 1, "KFD's SDMA type");
    assert_eq!(u32_at(&blob, 16 + 5 * 272 + 108), 0, "ctl_stack_size");
    assert_eq!(u32_at(&blob, mqd + 4), 2, "MQD version");
    assert_eq!(
        &blob[mqd + 64..mqd + 80],
        &[2, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0xf0, 0xf0, 0xf0, 0x0f, 0x0f, 0x0f, 0x0f]
    );
    let cu_section = blob[mqd + 64..mqd + 200].to_vec();
    let ring_copy: Vec<u8> = (0..RING_SIZE as usize)
        .map(|i| unsafe_byte(r.ring, i))
        .collect();
    let old_offsets: Vec<u64> = r.handles.iter().map(|h| h.1).collect();
    // The restored process: fresh kfd and render opens.
    d.reopen_as_restored(kfd);
    devs[8..12].copy_from_slice(&950u32.to_le_bytes());
    let restore = |blob: &[u8], size: u64, nd: u32, nb: u32| {
        d.call(
            nr::CRIU_OP,
            &criu(
                criu_op::RESTORE,
                dp,
                bp,
                blob.as_ptr() as u64,
                size,
                nd,
                nb,
                no,
                0,
            ),
        )
    };
    // Corruptions are refused without leaving state behind.
    let mut bad = blob.clone();
    bad[0] = 2;
    assert_eq!(restore(&bad, psize, nd, nb), Err(libc::EINVAL));
    // XNACK on cannot be restored on gfx908.
    let mut bad = blob.clone();
    bad[4] = 1;
    assert_eq!(restore(&bad, psize, nd, nb), Err(libc::EPERM));
    let mut longer = blob.clone();
    longer.extend_from_slice(&[0; 8]);
    assert_eq!(restore(&longer, psize + 8, nd, nb), Err(libc::EINVAL));
    assert_eq!(restore(&blob, psize - 4, nd, nb), Err(libc::EINVAL));
    assert_eq!(restore(&blob, psize, nd, 0), Err(libc::EINVAL));
    assert_eq!(restore(&blob, psize, 2, nb), Err(libc::EINVAL));
    let mut bad = blob.clone();
    let mqd = 16 + 5 * 272 + 120;
    bad[mqd] ^= 0xff;
    assert_eq!(restore(&bad, psize, nd, nb), Err(libc::EINVAL));
    // Hostile sizes, the blob kept self-consistent (the bytes inserted):
    // refused before anything is copied, as a fixed kernel refuses them.
    let q = 16 + 5 * 272;
    for (field, grow) in [(112, 64 << 10), (108, 1 << 20), (112, 4096)] {
        let mut bad = blob.clone();
        let v = u32_at(&bad, q + field) + grow;
        bad[q + field..q + field + 4].copy_from_slice(&v.to_le_bytes());
        bad.splice(mqd..mqd, std::iter::repeat_n(0u8, grow as usize));
        let size = bad.len() as u64;
        assert_eq!(
            restore(&bad, size, nd, nb),
            Err(libc::EINVAL),
            "field {field} + {grow}"
        );
    }
    // An MQD shorter than KFD's (the rest cut), and a queue type no
    // process owns (HIQ) or an SDMA queue in AQL format.
    let mut bad = blob.clone();
    bad[q + 112..q + 116].copy_from_slice(&64u32.to_le_bytes());
    bad.drain(mqd + 64..mqd + 512);
    let size = bad.len() as u64;
    assert_eq!(
        restore(&bad, size, nd, nb),
        Err(libc::EINVAL),
        "64-byte MQD"
    );
    for (field, v) in [(68, 2u32), (68, 6), (72, 1)] {
        let mut bad = blob.clone();
        bad[q + field..q + field + 4].copy_from_slice(&v.to_le_bytes());
        assert_eq!(
            restore(&bad, psize, nd, nb),
            Err(libc::EINVAL),
            "field {field} = {v}"
        );
    }
    let mut bad = blob.clone();
    bad[16 + 272 + 8..16 + 272 + 12].copy_from_slice(&(r.handles[0].0 as u32).to_le_bytes());
    assert_eq!(
        restore(&bad, psize, nd, nb),
        Err(libc::ENOMEM),
        "duplicate IDR id"
    );
    let avail = d
        .call(nr::AVAILABLE_MEMORY, &args(&[(8, d.gpu_id as u64)], 16))
        .unwrap();
    assert_eq!(
        u64_at(&avail, 0),
        32 << 30,
        "a refused restore left VRAM allocated"
    );

    restore(&blob, psize, nd, nb).unwrap();
    // The restored queue holds the GWS again.
    assert_eq!(
        d.call(nr::ALLOC_QUEUE_GWS, &args(&[(0, 0), (4, 1)], 16)),
        Err(libc::EBUSY)
    );
    assert_eq!(
        restore(&blob, psize, nd, nb),
        Err(libc::EINVAL),
        "second RESTORE"
    );
    let mut new_maps = Vec::new();
    for (i, old) in old_offsets.iter().enumerate() {
        let b = &bos[i * 48..(i + 1) * 48];
        let ro = u64_at(b, 24);
        assert!(ro >= 4 << 30 && ro != *old, "restored_offset {ro:#x}");
        assert_eq!(u32_at(b, 40), 0xffff_ffff);
        new_maps.push(d.map_node(
            NodeKind::Render { minor: d.minor },
            ro,
            u64_at(b, 8) as usize,
        ));
    }
    // Same handles: freeing the restored ctl... no: map it by the old handle.
    let ids = [d.gpu_id];
    let mut m = vec![0u8; 24];
    m[0..8].copy_from_slice(&r.handles[3].0.to_le_bytes());
    m[8..16].copy_from_slice(&(ids.as_ptr() as u64).to_le_bytes());
    m[16..20].copy_from_slice(&1u32.to_le_bytes());
    d.call(nr::MAP_MEMORY_TO_GPU, &m).unwrap();
    // The checkpointer writes BO contents back through the render node.
    for (i, b) in ring_copy.iter().enumerate() {
        // SAFETY: the new ring mapping is RING_SIZE bytes.
        unsafe { *new_maps[0].add(i) = *b };
    }
    r.ring = new_maps[0];
    r.ctl = new_maps[1];
    // The process is back in the slot its blob recorded: the doorbell it
    // had mapped is its queue's again, as a fresh queue's slice shows.
    let q = blob_queue_doorbell(&d, &blob);
    // SAFETY: 8-byte doorbells inside two live mappings.
    let (old, new) = unsafe {
        (
            std::ptr::read_volatile(r.doorbell as *const u64),
            std::ptr::read_volatile(q as *const u64),
        )
    };
    assert_eq!(old, new);
    // SAFETY: the doorbell slot of the restored queue.
    let db = unsafe { std::ptr::read_volatile(r.doorbell as *const u64) };
    assert_eq!(db, r.wptr, "MQD wptr restored");
    r.push(&[5, lo(CTL_VA + 32), hi(CTL_VA + 32), 0x77]);
    r.kick();
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: inside ctl.
    assert_eq!(unsafe { rd32(r.ctl, 32) }, 0, "ran before RESUME");
    assert_eq!(
        d.call(
            nr::CRIU_OP,
            &criu(criu_op::RESUME, 0, 0, 0, 0, 0, 0, 0, 999_999)
        ),
        Err(libc::ESRCH)
    );
    d.call(
        nr::CRIU_OP,
        &criu(criu_op::RESUME, 0, 0, 0, 0, 0, 0, 0, std::process::id()),
    )
    .unwrap();
    let t = Instant::now();
    // SAFETY: inside ctl.
    while unsafe { rd32(r.ctl, 32) } != 0x77 && t.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: inside ctl.
    let v = unsafe { rd32(r.ctl, 32) };
    assert_eq!(v, 0x77, "queue did not run after RESUME");
    assert_eq!(
        d.call(
            nr::CRIU_OP,
            &criu(criu_op::RESUME, 0, 0, 0, 0, 0, 0, 0, std::process::id())
        ),
        Err(libc::EINVAL)
    );
    // The restored event still works with the restored signal page.
    let (wa, _e) = wait_args(&[r.event], false, 0);
    d.call(nr::SET_EVENT, &r.event.to_le_bytes()).unwrap();
    assert_eq!(u32_at(&d.call(nr::WAIT_EVENTS, &wa).unwrap(), 20), 0);
    // The restored queue kept its CU mask: a new checkpoint shows it.
    let (psize, _, nb, no) = process_info(&d);
    let mut bos = vec![0u8; 48 * nb as usize];
    let mut blob2 = vec![0u8; psize as usize];
    d.call(
        nr::CRIU_OP,
        &criu(
            criu_op::CHECKPOINT,
            devs.as_mut_ptr() as u64,
            bos.as_mut_ptr() as u64,
            blob2.as_mut_ptr() as u64,
            psize,
            nd,
            nb,
            no,
            0,
        ),
    )
    .unwrap();
    let q = 16 + nb as usize * 272;
    assert_eq!(u32_at(&blob2, q + 76), 0, "queue 0 comes first");
    assert_eq!(&blob2[q + 120 + 64..q + 120 + 200], &cu_section[..]);
}

fn unsafe_byte(p: *mut u8, i: usize) -> u8 {
    // SAFETY: callers pass an index inside the mapping.
    unsafe { *p.add(i) }
}

/// The restored queue's doorbell: same queue id, the new process' slice.
fn blob_queue_doorbell(d: &Dev, blob: &[u8]) -> *mut u8 {
    let q = 16 + 5 * 272;
    let qid = u32_at(blob, q + 76);
    // A fresh queue in the restored process tells us the doorbell slice.
    let probe = d
        .call(
            nr::CREATE_QUEUE,
            &queue_args(d.gpu_id, queue_type::COMPUTE, RING_SIZE),
        )
        .unwrap();
    let dbo = u64_at(&probe, 24);
    let base = d.map_node(NodeKind::Kfd, dbo & !8191, 8192);
    // SAFETY: qid * 8 < 8192.
    unsafe { base.add(qid as usize * 8) }
}

/// Drops CAP_SYS_ADMIN and CAP_CHECKPOINT_RESTORE from the calling
/// thread's effective set (capabilities are per thread).
fn drop_cr_caps() {
    #[repr(C)]
    struct Hdr {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Hdr {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget fills the two v3 data structs.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) };
    assert_eq!(r, 0);
    d[0].effective &= !(1 << 21);
    d[1].effective &= !(1 << (40 - 32));
    // SAFETY: capset reads the header and two data structs.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) };
    assert_eq!(r, 0);
}

#[test]
fn criu_op_needs_ptrace_and_capabilities() {
    let d = Dev::new("");
    // SAFETY: the child only calls async-signal-safe pause() and _exit.
    let child = unsafe { libc::fork() };
    if child == 0 {
        loop {
            // SAFETY: pause has no preconditions.
            unsafe { libc::pause() };
        }
    }
    assert!(child > 0);
    let victim = Caller {
        tid: child as u32,
        tgid: child as u32,
    };
    let fh = d.emu.open(&NodeKind::Kfd, &victim).unwrap();
    let info = criu(criu_op::PROCESS_INFO, 0, 0, 0, 0, 0, 0, 0, 0);
    // Not its tracer: the fd is not ours.
    assert_eq!(d.call_fh(fh, &me(), nr::CRIU_OP, &info), Err(libc::EBADF));
    assert_eq!(
        d.call_fh(fh, &me(), nr::GET_VERSION, &[0; 8]),
        Err(libc::EBADF)
    );
    // SAFETY: seizing a child we own, from this thread.
    let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, child, 0, 0) };
    assert_eq!(r, 0, "PTRACE_SEIZE: {}", std::io::Error::last_os_error());
    let out = d.call_fh(fh, &me(), nr::CRIU_OP, &info).unwrap();
    assert_eq!(u32_at(&out, 32), 1);
    assert_eq!(u32_at(&out, 44), child as u32);
    // Only CRIU_OP is open to the tracer.
    assert_eq!(
        d.call_fh(fh, &me(), nr::GET_VERSION, &[0; 8]),
        Err(libc::EBADF)
    );
    // Another thread of the tracer process is not the tracer.
    let other = waiter();
    assert_eq!(d.call_fh(fh, &other, nr::CRIU_OP, &info), Err(libc::EBADF));
    // The victim itself, without the capabilities: EACCES.
    let own = d.emu.open(&NodeKind::Kfd, &me()).unwrap();
    let emu = &d.emu;
    std::thread::scope(|s| {
        s.spawn(|| {
            drop_cr_caps();
            let (tx, rx) = channel();
            let c = me();
            emu.ioctl(
                own,
                &c,
                kfd_iowr(nr::CRIU_OP, 56),
                0,
                &info,
                56,
                Box::new(Tx(Mutex::new(tx))),
            );
            assert_eq!(rx.recv().unwrap(), Err(libc::EACCES));
            let (tx, rx) = channel();
            emu.ioctl(
                own,
                &c,
                kfd_iowr(nr::GET_VERSION, 8),
                0,
                &[0; 8],
                8,
                Box::new(Tx(Mutex::new(tx))),
            );
            assert!(rx.recv().unwrap().is_ok());
        });
    });
    // SAFETY: killing and reaping our own child.
    unsafe {
        libc::kill(child, libc::SIGKILL);
    }
    // SAFETY: as above.
    unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
}

fn drm(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (0x64 << 8) | nr
}

#[test]
fn render_node_version_and_dev_info() {
    let d = Dev::new("");
    let (_kfd, render) = d.setup();
    let call = |cmd: u32, input: &[u8], out: u32| {
        let (tx, rx) = channel();
        d.emu.ioctl(
            render,
            &me(),
            cmd,
            0,
            input,
            out,
            Box::new(Tx(Mutex::new(tx))),
        );
        rx.recv_timeout(Duration::from_secs(5)).unwrap()
    };
    let mut name = [0u8; 4];
    let mut desc = [0u8; 64];
    let mut v = vec![0u8; 64];
    v[16..24].copy_from_slice(&4u64.to_le_bytes());
    v[24..32].copy_from_slice(&(name.as_mut_ptr() as u64).to_le_bytes());
    v[48..56].copy_from_slice(&64u64.to_le_bytes());
    v[56..64].copy_from_slice(&(desc.as_mut_ptr() as u64).to_le_bytes());
    let out = call(drm(3, 0x00, 64), &v, 64).unwrap();
    // The name is truncated to the caller's buffer, its full length reported.
    assert_eq!(&name, b"amdg");
    assert_eq!(u64_at(&out, 16), 6);
    assert!(u64_at(&out, 48) > 0 && u64_at(&out, 48) <= 64);
    assert_eq!(u32_at(&out, 0), 3);

    let mut dev = vec![0u8; 256];
    let mut q = vec![0u8; 32];
    q[0..8].copy_from_slice(&(dev.as_mut_ptr() as u64).to_le_bytes());
    q[8..12].copy_from_slice(&(dev.len() as u32).to_le_bytes());
    q[12..16].copy_from_slice(&0x16u32.to_le_bytes());
    call(drm(1, 0x45, 32), &q, 0).unwrap();
    let p = Profile::builtin("mi100").unwrap();
    assert_eq!(u32_at(&dev, 0), p.gpus()[0].device_id);
    assert_eq!(u32_at(&dev, 16), 141, "GFX9 is family AI");
    assert!(u64_at(&dev, 152) > u64_at(&dev, 144));
    // Unknown query, bad pointer, unmodelled DRM ioctls.
    let mut bad = q.clone();
    bad[12..16].copy_from_slice(&0x7777u32.to_le_bytes());
    assert_eq!(call(drm(1, 0x45, 32), &bad, 0), Err(libc::EINVAL));
    let mut badp = q.clone();
    badp[0..8].copy_from_slice(&8u64.to_le_bytes());
    assert_eq!(call(drm(1, 0x45, 32), &badp, 0), Err(libc::EFAULT));
    assert!(
        call(drm(3, 0x40, 32), &[0; 32], 32).is_err(),
        "GEM_CREATE is not emulated"
    );
}

#[test]
fn misc_ioctls_and_xnack() {
    let d = Dev::new("");
    d.setup();
    let c = d.call(0x05, &args(&[(32, d.gpu_id as u64)], 40)).unwrap();
    assert!(u64_at(&c, 0) > 0 && u64_at(&c, 24) > 0);
    // A node without GPU (gpu_id 0 of a CPU node, or unknown): success
    // with a GPU counter of 0, the CPU and system counters running.
    for id in [0, 0x1234] {
        let c = d.call(0x05, &args(&[(32, id)], 40)).unwrap();
        assert_eq!(u64_at(&c, 0), 0);
        assert!(u64_at(&c, 8) > 0 && u64_at(&c, 16) > 0);
        assert_eq!(u64_at(&c, 24), 1_000_000_000);
    }
    d.call(0x04, &args(&[(16, d.gpu_id as u64), (20, 1), (24, 0)], 32))
        .unwrap();
    assert_eq!(
        d.call(0x04, &args(&[(16, d.gpu_id as u64), (20, 7)], 32)),
        Err(libc::EINVAL)
    );
    // XNACK on gfx908 (retry off at boot): off, and cannot be switched on.
    let q = (-1i32).to_le_bytes();
    assert_eq!(u32_at(&d.call(nr::SET_XNACK_MODE, &q).unwrap(), 0), 0);
    assert_eq!(
        d.call(nr::SET_XNACK_MODE, &1i32.to_le_bytes()),
        Err(libc::EPERM)
    );
    d.call(nr::SET_XNACK_MODE, &0i32.to_le_bytes()).unwrap();
    // gfx90a switches per process: query (-1), set, query.
    let d = Dev::new("[gpu_defaults]\ngfx_target_version = 90010\n");
    d.setup();
    assert_eq!(u32_at(&d.call(nr::SET_XNACK_MODE, &q).unwrap(), 0), 0);
    d.call(nr::SET_XNACK_MODE, &1i32.to_le_bytes()).unwrap();
    assert_eq!(u32_at(&d.call(nr::SET_XNACK_MODE, &q).unwrap(), 0), 1);
    // SVM: KFD's argument checks first (the caller's size must hold the
    // attributes, the range be page aligned and not empty).
    let svm = |start: u64, size: u64, nattr: u64, len: usize| {
        d.call(
            nr::SVM,
            &args(&[(0, start), (8, size), (16, 0), (20, nattr)], len),
        )
    };
    assert_eq!(svm(0x10000, 0x1000, 2, 24 + 8), Err(libc::EINVAL));
    assert_eq!(svm(0x10800, 0x1000, 0, 24), Err(libc::EINVAL));
    assert_eq!(svm(0, 0x1000, 0, 24), Err(libc::EINVAL));
    assert_eq!(svm(0x10000, 0, 0, 24), Err(libc::EINVAL));
    assert!(d.call(nr::GET_VERSION, &[0; 8]).is_ok());
}

#[test]
fn per_device_state_ioctls_follow_kfd() {
    let d = Dev::new("");
    let kfd = d.emu.open(&NodeKind::Kfd, &me()).unwrap();
    KFD_FH.with(|f| f.set(kfd));
    let g = d.gpu_id as u64;
    let scratch = |id: u64| {
        d.call(
            nr::SET_SCRATCH_BACKING_VA,
            &args(&[(0, 0x7f00), (8, id)], 16),
        )
    };
    let trap = |id: u64| {
        d.call(
            nr::SET_TRAP_HANDLER,
            &a64(&[(0, 0x7000_0000), (8, 0x7000_1000), (16, id)], 24),
        )
    };
    let policy = |id: u64, base: u64, size: u64| {
        d.call(
            nr::SET_MEMORY_POLICY,
            &a64(&[(0, base), (8, size), (16, id)], 32),
        )
    };
    // Unknown device: EINVAL; known but no VM acquired: the bind fails,
    // reported as ENODEV by SET_SCRATCH_BACKING_VA, ESRCH by the others.
    assert_eq!(scratch(0x1234), Err(libc::EINVAL));
    assert_eq!(scratch(g), Err(libc::ENODEV));
    assert_eq!(trap(0x1234), Err(libc::EINVAL));
    assert_eq!(trap(g), Err(libc::ESRCH));
    assert_eq!(policy(0x1234, 0, 0), Err(libc::EINVAL));
    assert_eq!(policy(g, 0, 0), Err(libc::ESRCH));
    d.emu.release(kfd);
    d.setup();
    scratch(g).unwrap();
    trap(g).unwrap();
    // Policies: 0 or 1 only, checked before the device.
    let bad = args(&[(16, 0x1234), (20, 2)], 32);
    assert_eq!(d.call(nr::SET_MEMORY_POLICY, &bad), Err(libc::EINVAL));
    // APE1: 64 KiB granular, below 2^47; size 0 disables it.
    policy(g, 0, 0).unwrap();
    policy(g, 0x7fff_0000_0000, 0x1_0000_0000).unwrap();
    assert_eq!(policy(g, 0x7fff_0000_1000, 0x1_0000), Err(libc::EINVAL));
    assert_eq!(policy(g, 0x7fff_0000_0000, 0x1_8000), Err(libc::EINVAL));
    assert_eq!(policy(g, 0x7fff_ffff_0000, 0x2_0000), Err(libc::EINVAL));

    // GET_TILE_CONFIG: GFX9 has no tile tables; counts are clipped to
    // amdgpu's 32 and 16 and that many zero words are copied out.
    let mut tiles = vec![0xffu32; 40];
    let mut macros = vec![0xffu32; 20];
    let t = d
        .call(
            nr::GET_TILE_CONFIG,
            &args(
                &[
                    (0, tiles.as_mut_ptr() as u64),
                    (8, macros.as_mut_ptr() as u64),
                    (16, 40),
                    (20, 20),
                    (24, g),
                ],
                40,
            ),
        )
        .unwrap();
    assert_eq!((u32_at(&t, 16), u32_at(&t, 20)), (32, 16));
    assert_ne!(u32_at(&t, 28), 0, "gb_addr_config");
    assert_eq!((u32_at(&t, 32), u32_at(&t, 36)), (0, 0));
    assert!(tiles[..32].iter().all(|&v| v == 0) && tiles[32] == 0xff);
    assert!(macros[..16].iter().all(|&v| v == 0) && macros[16] == 0xff);
    let bad = args(&[(0, 8), (16, 1), (24, g)], 40);
    let e = d.call(nr::GET_TILE_CONFIG, &bad);
    assert_eq!(e, Err(libc::EFAULT));
    assert_eq!(
        d.call(nr::GET_TILE_CONFIG, &args(&[(24, 0x1234)], 40)),
        Err(libc::EINVAL)
    );

    // The old apertures ioctl: one entry per device, the rest zero.
    let ap = d.call(nr::GET_PROCESS_APERTURES, &[0u8; 400]).unwrap();
    assert_eq!(u32_at(&ap, 392), 1);
    assert_eq!(u32_at(&ap, 48), d.gpu_id);
    assert!(ap[56..392].iter().all(|&b| b == 0));

    // Queue extras on a compute queue.
    let q = queue_args(d.gpu_id, queue_type::COMPUTE_AQL, 256);
    let c = d.call(nr::CREATE_QUEUE, &q).unwrap();
    // Rings below KFD_MIN_QUEUE_RING_SIZE are raised to it.
    assert_eq!(u32_at(&c, 32), 1024);
    let qid = u32_at(&c, 52) as u64;
    // CU mask: a multiple of 32 bits, not 0; unknown queue: EFAULT.
    let mask = [0xffff_ffffu32; 4];
    let cu = |id: u64, n: u64, ptr: u64| {
        d.call(nr::SET_CU_MASK, &args(&[(0, id), (4, n), (8, ptr)], 16))
    };
    cu(qid, 128, mask.as_ptr() as u64).unwrap();
    assert_eq!(cu(qid, 100, mask.as_ptr() as u64), Err(libc::EINVAL));
    assert_eq!(cu(qid, 0, mask.as_ptr() as u64), Err(libc::EINVAL));
    assert_eq!(cu(qid, 64, 8), Err(libc::EFAULT));
    assert_eq!(cu(77, 64, mask.as_ptr() as u64), Err(libc::EFAULT));
    // Wave state: an active queue has none (EINVAL), nor has an SDMA
    // queue, active or not; unknown queue: EFAULT. Suspended (0 %), a
    // queue without a save area reports its MQD's zeros: the header
    // written at the address, no control stack; a bad address: EFAULT.
    let mut header = [0xffu8; 16];
    let ws = |id: u64, at: u64| d.call(nr::GET_QUEUE_WAVE_STATE, &args(&[(0, at), (16, id)], 24));
    let at = header.as_mut_ptr() as u64;
    assert_eq!(ws(qid, at), Err(libc::EINVAL));
    assert_eq!(ws(77, at), Err(libc::EFAULT));
    let suspend = |id: u64| {
        let upd = args(&[(0, RING_VA), (8, id), (12, 4096), (16, 0), (20, 7)], 24);
        d.call(nr::UPDATE_QUEUE, &upd).unwrap();
    };
    let sq = d
        .call(
            nr::CREATE_QUEUE,
            &queue_args(d.gpu_id, queue_type::SDMA, 256),
        )
        .unwrap();
    let sdma = u32_at(&sq, 52) as u64;
    assert_eq!(ws(sdma, at), Err(libc::EINVAL));
    suspend(sdma);
    assert_eq!(ws(sdma, at), Err(libc::EINVAL));
    d.call(nr::DESTROY_QUEUE, &args(&[(0, sdma)], 8)).unwrap();
    suspend(qid);
    assert_eq!(ws(qid, 8), Err(libc::EFAULT));
    let w = ws(qid, at).unwrap();
    assert_eq!((u32_at(&w, 8), u32_at(&w, 12)), (0, 0));
    assert_eq!(header, [0; 16]);
    // GWS: one queue per process and GPU.
    let gws = |id: u64, n: u64| d.call(nr::ALLOC_QUEUE_GWS, &args(&[(0, id), (4, n)], 16));
    let c2 = d.call(nr::CREATE_QUEUE, &q).unwrap();
    let qid2 = u32_at(&c2, 52) as u64;
    assert_eq!(gws(77, 1), Err(libc::EINVAL));
    assert_eq!(gws(qid, 0), Err(libc::EINVAL));
    gws(qid, 1).unwrap();
    assert_eq!(gws(qid2, 1), Err(libc::EBUSY));
    gws(qid, 0).unwrap();
    gws(qid2, 1).unwrap();
    // Destroying the holder gives the GWS back.
    d.call(nr::DESTROY_QUEUE, &args(&[(0, qid2)], 8)).unwrap();
    gws(qid, 1).unwrap();

    // dma-bufs: a closed fd is EBADF, a file that is no dma-buf EINVAL
    // (the emulator's own: own_dmabufs_are_described_and_imported).
    d.fds.insert(950, kfd);
    for n in [nr::GET_DMABUF_INFO, nr::IMPORT_DMABUF] {
        let (fd_off, len) = if n == nr::GET_DMABUF_INFO {
            (28, 32)
        } else {
            (20, 24)
        };
        assert_eq!(d.call(n, &args(&[(fd_off, 951)], len)), Err(libc::EBADF));
        assert_eq!(d.call(n, &args(&[(fd_off, 950)], len)), Err(libc::EINVAL));
    }
    // SMI events: unknown GPU EINVAL; the anon fd itself is a known gap.
    assert_eq!(
        d.call(nr::SMI_EVENTS, &args(&[(0, 0x1234)], 8)),
        Err(libc::EINVAL)
    );
    assert_eq!(
        d.call(nr::SMI_EVENTS, &args(&[(0, g)], 8)),
        Err(libc::EOPNOTSUPP)
    );
    // The signal page BO stays until the process goes (EPERM).
    let (sh, _) = d.alloc(SIG_VA, 32768, alloc::GTT, 0).unwrap();
    d.call(nr::CREATE_EVENT, &args(&[(0, sh), (16, 1)], 32))
        .unwrap();
    assert_eq!(
        d.call(nr::FREE_MEMORY_OF_GPU, &sh.to_le_bytes()),
        Err(libc::EPERM)
    );
}

// SAFETY (for the helpers below): p points into a live test mapping of at
// least off+8 bytes.
unsafe fn wr64(p: *mut u8, off: usize, v: u64) {
    // SAFETY: see above.
    unsafe { std::ptr::write_volatile(p.wrapping_add(off) as *mut u64, v) }
}
unsafe fn rd64(p: *mut u8, off: usize) -> u64 {
    // SAFETY: see above.
    unsafe { std::ptr::read_volatile(p.wrapping_add(off) as *const u64) }
}

/// The emulated GPU clock: CLOCK_MONOTONIC_RAW in nanoseconds (what
/// GET_CLOCK_COUNTERS reports as `gpu_clock_counter`).
fn gpu_clock() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_RAW, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// An AQL compute queue the way ROCr lays it out: the ring, an
/// `amd_queue_t` (write pointer at 56, read pointer at 128,
/// `queue_inactive_signal` at 192) and `amd_signal_t`s (value at 8, event
/// mailbox at 16, event id at 24) in GTT BOs, one interrupt event.
#[test]
fn aql_barriers_run_and_a_bad_dispatch_stops_the_queue() {
    const AQ_VA: u64 = 0x1001_0000;
    const SIGS_VA: u64 = 0x1002_0000;
    let d = Dev::new("");
    d.setup();
    let map = |va, size, flags| {
        let (h, off) = d.alloc(va, size, flags, 0).unwrap();
        // The CP reaches only BOs mapped on its GPU.
        d.map_gpu(h);
        (
            h,
            d.map_node(NodeKind::Render { minor: d.minor }, off, size as usize),
        )
    };
    let (_, ring) = map(RING_VA, 4096, alloc::GTT);
    let (_, aq) = map(AQ_VA, 4096, alloc::GTT);
    let (_, sigs) = map(SIGS_VA, 4096, alloc::GTT);
    let (sig_h, page) = map(SIG_VA, 32768, alloc::GTT);
    let ev = d
        .call(nr::CREATE_EVENT, &args(&[(0, sig_h), (16, 1)], 32))
        .unwrap();
    let event = u32_at(&ev, 24);
    let mailbox = SIG_VA + u32_at(&ev, 28) as u64 * 8;
    // Signals: 0 a dependency, 1 a completion, 2 the queue's inactive
    // signal; 1 and 2 raise the event.
    let sig = |i: u64| SIGS_VA + 64 * i;
    // SAFETY: all offsets below lie inside the 4 KiB mappings.
    unsafe {
        for i in 0..4 {
            wr64(sigs, 64 * i + 8, if i == 2 { 0 } else { 1 });
        }
        for i in [1, 2] {
            wr64(sigs, 64 * i + 16, mailbox);
            wr32(sigs, 64 * i + 24, event);
        }
        wr64(aq, 192, sig(2));
        for i in 0..64 {
            wr32(ring, i * 64, 1); // INVALID, as ROCr fills a new ring
        }
    }
    let q = d
        .call(
            nr::CREATE_QUEUE,
            &model::queue_args(
                d.gpu_id,
                queue_type::COMPUTE_AQL,
                (RING_VA, 4096),
                (AQ_VA + 56, AQ_VA + 128),
                None,
            ),
        )
        .unwrap();
    let doorbell = map_doorbell(&d.emu, u64_at(&q, 24));
    // Publishes packet `i` (its header last) and rings the doorbell.
    let submit = |i: usize, header: u32, deps: &[u64], completion: u64| {
        // SAFETY: packet i of the 64-packet ring; the aq and doorbell maps.
        unsafe {
            for (j, dep) in deps.iter().enumerate() {
                wr64(ring, i * 64 + 8 + 8 * j, *dep);
            }
            wr64(ring, i * 64 + 56, completion);
            wr64(aq, 56, i as u64 + 1);
            wr32(ring, i * 64, header);
            wr64(doorbell, 0, i as u64);
        }
    };
    let wait = || {
        let (wa, _evs) = wait_args(&[event], false, 3000);
        u32_at(&d.call(nr::WAIT_EVENTS, &wa).unwrap(), 20)
    };
    let rptr = || {
        // SAFETY: the read pointer inside the aq mapping.
        unsafe { rd64(aq, 128) }
    };

    // BARRIER_AND on signal 0: waits while it is not 0.
    submit(0, 3 | 1 << 8, &[0, sig(0)], sig(1));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(rptr(), 0, "the barrier ran with its dependency pending");
    // SAFETY: see above.
    unsafe { wr64(sigs, 8, 0) };
    assert_eq!(wait(), 0, "the completion signal's event");
    // SAFETY: see above.
    unsafe {
        assert_eq!(rd64(sigs, 64 + 8), 0, "completion signal decremented");
        assert_eq!(
            rd64(page, (mailbox - SIG_VA) as usize),
            u64::MAX,
            "slot re-armed"
        );
        assert_eq!(rd32(ring, 0) & 0xff, 1, "the slot is INVALID again");
    }
    assert_eq!(rptr(), 1);
    // SAFETY: see above.
    unsafe {
        assert_eq!(
            (rd64(sigs, 64 + 32), rd64(sigs, 64 + 40)),
            (0, 0),
            "no timestamps without profiling"
        );
    }
    // BARRIER_OR with no dependency completes at once; the queue now asks
    // for timestamps (amd_queue_t queue_properties bit 3, at 180).
    // SAFETY: see above.
    unsafe {
        wr64(sigs, 64 + 8, 1);
        wr32(aq, 180, 1 << 3);
    }
    let before = gpu_clock();
    submit(1, 5, &[], sig(1));
    assert_eq!(wait(), 0);
    assert_eq!(rptr(), 2);
    // SAFETY: see above.
    let (start, end) = unsafe { (rd64(sigs, 64 + 32), rd64(sigs, 64 + 40)) };
    assert!(
        before <= start && start <= end && end <= gpu_clock(),
        "start {start} and end {end} stamped from the GPU clock after {before}"
    );

    // A kernel dispatch of no work-items: the queue stops at it with the
    // CP's "invalid dimension" error on its inactive signal.
    submit(2, 2, &[], sig(3));
    assert_eq!(wait(), 0, "the inactive signal's event");
    // SAFETY: see above.
    unsafe {
        assert_eq!(rd64(sigs, 2 * 64 + 8), 0x2);
        assert_eq!(
            rd64(sigs, 3 * 64 + 8),
            1,
            "the dispatch's completion untouched"
        );
    }
    assert_eq!(rptr(), 2, "the read pointer stays at the dispatch");
    // Nothing after it runs.
    // SAFETY: see above.
    unsafe { wr64(sigs, 64 + 8, 1) };
    submit(3, 5, &[], sig(1));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(rptr(), 2);
    // SAFETY: see above.
    assert_eq!(unsafe { rd64(sigs, 64 + 8) }, 1);
}

/// An SVM request on `pages` pages from `base`: op 0 SET_ATTR, 1 GET_ATTR.
fn svm_args(base: u64, first: u64, pages: u64, op: u32, attrs: &[(u32, u32)]) -> Vec<u8> {
    let mut a = a64(&[(0, base + first * 4096), (8, pages * 4096)], 24);
    a[16..20].copy_from_slice(&op.to_le_bytes());
    a[20..24].copy_from_slice(&(attrs.len() as u32).to_le_bytes());
    for (t, v) in attrs {
        a.extend_from_slice(&t.to_le_bytes());
        a.extend_from_slice(&v.to_le_bytes());
    }
    a
}

fn svm_attrs(out: &[u8]) -> Vec<(u32, u32)> {
    (24..out.len())
        .step_by(8)
        .map(|o| (u32_at(out, o), u32_at(out, o + 4)))
        .collect()
}

// KFD_IOCTL_SVM_ATTR_* and locations.
const PREFERRED: u32 = 0;
const PREFETCH: u32 = 1;
const ACCESS: u32 = 2;
const IN_PLACE: u32 = 3;
const NO_ACCESS: u32 = 4;
const SET_FLAGS: u32 = 5;
const CLR_FLAGS: u32 = 6;
const GRANULARITY: u32 = 7;
const UNDEFINED: u32 = u32::MAX;

/// Anonymous memory of the test process, `pages` pages.
fn anon(pages: usize) -> u64 {
    // SAFETY: a fresh private anonymous mapping, never freed by the test
    // except through munmap calls on parts of it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            pages * 4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p as u64
}

#[test]
fn svm_attributes_split_merge_and_refuse_like_kfd() {
    let d = Dev::new("");
    d.setup();
    let g = d.gpu_id;
    let base = anon(16);
    let set = |first, pages, attrs: &[(u32, u32)]| {
        d.call(nr::SVM, &svm_args(base, first, pages, 0, attrs))
    };
    let get = |first, pages, attrs: &[(u32, u32)]| {
        d.call(nr::SVM, &svm_args(base, first, pages, 1, attrs))
            .map(|o| svm_attrs(&o))
    };
    let all = [
        (PREFERRED, 0),
        (PREFETCH, 0),
        (ACCESS, g),
        (SET_FLAGS, 0),
        (CLR_FLAGS, 0),
        (GRANULARITY, 0),
    ];
    // No range yet: the defaults (flags HOST_ACCESS | COHERENT, 2^9 pages,
    // no access without XNACK).
    assert_eq!(
        get(0, 16, &all).unwrap(),
        [
            (PREFERRED, UNDEFINED),
            (PREFETCH, UNDEFINED),
            (NO_ACCESS, g),
            (SET_FLAGS, 3),
            (CLR_FLAGS, !3),
            (GRANULARITY, 9)
        ]
    );
    set(
        0,
        8,
        &[
            (PREFERRED, g),
            (ACCESS, g),
            (SET_FLAGS, 0x10),
            (GRANULARITY, 0x50),
        ],
    )
    .unwrap();
    assert_eq!(
        get(0, 8, &all).unwrap(),
        [
            (PREFERRED, g),
            (PREFETCH, UNDEFINED),
            (ACCESS, g),
            (SET_FLAGS, 0x13),
            (CLR_FLAGS, !0x13),
            (GRANULARITY, 0x3f)
        ]
    );
    // Pages without a range do not count.
    assert_eq!(get(0, 16, &[(PREFERRED, 0)]).unwrap(), [(PREFERRED, g)]);
    // A second range overlapping the first: it is split, the new part
    // gets defaults plus the attributes; where they differ, GET answers
    // undefined / the intersection.
    set(4, 8, &[(PREFERRED, 0), (IN_PLACE, g), (CLR_FLAGS, 1)]).unwrap();
    assert_eq!(
        get(0, 4, &[(PREFERRED, 0), (ACCESS, g)]).unwrap(),
        [(PREFERRED, g), (ACCESS, g)]
    );
    assert_eq!(
        get(
            4,
            8,
            &[(PREFERRED, 0), (ACCESS, g), (SET_FLAGS, 0), (CLR_FLAGS, 0)]
        )
        .unwrap(),
        [
            (PREFERRED, 0),
            (IN_PLACE, g),
            (SET_FLAGS, 2),
            (CLR_FLAGS, !0x12)
        ]
    );
    assert_eq!(
        get(0, 12, &[(PREFERRED, 0), (ACCESS, g), (SET_FLAGS, 0)]).unwrap(),
        [(PREFERRED, UNDEFINED), (NO_ACCESS, g), (SET_FLAGS, 2)]
    );
    // KFD's refusals: an unknown GPU or attribute (EINVAL); GET of a type
    // it cannot answer; memory that is not mapped (EFAULT); memory a BO
    // mapped to the GPU covers (EADDRINUSE); an unknown op.
    assert_eq!(set(0, 1, &[(ACCESS, 0x1234)]), Err(libc::EINVAL));
    assert_eq!(set(0, 1, &[(PREFETCH, UNDEFINED)]), Err(libc::EINVAL));
    assert_eq!(set(0, 1, &[(9, 0)]), Err(libc::EINVAL));
    assert_eq!(get(0, 1, &[(NO_ACCESS, g)]), Err(libc::EINVAL));
    assert_eq!(get(0, 1, &[(ACCESS, 0x1234)]), Err(libc::EINVAL));
    // A hole: page 11 of the test's own mapping goes.
    // SAFETY: the pages are the test's own mapping, unused by Rust code.
    let r = unsafe { libc::munmap((base + 11 * 4096) as *mut _, 4096) };
    assert_eq!(r, 0);
    assert_eq!(set(10, 3, &[(PREFERRED, 0)]), Err(libc::EFAULT));
    let (h, _) = d
        .alloc(base + 14 * 4096, 8192, alloc::USERPTR, base + 14 * 4096)
        .unwrap();
    let ids = [g];
    let mut m = a64(&[(0, h), (8, ids.as_ptr() as u64)], 24);
    m[16..20].copy_from_slice(&1u32.to_le_bytes());
    d.call(nr::MAP_MEMORY_TO_GPU, &m).unwrap();
    assert_eq!(set(12, 4, &[(PREFERRED, 0)]), Err(libc::EADDRINUSE));
    assert_eq!(
        d.call(nr::SVM, &svm_args(base, 0, 1, 7, &[])),
        Err(libc::EINVAL)
    );
    // A BO cannot be allocated where an SVM range is.
    assert_eq!(
        d.alloc(base + 4096, 4096, alloc::USERPTR, base + 4096),
        Err(libc::EADDRINUSE)
    );
    // Unmapping memory ends the ranges there, as KFD's notifier does.
    // SAFETY: pages 2..11 of the test's own mapping, unused by Rust code.
    let r = unsafe { libc::munmap((base + 2 * 4096) as *mut _, 9 * 4096) };
    assert_eq!(r, 0);
    assert_eq!(set(0, 4, &[(PREFERRED, 0)]), Err(libc::EFAULT));
    d.alloc(base + 4096 * 4, 4096, alloc::GTT, 0).unwrap();
    assert_eq!(get(0, 2, &[(PREFERRED, 0)]).unwrap(), [(PREFERRED, g)]);
}

#[test]
fn svm_ranges_survive_checkpoint_and_resume() {
    let d = Dev::new("");
    let (kfd, _render) = d.setup();
    let g = d.gpu_id;
    let base = anon(8);
    d.call(
        nr::SVM,
        &svm_args(
            base,
            2,
            4,
            0,
            &[(PREFERRED, g), (IN_PLACE, g), (CLR_FLAGS, 2)],
        ),
    )
    .unwrap();
    let (psize, nd, nb, no) = process_info(&d);
    assert_eq!((nd, nb, no), (1, 0, 1));
    // Process and device records, then one SVM record: header and
    // 4 + 1 attributes.
    assert_eq!(psize, 8 + 8 + 24 + 5 * 8);
    let mut devs = vec![0u8; 16];
    let mut bos = vec![0u8; 48];
    let mut blob = vec![0u8; psize as usize];
    d.call(
        nr::CRIU_OP,
        &criu(
            criu_op::CHECKPOINT,
            devs.as_mut_ptr() as u64,
            bos.as_mut_ptr() as u64,
            blob.as_mut_ptr() as u64,
            psize,
            nd,
            nb,
            no,
            0,
        ),
    )
    .unwrap();
    let r = &blob[16..];
    assert_eq!(u32_at(r, 0), 2, "object type SVM range");
    assert_eq!((u64_at(r, 8), u64_at(r, 16)), (base / 4096 + 2, 4), "pages");
    let attrs: Vec<(u32, u32)> = (0..5)
        .map(|i| (u32_at(r, 24 + 8 * i), u32_at(r, 28 + 8 * i)))
        .collect();
    assert_eq!(
        attrs,
        [
            (PREFERRED, g),
            (PREFETCH, UNDEFINED),
            (SET_FLAGS, 1),
            (GRANULARITY, 9),
            (IN_PLACE, g)
        ]
    );
    d.reopen_as_restored(kfd);
    devs[8..12].copy_from_slice(&950u32.to_le_bytes());
    d.call(
        nr::CRIU_OP,
        &criu(
            criu_op::RESTORE,
            devs.as_mut_ptr() as u64,
            0,
            blob.as_ptr() as u64,
            psize,
            nd,
            0,
            no,
            0,
        ),
    )
    .unwrap();
    // Until RESUME the range is not there.
    let q = [(PREFERRED, 0), (ACCESS, g), (SET_FLAGS, 0)];
    let got = svm_attrs(&d.call(nr::SVM, &svm_args(base, 2, 4, 1, &q)).unwrap());
    assert_eq!(
        got,
        [(PREFERRED, UNDEFINED), (NO_ACCESS, g), (SET_FLAGS, 3)]
    );
    d.call(
        nr::CRIU_OP,
        &criu(criu_op::RESUME, 0, 0, 0, 0, 0, 0, 0, std::process::id()),
    )
    .unwrap();
    let got = svm_attrs(&d.call(nr::SVM, &svm_args(base, 2, 4, 1, &q)).unwrap());
    assert_eq!(got, [(PREFERRED, g), (IN_PLACE, g), (SET_FLAGS, 1)]);
    assert_eq!(
        svm_attrs(
            &d.call(nr::SVM, &svm_args(base, 0, 2, 1, &[(PREFERRED, 0)]))
                .unwrap()
        ),
        [(PREFERRED, UNDEFINED)],
        "the restored range has its own extent"
    );
}

/// A GPU process of its own for the multi-process CRIU tests.  A `sleep`
/// child lends its pid (RESUME finds a KFD process by pid); this thread
/// issues the ioctls, so the memory they point at is ours.  The doorbell
/// and events pages are mapped at the offsets CREATE_QUEUE and
/// CREATE_EVENT gave, as a client maps them; after a restore the mappings
/// are kept (CRIU restores such VMAs at their recorded offsets).
struct GpuProc {
    child: std::process::Child,
    c: Caller,
    kfd: u64,
    /// The render fd number of the current open (in the `Table`).
    fd: i32,
    ring: *mut u8,
    ctl: *mut u8,
    doorbell_off: u64,
    doorbell: *mut u8,
    events_off: u64,
    events: *mut u8,
    event: u32,
    wptr: u64,
}

impl Drop for GpuProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What CHECKPOINT wrote for one process.
struct Image {
    devs: Vec<u8>,
    bos: Vec<u8>,
    blob: Vec<u8>,
    nb: u32,
    no: u32,
    /// The queue's write pointer at the checkpoint.
    wptr: u64,
}

impl Image {
    /// Zeroed buffers for the PROCESS_INFO sizes `info_sizes` read.
    fn sized((psize, nd, nb, no): (u64, u32, u32, u32), wptr: u64) -> Image {
        Image {
            devs: vec![0u8; 16 * nd as usize],
            bos: vec![0u8; 48 * nb as usize],
            blob: vec![0u8; psize as usize],
            nb,
            no,
            wptr,
        }
    }

    /// CHECKPOINT's arguments: write into this image's buffers.
    fn checkpoint_args(&mut self) -> Vec<u8> {
        let (psize, nd) = (self.blob.len() as u64, (self.devs.len() / 16) as u32);
        criu(
            criu_op::CHECKPOINT,
            self.devs.as_mut_ptr() as u64,
            self.bos.as_mut_ptr() as u64,
            self.blob.as_mut_ptr() as u64,
            psize,
            nd,
            self.nb,
            self.no,
            0,
        )
    }

    /// RESTORE's arguments for one device: this image's device and BO
    /// records, with `blob` for private data (its own, if not given).
    fn restore_args(&mut self, blob: Option<&[u8]>) -> Vec<u8> {
        let blob = blob.unwrap_or(&self.blob);
        let (pp, psize) = (blob.as_ptr() as u64, blob.len() as u64);
        criu(
            criu_op::RESTORE,
            self.devs.as_mut_ptr() as u64,
            self.bos.as_mut_ptr() as u64,
            pp,
            psize,
            1,
            self.nb,
            self.no,
            0,
        )
    }
}

impl GpuProc {
    /// Opens /dev/kfd and the render node (render fd number `fd`) as a new
    /// process, acquires the VM.
    fn spawn(d: &Dev, fd: i32) -> GpuProc {
        let child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let c = Caller {
            tid: me().tid,
            tgid: child.id(),
        };
        let mut p = GpuProc {
            child,
            c,
            kfd: 0,
            fd,
            ring: std::ptr::null_mut(),
            ctl: std::ptr::null_mut(),
            doorbell_off: 0,
            doorbell: std::ptr::null_mut(),
            events_off: 0,
            events: std::ptr::null_mut(),
            event: 0,
            wptr: 0,
        };
        p.reopen(d, fd, true);
        p
    }

    /// Fresh /dev/kfd and render opens of this process on `d` (the old
    /// KFD context, if any, is gone); `acquire`: ACQUIRE_VM as well.
    fn reopen(&mut self, d: &Dev, fd: i32, acquire: bool) {
        self.kfd = d.emu.open(&NodeKind::Kfd, &self.c).unwrap();
        let render = d
            .emu
            .open(&NodeKind::Render { minor: d.minor }, &self.c)
            .unwrap();
        d.fds.insert(fd, render);
        self.fd = fd;
        if acquire {
            self.call(
                d,
                nr::ACQUIRE_VM,
                &args(&[(0, fd as u64), (4, d.gpu_id as u64)], 8),
            )
            .unwrap();
        }
    }

    fn call(&self, d: &Dev, n: u32, input: &[u8]) -> Result<Vec<u8>, i32> {
        d.call_fh(self.kfd, &self.c, n, input)
    }

    fn alloc(&self, d: &Dev, va: u64, size: u64) -> u64 {
        let a = args(
            &[
                (0, va),
                (8, size),
                (32, d.gpu_id as u64),
                (36, alloc::GTT as u64),
            ],
            40,
        );
        let out = self.call(d, nr::ALLOC_MEMORY_OF_GPU, &a).unwrap();
        self.call(
            d,
            nr::MAP_MEMORY_TO_GPU,
            &map_args(u64_at(&out, 16), &[d.gpu_id]),
        )
        .unwrap();
        u64_at(&out, 24)
    }

    /// A signal event on the events page of /dev/kfd (no page BO, as on
    /// an APU): returns (event id, events page offset).
    fn signal_event(&self, d: &Dev) -> Result<(u32, u64), i32> {
        let ev = self.call(d, nr::CREATE_EVENT, &args(&[(16, 1)], 32))?;
        Ok((u32_at(&ev, 24), u64_at(&ev, 0)))
    }

    /// Ring, control words, an SDMA queue and a signal event.
    fn setup_gpu(&mut self, d: &Dev) {
        let render = NodeKind::Render { minor: d.minor };
        let ring_off = self.alloc(d, RING_VA, RING_SIZE);
        self.ring = d.map_node(render, ring_off, RING_SIZE as usize);
        let ctl_off = self.alloc(d, CTL_VA, 4096);
        self.ctl = d.map_node(render, ctl_off, 4096);
        let (event, events_off) = self.signal_event(d).unwrap();
        self.event = event;
        self.events_off = events_off;
        self.events = d.map_node(
            NodeKind::Kfd,
            events_off,
            (kfd_emu::device::uapi::SIGNAL_PAGE_SIZE) as usize,
        );
        let q = self
            .call(
                d,
                nr::CREATE_QUEUE,
                &queue_args(d.gpu_id, queue_type::SDMA, RING_SIZE),
            )
            .unwrap();
        self.doorbell_off = u64_at(&q, 24);
        self.doorbell = self.map_doorbell(d);
    }

    /// This process' doorbell, mapped from `d`'s /dev/kfd at the offset
    /// CREATE_QUEUE gave.
    fn map_doorbell(&self, d: &Dev) -> *mut u8 {
        map_doorbell(&d.emu, self.doorbell_off)
    }

    /// The doorbell's value, read through the process' own mapping.
    fn doorbell_value(&self) -> u64 {
        // SAFETY: an 8-byte doorbell inside a live 8 KiB mapping.
        unsafe { std::ptr::read_volatile(self.doorbell as *const u64) }
    }

    /// The event's slot on the events page, through the process' mapping.
    fn event_slot(&self) -> *mut u64 {
        self.events.wrapping_add(self.event as usize * 8) as *mut u64
    }

    /// One round of GPU work through the process' own mappings: the CPU
    /// marks the event's slot, the queue writes `v` to the control words
    /// and raises the TRAP interrupt; the event must fire.
    fn run(&mut self, d: &Dev, v: u32) {
        // SAFETY: the event's 8-byte slot inside the live events mapping.
        unsafe { std::ptr::write_volatile(self.event_slot(), 1) };
        for dw in [5, lo(CTL_VA + 16), hi(CTL_VA + 16), v, 6, 0] {
            // SAFETY: the ring mapping is RING_SIZE bytes.
            unsafe { wr32(self.ring, (self.wptr % RING_SIZE) as usize, dw) };
            self.wptr += 4;
        }
        // SAFETY: as in `doorbell_value`.
        unsafe { std::ptr::write_volatile(self.doorbell as *mut u64, self.wptr) };
        let t = Instant::now();
        // SAFETY: ctl maps 4096 bytes.
        while unsafe { rd32(self.ctl, 16) } != v && t.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: as above.
        let got = unsafe { rd32(self.ctl, 16) };
        assert_eq!(got, v, "process {}: the queue did not run", self.c.tgid);
        let (wa, _e) = wait_args(&[self.event], false, 2000);
        let out = self.call(d, nr::WAIT_EVENTS, &wa).unwrap();
        assert_eq!(
            u32_at(&out, 20),
            0,
            "process {}: the event did not fire",
            self.c.tgid
        );
    }

    fn checkpoint(&self, d: &Dev) -> Image {
        let info = self
            .call(
                d,
                nr::CRIU_OP,
                &criu(criu_op::PROCESS_INFO, 0, 0, 0, 0, 0, 0, 0, 0),
            )
            .unwrap();
        let mut img = Image::sized(info_sizes(&info), self.wptr);
        self.call(d, nr::CRIU_OP, &img.checkpoint_args()).unwrap();
        img
    }

    /// RESTORE of `img` (with `blob` instead of its own, if given).
    fn restore(&self, d: &Dev, img: &mut Image, blob: Option<&[u8]>) -> Result<(), i32> {
        img.devs[8..12].copy_from_slice(&(self.fd as u32).to_le_bytes());
        self.call(d, nr::CRIU_OP, &img.restore_args(blob))
            .map(|_| ())
    }

    /// After a RESTORE of `img`: maps the restored ring and control BOs
    /// (their contents are not needed), RESUMEs, and checks what the
    /// process sees through the /dev/kfd mappings it kept: its own
    /// doorbell (the wptr of the checkpoint) and an unsignaled slot.
    fn resume(&mut self, d: &Dev, img: &Image) {
        let render = NodeKind::Render { minor: d.minor };
        for b in img.bos.chunks(48) {
            let (va, size, ro) = (u64_at(b, 0), u64_at(b, 8), u64_at(b, 24));
            if va == RING_VA {
                self.ring = d.map_node(render, ro, size as usize);
            } else if va == CTL_VA {
                self.ctl = d.map_node(render, ro, size as usize);
            }
        }
        self.call(
            d,
            nr::CRIU_OP,
            &criu(criu_op::RESUME, 0, 0, 0, 0, 0, 0, 0, self.c.tgid),
        )
        .unwrap();
        assert_eq!(
            self.doorbell_value(),
            self.wptr,
            "process {}: its doorbell mapping shows another queue",
            self.c.tgid
        );
        // SAFETY: the event's slot inside the live events mapping.
        let slot = unsafe { std::ptr::read_volatile(self.event_slot()) };
        assert_eq!(slot, u64::MAX, "process {}: events page", self.c.tgid);
    }
}

/// Two processes are restored in the other order than they opened
/// /dev/kfd first, so their fresh opens get other slots than before.  The
/// doorbell and events page offsets each one had before the checkpoint
/// must still reach its own queue and events, as with KFD, which finds
/// the process at mmap time.
#[test]
fn criu_restore_in_swapped_order_keeps_kfd_offsets() {
    let d = Dev::new("");
    let mut a = GpuProc::spawn(&d, 901);
    let mut b = GpuProc::spawn(&d, 902);
    a.setup_gpu(&d);
    b.setup_gpu(&d);
    assert_ne!(
        a.doorbell_off & !8191,
        b.doorbell_off & !8191,
        "two processes share doorbells"
    );
    assert_ne!(a.events_off, b.events_off);
    // Different doorbell values, so that a mix-up shows.
    a.run(&d, 1);
    b.run(&d, 2);
    b.run(&d, 3);
    let mut img_a = a.checkpoint(&d);
    let mut img_b = b.checkpoint(&d);
    d.emu.release(a.kfd);
    d.emu.release(b.kfd);

    // The blobs record the slots (the device record's reserved word):
    // A opened first and got slot 1, B slot 2.
    assert_eq!(
        u64_at(&img_a.blob, 8),
        u64::from_le_bytes(*b"\x01\0\0\0KESL")
    );
    assert_eq!(
        u64_at(&img_b.blob, 8),
        u64::from_le_bytes(*b"\x02\0\0\0KESL")
    );

    // B opens first (slot 3, the next one), A next (slot 4).
    b.reopen(&d, 912, false);
    a.reopen(&d, 911, false);

    // Each takes its old slot back.
    b.restore(&d, &mut img_b, None).unwrap();
    a.restore(&d, &mut img_a, None).unwrap();
    b.resume(&d, &img_b);
    a.resume(&d, &img_a);
    for i in 0..3 {
        a.run(&d, 10 + i);
        b.run(&d, 20 + i);
    }
    // New offsets name the same slots as before the checkpoint.
    let (_, off) = a.signal_event(&d).unwrap();
    assert_eq!(off, a.events_off);
    let (_, off) = b.signal_event(&d).unwrap();
    assert_eq!(off, b.events_off);
    // A second checkpoint records the same slots.
    assert_eq!(a.checkpoint(&d).blob[8..16], img_a.blob[8..16]);
    assert_eq!(b.checkpoint(&d).blob[8..16], img_b.blob[8..16]);
}

/// A restore needs the slot its image recorded.  On another emulator (a
/// restore on another host, where slots are numbered anew) a process
/// that uses that slot (it handed out offsets of it) makes the restore
/// fail with EBUSY, changing nothing; once the slot is free the restore
/// works.  A process that has only opened /dev/kfd gives its slot up (the
/// two swap).  A restoring process that already handed out offsets of its
/// own slot cannot move.
#[test]
fn criu_restore_slot_in_use_is_ebusy() {
    let d = Dev::new("");
    let mut a = GpuProc::spawn(&d, 921);
    a.setup_gpu(&d);
    a.run(&d, 1);
    let mut img = a.checkpoint(&d);
    d.emu.release(a.kfd);

    // Another host: X takes slot 1, A's, and uses it (an events page
    // offset); A gets slot 2.
    let d2 = Dev::new("");
    let x = GpuProc::spawn(&d2, 922);
    x.signal_event(&d2).unwrap();
    a.reopen(&d2, 923, false);
    // Not a slot word of ours: refused as a damaged blob.
    let mut bad = img.blob.clone();
    bad[8..16].copy_from_slice(&0x1234_5678_0000_0001u64.to_le_bytes());
    assert_eq!(a.restore(&d2, &mut img, Some(&bad)), Err(libc::EINVAL));
    assert_eq!(a.restore(&d2, &mut img, None), Err(libc::EBUSY));
    assert_eq!(a.restore(&d2, &mut img, None), Err(libc::EBUSY));
    // Slot 1 is free again: the refused restores left A as it was.
    d2.emu.release(x.kfd);
    a.restore(&d2, &mut img, None).unwrap();
    // CRIU maps the recorded offsets on this host's /dev/kfd.
    let remap = |a: &mut GpuProc, d: &Dev| {
        a.doorbell = a.map_doorbell(d);
        a.events = d.map_node(
            NodeKind::Kfd,
            a.events_off,
            kfd_emu::device::uapi::SIGNAL_PAGE_SIZE as usize,
        );
    };
    remap(&mut a, &d2);
    a.resume(&d2, &img);
    a.run(&d2, 2);

    // A third host: Y has only opened /dev/kfd (slot 1); A opens next
    // (slot 2) and at first hands out an events page offset of it.
    let d3 = Dev::new("");
    let y = GpuProc::spawn(&d3, 931);
    a.reopen(&d3, 932, false);
    let (e0, _) = a.signal_event(&d3).unwrap();
    a.signal_event(&d3).unwrap();
    a.call(&d3, nr::DESTROY_EVENT, &e0.to_le_bytes()).unwrap();
    assert_eq!(a.restore(&d3, &mut img, None), Err(libc::EBUSY));
    // A fresh context of A (slot 3) swaps with Y.  (The process is the
    // image's again: its queue's write pointer too.)
    d3.emu.release(a.kfd);
    a.reopen(&d3, 933, false);
    a.restore(&d3, &mut img, None).unwrap();
    a.wptr = img.wptr;
    remap(&mut a, &d3);
    a.resume(&d3, &img);
    a.run(&d3, 3);
    // Y moved to slot 3.
    let (_, y_events) = y.signal_event(&d3).unwrap();
    assert_eq!(y_events - a.events_off, 2 << 44);
}

/// SVM memory is in a GPU's VM where a range gives that GPU access (KFD
/// maps such ranges on the GPUs of their access bitmaps); with XNACK on,
/// all the process' memory is (a fault there makes KFD map it).  The SDMA
/// engine reaches it in place; other memory faults.
#[test]
fn sdma_reaches_svm_memory() {
    let d = Dev::new("");
    d.setup();
    let mut r = Rig::new(&d);
    // SAFETY: src maps 65536 bytes.
    unsafe { wr32(r.src, 0, 0x5151_0001) };
    let mem = anon(2);
    d.call(nr::SVM, &svm_args(mem, 0, 1, 0, &[(ACCESS, d.gpu_id)]))
        .unwrap();
    r.push(&pkt::copy_linear(SRC_VA, mem + 8, 4));
    r.run();
    // SAFETY: inside the 2-page anonymous mapping.
    assert_eq!(unsafe { rd32(mem as *mut u8, 8) }, 0x5151_0001);
    // The second page has no range: a fault.
    let at = r.wptr;
    r.push(&pkt::copy_linear(SRC_VA, mem + 4096, 4));
    r.run_stops_at(at);

    // XNACK on (gfx90a switches per process; before any queue): any
    // mapped memory is reachable.
    let d = Dev::new("[gpu_defaults]\ngfx_target_version = 90010\n");
    d.setup();
    d.call(nr::SET_XNACK_MODE, &1i32.to_le_bytes()).unwrap();
    let mut r = Rig::new(&d);
    // SAFETY: src maps 65536 bytes.
    unsafe { wr32(r.src, 0, 0x5151_0002) };
    let mem = anon(1);
    r.push(&pkt::copy_linear(SRC_VA, mem + 16, 4));
    r.run();
    // SAFETY: inside the anonymous page.
    assert_eq!(unsafe { rd32(mem as *mut u8, 16) }, 0x5151_0002);
}

/// `kfd-emu supervise`'s path without seccomp: the installer stands in
/// for SECCOMP_IOCTL_NOTIF_ADDFD (it dups into this process).
struct Install(std::cell::Cell<bool>);

impl kfd_emu::device::FdInstaller for Install {
    fn install(&self, file: std::os::fd::BorrowedFd<'_>, cloexec: bool) -> Result<u32, i32> {
        if !self.0.get() {
            // The caller was interrupted: ADDFD finds no notification.
            return Err(libc::ENOENT);
        }
        assert!(!cloexec, "KFD's dma-buf fds are not close-on-exec");
        // SAFETY: F_DUPFD on a live descriptor; the new fd is the test's.
        let fd = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD, 0) };
        assert!(fd >= 0);
        Ok(fd as u32)
    }
}

#[test]
fn supervised_checkpoint_hands_out_dmabufs_and_replays_an_interrupted_answer() {
    let d = Dev::new("");
    let (kfd, render) = d.setup();
    let (_, vram_off) = d.alloc(0x1000_0000, 2 << 20, alloc::VRAM, 0).unwrap();
    let user = d.user_mem(0x2000_0000, 4096);
    assert!(!user.is_null());
    let (psize, nd, nb, no) = process_info(&d);
    assert_eq!(nb, 2);
    let mut devs = vec![0u8; 16];
    let mut bos = vec![0u8; 48 * nb as usize];
    let mut blob = vec![0u8; psize as usize];
    let args = criu(
        criu_op::CHECKPOINT,
        devs.as_mut_ptr() as u64,
        bos.as_mut_ptr() as u64,
        blob.as_mut_ptr() as u64,
        psize,
        nd,
        nb,
        no,
        0,
    );
    let mut a = args.clone();
    let cmd = kfd_abi::ioctl::AMDKFD_IOC_CRIU_OP;
    let inst = Install(std::cell::Cell::new(false));
    // The op runs, but the answer cannot be handed out.
    assert_eq!(
        d.emu
            .fd_ioctl(kfd, &me(), cmd, a.as_mut_ptr() as u64, &inst),
        Some(Err(libc::ENOENT))
    );
    // A CHECKPOINT now would be EINVAL (not paused): the restarted call
    // gets the first one's answer instead.
    d.call(nr::CRIU_OP, &criu(criu_op::UNPAUSE, 0, 0, 0, 0, 0, 0, 0, 0))
        .unwrap();
    inst.0.set(true);
    assert_eq!(
        d.emu
            .fd_ioctl(kfd, &me(), cmd, a.as_mut_ptr() as u64, &inst),
        Some(Ok(()))
    );
    assert_eq!(
        d.emu
            .fd_ioctl(kfd, &me(), cmd, a.as_mut_ptr() as u64, &inst),
        Some(Err(libc::EINVAL)),
        "replayed once"
    );
    let mut vram_fd = None;
    for i in 0..nb as usize {
        let b = &bos[i * 48..(i + 1) * 48];
        let fd = u32_at(b, 40);
        if u32_at(b, 36) & alloc::VRAM != 0 {
            assert_eq!(u64_at(b, 16), vram_off);
            // SAFETY: lseek on the fd installed for us.
            let end = unsafe { libc::lseek(fd as i32, 0, libc::SEEK_END) };
            assert_eq!(end, 2 << 20, "a dma-buf of the BO's size");
            vram_fd = Some(fd as i32);
        } else {
            assert_eq!(fd, 0xffff_ffff, "no dma-buf for a USERPTR BO");
        }
    }
    let vram_fd = vram_fd.expect("the VRAM bucket");
    // Another CRIU op is the kernel's (through FUSE): not served here.
    let mut p = criu(criu_op::PROCESS_INFO, 0, 0, 0, 0, 0, 0, 0, 0);
    assert_eq!(
        d.emu
            .fd_ioctl(kfd, &me(), cmd, p.as_mut_ptr() as u64, &inst),
        None
    );
    // The dma-buf imports into the render node, once per file.
    let prime = |fd: i32| {
        let mut b = vec![0u8; 12];
        b[8..].copy_from_slice(&fd.to_le_bytes());
        let (tx, rx) = channel();
        d.emu.ioctl(
            render,
            &me(),
            kfd_abi::ioctl::DRM_IOCTL_PRIME_FD_TO_HANDLE,
            0,
            &b,
            12,
            Box::new(Tx(Mutex::new(tx))),
        );
        rx.recv_timeout(Duration::from_secs(5))
            .expect("no reply")
            .map(|o| u32_at(&o, 0))
    };
    // That checkpoint is over (UNPAUSE), but its dma-buf is still one
    // while the BO lives, as KFD's (a pre-dump imports it then).
    assert_eq!(prime(vram_fd), Ok(1));
    assert_eq!(prime(0), Err(libc::EINVAL), "not a dma-buf");
    // SAFETY: closing the fd installed for us.
    unsafe { libc::close(vram_fd) };
    // A new checkpoint: its dma-buf imports, once per file (the handle of
    // the import above), and holds the BO's bytes (a snapshot).
    d.call(
        nr::CRIU_OP,
        &criu(criu_op::PROCESS_INFO, 0, 0, 0, 0, 0, 0, 0, 0),
    )
    .unwrap();
    let vram = d.map_node(NodeKind::Render { minor: d.minor }, vram_off, 2 << 20);
    // SAFETY: inside the BO's 2 MiB mapping.
    unsafe { vram.add(4096).write_bytes(0x77, 4096) };
    let mut a = args.clone();
    assert_eq!(
        d.emu
            .fd_ioctl(kfd, &me(), cmd, a.as_mut_ptr() as u64, &inst),
        Some(Ok(()))
    );
    let fd = (0..nb as usize)
        .map(|i| &bos[i * 48..(i + 1) * 48])
        .find(|b| u32_at(b, 36) & alloc::VRAM != 0)
        .map(|b| u32_at(b, 40) as i32)
        .unwrap();
    assert_eq!(prime(fd), Ok(1));
    assert_eq!(prime(fd), Ok(1));
    let mut page = vec![0u8; 4096];
    // SAFETY: reading the dma-buf's second page at its offset.
    let n = unsafe { libc::pread(fd, page.as_mut_ptr().cast(), 4096, 4096) };
    assert_eq!(n, 4096);
    assert!(page.iter().all(|&b| b == 0x77), "the snapshot holds the BO");
    d.call(nr::CRIU_OP, &criu(criu_op::UNPAUSE, 0, 0, 0, 0, 0, 0, 0, 0))
        .unwrap();
    assert_eq!(prime(fd), Ok(1), "still a dma-buf after UNPAUSE");
    // SAFETY: closing the fd installed for us.
    unsafe { libc::close(fd) };
}

/// Kernels for the shader engine, assembled with llvm-mc-15 for gfx908 and
/// gfx90a (the words are the same on both).  Each kernel object is a
/// kernel descriptor whose code starts 256 bytes after it; its only user
/// SGPRs are the kernarg pointer (s[0:1]), then the workgroup id X (s2).
/// Kernarg: {out: u64, flag: u32}; the kernels that hold on the flag
/// first add 1 per work-item to the arrival counter at kernarg + 256
/// (`ARRIVED`), so a test sees when their waves run.
const K_IDS: &[u32] = &[
    0xc0060100, 0x00000000, // s_load_dwordx2 s[4:5], s[0:1], 0x0
    0xd1fd0001, 0x04010e02, // v_lshl_add_u32 v1, s2, 7, v0
    0x24040282, // v_lshlrev_b32_e32 v2, 2, v1
    0xbf8a0000, // s_barrier
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xdc708000, 0x00040102, // global_store_dword v2, v1, s[4:5]
    0xbf810000, // s_endpgm
];
const K_FAULT: &[u32] = &[
    0x7e020280, // v_mov_b32_e32 v1, 0
    0xdc708000, 0x007f0000, // global_store_dword v[0:1], v0, off
    0xbf810000, // s_endpgm
];
const K_TRAP: &[u32] = &[
    0xbf920002, // s_trap 2
    0xbf810000, // s_endpgm
];
const K_SPIN: &[u32] = &[
    0xc00300c0, 0x00000008, // s_load_dword s3, s[0:1], 0x8 glc
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xbf8e0001, // s_sleep 1
    0xbf068003, // s_cmp_eq_u32 s3, 0
    0xbf85fffa, // s_cbranch_scc1 -6 (the load)
    0xbf810000, // s_endpgm
];
/// Each work-item puts its global id into the LDS, arrives, spins until
/// the flag is set, meets its workgroup at a barrier, and stores what the
/// LDS holds for it (its id again) to out[id]: registers, the LDS and a
/// barrier that live through an eviction.  Workgroups of 128, 512 bytes of
/// LDS.
const K_HOLD: &[u32] = &[
    0xc0060100, 0x00000000, // s_load_dwordx2 s[4:5], s[0:1], 0x0
    0xd1fd0001, 0x04010e02, // v_lshl_add_u32 v1, s2, 7, v0
    0x24040082, // v_lshlrev_b32_e32 v2, 2, v0
    0xd81a0000, 0x00000102, // ds_write_b32 v2, v1
    0x7e080280, // v_mov_b32_e32 v4, 0
    0x7e0a0281, // v_mov_b32_e32 v5, 1
    0xdd088100, 0x00000504, // global_atomic_add v4, v5, s[0:1] offset:256
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xc00300c0, 0x00000008, // s_load_dword s3, s[0:1], 0x8 glc
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xbf8e0001, // s_sleep 1
    0xbf068003, // s_cmp_eq_u32 s3, 0
    0xbf85fffa, // s_cbranch_scc1 -6 (the load)
    0xbf8a0000, // s_barrier
    0xd86c0000, 0x03000002, // ds_read_b32 v3, v2
    0x24040282, // v_lshlrev_b32_e32 v2, 2, v1
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xdc708000, 0x00040302, // global_store_dword v2, v3, s[4:5]
    0xbf810000, // s_endpgm
];
/// Each wave (workgroups of one wave) stores its workgroup id at its
/// scratch address (flat scratch init plus its scratch wave offset) through
/// a global store, spins until the flag is set, reads it back and stores
/// {what it read, the address} to out[16 * group]: where the CP put each
/// wave's scratch, and that it held through an eviction.  User SGPRs
/// kernarg (s[0:1]) and flat scratch init (s[2:3]); workgroup id X in s4,
/// the scratch wave offset in s5.
const K_SCRATCH: &[u32] = &[
    0xc0060180, 0x00000000, // s_load_dwordx2 s[6:7], s[0:1], 0x0
    0x80080502, // s_add_u32 s8, s2, s5
    0x82098003, // s_addc_u32 s9, s3, 0
    0x7e020204, // v_mov_b32_e32 v1, s4
    0x7e040280, // v_mov_b32_e32 v2, 0
    0xdc708000, 0x00080102, // global_store_dword v2, v1, s[8:9]
    0x7e0a0281, // v_mov_b32_e32 v5, 1
    0xdd088100, 0x00000502, // global_atomic_add v2, v5, s[0:1] offset:256
    0xbf8c0070, // s_waitcnt vmcnt(0) lgkmcnt(0)
    0xc0030280, 0x00000008, // s_load_dword s10, s[0:1], 0x8 glc
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xbf8e0001, // s_sleep 1
    0xbf06800a, // s_cmp_eq_u32 s10, 0
    0xbf85fffa, // s_cbranch_scc1 -6 (the load)
    0xdc518000, 0x03080002, // global_load_dword v3, v2, s[8:9] glc
    0x8e0b8404, // s_lshl_b32 s11, s4, 4
    0x80060b06, // s_add_u32 s6, s6, s11
    0x82078007, // s_addc_u32 s7, s7, 0
    0x7e080208, // v_mov_b32_e32 v4, s8
    0x7e0a0209, // v_mov_b32_e32 v5, s9
    0xbf8c0f70, // s_waitcnt vmcnt(0)
    0xdc788000, 0x00060302, // global_store_dwordx3 v2, v[3:5], s[6:7]
    0xbf810000, // s_endpgm
];
/// Workgroups of one wave: each stores its HW_ID (where the SPI placed
/// it) to out[group], then arrives (so an arrived wave's HW_ID is there),
/// spins until the flag is set, and stores
/// HW_ID again to out[512 + group] (after an eviction: where its restore
/// placed it).
const K_HWID: &[u32] = &[
    0xc0060100, 0x00000000, // s_load_dwordx2 s[4:5], s[0:1], 0x0
    0xb886f804, // s_getreg_b32 s6, hwreg(HW_REG_HW_ID)
    0x7e040202, // v_mov_b32_e32 v2, s2
    0x24040482, // v_lshlrev_b32_e32 v2, 2, v2
    0x7e060206, // v_mov_b32_e32 v3, s6
    0x7e080280, // v_mov_b32_e32 v4, 0
    0x7e0a0281, // v_mov_b32_e32 v5, 1
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xdc708000, 0x00040302, // global_store_dword v2, v3, s[4:5]
    0xbf8c0f70, // s_waitcnt vmcnt(0)
    0xdd088100, 0x00000504, // global_atomic_add v4, v5, s[0:1] offset:256
    0xc00300c0, 0x00000008, // s_load_dword s3, s[0:1], 0x8 glc
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xbf8e0001, // s_sleep 1
    0xbf068003, // s_cmp_eq_u32 s3, 0
    0xbf85fffa, // s_cbranch_scc1 -6 (the load)
    0xb886f804, // s_getreg_b32 s6, hwreg(HW_REG_HW_ID)
    0x7e060206, // v_mov_b32_e32 v3, s6
    0xdc708800, 0x00040302, // global_store_dword v2, v3, s[4:5] offset:2048
    0xbf810000, // s_endpgm
];
const K_ILLEGAL: &[u32] = &[
    0xf0000f00,
    0x00000000, // image_load v[0:3], v0, s[0:7] dmask:0xf (graphics: no compute encoding)
    0xbf810000, // s_endpgm
];

/// Two AQL queues with their rings, `amd_queue_t`s and signals in GTT
/// (as in `aql_barriers_run_and_a_bad_dispatch_stops_the_queue`), the
/// kernels above at `CODE_VA + 0x400 * k`, kernarg at `DATA_VA` and an
/// output buffer at `DATA_VA + 0x1000`.
struct Shader {
    d: Dev,
    /// The XCCs of the GPU: each queue's save area holds one slice each.
    xccs: u64,
    rings: [*mut u8; 2],
    aqs: [*mut u8; 2],
    sigs: *mut u8,
    data: *mut u8,
    doorbells: [*mut u8; 2],
    event: u32,
}

/// The queues' context save areas (GTT BOs at `CTX_VA + CTX_SIZE * q`):
/// a one-page control stack, then the wave area; smaller than MI100's, as
/// KFD before 1.17 accepts (the rig with save areas runs at 1.11).
const CTX_VA: u64 = 0x5100_0000;
const CTX_CTL: u64 = 0x1000;
const CTX_SIZE: u64 = 0x4_0000;

/// A profile override for KFD 1.11 (ROCm 5.2's).
const KFD_1_11: &str = "kfd_minor_version = 11\n";

const CODE_VA: u64 = 0x5000_0000;
const DATA_VA: u64 = 0x5001_0000;
const SHADER_SIGS_VA: u64 = 0x5002_0000;
const KERNARG: u64 = DATA_VA;
const OUT: u64 = DATA_VA + 0x1000;
/// The arrival counter's offset in the data BO (kernarg + 256).
const ARRIVED: usize = 0x100;

impl Shader {
    fn new() -> Shader {
        Shader::on(Dev::new(""), false)
    }

    /// The rig on `d`; `ctx`: the queues have context save areas.
    fn on(d: Dev, ctx: bool) -> Shader {
        Shader::on_xccs(d, ctx, 1)
    }

    /// The rig on `d`, a GPU of `xccs` XCCs: a queue's context save area
    /// is `xccs` slices of `CTX_SIZE` (KFD's per-XCC size), as libhsakmt
    /// allocates it.
    fn on_xccs(d: Dev, ctx: bool, xccs: u64) -> Shader {
        d.setup();
        let map = |va, size| {
            let (h, off) = d.alloc(va, size, alloc::GTT, 0).unwrap();
            d.map_gpu(h);
            let p = d.map_node(NodeKind::Render { minor: d.minor }, off, size as usize);
            (h, p)
        };
        let rings = [map(RING_VA, 4096).1, map(RING_VA + 0x1000, 4096).1];
        let aqs = [map(AQ_BASE, 4096).1, map(AQ_BASE + 0x1000, 4096).1];
        let (_, code) = map(CODE_VA, 0x2000);
        let (_, data) = map(DATA_VA, 0x2000);
        let (_, sigs) = map(SHADER_SIGS_VA, 4096);
        let (sig_h, _) = map(SIG_VA, 32768);
        let ev = d
            .call(nr::CREATE_EVENT, &args(&[(0, sig_h), (16, 1)], 32))
            .unwrap();
        let event = u32_at(&ev, 24);
        let mailbox = SIG_VA + u32_at(&ev, 28) as u64 * 8;
        let kernels = [
            K_IDS, K_FAULT, K_TRAP, K_SPIN, K_ILLEGAL, K_HOLD, K_SCRATCH, K_HWID,
        ];
        // SAFETY: every offset below lies inside the mappings just made.
        unsafe {
            for (k, words) in kernels.iter().enumerate() {
                let kd = 0x400 * k;
                let scratch = words.as_ptr() == K_SCRATCH.as_ptr();
                wr64(code, kd + 16, 256); // entry offset
                if scratch {
                    // 4 user SGPRs, workgroup id X, the scratch wave offset;
                    // kernarg segment ptr and flat scratch init.
                    wr32(code, kd + 52, 1 | 4 << 1 | 1 << 7);
                    wr32(code, kd + 56, 1 << 3 | 1 << 5);
                } else {
                    wr32(code, kd + 52, 2 << 1 | 1 << 7); // 2 user SGPRs, workgroup id X
                    wr32(code, kd + 56, 1 << 3); // kernarg segment ptr
                }
                for (i, w) in words.iter().enumerate() {
                    wr32(code, kd + 256 + 4 * i, *w);
                }
            }
            // Signals 0, 1: completions of queue 0, 1; 2, 3: their inactive signals.
            for i in 0..4 {
                wr64(sigs, 64 * i + 16, mailbox);
                wr32(sigs, 64 * i + 24, event);
            }
            for (q, aq) in aqs.iter().enumerate() {
                wr64(*aq, 192, Self::sig(2 + q as u64));
                for i in 0..64 {
                    wr32(rings[q], i * 64, 1);
                }
            }
            wr64(data, 0, OUT);
        }
        let mut doorbells = [std::ptr::null_mut(); 2];
        for (q, db) in doorbells.iter_mut().enumerate() {
            let base = AQ_BASE + 0x1000 * q as u64;
            let area = CTX_VA + CTX_SIZE * xccs * q as u64;
            if ctx {
                map(area, CTX_SIZE * xccs);
            }
            let a = model::queue_args(
                d.gpu_id,
                queue_type::COMPUTE_AQL,
                (RING_VA + 0x1000 * q as u64, 4096),
                (base + 56, base + 128),
                ctx.then_some((area, CTX_SIZE, CTX_CTL)),
            );
            let out = d.call(nr::CREATE_QUEUE, &a).unwrap();
            *db = map_doorbell(&d.emu, u64_at(&out, 24));
        }
        Shader {
            d,
            xccs,
            rings,
            aqs,
            sigs,
            data,
            doorbells,
            event,
        }
    }

    fn sig(i: u64) -> u64 {
        SHADER_SIGS_VA + 64 * i
    }

    fn sig_value(&self, i: usize) -> i64 {
        // SAFETY: signal i inside the signal mapping.
        unsafe { rd64(self.sigs, 64 * i + 8) as i64 }
    }

    /// Dispatches kernel `k` on queue `q` as packet `i`: `grid` work-items
    /// in workgroups of `group`, completion signal `q` set to 1 first.
    fn dispatch(&self, q: usize, i: usize, k: usize, grid: u32, group: u16) {
        self.dispatch_lds(q, i, k, grid, group, 0);
    }

    /// As `dispatch`, with `lds` bytes of group segment.
    fn dispatch_lds(&self, q: usize, i: usize, k: usize, grid: u32, group: u16, lds: u32) {
        self.dispatch_private(q, i, k, grid, group, (0, lds));
    }

    /// As `dispatch`, with `private` and `lds` bytes of private and group
    /// segment.
    fn dispatch_private(
        &self,
        q: usize,
        i: usize,
        k: usize,
        grid: u32,
        group: u16,
        (private, lds): (u32, u32),
    ) {
        let r = self.rings[q];
        // SAFETY: packet i of queue q's 64-packet ring, its amd_queue_t and
        // doorbell, signal q.
        unsafe {
            wr64(self.sigs, 64 * q + 8, 1);
            wr32(r, i * 64 + 4, group as u32 | 1 << 16);
            wr32(r, i * 64 + 8, 1);
            wr32(r, i * 64 + 12, grid);
            wr32(r, i * 64 + 16, 1);
            wr32(r, i * 64 + 20, 1);
            wr64(r, i * 64 + 24, private as u64 | (lds as u64) << 32); // private, group sizes
            wr64(r, i * 64 + 32, CODE_VA + 0x400 * k as u64);
            wr64(r, i * 64 + 40, KERNARG);
            wr64(r, i * 64 + 56, Self::sig(q as u64));
            wr64(self.aqs[q], 56, i as u64 + 1);
            wr32(r, i * 64, 2 | 1 << 16); // KERNEL_DISPATCH, 1 dimension
            wr64(self.doorbells[q], 0, i as u64);
        }
    }

    /// Waits until signal `i` is `want` (events wake the wait).
    fn wait_for(&self, i: usize, want: i64) -> bool {
        let end = Instant::now() + Duration::from_secs(20);
        while self.sig_value(i) != want {
            if Instant::now() > end {
                return false;
            }
            let (wa, _evs) = wait_args(&[self.event], false, 100);
            let _ = self.d.call(nr::WAIT_EVENTS, &wa);
        }
        true
    }

    /// Waits until `n` work-items of the held kernels arrived at their
    /// spin (their waves run), per the counter they add to.
    fn wait_arrived(&self, n: u32) -> bool {
        let end = Instant::now() + Duration::from_secs(20);
        // SAFETY: the counter word inside the data mapping.
        while unsafe { rd32(self.data, ARRIVED) } < n {
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    fn out(&self, i: usize) -> u32 {
        // SAFETY: dword i of the output buffer (i < 1024).
        unsafe { rd32(self.data, 0x1000 + 4 * i) }
    }

    /// After a checkpoint's pause of a dispatch held on its flag: UNPAUSE,
    /// the flag set, and the dispatch on queue 0 completes with work-item
    /// i's id (through its LDS) in output word i, for `items` work-items.
    fn unpause_and_finish(&self, items: usize) {
        self.d
            .call(nr::CRIU_OP, &criu(criu_op::UNPAUSE, 0, 0, 0, 0, 0, 0, 0, 0))
            .unwrap();
        // SAFETY: the kernarg's flag.
        unsafe { wr32(self.data, 8, 1) };
        assert!(self.wait_for(0, 0), "the resumed dispatch completes");
        for i in 0..items {
            assert_eq!(self.out(i), i as u32, "work-item {i}'s id through its LDS");
        }
    }
}

const AQ_BASE: u64 = 0x5003_0000;

#[test]
fn a_dispatch_runs_its_waves_with_ids_barriers_and_a_partial_workgroup() {
    let s = Shader::new();
    // 300 work-items in workgroups of 128: two full workgroups of two
    // waves, one of 44 work-items in one partial wave.
    s.dispatch(0, 0, 0, 300, 128);
    assert!(s.wait_for(0, 0), "the dispatch's completion signal");
    for i in 0..300 {
        assert_eq!(s.out(i), i as u32, "work-item {i}'s global id");
    }
    assert_eq!(s.out(300), 0, "no work-item past the grid");
    // SAFETY: the ring and read pointer of queue 0.
    unsafe {
        assert_eq!(rd32(s.rings[0], 0) & 0xff, 1, "the packet slot is INVALID");
        assert_eq!(rd64(s.aqs[0], 128), 1, "the read pointer moved on");
    }
}

#[test]
fn a_spinning_wave_stalls_no_other_queue() {
    let s = Shader::new();
    s.dispatch(0, 0, 3, 64, 64);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(s.sig_value(0), 1, "the spinner ended with its flag clear");
    s.dispatch(1, 0, 0, 256, 128);
    assert!(s.wait_for(1, 0), "queue 1's dispatch beside the spinner");
    assert_eq!(s.out(255), 255);
    assert_eq!(s.sig_value(0), 1, "the spinner is still spinning");
    // Its queue has no context save area for its waves: the checkpoint is
    // refused, and the process runs on.
    let info = criu(criu_op::PROCESS_INFO, 0, 0, 0, 0, 0, 0, 0, 0);
    assert_eq!(s.d.call(nr::CRIU_OP, &info), Err(libc::EBUSY));
    // SAFETY: the kernarg's flag.
    unsafe { wr32(s.data, 8, 1) };
    assert!(s.wait_for(0, 0), "the spinner ends once the flag is set");
}

/// KFD's MMU notifier: when the process replaces a USERPTR BO's pages (a
/// new mapping over them) KFD evicts its queues, revalidates the BO onto
/// the new pages and restores the queues, so the next kernel writes the new
/// pages; when it takes them away (PROT_NONE) the revalidation fails and
/// the GPU's access faults (the queue stops at the packet).  kfd-emu
/// reaches USERPTR memory through the process' address space at every
/// access, so a kernel sees what KFD's revalidation would give it.
#[test]
fn a_userptr_bo_follows_the_pages_the_process_maps_there() {
    const UP_VA: u64 = 0x5300_0000;
    let s = Shader::new();
    let user = s.d.user_mem(UP_VA, 4096);
    let remap = |prot| {
        // SAFETY: replaces the USERPTR page this test mapped, which only
        // it and the emulator (through process_vm_*) use.
        let p = unsafe {
            libc::mmap(
                user.cast(),
                4096,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        assert_eq!(p, user.cast(), "the page replaced in place");
    };
    // SAFETY: the kernarg's out pointer.
    unsafe { wr64(s.data, 0, UP_VA) };
    s.dispatch(0, 0, 0, 128, 128);
    assert!(s.wait_for(0, 0), "the kernel on the first pages");
    // SAFETY: the USERPTR page.
    assert_eq!(unsafe { rd32(user, 4 * 127) }, 127);
    remap(libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: the USERPTR page, new.
    assert_eq!(unsafe { rd32(user, 4 * 127) }, 0, "a fresh page");
    s.dispatch(0, 1, 0, 128, 128);
    assert!(s.wait_for(0, 0), "the kernel on the new pages");
    // SAFETY: the USERPTR page.
    let v = unsafe { rd32(user, 4 * 127) };
    assert_eq!(v, 127, "written to the new page");
    remap(libc::PROT_NONE);
    s.dispatch(0, 2, 0, 128, 128);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.sig_value(0), 1, "the faulting dispatch did not complete");
    // SAFETY: queue 0's read pointer.
    assert_eq!(unsafe { rd64(s.aqs[0], 128) }, 2, "the queue stays at it");
}

#[test]
fn faults_traps_and_illegal_instructions_stop_the_queue_with_the_cps_errors() {
    let s = Shader::new();
    // A store to VA 0..63: a GPU page fault, reported on the process'
    // memory events; the queue stops, the completion signal untouched.
    s.dispatch(0, 0, 1, 64, 64);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.sig_value(0), 1, "the faulting dispatch did not complete");
    // SAFETY: queue 0's read pointer.
    assert_eq!(unsafe { rd64(s.aqs[0], 128) }, 0, "the queue stays at it");
    // s_trap: queue error 0x80000000 on the inactive signal.
    s.dispatch(1, 0, 2, 64, 64);
    assert!(s.wait_for(3, 0x8000_0000), "s_trap's queue error");
    assert_eq!(s.sig_value(1), 1);
    // An instruction the engine does not run (MIMG) on a fresh queue pair.
    let t = Shader::new();
    t.dispatch(0, 0, 4, 64, 64);
    assert!(
        t.wait_for(2, 0x4000_0000),
        "the illegal instruction's queue error"
    );
    // The emulator still runs dispatches.
    t.dispatch(1, 0, 0, 128, 128);
    assert!(t.wait_for(1, 0));
    assert_eq!(t.out(127), 127);
}

/// The BO buckets of an image: (GPU VA, size, mmap offset at the
/// checkpoint, restored offset, flags).
fn buckets(img: &Image) -> Vec<(u64, u64, u64, u64, u32)> {
    img.bos
        .chunks(48)
        .map(|b| {
            (
                u64_at(b, 0),
                u64_at(b, 8),
                u64_at(b, 16),
                u64_at(b, 24),
                u32_at(b, 36),
            )
        })
        .collect()
}

/// PROCESS_INFO and CHECKPOINT of the test process on `d` (through its
/// /dev/kfd open `fh`).
fn dump_me(d: &Dev, fh: u64) -> Image {
    let call = |a: &[u8]| d.call_fh(fh, &me(), nr::CRIU_OP, a);
    let info = call(&criu(criu_op::PROCESS_INFO, 0, 0, 0, 0, 0, 0, 0, 0)).unwrap();
    let mut img = Image::sized(info_sizes(&info), 0);
    call(&img.checkpoint_args()).unwrap();
    img
}

/// The test process on `d` dumped and restored, unchanged, on another
/// host (`restore_me`): its image, the new host and its /dev/kfd open there.
fn moved(d: &Dev) -> (Image, Dev, u64) {
    let fh = KFD_FH.with(|f| f.get());
    let mut img = dump_me(d, fh);
    let blob = img.blob.clone();
    let (d2, fh2, r) = restore_me(d, &mut img, &blob);
    r.unwrap();
    (img, d2, fh2)
}

/// Another host (other gpu_id and render minor): the test process opens
/// /dev/kfd and the render node there (fd 900) and RESTOREs `img` with
/// `blob`; on success copies every GTT BO's bytes from `d`, as CRIU does
/// before RESUME.  Returns the new host and the process' /dev/kfd open.
fn restore_me(d: &Dev, img: &mut Image, blob: &[u8]) -> (Dev, u64, Result<(), i32>) {
    restore_me_on(d, img, blob, "")
}

/// As `restore_me`, onto a GPU whose profile table adds `gpu` lines.
fn restore_me_on(d: &Dev, img: &mut Image, blob: &[u8], gpu: &str) -> (Dev, u64, Result<(), i32>) {
    let d2 = Dev::new(&format!(
        "{KFD_1_11}[[gpus]]\ngpu_id = 0x5151\ndrm_render_minor = 150\n{gpu}"
    ));
    assert_ne!(d2.gpu_id, d.gpu_id);
    let fh = d2.emu.open(&NodeKind::Kfd, &me()).unwrap();
    let render = d2
        .emu
        .open(&NodeKind::Render { minor: d2.minor }, &me())
        .unwrap();
    d2.fds.insert(900, render);
    img.devs[4..8].copy_from_slice(&d2.gpu_id.to_le_bytes());
    img.devs[8..12].copy_from_slice(&900u32.to_le_bytes());
    let a = img.restore_args(Some(blob));
    let r = d2.call_fh(fh, &me(), nr::CRIU_OP, &a).map(|_| ());
    if r.is_ok() {
        for (_, size, old, new, flags) in buckets(img) {
            if flags & alloc::GTT == 0 {
                continue;
            }
            let from = d.map_node(NodeKind::Render { minor: d.minor }, old, size as usize);
            let to = d2.map_node(NodeKind::Render { minor: d2.minor }, new, size as usize);
            // SAFETY: two live mappings of `size` bytes each.
            unsafe { std::ptr::copy_nonoverlapping(from, to, size as usize) };
        }
    }
    (d2, fh, r)
}

/// The restored process' view of the BO at `va` on host `d2`.
fn restored_bo(d2: &Dev, img: &Image, va: u64) -> *mut u8 {
    let (_, size, _, new, _) = buckets(img)
        .into_iter()
        .find(|b| b.0 == va)
        .expect("the BO is in the image");
    d2.map_node(NodeKind::Render { minor: d2.minor }, new, size as usize)
}

/// Polls a 64-bit signal value through a mapping until it is `want`.
fn poll_signal(sigs: *mut u8, i: usize, want: i64) -> bool {
    let end = Instant::now() + Duration::from_secs(20);
    // SAFETY: signal i inside the live signal mapping.
    while unsafe { rd64(sigs, 64 * i + 8) } as i64 != want {
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

/// A dispatch holding registers, LDS and a barrier is in flight on queue 0
/// of a rig with context save areas: 2 workgroups of 2 waves, every wave
/// spinning on the kernarg's flag.
fn held_dispatch() -> Shader {
    let s = Shader::on(Dev::new(KFD_1_11), true);
    s.dispatch_lds(0, 0, 5, 256, 128, 512);
    assert!(s.wait_arrived(256), "every work-item holds at its flag");
    assert_eq!(s.sig_value(0), 1, "the dispatch waits for its flag");
    s
}

/// PROCESS_INFO saves the waves of a dispatch in flight into the queue's
/// context save area (the wave area fills, its control stack comes back in
/// CHECKPOINT's queue record); UNPAUSE rebuilds them from there, and the
/// kernel finishes with every work-item's result.
#[test]
fn a_dispatch_in_flight_is_saved_at_process_info_and_runs_on_after_unpause() {
    let s = held_dispatch();
    let fh = KFD_FH.with(|f| f.get());
    let img = dump_me(&s.d, fh);
    let magic = gfx9::cwsr::stack::MAGIC.to_le_bytes();
    let at = img.blob.windows(4).position(|w| w == magic);
    assert!(at.is_some(), "the queue record holds a control stack");
    let area = s.d.map_node(
        NodeKind::Render { minor: s.d.minor },
        buckets(&img)
            .iter()
            .find(|b| b.0 == CTX_VA)
            .expect("the save area BO")
            .2,
        CTX_SIZE as usize,
    );
    // SAFETY: the save area's mapping of CTX_SIZE bytes.
    let wave_area = unsafe { std::slice::from_raw_parts(area.add(CTX_CTL as usize), 0x1000) };
    assert!(
        wave_area.iter().any(|&b| b != 0),
        "the wave area holds the waves"
    );
    s.unpause_and_finish(256);
}

/// GET_QUEUE_WAVE_STATE of queue 0 of `s` into a buffer as large as its
/// save area (`s.xccs` slices): the used sizes returned, and each XCC's
/// control stack, checked against the header KFD writes at its slice's
/// start (control stack below `CTX_CTL`, wave area above it).
fn wave_state_of(s: &Shader) -> ((u32, u32), Vec<gfx9::cwsr::ControlStack>) {
    let mut buf = vec![0u8; (CTX_SIZE * s.xccs) as usize];
    let a = args(&[(0, buf.as_mut_ptr() as u64), (16, 0)], 24);
    let w = s.d.call(nr::GET_QUEUE_WAVE_STATE, &a).unwrap();
    let stacks = (0..s.xccs as usize)
        .map(|x| {
            let slice = &buf[x * CTX_SIZE as usize..];
            let (off, len) = (u32_at(slice, 0), u32_at(slice, 4));
            let (wg, used) = (u32_at(slice, 8), u32_at(slice, 12));
            assert_eq!(off + len, CTX_CTL as u32, "XCC {x}: the stack ends there");
            assert_eq!(wg, CTX_CTL as u32 + used, "XCC {x}: the wave area's end");
            let stack = &slice[off as usize..CTX_CTL as usize];
            let stack = gfx9::cwsr::ControlStack::decode(gfx9::Target::Gfx908, stack).unwrap();
            assert_eq!(stack.wave_area_used(), used as u64, "XCC {x}'s wave blocks");
            if x == 0 {
                assert_eq!(
                    (u32_at(&w, 8), u32_at(&w, 12)),
                    (len, used),
                    "XCC 0's sizes"
                );
            }
            stack
        })
        .collect();
    ((u32_at(&w, 8), u32_at(&w, 12)), stacks)
}

/// A debugger's GET_QUEUE_WAVE_STATE on the queue whose dispatch in flight
/// PROCESS_INFO saved (an active queue has no wave state: EINVAL): the
/// used sizes match the waves saved, the control stack copied to the
/// caller's address decodes to its 4 waves, and after UNPAUSE the kernel
/// finishes with every work-item's result.
#[test]
fn get_queue_wave_state_reports_the_saved_waves_and_the_dispatch_runs_on() {
    let s = held_dispatch();
    let mut header = [0u8; 16];
    let a = args(&[(0, header.as_mut_ptr() as u64), (16, 0)], 24);
    assert_eq!(s.d.call(nr::GET_QUEUE_WAVE_STATE, &a), Err(libc::EINVAL));
    let info = criu(criu_op::PROCESS_INFO, 0, 0, 0, 0, 0, 0, 0, 0);
    s.d.call(nr::CRIU_OP, &info).unwrap();
    let ((ctl, used), stacks) = wave_state_of(&s);
    assert!(ctl > 0 && used > 0, "sizes {ctl}, {used}");
    assert_eq!(stacks[0].dispatches.len(), 1);
    let groups: Vec<u32> = stacks[0].dispatches[0]
        .waves
        .iter()
        .map(|w| w.workgroup)
        .collect();
    assert_eq!(groups, [0, 0, 1, 1], "2 workgroups of 2 waves");
    s.unpause_and_finish(256);
}

/// UPDATE_QUEUE of queue 0 of `s`: its ring (at the rig's place, `size`
/// bytes) and its share of the GPU.
fn update_queue0(s: &Shader, size: u32, percent: u32) -> Result<Vec<u8>, i32> {
    let a = args(
        &[
            (0, RING_VA),
            (8, 0),
            (12, size as u64),
            (16, percent as u64),
        ],
        24,
    );
    s.d.call(nr::UPDATE_QUEUE, &a)
}

/// UPDATE_QUEUE unmapping a queue with a kernel in flight (a share of 0, or
/// a ring of size 0 or base 0) preempts it with wavefront save, as KFD's
/// HWS unmaps it: the waves (registers, LDS, a barrier) go into the
/// queue's context save area (GET_QUEUE_WAVE_STATE shows them), none runs
/// while the queue is unmapped, and mapped again the queue rebuilds them
/// and the kernel finishes with every work-item's result.
#[test]
fn update_queue_unmapping_a_queue_saves_its_waves_and_mapping_it_resumes_them() {
    for unmap in ["percent 0", "ring base 0"] {
        let s = held_dispatch();
        if unmap == "percent 0" {
            update_queue0(&s, 4096, 0).unwrap();
        } else {
            let a = args(&[(0, 0), (8, 0), (12, 4096), (16, 100)], 24);
            s.d.call(nr::UPDATE_QUEUE, &a).unwrap();
        }
        let ((ctl, used), stacks) = wave_state_of(&s);
        assert!(ctl > 0 && used > 0, "{unmap}: sizes {ctl}, {used}");
        assert_eq!(
            stacks[0].dispatches[0].waves.len(),
            4,
            "{unmap}: 4 waves saved"
        );
        // SAFETY: the kernarg's flag.
        unsafe { wr32(s.data, 8, 1) };
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            s.sig_value(0),
            1,
            "{unmap}: no wave runs on the unmapped queue"
        );
        // Mapped again: the waves run on from where they were saved.
        update_queue0(&s, 4096, 100).unwrap();
        assert!(s.wait_for(0, 0), "{unmap}: the resumed dispatch completes");
        for i in 0..256 {
            assert_eq!(
                s.out(i),
                i as u32,
                "{unmap}: work-item {i}'s id through its LDS"
            );
        }
    }
}

/// A queue unmapped by UPDATE_QUEUE with its waves saved is checkpointed
/// with them (its control stack in its record) and, restored on another
/// host, stays unmapped until UPDATE_QUEUE maps it: then its kernel
/// finishes there.
#[test]
fn an_unmapped_queue_with_saved_waves_is_checkpointed_and_resumed_elsewhere() {
    let s = held_dispatch();
    update_queue0(&s, 4096, 0).unwrap();
    let (img, d2, fh2) = moved(&s.d);
    let magic = gfx9::cwsr::stack::MAGIC.to_le_bytes();
    assert!(
        img.blob.windows(4).any(|w| w == magic),
        "the queue record holds the control stack"
    );
    let (data, sigs) = (
        restored_bo(&d2, &img, DATA_VA),
        restored_bo(&d2, &img, SHADER_SIGS_VA),
    );
    let pid = std::process::id();
    let call = |n, a: &[u8]| d2.call_fh(fh2, &me(), n, a);
    call(
        nr::CRIU_OP,
        &criu(criu_op::RESUME, 0, 0, 0, 0, 0, 0, 0, pid),
    )
    .unwrap();
    // SAFETY: the restored kernarg's flag.
    unsafe { wr32(data, 8, 1) };
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: the restored completion signal.
    let completion = unsafe { rd64(sigs, 8) };
    assert_eq!(completion, 1, "the restored queue is still unmapped");
    let a = args(&[(0, RING_VA), (8, 0), (12, 4096), (16, 100)], 24);
    call(nr::UPDATE_QUEUE, &a).unwrap();
    assert!(poll_signal(sigs, 0, 0), "the restored dispatch completes");
    for i in 0..256 {
        // SAFETY: the restored output buffer.
        let v = unsafe { rd32(data, 0x1000 + 4 * i) };
        assert_eq!(v, i as u32, "work-item {i}");
    }
}

/// The dispatch checkpointed mid-flight is restored into a fresh emulator
/// (other gpu_id, other render minor) from the private data and the BOs'
/// bytes alone, and finishes there with every work-item's result.
#[test]
fn a_dispatch_in_flight_resumes_on_another_host() {
    let s = held_dispatch();
    let (img, d2, fh2) = moved(&s.d);
    let (data, sigs) = (
        restored_bo(&d2, &img, DATA_VA),
        restored_bo(&d2, &img, SHADER_SIGS_VA),
    );
    let pid = std::process::id();
    d2.call_fh(
        fh2,
        &me(),
        nr::CRIU_OP,
        &criu(criu_op::RESUME, 0, 0, 0, 0, 0, 0, 0, pid),
    )
    .unwrap();
    released_dispatch_completes(sigs, data, 256);
}

/// SET_CU_MASK on queue 0 of `s` (`words` of mask).
fn set_cu_mask(s: &Shader, words: &[u32]) -> Result<Vec<u8>, i32> {
    let n = 32 * words.len() as u64;
    let a = args(&[(0, 0), (4, n), (8, words.as_ptr() as u64)], 16);
    s.d.call(nr::SET_CU_MASK, &a)
}

/// HW_ID's (SE, SH, CU) and (SIMD, wave slot).
fn hw_id_cu(v: u32) -> ((u32, u32, u32), (u32, u32)) {
    (
        (v >> 13 & 7, v >> 12 & 1, v >> 8 & 0xf),
        (v >> 4 & 3, v & 0xf),
    )
}

/// K_HWID's `groups` one-wave workgroups on queue 0, held at the flag.
fn hwid_dispatch(s: &Shader, groups: u32) {
    s.dispatch(0, 0, 7, 64 * groups, 64);
}

/// The CU mask places the waves as the SPI does: on an MI100 (4 shader
/// engines, 10 wave slots per SIMD) a queue masked to one CU (bit 0: SE0
/// SH0 CU0) has at most that CU's 40 waves resident, each in its own SIMD
/// slot, and every wave of the kernel runs there; masked to two CUs (bits
/// 0 and 1: CU0 of SE0 and SE1) all 64 waves are resident at once, on
/// those two CUs only.  A queue without a mask spreads them wider.
#[test]
fn a_cu_mask_decides_where_and_how_many_waves_run() {
    let s = Shader::on(Dev::new(KFD_1_11), false);
    set_cu_mask(&s, &[1, 0, 0, 0]).unwrap();
    hwid_dispatch(&s, 64);
    assert!(s.wait_arrived(40 * 64), "one CU's 40 waves run");
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: the arrival counter inside the data mapping.
    let arrived = unsafe { rd32(s.data, ARRIVED) };
    assert_eq!(arrived, 40 * 64, "no 41st wave is resident on one CU");
    let first: std::collections::BTreeSet<_> = (0..64).map(|g| hw_id_cu(s.out(g))).collect();
    assert_eq!(first.len(), 40, "the resident waves have a slot each");
    assert!(first.iter().all(|(cu, _)| *cu == (0, 0, 0)), "{first:?}");
    // SAFETY: the kernarg's flag.
    unsafe { wr32(s.data, 8, 1) };
    assert!(s.wait_for(0, 0), "the kernel completes");
    for g in 0..64 {
        assert_eq!(
            hw_id_cu(s.out(g)).0,
            (0, 0, 0),
            "wave {g} ran on SE0 SH0 CU0"
        );
    }

    let s = Shader::on(Dev::new(KFD_1_11), false);
    set_cu_mask(&s, &[0b11]).unwrap();
    hwid_dispatch(&s, 64);
    assert!(s.wait_arrived(64 * 64), "two CUs hold all 64 waves");
    let ses: std::collections::BTreeSet<_> = (0..64).map(|g| hw_id_cu(s.out(g)).0).collect();
    assert_eq!(ses.into_iter().collect::<Vec<_>>(), [(0, 0, 0), (1, 0, 0)]);
    // SAFETY: the kernarg's flag.
    unsafe { wr32(s.data, 8, 1) };
    assert!(s.wait_for(0, 0), "the kernel completes");

    let s = Shader::on(Dev::new(KFD_1_11), false);
    hwid_dispatch(&s, 64);
    assert!(s.wait_arrived(64 * 64), "every CU: all 64 waves");
    let cus: std::collections::BTreeSet<_> = (0..64).map(|g| hw_id_cu(s.out(g)).0).collect();
    assert!(
        cus.len() > 2,
        "no mask: the waves spread over {} CUs",
        cus.len()
    );
    // SAFETY: the kernarg's flag.
    unsafe { wr32(s.data, 8, 1) };
    assert!(s.wait_for(0, 0), "the kernel completes");
}

/// A mask of no CU at all is KFD's to take (only a mask of no bits is
/// EINVAL): the queue's workgroups wait, as the hardware's queue hangs, and
/// a mask enabling a CU again lets the next dispatch run.
#[test]
fn a_cu_mask_of_no_cu_holds_the_queue_s_workgroups() {
    let s = Shader::new();
    assert_eq!(set_cu_mask(&s, &[]), Err(libc::EINVAL));
    set_cu_mask(&s, &[0, 0]).unwrap();
    // SAFETY: the kernarg's flag: the waves would not wait.
    unsafe { wr32(s.data, 8, 1) };
    hwid_dispatch(&s, 1);
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: the arrival counter inside the data mapping.
    assert_eq!(unsafe { rd32(s.data, ARRIVED) }, 0, "no wave ran");
    assert_eq!(s.sig_value(0), 1, "the dispatch waits");
}

/// The CU mask is the queue's across a checkpoint: a dispatch masked to
/// CU0 of SE1 is dumped in flight, restored on another host, and its
/// rebuilt waves run on CU0 of SE1 there too (HW_ID after the restore).
#[test]
fn a_restored_queue_keeps_its_cu_mask() {
    let s = Shader::on(Dev::new(KFD_1_11), true);
    set_cu_mask(&s, &[0b10]).unwrap();
    hwid_dispatch(&s, 8);
    assert!(s.wait_arrived(8 * 64), "the 8 waves hold at their flag");
    let (img, d2, fh2) = moved(&s.d);
    let (data, sigs) = (
        restored_bo(&d2, &img, DATA_VA),
        restored_bo(&d2, &img, SHADER_SIGS_VA),
    );
    let pid = std::process::id();
    let resume = criu(criu_op::RESUME, 0, 0, 0, 0, 0, 0, 0, pid);
    d2.call_fh(fh2, &me(), nr::CRIU_OP, &resume).unwrap();
    // SAFETY: the restored kernarg's flag.
    unsafe { wr32(data, 8, 1) };
    assert!(poll_signal(sigs, 0, 0), "the restored dispatch completes");
    for g in 0..8 {
        // SAFETY: the restored output buffer: HW_ID before and after.
        let (before, after) = unsafe { (rd32(data, 0x1000 + 4 * g), rd32(data, 0x1800 + 4 * g)) };
        assert_eq!(hw_id_cu(before).0, (1, 0, 0), "wave {g} before the dump");
        assert_eq!(hw_id_cu(after).0, (1, 0, 0), "wave {g} after the restore");
    }
}

/// On a GPU of 4 XCCs the mask's bits take turns over the XCCs (bit `i`
/// is XCC `i % 4`'s): bits 0 and 5 enable CU0 of SE0 on XCC 0 and CU0 of
/// SE1 on XCC 1 only, and XCC 2 and 3 have no CU, so the workgroups the
/// CP hands them wait; the waves of XCC 0 and 1 run where the mask says.
#[test]
fn on_4_xccs_the_cu_mask_is_split_over_the_xccs() {
    let d = Dev::new(&format!("{KFD_1_11}[[gpus]]\n{XCC4}"));
    let s = Shader::on_xccs(d, false, 4);
    set_cu_mask(&s, &[1 | 1 << 5]).unwrap();
    hwid_dispatch(&s, 2);
    assert!(s.wait_arrived(2 * 64), "workgroups 0 and 1 run");
    assert_eq!(hw_id_cu(s.out(0)).0, (0, 0, 0), "XCC 0: SE0 CU0");
    assert_eq!(hw_id_cu(s.out(1)).0, (1, 0, 0), "XCC 1: SE1 CU0");
    // SAFETY: the kernarg's flag.
    unsafe { wr32(s.data, 8, 1) };
    assert!(s.wait_for(0, 0), "the kernel completes");
    // Of 3 workgroups the third goes to XCC 2, which the mask leaves no CU.
    s.dispatch(0, 1, 7, 64 * 3, 64);
    assert!(s.wait_arrived(4 * 64), "workgroups 0 and 1 ran again");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.sig_value(0), 1, "XCC 2's workgroup waits");
    // SAFETY: the arrival counter inside the data mapping.
    assert_eq!(unsafe { rd32(s.data, ARRIVED) }, 4 * 64, "it never ran");
}

/// A damaged control stack fails the RESTORE (EINVAL): a wrong magic,
/// version or wave count, or a control stack longer than its MQD's.  A
/// damaged wave block, which only the save area shows, is the queue's
/// error when it runs after RESUME (queue error 0x20 on its inactive
/// signal, the completion signal untouched), never the daemon's.
#[test]
fn a_damaged_save_fails_the_restore_or_the_queue_at_resume() {
    let magic = gfx9::cwsr::stack::MAGIC.to_le_bytes();
    for damage in [
        "stack magic",
        "stack version",
        "stack waves",
        "stack length",
    ] {
        let s = held_dispatch();
        let fh = KFD_FH.with(|f| f.get());
        let mut img = dump_me(&s.d, fh);
        let mut blob = img.blob.clone();
        let at = blob.windows(4).position(|w| w == magic).unwrap();
        let mqd = blob.windows(4).position(|w| w == b"KEMQ").unwrap();
        match damage {
            "stack magic" => blob[at] ^= 1,
            "stack version" => blob[at + 4] = 9,
            "stack waves" => blob[at + 8] ^= 1,
            _ => blob[mqd + 44..mqd + 48].copy_from_slice(&(CTX_CTL as u32 + 8).to_le_bytes()),
        }
        let (_, _, r) = restore_me(&s.d, &mut img, &blob);
        assert_eq!(r, Err(libc::EINVAL), "{damage}");
    }
    // The wave block's PC_HI (HWREG slot 2): replay bits it never saves.
    let alloc = gfx9::cwsr::Alloc::from_descriptor(gfx9::Target::Gfx908, 0, 0, 512).unwrap();
    let pc_hi = CTX_CTL as usize + gfx9::cwsr::WaveBlock::of(&alloc).hwreg + 8;
    let s = held_dispatch();
    let (img, d2, fh2) = moved(&s.d);
    let area = restored_bo(&d2, &img, CTX_VA);
    // SAFETY: inside the restored save area.
    unsafe { wr32(area, pc_hi, 0x1_0000) };
    let sigs = restored_bo(&d2, &img, SHADER_SIGS_VA);
    let pid = std::process::id();
    let resume = criu(criu_op::RESUME, 0, 0, 0, 0, 0, 0, 0, pid);
    d2.call_fh(fh2, &me(), nr::CRIU_OP, &resume).unwrap();
    assert!(poll_signal(sigs, 2, 0x20), "wave block: queue 0's error");
    // SAFETY: the restored signals.
    assert_eq!(unsafe { rd64(sigs, 8) }, 1, "wave block: no completion");
}

/// The MQD's control stack size is the record's: an image whose MQD names
/// a larger stack than its record holds (a queue without waves, so no
/// stack is read) is refused at RESTORE, where the next checkpoint would
/// have written a stack of that size; unchanged, it restores.
#[test]
fn an_mqd_stack_size_other_than_the_records_is_refused_at_restore() {
    let s = Shader::on(Dev::new(KFD_1_11), true);
    let fh = KFD_FH.with(|f| f.get());
    let mut img = dump_me(&s.d, fh);
    let at = img.blob.windows(4).position(|w| w == b"KEMQ").unwrap();
    let size = u32::from_le_bytes(img.blob[at + 40..at + 44].try_into().unwrap());
    assert_eq!(size, CTX_CTL as u32, "the MQD's control stack size");
    for bad in [0x8000_0000u32, CTX_CTL as u32 + 0x1000, 0] {
        let mut blob = img.blob.clone();
        blob[at + 40..at + 44].copy_from_slice(&bad.to_le_bytes());
        let (_, _, r) = restore_me(&s.d, &mut img, &blob);
        assert_eq!(r, Err(libc::EINVAL), "MQD ctl_stack_size {bad:#x}");
    }
    let blob = img.blob.clone();
    let (_, _, r) = restore_me(&s.d, &mut img, &blob);
    r.unwrap();
}

/// A compute queue's save area and control stack sizes at CREATE_QUEUE and
/// RESTORE: MI100's exactly (0x45e1000 and 0x9000 bytes) from KFD 1.17 on,
/// at most those and a stack within its area before; a queue without a
/// save area is not checked.
#[test]
fn save_area_sizes_follow_the_node() {
    let (ctx, ctl) = (0x45e_1000u64, 0x9000u64);
    let try_sizes = |d: &Dev, size: u64, stack: u64| {
        let a = model::queue_args(
            d.gpu_id,
            queue_type::COMPUTE_AQL,
            (RING_VA, 4096),
            (CTL_VA + 8, CTL_VA),
            Some((CTX_VA, size, stack)),
        );
        d.call(nr::CREATE_QUEUE, &a).map(|_| ())
    };
    let d = Dev::new("");
    d.setup();
    for (size, stack) in [
        (CTX_SIZE, CTX_CTL),
        (ctx, ctl - 0x1000),
        (ctx + 0x1000, ctl),
    ] {
        let r = try_sizes(&d, size, stack);
        assert_eq!(r, Err(libc::EINVAL), "KFD 1.18: {size:#x}, {stack:#x}");
    }
    try_sizes(&d, ctx, ctl).unwrap();
    d.call(
        nr::CREATE_QUEUE,
        &queue_args(d.gpu_id, queue_type::COMPUTE_AQL, 4096),
    )
    .unwrap();
    let d = Dev::new(KFD_1_11);
    d.setup();
    for (size, stack) in [(ctx + 0x1000, ctl), (ctx, ctl + 0x1000), (0x8000, ctl)] {
        let r = try_sizes(&d, size, stack);
        assert_eq!(r, Err(libc::EINVAL), "KFD 1.11: {size:#x}, {stack:#x}");
    }
    try_sizes(&d, ctx, ctl).unwrap();
    try_sizes(&d, CTX_SIZE, CTX_CTL).unwrap();
    // RESTORE: a record's save area far larger than the node's.
    let s = Shader::on(Dev::new(KFD_1_11), true);
    let fh = KFD_FH.with(|f| f.get());
    let mut img = dump_me(&s.d, fh);
    let at = img.blob.windows(4).position(|w| w == b"KEMQ").unwrap();
    let size = u32::from_le_bytes(img.blob[at - 16..at - 12].try_into().unwrap());
    assert_eq!(
        size, CTX_SIZE as u32,
        "the record's ctx_save_restore_area_size"
    );
    let mut blob = img.blob.clone();
    blob[at - 16..at - 12].copy_from_slice(&0xffff_f000u32.to_le_bytes());
    let (_, _, r) = restore_me(&s.d, &mut img, &blob);
    assert_eq!(r, Err(libc::EINVAL));
}

/// A change to a checkpoint's private data.
type Damage = Box<dyn Fn(&mut Vec<u8>)>;

/// MI100's CUs over 4 XCCs, as an MI300 partition has several.
const XCC4: &str = "num_xcc = 4\n";

/// `s`'s dump `img` restored on another 4-XCC GPU and RESUMEd there: the
/// new device (kept alive by the caller) and its kernarg and signals BOs.
fn resumed_on_xcc4(s: &Shader, img: &mut Image) -> (Dev, *mut u8, *mut u8) {
    let blob = img.blob.clone();
    let (d2, fh2, r) = restore_me_on(&s.d, img, &blob, XCC4);
    r.unwrap();
    let (data, sigs) = (
        restored_bo(&d2, img, DATA_VA),
        restored_bo(&d2, img, SHADER_SIGS_VA),
    );
    let pid = std::process::id();
    let resume = criu(criu_op::RESUME, 0, 0, 0, 0, 0, 0, 0, pid);
    d2.call_fh(fh2, &me(), nr::CRIU_OP, &resume).unwrap();
    (d2, data, sigs)
}

/// A dispatch of 8 workgroups of 2 waves (K_HOLD: registers, LDS and a
/// barrier) in flight on queue 0 of a GPU of 4 XCCs: the CP hands XCC `x`
/// the workgroups `x` and `x + 4`.
fn held_dispatch_on_4_xccs() -> Shader {
    let d = Dev::new(&format!("{KFD_1_11}[[gpus]]\n{XCC4}"));
    let s = Shader::on_xccs(d, true, 4);
    s.dispatch_lds(0, 0, 5, 1024, 128, 512);
    assert!(s.wait_arrived(1024), "every work-item holds at its flag");
    assert_eq!(s.sig_value(0), 1, "the dispatch waits for its flag");
    s
}

/// Where queue 0's MQDs start in a blob, and its control stacks of
/// `CTX_CTL` bytes each after the 4 MQDs of 2048.
fn queue0_mqds(blob: &[u8]) -> (usize, usize) {
    let mqd = blob.windows(4).position(|w| w == b"KEMQ").unwrap();
    (mqd, mqd + 4 * 2048)
}

/// Bytes `used` of MQD `x`'s control stack (its end), per the MQD.
fn xcc_stack(blob: &[u8], x: usize) -> std::ops::Range<usize> {
    let (mqd, stacks) = queue0_mqds(blob);
    let used = u32_at(blob, mqd + 2048 * x + 44) as usize;
    let end = stacks + (x + 1) * CTX_CTL as usize;
    end - used..end
}

/// On a GPU of 4 XCCs, PROCESS_INFO saves each XCC's waves into its slice
/// of the save area and its own control stack, CHECKPOINT returns 4 MQDs
/// and 4 control stacks (Linux 6.18's layout), and another host of 4 XCCs
/// resumes the waves of every XCC: each work-item's result.
#[test]
fn a_dispatch_on_4_xccs_is_saved_per_xcc_and_resumes_on_another_host() {
    let s = held_dispatch_on_4_xccs();
    let fh = KFD_FH.with(|f| f.get());
    let mut img = dump_me(&s.d, fh);
    let magic = gfx9::cwsr::stack::MAGIC.to_le_bytes();
    let area = s.d.map_node(
        NodeKind::Render { minor: s.d.minor },
        buckets(&img).iter().find(|b| b.0 == CTX_VA).unwrap().2,
        (CTX_SIZE * s.xccs) as usize,
    );
    for x in 0..4 {
        let r = xcc_stack(&img.blob, x);
        assert_eq!(
            &img.blob[r.start..r.start + 4],
            magic,
            "XCC {x}'s control stack"
        );
        let stack = gfx9::cwsr::ControlStack::decode(gfx9::Target::Gfx908, &img.blob[r]).unwrap();
        let d = &stack.dispatches[0];
        assert_eq!((d.xcc.index, d.xcc.count), (x as u16, 4));
        let groups: Vec<u32> = d.waves.iter().map(|w| w.workgroup).collect();
        let (a, b) = (x as u32, x as u32 + 4);
        assert_eq!(groups, [a, a, b, b], "XCC {x} saved its workgroups' waves");
        let at = (CTX_SIZE as usize) * x + CTX_CTL as usize;
        // SAFETY: inside the save area's mapping of 4 slices.
        let waves = unsafe { std::slice::from_raw_parts(area.add(at), 0x1000) };
        assert!(
            waves.iter().any(|&b| b != 0),
            "XCC {x}'s slice holds its waves"
        );
    }
    let (_d2, data, sigs) = resumed_on_xcc4(&s, &mut img);
    released_dispatch_completes(sigs, data, 1024);
}

/// Queue 0's scratch: a GTT BO at `SCRATCH_VA` of 4 XCC slices of 4
/// wave slots of 1 KiB (16 bytes per work-item), set in its `amd_queue_t`
/// as ROCr 6 does on a GPU of 4 XCCs (`scratch_backing_memory_byte_size`
/// and `compute_tmpring_size`'s WAVES per XCC).
const SCRATCH_VA: u64 = 0x5200_0000;
const SCRATCH_XCC: u64 = 0x1000;

/// K_SCRATCH on queue 0 of a GPU of 4 XCCs: 16 workgroups of one wave, all
/// resident, each holding a value at its scratch address.
fn scratch_dispatch_on_4_xccs() -> Shader {
    let d = Dev::new(&format!("{KFD_1_11}[[gpus]]\n{XCC4}"));
    let s = Shader::on_xccs(d, true, 4);
    let (h, _) =
        s.d.alloc(SCRATCH_VA, 4 * SCRATCH_XCC, alloc::GTT, 0)
            .unwrap();
    s.d.map_gpu(h);
    let aq = s.aqs[0];
    // SAFETY: amd_queue_t fields of queue 0's mapping.
    unsafe {
        wr32(aq, 140, 4 | 1 << 12); // compute_tmpring_size: 4 waves per XCC of 1 KiB
        wr64(aq, 160, SCRATCH_VA); // scratch_backing_memory_location
        wr64(aq, 168, SCRATCH_XCC); // scratch_backing_memory_byte_size: per XCC
        wr32(aq, 176, 16); // scratch_workitem_byte_size
    }
    s.dispatch_private(0, 0, 6, 16 * 64, 64, (16, 0));
    assert!(s.wait_arrived(16 * 64), "every work-item holds at its flag");
    assert_eq!(s.sig_value(0), 1, "the dispatch waits for its flag");
    s
}

/// After the flag: each wave of the scratch dispatch read back its own
/// workgroup id from its scratch, which lies in its XCC's slice (the CP
/// hands workgroup `g` to XCC `g % 4`), and no two waves shared it.
fn scratch_per_xcc(data: *mut u8) {
    let mut seen = std::collections::BTreeSet::new();
    for g in 0..16u64 {
        // SAFETY: out[16 * g] of the output buffer.
        let (v, lo, hi) = unsafe {
            let at = 0x1000 + 16 * g as usize;
            (rd32(data, at), rd32(data, at + 4), rd32(data, at + 8))
        };
        let addr = (hi as u64) << 32 | lo as u64;
        assert_eq!(v as u64, g, "workgroup {g}'s scratch held its value");
        let slice = SCRATCH_VA + (g % 4) * SCRATCH_XCC;
        assert!(
            (slice..slice + SCRATCH_XCC).contains(&addr),
            "workgroup {g} (XCC {}): scratch at {addr:#x}, its XCC's slice is {slice:#x}",
            g % 4
        );
        assert!(
            seen.insert(addr),
            "workgroup {g}: scratch {addr:#x} taken twice"
        );
    }
}

/// On a GPU of 4 XCCs the CP gives each XCC's waves slots of that XCC's
/// slice of the queue's scratch only: 16 resident waves, 4 per XCC, fill
/// the 4 slices of 4 slots (one pool of 16 would put XCC 1's first wave in
/// XCC 0's slice). Checkpointed with the waves holding their scratch and
/// restored on another host of 4 XCCs, every wave reads back its value
/// from its own slice.
#[test]
fn scratch_is_split_per_xcc_and_restored_with_the_waves() {
    let s = scratch_dispatch_on_4_xccs();
    let fh = KFD_FH.with(|f| f.get());
    let mut img = dump_me(&s.d, fh);
    let (_d2, data, sigs) = resumed_on_xcc4(&s, &mut img);
    // SAFETY: the restored kernarg's flag.
    unsafe { wr32(data, 8, 1) };
    assert!(poll_signal(sigs, 0, 0), "the restored dispatch completes");
    scratch_per_xcc(data);
    // The original runs on after UNPAUSE, the same.
    s.d.call(nr::CRIU_OP, &criu(criu_op::UNPAUSE, 0, 0, 0, 0, 0, 0, 0, 0))
        .unwrap();
    // SAFETY: the kernarg's flag.
    unsafe { wr32(s.data, 8, 1) };
    assert!(s.wait_for(0, 0), "the dispatch completes after UNPAUSE");
    scratch_per_xcc(s.data);
}

/// On 4 XCCs GET_QUEUE_WAVE_STATE writes each XCC's header and control
/// stack into its slice (Linux 6.18's v9.4.3 path) and returns XCC 0's
/// sizes; the dispatch then finishes after UNPAUSE.
#[test]
fn get_queue_wave_state_on_4_xccs_fills_each_xccs_slice() {
    let s = held_dispatch_on_4_xccs();
    let info = criu(criu_op::PROCESS_INFO, 0, 0, 0, 0, 0, 0, 0, 0);
    s.d.call(nr::CRIU_OP, &info).unwrap();
    let (_, stacks) = wave_state_of(&s);
    for (x, stack) in stacks.iter().enumerate() {
        let d = &stack.dispatches[0];
        assert_eq!((d.xcc.index, d.xcc.count), (x as u16, 4));
        let (a, b) = (x as u32, x as u32 + 4);
        let groups: Vec<u32> = d.waves.iter().map(|w| w.workgroup).collect();
        assert_eq!(groups, [a, a, b, b], "XCC {x}'s workgroups' waves");
    }
    s.unpause_and_finish(1024);
}

/// Damage to one XCC's MQD or control stack fails the RESTORE (EINVAL): its
/// stack's magic, a stack another XCC wrote, an MQD whose read pointer is
/// not XCC 0's, an XCC with no stack while the others hold the dispatch;
/// so does a host whose GPU has another XCC count (its MQD size).
#[test]
fn damage_to_one_xcc_and_another_xcc_count_are_refused_at_restore() {
    let s = held_dispatch_on_4_xccs();
    let fh = KFD_FH.with(|f| f.get());
    let mut img = dump_me(&s.d, fh);
    let (mqd, _) = queue0_mqds(&img.blob);
    let swap = |b: &mut Vec<u8>| {
        let (r1, r2) = (xcc_stack(b, 1), xcc_stack(b, 2));
        assert_eq!(r1.len(), r2.len(), "XCCs 1 and 2 saved as many waves");
        let one = b[r1.clone()].to_vec();
        b.copy_within(r2.clone(), r1.start);
        b[r2].copy_from_slice(&one);
    };
    let damages: Vec<(&str, Damage)> = vec![
        (
            "XCC 2's stack magic",
            Box::new(|b| {
                let at = xcc_stack(b, 2).start;
                b[at] ^= 1;
            }),
        ),
        ("XCCs 1 and 2 swapped", Box::new(swap)),
        (
            "XCC 3's MQD rptr",
            Box::new(move |b| b[mqd + 3 * 2048 + 8] ^= 0x40),
        ),
        (
            "XCC 1's stack unused",
            Box::new(move |b| {
                b[mqd + 2048 + 44..mqd + 2048 + 48].fill(0);
            }),
        ),
    ];
    for (damage, f) in damages {
        let mut blob = img.blob.clone();
        f(&mut blob);
        let (_, _, r) = restore_me_on(&s.d, &mut img, &blob, XCC4);
        assert_eq!(r, Err(libc::EINVAL), "{damage}");
    }
    let blob = img.blob.clone();
    let (_, _, r) = restore_me_on(&s.d, &mut img, &blob, "num_xcc = 2\n");
    assert_eq!(r, Err(libc::EINVAL), "a GPU of 2 XCCs");
    let (_, _, r) = restore_me_on(&s.d, &mut img, &blob, XCC4);
    r.unwrap();
}

/// After RESUME of a restored dispatch held on its flag: its completion
/// signal still waits, and once the flag is set the dispatch completes with
/// work-item i's id in output word i, for `items` work-items.
fn released_dispatch_completes(sigs: *mut u8, data: *mut u8, items: usize) {
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: the restored signals.
    let completion = unsafe { rd64(sigs, 8) };
    assert_eq!(completion, 1, "the waves wait for their flag again");
    // SAFETY: the restored kernarg's flag.
    unsafe { wr32(data, 8, 1) };
    assert!(poll_signal(sigs, 0, 0), "the restored dispatch completes");
    for i in 0..items {
        // SAFETY: the restored output buffer.
        let v = unsafe { rd32(data, 0x1000 + 4 * i) };
        assert_eq!(v, i as u32, "work-item {i}");
    }
}

/// GET_DMABUF_INFO and IMPORT_DMABUF of the emulator's own dma-buf (an
/// EXPORT_DMABUF fd, as HIP IPC hands it to another process): the BO's
/// size, GPU and domain; an import at another VA is a BO of the same
/// memory (its mmap offset the exporter's), mappable, and freeing it
/// leaves the exported BO alone.
#[test]
fn own_dmabufs_are_described_and_imported() {
    let d = Dev::new("");
    let (kfd, _) = d.setup();
    let (h, _) = d.alloc(0x1000_0000, 2 << 20, alloc::VRAM, 0).unwrap();
    let inst = Install(std::cell::Cell::new(true));
    let mut e = args(&[(0, h)], 16);
    let cmd = kfd_abi::ioctl::AMDKFD_IOC_EXPORT_DMABUF;
    assert_eq!(
        d.emu
            .fd_ioctl(kfd, &me(), cmd, e.as_mut_ptr() as u64, &inst),
        Some(Ok(()))
    );
    let fd = u32_at(&e, 12) as u64;
    let info = d.call(nr::GET_DMABUF_INFO, &args(&[(28, fd)], 32)).unwrap();
    assert_eq!(u64_at(&info, 0), 2 << 20, "size");
    assert_eq!(u32_at(&info, 20), d.gpu_id, "GPU");
    assert_eq!(u32_at(&info, 24), alloc::VRAM, "flags");
    assert_eq!(u32_at(&info, 16), 0, "no metadata");
    let import = |va: u64, gpu: u32| {
        d.call(
            nr::IMPORT_DMABUF,
            &args(&[(0, va), (16, gpu as u64), (20, fd)], 24),
        )
    };
    assert_eq!(
        import(0x3000_0000, 0x1234),
        Err(libc::EINVAL),
        "no such GPU"
    );
    assert_eq!(import(0x1010_0000, d.gpu_id), Err(libc::EINVAL), "VA taken");
    let ih = u64_at(&import(0x3000_0000, d.gpu_id).unwrap(), 8);
    assert_ne!(ih, h);
    d.map_gpu(ih);
    // CRIU's view: both BOs at the exporter's mmap offset.
    let (_, _, nb, _) = process_info(&d);
    assert_eq!(nb, 2, "two BOs");
    d.call(nr::UNMAP_MEMORY_FROM_GPU, &map_args(ih, &[d.gpu_id]))
        .unwrap();
    d.call(nr::FREE_MEMORY_OF_GPU, &ih.to_le_bytes()).unwrap();
    // The exported BO and its dma-buf live on: a second import.
    let again = u64_at(&import(0x3000_0000, d.gpu_id).unwrap(), 8);
    d.call(nr::FREE_MEMORY_OF_GPU, &again.to_le_bytes())
        .unwrap();
    d.call(nr::FREE_MEMORY_OF_GPU, &h.to_le_bytes()).unwrap();
}
