//! The device model end to end through the real FUSE transport: this test
//! re-runs itself as a client inside `kfd-emu run --profile mi100`, which
//! drives /dev/kfd and /dev/dri/renderD128 like the thunk does: acquire
//! the VM with a render fd (resolved by the daemon through pidfd_getfd),
//! allocate and mmap BOs, create a signal event and an SDMA queue, ring
//! its doorbell through the /dev/kfd mapping and block in WAIT_EVENTS
//! until the emulated engine's TRAP wakes it.  Needs root (FUSE mounts).

use std::ffi::CString;
use std::process::Command;

mod model;
use model::map_fd as map;
use model::try_map_fd as try_map;

const ROLE: &str = "KFD_EMU_DEVICE_E2E_CLIENT";

fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u64 {
    ((dir << 30) | ((size as u32) << 16) | (ty << 8) | nr) as u64
}

fn ioctl(fd: i32, dir: u32, ty: u32, nr: u32, buf: &mut [u8]) -> Result<(), i32> {
    // SAFETY: the kernel reads/writes at most buf.len() bytes (the size
    // encoded in the request) of a live buffer.
    let r = unsafe { libc::ioctl(fd, ioc(dir, ty, nr, buf.len()) as _, buf.as_mut_ptr()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    Ok(())
}

fn kfd(fd: i32, nr: u32, buf: &mut [u8]) -> Result<(), i32> {
    ioctl(fd, 3, 0x4b, nr, buf)
}

fn open(path: &str) -> i32 {
    let c = CString::new(path).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(fd >= 0, "open {path}: {}", std::io::Error::last_os_error());
    fd
}

fn put(b: &mut [u8], off: usize, v: u64, width: usize) {
    b[off..off + width].copy_from_slice(&v.to_le_bytes()[..width]);
}
fn get(b: &[u8], off: usize, width: usize) -> u64 {
    let mut x = [0u8; 8];
    x[..width].copy_from_slice(&b[off..off + width]);
    u64::from_le_bytes(x)
}

/// The GPU's gpu_id, as KFD's topology gives it.
fn gpu_id() -> u64 {
    std::fs::read_to_string("/sys/class/kfd/kfd/topology/nodes/1/gpu_id")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// ACQUIRE_VM: the process' /dev/kfd `k` adopts the VM of render file `r`.
fn acquire_vm(k: i32, r: i32, gpu: u64) {
    let mut vm = [0u8; 8];
    put(&mut vm, 0, r as u64, 4);
    put(&mut vm, 4, gpu, 4);
    ioctl(k, 1, 0x4b, 0x15, &mut vm).unwrap();
}

/// ALLOC_MEMORY_OF_GPU of `size` bytes at `va`: the BO's handle and its
/// mmap offset.
fn alloc_bo(k: i32, gpu: u64, va: u64, size: u64, flags: u64) -> (u64, u64) {
    let mut a = [0u8; 40];
    put(&mut a, 0, va, 8);
    put(&mut a, 8, size, 8);
    put(&mut a, 32, gpu, 4);
    put(&mut a, 36, flags, 4);
    kfd(k, 0x16, &mut a).unwrap();
    (get(&a, 16, 8), get(&a, 24, 8))
}

/// A `struct kfd_event_data` naming `event`.
fn event_data(event: u64) -> [u8; 48] {
    let mut evd = [0u8; 48];
    put(&mut evd, 40, event, 4);
    evd
}

/// WAIT_EVENTS' arguments: the one event of `evd`, for up to `timeout_ms`.
fn wait_args(evd: &mut [u8; 48], timeout_ms: u64) -> [u8; 24] {
    let mut w = [0u8; 24];
    put(&mut w, 0, evd.as_mut_ptr() as u64, 8);
    put(&mut w, 8, 1, 4);
    put(&mut w, 16, timeout_ms, 4);
    w
}

fn client() {
    client_with(false);
}

/// The SDMA copy; with `dmabuf` (under `kfd-emu supervise`) the
/// destination BO is exported and its dma-buf mapped before the copy,
/// and the copy is read through that mapping too.
fn client_with(dmabuf: bool) {
    let gpu = gpu_id();
    let k = open("/dev/kfd");
    let r = open("/dev/dri/renderD128");
    let mut v = [0u8; 8];
    ioctl(k, 2, 0x4b, 0x01, &mut v).unwrap();
    assert_eq!((get(&v, 0, 4), get(&v, 4, 4)), (1, 18));
    let mut vm = [0u8; 8];
    put(&mut vm, 0, r as u64, 4);
    put(&mut vm, 4, gpu, 4);
    ioctl(k, 1, 0x4b, 0x15, &mut vm).unwrap();
    let r2 = open("/dev/dri/renderD128");
    put(&mut vm, 0, r2 as u64, 4);
    assert_eq!(ioctl(k, 1, 0x4b, 0x15, &mut vm), Err(libc::EBUSY));

    let alloc = |va: u64, size: u64, flags: u64| {
        let (handle, off) = alloc_bo(k, gpu, va, size, flags);
        // MAP_MEMORY_TO_GPU: the GPU's engines reach only mapped BOs.
        let ids = [gpu as u32];
        let mut m = [0u8; 24];
        put(&mut m, 0, handle, 8);
        put(&mut m, 8, ids.as_ptr() as u64, 8);
        put(&mut m, 16, 1, 4);
        kfd(k, 0x18, &mut m).unwrap();
        (handle, map(r, off, size as usize))
    };
    let (ring_va, ctl_va, src_va, dst_va, sig_va) = (
        0x1000_0000u64,
        0x1001_0000u64,
        0x2000_0000u64,
        0x3000_0000u64,
        0x4000_0000u64,
    );
    let (_, ring) = alloc(ring_va, 4096, 2);
    let (_, _ctl) = alloc(ctl_va, 4096, 2);
    let (_, src) = alloc(src_va, 1 << 20, 1);
    let (dst_h, dst) = alloc(dst_va, 1 << 20, 1);
    let via_dmabuf = dmabuf.then(|| {
        // struct kfd_ioctl_export_dmabuf_args { u64 handle; u32 flags; u32 dmabuf_fd; }
        let mut e = [0u8; 16];
        put(&mut e, 0, dst_h, 8);
        put(&mut e, 8, libc::O_CLOEXEC as u64, 4);
        kfd(k, 0x24, &mut e).unwrap();
        try_map(get(&e, 12, 4) as i32, 0, 1 << 20).expect("mmap of the dma-buf")
    });
    let (sig_h, _sig) = alloc(sig_va, 32768, 2);
    // SAFETY: src maps 1 MiB that only this slice accesses in this process.
    let src = unsafe { std::slice::from_raw_parts_mut(src, 1 << 20) };
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let mut ev = [0u8; 32];
    put(&mut ev, 0, sig_h, 8);
    put(&mut ev, 16, 1, 4);
    kfd(k, 0x08, &mut ev).unwrap();
    let event = get(&ev, 24, 4);
    let mut q = [0u8; 88];
    put(&mut q, 0, ring_va, 8);
    put(&mut q, 8, ctl_va + 8, 8);
    put(&mut q, 16, ctl_va, 8);
    put(&mut q, 32, 4096, 4);
    put(&mut q, 36, gpu, 4);
    put(&mut q, 40, 1, 4);
    put(&mut q, 44, 100, 4);
    kfd(k, 0x02, &mut q).unwrap();
    let dbo = get(&q, 24, 8);
    assert!(dbo < 1 << 63);
    // SAFETY: the doorbell lies in the 8 KiB slice.
    let doorbell = unsafe { map(k, dbo & !8191, 8192).add((dbo & 8191) as usize) } as *mut u64;

    let slot = sig_va + event * 8;
    let pkts: Vec<u32> = vec![
        1,
        (1 << 20) - 1,
        0,
        src_va as u32,
        (src_va >> 32) as u32,
        dst_va as u32,
        (dst_va >> 32) as u32,
        5,
        slot as u32,
        (slot >> 32) as u32,
        1,
        6,
        0,
    ];
    // SAFETY: the ring maps 4096 bytes, 8-aligned (page-aligned mapping).
    let ring = unsafe { std::slice::from_raw_parts_mut(ring as *mut u32, 1024) };
    ring[..pkts.len()].copy_from_slice(&pkts);
    // The packets must be in memory before the doorbell says so.
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    // SAFETY: doorbell points into a live mapping.
    unsafe { std::ptr::write_volatile(doorbell, pkts.len() as u64 * 4) };
    // Block in the daemon until the TRAP signals the event.
    let mut evd = event_data(event);
    let mut w = wait_args(&mut evd, 10_000);
    let t = std::time::Instant::now();
    loop {
        match kfd(k, 0x0c, &mut w) {
            Err(libc::EINTR) => continue,
            r => break r.unwrap(),
        }
    }
    assert_eq!(get(&w, 20, 4), 0, "wait timed out after {:?}", t.elapsed());
    // SAFETY: dst maps 1 MiB; the engine finished writing it (the trap came
    // after the copy).
    let dst = unsafe { std::slice::from_raw_parts(dst, 1 << 20) };
    for (i, b) in dst.iter().enumerate() {
        assert_eq!(*b, (i % 251) as u8, "byte {i}");
    }
    if let Some(p) = via_dmabuf {
        // SAFETY: the dma-buf's mapping of the same 1 MiB.
        let d = unsafe { std::slice::from_raw_parts(p, 1 << 20) };
        assert!(
            d == dst,
            "the SDMA copy read through the dma-buf's mapping differs"
        );
        println!("e2e: the SDMA copy is seen through the dma-buf's mapping");
    }
    println!("e2e: 1 MiB SDMA copy + trap wait in {:?}", t.elapsed());
    interrupted_wait(k);
}

extern "C" fn on_usr1(_: libc::c_int) {}

/// Installs a no-op SIGUSR1 handler without SA_RESTART: the signal ends
/// a blocked ioctl with EINTR.
fn interrupt_with_usr1() {
    // SAFETY: sigaction is plain data; all-zero is a valid value.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as usize;
    // SAFETY: installing a no-op handler without SA_RESTART.
    unsafe { libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()) };
}

/// A signal ends a parked WAIT_EVENTS with EINTR (the transport answers
/// the FUSE interrupt); the thread's next wait is served normally and a
/// later SET_EVENT reaches it, not the abandoned wait.
fn interrupted_wait(k: i32) {
    interrupt_with_usr1();
    let mut ev = [0u8; 32];
    put(&mut ev, 16, 1, 4);
    kfd(k, 0x08, &mut ev).unwrap();
    let event = get(&ev, 24, 4);
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() }).unwrap();
        let mut evd = event_data(event);
        let mut w = wait_args(&mut evd, u32::MAX as u64);
        let first = kfd(k, 0x0c, &mut w);
        let second = kfd(k, 0x0c, &mut w).map(|()| get(&w, 20, 4));
        (first, second)
    });
    let tid = rx.recv().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let pid = std::process::id() as libc::pid_t;
    // SAFETY: signalling a live thread of this process.
    unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGUSR1) };
    std::thread::sleep(std::time::Duration::from_millis(100));
    let mut set = [0u8; 8];
    put(&mut set, 0, event, 4);
    ioctl(k, 1, 0x4b, 0x0a, &mut set).unwrap();
    let (first, second) = waiter.join().unwrap();
    assert_eq!(first, Err(libc::EINTR));
    assert_eq!(second, Ok(0));
    println!("e2e: interrupted wait answered EINTR, the next wait got the event");
}

/// The thread `tid` of this process is blocked in ioctl(2) (syscall 16
/// on x86-64): its request reached the daemon.
fn in_ioctl(tid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
        .is_ok_and(|s| s.split_whitespace().next() == Some("16"))
}

/// The race of issue #3: a wait interrupted by a signal must leave the
/// device model at once.  The thread takes its time before retrying (a
/// signal handler, a CRIU dump in between); a SET_EVENT of the auto-reset
/// event in that window must stay signalled for the retried wait instead
/// of being consumed by the abandoned one.
fn interrupted_wait_then_set_event_client() {
    interrupt_with_usr1();
    let k = open("/dev/kfd");
    let mut ev = [0u8; 32];
    put(&mut ev, 16, 1, 4); // auto_reset, signal event, kfd events page
    kfd(k, 0x08, &mut ev).unwrap();
    let event = get(&ev, 24, 4);
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (first_tx, first_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let waiter = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tid_tx.send(unsafe { libc::gettid() }).unwrap();
        let mut evd = event_data(event);
        let mut w = wait_args(&mut evd, u32::MAX as u64);
        first_tx.send(kfd(k, 0x0c, &mut w)).unwrap();
        go_rx.recv().unwrap();
        put(&mut w, 16, 5_000, 4);
        let t = std::time::Instant::now();
        let second = kfd(k, 0x0c, &mut w).map(|()| get(&w, 20, 4));
        (second, t.elapsed())
    });
    let tid = tid_rx.recv().unwrap();
    let t = std::time::Instant::now();
    while !in_ioctl(tid) {
        assert!(t.elapsed().as_secs() < 10, "the wait never blocked");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Let the request settle in the daemon (parked) before interrupting.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let pid = std::process::id() as libc::pid_t;
    // SAFETY: signalling a live thread of this process.
    unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGUSR1) };
    let first = first_rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the signal did not end the wait");
    assert_eq!(first, Err(libc::EINTR));
    // The waiter has not retried yet: signal the event now.
    let mut set = [0u8; 8];
    put(&mut set, 0, event, 4);
    ioctl(k, 1, 0x4b, 0x0a, &mut set).unwrap();
    go_tx.send(()).unwrap();
    let (second, took) = waiter.join().unwrap();
    assert_eq!(
        second,
        Ok(0),
        "the retried wait did not see the SET_EVENT (wait_result 1 = timeout) after {took:?}"
    );
    assert!(
        took < std::time::Duration::from_secs(1),
        "retried wait took {took:?}"
    );
    println!("e2e: SET_EVENT between EINTR and the retry reached the retry in {took:?}");
}

/// Under `kfd-emu supervise`: a BO maps only through the render file whose
/// VM the process adopted (`drm_gem_mmap`: EACCES for another file of the
/// node), only at the offset where it starts and not past its end (EINVAL),
/// and VRAM only with CPU access (PUBLIC; else EPERM).
fn owning_file_client() {
    let gpu = gpu_id();
    // The other file comes first, as a process' Mesa open would.
    let other = open("/dev/dri/renderD128");
    let k = open("/dev/kfd");
    let r = open("/dev/dri/renderD128");
    acquire_vm(k, r, gpu);
    let mut offsets = Vec::new();
    // GTT, then VRAM (CPU-visible: PUBLIC).
    for (va, flags) in [(0x1000_0000u64, 2u64), (0x2000_0000, 1 | 1 << 29)] {
        offsets.push(alloc_bo(k, gpu, va, 8192, flags).1);
    }
    for off in offsets {
        assert_eq!(
            try_map(other, off, 8192),
            Err(libc::EACCES),
            "offset {off:#x}"
        );
        assert_eq!(
            try_map(other, off, 4096),
            Err(libc::EACCES),
            "offset {off:#x}"
        );
        let p = try_map(r, off, 8192).unwrap();
        // SAFETY: p maps 8192 bytes of the BO.
        unsafe { p.write_volatile(0x5a) };
        // SAFETY: as above.
        assert_eq!(unsafe { p.read_volatile() }, 0x5a);
        assert_eq!(
            try_map(r, off + 4096, 4096),
            Err(libc::EINVAL),
            "inside a BO"
        );
        assert_eq!(try_map(r, off, 3 * 4096), Err(libc::EINVAL), "past its end");
    }
    // VRAM without PUBLIC: mapped after the ownership check, as Linux 6.x
    // maps it (KFD never marks its BOs NO_CPU_ACCESS).
    let (_, off) = alloc_bo(k, gpu, 0x3000_0000, 8192, 1);
    assert_eq!(try_map(other, off, 8192), Err(libc::EACCES));
    assert!(try_map(r, off, 8192).is_ok(), "VRAM without PUBLIC");
    // Nothing starts at the bottom of the offset space.
    assert_eq!(try_map(r, 0, 4096), Err(libc::EINVAL));
    // Other files map as ever.
    let f = std::fs::File::open(std::env::current_exe().unwrap()).unwrap();
    try_map_ro(&f).expect("mmap of a regular file");
    println!("e2e: BO mappings only through the owning render file");
}

/// Re-runs test `name` of this binary as a client inside
/// `kfd-emu run --profile mi100`; returns its output, which must contain
/// `marker`.
fn run_client(name: &str, marker: &str) {
    run_client_in(name, marker, &[]);
}

/// As [`run_client`], the client under `kfd-emu supervise`.
fn run_client_supervised(name: &str, marker: &str) {
    let emu = env!("CARGO_BIN_EXE_kfd-emu");
    run_client_in(name, marker, &[emu, "supervise", "--"]);
}

/// As [`run_client`], the client started by `wrap` (a command line).
fn run_client_in(name: &str, marker: &str, wrap: &[&str]) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "{name}: needs root for the emulator's FUSE mounts; run the tests as root"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kfd-emu"))
        .args(["run", "--profile", "mi100", "--"])
        .args(wrap)
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(ROLE, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains(marker),
        "client failed:\n{text}"
    );
    for l in text.lines().filter(|l| l.contains("e2e:")) {
        println!("{l}");
    }
}

#[test]
fn sdma_copy_and_trap_through_fuse() {
    if std::env::var_os(ROLE).is_some() {
        client();
        return;
    }
    run_client("sdma_copy_and_trap_through_fuse", "e2e: 1 MiB");
}

#[test]
fn sdma_copy_seen_through_a_dmabuf_under_supervise() {
    if std::env::var_os(ROLE).is_some() {
        client_with(true);
        return;
    }
    run_client_supervised(
        "sdma_copy_seen_through_a_dmabuf_under_supervise",
        "e2e: the SDMA copy is seen through the dma-buf's mapping",
    );
}

#[test]
fn interrupted_wait_leaves_a_later_set_event_to_the_retry() {
    if std::env::var_os(ROLE).is_some() {
        interrupted_wait_then_set_event_client();
        return;
    }
    run_client(
        "interrupted_wait_leaves_a_later_set_event_to_the_retry",
        "e2e: SET_EVENT between EINTR",
    );
}

#[test]
fn bo_maps_only_through_the_owning_render_file_under_supervise() {
    if std::env::var_os(ROLE).is_some() {
        owning_file_client();
        return;
    }
    run_client_supervised(
        "bo_maps_only_through_the_owning_render_file_under_supervise",
        "e2e: BO mappings only through the owning render file",
    );
}

/// Under `kfd-emu supervise`: a dma-buf the process exported
/// (EXPORT_DMABUF) maps onto the BO's own pages, as amdgpu's does: what
/// is written through the BO's render mapping is read through the
/// dma-buf's and the other way round, and the mapping names `/dmabuf:`
/// at the BO's render offset (the kernel adds the BO's fake offset).
fn dmabuf_alias_client() {
    let gpu = gpu_id();
    let k = open("/dev/kfd");
    let r = open("/dev/dri/renderD128");
    acquire_vm(k, r, gpu);
    // GTT, then CPU-visible VRAM (PUBLIC).
    for (va, flags) in [(0x1000_0000u64, 2u64), (0x2000_0000, 1 | 1 << 29)] {
        let (handle, off) = alloc_bo(k, gpu, va, 8192, flags);
        let bo = try_map(r, off, 8192).unwrap();
        // struct kfd_ioctl_export_dmabuf_args { u64 handle; u32 flags; u32 dmabuf_fd; }
        let mut e = [0u8; 16];
        put(&mut e, 0, handle, 8);
        put(&mut e, 8, libc::O_CLOEXEC as u64, 4);
        kfd(k, 0x24, &mut e).unwrap();
        let dmabuf = get(&e, 12, 4) as i32;
        let db = try_map(dmabuf, 0, 8192).unwrap();
        // Byte `i` of a mapping of 8192 bytes.
        let at = |p: *mut u8, i: usize| p.wrapping_add(i);
        // SAFETY: inside the BO's 8192-byte mapping.
        unsafe { at(bo, 4097).write_volatile(0x5a) };
        // SAFETY: inside the dma-buf's 8192-byte mapping.
        let got = unsafe { at(db, 4097).read_volatile() };
        assert_eq!(got, 0x5a, "BO write seen through the dma-buf");
        // SAFETY: as above.
        unsafe { at(db, 17).write_volatile(0xa5) };
        // SAFETY: inside the BO's mapping.
        let got = unsafe { at(bo, 17).read_volatile() };
        assert_eq!(got, 0xa5, "dma-buf write seen through the BO");
        // A mapping of the second page only, and one past the end.
        let second = try_map(dmabuf, 4096, 4096).unwrap();
        // SAFETY: the BO's second page.
        let got = unsafe { second.wrapping_add(1).read_volatile() };
        assert_eq!(got, 0x5a);
        assert_eq!(
            try_map(dmabuf, 4096, 8192),
            Err(libc::EINVAL),
            "past its end"
        );
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps
            .lines()
            .find(|l| l.starts_with(&format!("{:x}-", db as usize)))
            .unwrap();
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(u64::from_str_radix(fields[2], 16).unwrap(), off, "{line}");
        assert!(line.ends_with("/dmabuf:"), "{line}");
    }
    println!("e2e: dma-buf mappings alias their BOs");
}

#[test]
fn dmabuf_mapping_aliases_the_bo_under_supervise() {
    if std::env::var_os(ROLE).is_some() {
        dmabuf_alias_client();
        return;
    }
    run_client_supervised(
        "dmabuf_mapping_aliases_the_bo_under_supervise",
        "e2e: dma-buf mappings alias their BOs",
    );
}

/// A supervised process given a second filter of the supervisor's
/// without a listener (what CRIU restores from an image into a task a
/// supervised `criu restore` forked): its trapped calls fail ENOSYS, then
/// it stops.
fn restored_filter_child() {
    let prog = kfd_emu::supervise::tagged_filter(0x5eed);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: seccomp reads `fprog` and the program, both live.
    let r = unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &fprog) };
    assert_eq!(r, 0, "seccomp: {}", std::io::Error::last_os_error());
    let exe = std::env::current_exe().unwrap();
    let before = std::fs::metadata(&exe).map_err(|e| e.raw_os_error());
    assert_eq!(
        before.err(),
        Some(Some(libc::ENOSYS)),
        "stat before the attach"
    );
    // SAFETY: raise has no preconditions.
    unsafe { libc::raise(libc::SIGSTOP) };
    std::fs::metadata(&exe).expect("stat after the attach");
    let f = std::fs::File::open(&exe).unwrap();
    try_map_ro(&f).expect("mmap of a file after the attach");
}

fn try_map_ro(f: &std::fs::File) -> Result<(), i32> {
    // SAFETY: a fresh private read-only mapping of a regular file.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            std::os::fd::AsRawFd::as_raw_fd(f),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    // SAFETY: unmapping the mapping made above.
    unsafe { libc::munmap(p, 4096) };
    Ok(())
}

/// Starts [`restored_filter_child`] under `kfd-emu supervise` (whose
/// listener stays live under the child's second filter: the kernel gives
/// no thread a second, EBUSY), attaches it once it stopped (the daemon
/// releases that listener) and lets it stat and map a file again.
fn attach_under_live_listener_client() {
    let dir = std::env::var_os("KFD_EMU_STATE_DIR").expect("run under kfd-emu run");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kfd-emu"))
        .args(["supervise", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "attach_releases_a_live_listener_under_the_restored_filter",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "child")
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let t0 = std::time::Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        if stat
            .rsplit_once(')')
            .unwrap()
            .1
            .trim_start()
            .starts_with('T')
        {
            break;
        }
        assert!(t0.elapsed().as_secs() < 30, "the child did not stop");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let n = kfd_emu::reattach::attach(std::path::Path::new(&dir), pid).expect("attach");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let st = child.wait().unwrap();
    assert!(st.success(), "child: {st}");
    println!("e2e: attached {n} thread(s) under a live listener");
}

#[test]
fn attach_releases_a_live_listener_under_the_restored_filter() {
    match std::env::var(ROLE).as_deref() {
        Ok("child") => return restored_filter_child(),
        Ok(_) => return attach_under_live_listener_client(),
        Err(_) => {}
    }
    run_client(
        "attach_releases_a_live_listener_under_the_restored_filter",
        "e2e: attached",
    );
}
