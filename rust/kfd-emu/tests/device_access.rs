//! In-process tests of the device model's access rules (capabilities,
//! the ptracer exception), argument size tolerance and the render node.
//! Arguments are built from kfd-abi's types, so these tests also pin the
//! emulator to the same layouts product code uses.

use std::mem::size_of;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kfd_abi::{ioctl, sys};
use kfd_emu::device::uapi::{self, criu_op, AsBytes};
use kfd_emu::device::{Caller, Emulator, NodeKind};
use kfd_emu::profile::Profile;

mod model;
use model::{call, cap_eff, me, Table};

fn emulator() -> (Emulator, Profile) {
    let p = Profile::builtin("mi100").unwrap();
    let emu = Emulator::new(&p, Box::new(Table::default())).unwrap();
    (emu, p)
}

/// An IOWR call with the kernel's struct size.
fn iowr<T: AsBytes>(emu: &Emulator, fh: u64, c: &Caller, cmd: u32, a: &T) -> Result<T, i32> {
    call(emu, fh, c, cmd, uapi::bytes(a), size_of::<T>()).map(|o| uapi::decode(&o))
}

fn process_info() -> Vec<u8> {
    let mut a = vec![0u8; size_of::<sys::kfd_ioctl_criu_args>()];
    a[std::mem::offset_of!(sys::kfd_ioctl_criu_args, op)..][..4]
        .copy_from_slice(&criu_op::PROCESS_INFO.to_le_bytes());
    a
}

const CRIU_CAPS: u64 = 1 << 40 | 1 << 21;

#[test]
fn criu_op_needs_checkpoint_restore_or_sys_admin() {
    let (emu, _) = emulator();
    let emu = Arc::new(emu);
    let kfd = emu.open(&NodeKind::Kfd, &me()).unwrap();
    if cap_eff(me().tid) & CRIU_CAPS != 0 {
        call(
            &emu,
            kfd,
            &me(),
            ioctl::AMDKFD_IOC_CRIU_OP,
            &process_info(),
            56,
        )
        .unwrap();
    }
    // Capabilities are per thread: drop both from this one thread's
    // effective set and call from it.
    let e = emu.clone();
    let r = std::thread::spawn(move || {
        let mut hdr = [0x2008_0522u32, 0]; // _LINUX_CAPABILITY_VERSION_3, this thread
        let mut data = [0u32; 6]; // {effective, permitted, inheritable} x 2
                                  // SAFETY: capget reads the header and fills the two data records.
        let rc = unsafe { libc::syscall(libc::SYS_capget, hdr.as_mut_ptr(), data.as_mut_ptr()) };
        assert_eq!(rc, 0);
        data[0] &= !(1 << 21);
        data[3] &= !(1 << (40 - 32));
        // SAFETY: capset reads the header and the two data records.
        let rc = unsafe { libc::syscall(libc::SYS_capset, hdr.as_mut_ptr(), data.as_ptr()) };
        assert_eq!(rc, 0);
        let c = me();
        assert_eq!(cap_eff(c.tid) & CRIU_CAPS, 0);
        let criu = call(&e, kfd, &c, ioctl::AMDKFD_IOC_CRIU_OP, &process_info(), 56);
        let version = call(&e, kfd, &c, ioctl::AMDKFD_IOC_GET_VERSION, &[], 8);
        (criu, version)
    })
    .join()
    .unwrap();
    assert_eq!(r.0, Err(libc::EACCES));
    assert!(r.1.is_ok(), "GET_VERSION needs no capability");
}

#[test]
fn criu_op_on_a_foreign_fd_only_from_the_ptracer_thread() {
    let (emu, _) = emulator();
    let emu = Arc::new(emu);
    // SAFETY: the child only makes raw syscalls (async-signal-safe).
    let child = unsafe { libc::fork() };
    assert!(child >= 0);
    if child == 0 {
        // SAFETY: a raw syscall in the forked child.
        unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) };
        loop {
            // SAFETY: as above; the child never returns.
            unsafe { libc::pause() };
        }
    }
    let child = child as u32;
    let tracer = || {
        let s = std::fs::read_to_string(format!("/proc/{child}/status")).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .map(|v| v.trim().parse::<u32>().unwrap())
    };
    let t = Instant::now();
    while tracer() != Some(me().tid) {
        assert!(t.elapsed() < Duration::from_secs(5), "child never traced");
        std::thread::sleep(Duration::from_millis(2));
    }
    let theirs = Caller {
        tid: child,
        tgid: child,
    };
    let fh = emu.open(&NodeKind::Kfd, &theirs).unwrap();

    // Only CRIU_OP, and only from the tracing thread.
    assert_eq!(
        call(&emu, fh, &me(), ioctl::AMDKFD_IOC_GET_VERSION, &[], 8),
        Err(libc::EBADF)
    );
    let e = emu.clone();
    let other = std::thread::spawn(move || {
        call(
            &e,
            fh,
            &me(),
            ioctl::AMDKFD_IOC_CRIU_OP,
            &process_info(),
            56,
        )
    })
    .join()
    .unwrap();
    assert_eq!(other, Err(libc::EBADF));
    let info = call(
        &emu,
        fh,
        &me(),
        ioctl::AMDKFD_IOC_CRIU_OP,
        &process_info(),
        56,
    );
    // RESTORE must run inside the restored process, even for the tracer.
    let restore = {
        let mut a = process_info();
        a[48..52].copy_from_slice(&criu_op::RESTORE.to_le_bytes());
        call(&emu, fh, &me(), ioctl::AMDKFD_IOC_CRIU_OP, &a, 56)
    };
    let unpause = {
        let mut a = process_info();
        a[48..52].copy_from_slice(&criu_op::UNPAUSE.to_le_bytes());
        call(&emu, fh, &me(), ioctl::AMDKFD_IOC_CRIU_OP, &a, 56)
    };
    // SAFETY: a plain syscall on our own child.
    unsafe { libc::kill(child as i32, libc::SIGKILL) };
    // SAFETY: reaps that child; no status is asked for.
    unsafe { libc::waitpid(child as i32, std::ptr::null_mut(), 0) };
    if cap_eff(me().tid) & CRIU_CAPS == 0 {
        assert_eq!(info, Err(libc::EACCES));
        return;
    }
    assert_eq!(restore, Err(libc::EBADF));
    let a: sys::kfd_ioctl_criu_args = uapi::decode(&info.unwrap());
    assert_eq!((a.pid, a.num_devices, a.num_bos), (child, 1, 0));
    unpause.unwrap();
    emu.release(fh);
}

#[test]
fn argument_sizes_are_tolerated_like_the_kernel() {
    let (emu, p) = emulator();
    let kfd = emu.open(&NodeKind::Kfd, &me()).unwrap();
    // A caller with a larger struct: an output-only one gets the rest
    // zeroed, an in/out one gets its own bytes back (kfd_ioctl copies
    // the caller's whole struct in and out).
    let v = call(&emu, kfd, &me(), ioctl::AMDKFD_IOC_GET_VERSION, &[], 16).unwrap();
    assert_eq!(v.len(), 16);
    let g: sys::kfd_ioctl_get_version_args = uapi::decode(&v);
    assert_eq!((g.major_version, g.minor_version), (1, p.kfd_minor_version));
    assert!(v[8..].iter().all(|b| *b == 0));
    let gpu_id = p.gpus()[0].gpu_id.0;
    let mut m = vec![0xffu8; 24];
    m[..16].copy_from_slice(uapi::bytes(&sys::kfd_ioctl_get_available_memory_args {
        available: 0,
        gpu_id,
        pad: 0,
    }));
    let out = call(&emu, kfd, &me(), ioctl::AMDKFD_IOC_AVAILABLE_MEMORY, &m, 24).unwrap();
    let a: sys::kfd_ioctl_get_available_memory_args = uapi::decode(&out);
    assert_eq!(a.available, p.gpus()[0].vram_size);
    assert!(out[16..].iter().all(|b| *b == 0xff));
    // A shorter one: missing fields read as zero (no gpu_id → EINVAL).
    assert_eq!(
        call(
            &emu,
            kfd,
            &me(),
            ioctl::AMDKFD_IOC_AVAILABLE_MEMORY,
            &m[..8],
            8
        ),
        Err(libc::EINVAL)
    );
    // Numbers outside the 1.18 table (0, 0x27 and up, ROCm's private
    // 0x80..): ENOTTY; the deprecated debugger requests: EPERM.
    for nr in [0x00, 0x27, 0x30, 0x82] {
        assert_eq!(
            call(&emu, kfd, &me(), 0xc008_4b00 | nr, &[0; 8], 8),
            Err(libc::ENOTTY)
        );
    }
    assert_eq!(
        call(&emu, kfd, &me(), 0xc008_4b0d, &[0; 8], 8),
        Err(libc::EPERM)
    );
    // An unknown fh.
    assert_eq!(
        call(
            &emu,
            kfd + 1000,
            &me(),
            ioctl::AMDKFD_IOC_GET_VERSION,
            &[],
            8
        ),
        Err(libc::EBADF)
    );
}

#[test]
fn render_node_version_and_dev_info() {
    let (emu, p) = emulator();
    let g = &p.gpus()[0];
    let r = emu
        .open(
            &NodeKind::Render {
                minor: g.drm_render_minor.0,
            },
            &me(),
        )
        .unwrap();
    // DRM_IOCTL_VERSION: strings copied up to the caller's lengths, full
    // lengths reported.
    let mut name = [0u8; 3];
    let mut date = [0u8; 32];
    let mut desc = [0u8; 64];
    let mut v = vec![0u8; size_of::<sys::drm_version>()];
    for (field, len, ptr) in [
        (16usize, name.len(), name.as_mut_ptr()),
        (32, date.len(), date.as_mut_ptr()),
        (48, desc.len(), desc.as_mut_ptr()),
    ] {
        v[field..field + 8].copy_from_slice(&(len as u64).to_le_bytes());
        v[field + 8..field + 16].copy_from_slice(&(ptr as u64).to_le_bytes());
    }
    let out = call(&emu, r, &me(), ioctl::DRM_IOCTL_VERSION, &v, v.len()).unwrap();
    let d: sys::drm_version = uapi::decode(&out);
    assert_eq!(d.name_len, 6);
    assert_eq!(&name, b"amd");
    assert!(d.version_major >= 3);
    assert_eq!(&date[..d.date_len as usize], b"20150101");

    // AMDGPU_INFO(DEV_INFO) writes the device record to return_pointer.
    let mut dev = vec![0u8; size_of::<sys::drm_amdgpu_info_device>()];
    let mut q = [0u8; 32];
    q[..8].copy_from_slice(&(dev.as_mut_ptr() as u64).to_le_bytes());
    q[8..12].copy_from_slice(&(dev.len() as u32).to_le_bytes());
    q[12..16].copy_from_slice(&sys::AMDGPU_INFO_DEV_INFO.to_le_bytes());
    call(&emu, r, &me(), ioctl::DRM_IOCTL_AMDGPU_INFO, &q, 0).unwrap();
    let info: sys::drm_amdgpu_info_device = uapi::decode(&dev);
    assert_eq!(
        info.family,
        sys::AMDGPU_FAMILY_AI,
        "gfx9 is family AI (141)"
    );
    assert_eq!(info.device_id, g.device_id);
    assert_eq!(info.cu_active_number, g.cu_count);
    assert!(info.virtual_address_offset < info.virtual_address_max);
    // Unknown queries and unmodelled DRM ioctls (tests/device_render.rs
    // has the other queries).
    q[12..16].copy_from_slice(&0x7777u32.to_le_bytes());
    assert_eq!(
        call(&emu, r, &me(), ioctl::DRM_IOCTL_AMDGPU_INFO, &q, 0),
        Err(libc::EINVAL)
    );
    assert_eq!(
        call(
            &emu,
            r,
            &me(),
            ioctl::DRM_IOCTL_AMDGPU_GEM_CREATE,
            &[0; 32],
            32
        ),
        Err(libc::EINVAL),
        "a BO of 0 bytes"
    );
    // DRM_IOCTL_AMDGPU_SCHED (DRM_IOW, 16 bytes): not modelled.
    assert_eq!(
        call(&emu, r, &me(), 0x4010_6455, &[0; 16], 0),
        Err(libc::ENOTTY)
    );
    // GEM_CREATE of 1 MiB of VRAM: handle 1, mapped at an offset of the
    // render file; GEM_CHANGE_HANDLE is refused (the profile's default).
    let mut c = [0u8; 32];
    c[..8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    c[16..24].copy_from_slice(&u64::from(sys::AMDGPU_GEM_DOMAIN_VRAM).to_le_bytes());
    let out = call(&emu, r, &me(), ioctl::DRM_IOCTL_AMDGPU_GEM_CREATE, &c, 32).unwrap();
    assert_eq!(out[..8], 1u64.to_le_bytes(), "handle 1");
    let out = call(
        &emu,
        r,
        &me(),
        ioctl::DRM_IOCTL_AMDGPU_GEM_MMAP,
        &out[..8],
        8,
    )
    .unwrap();
    assert!(u64::from_le_bytes(out[..8].try_into().unwrap()) >= uapi::RENDER_OFFSET_BASE);
    let rename = [1u8, 0, 0, 0, 2, 0, 0, 0];
    assert_eq!(
        call(
            &emu,
            r,
            &me(),
            ioctl::DRM_IOCTL_GEM_CHANGE_HANDLE,
            &rename,
            8
        ),
        Err(libc::EINVAL)
    );
    call(
        &emu,
        r,
        &me(),
        ioctl::DRM_IOCTL_GEM_CLOSE,
        &[1, 0, 0, 0, 0, 0, 0, 0],
        0,
    )
    .unwrap();
    assert_eq!(
        call(&emu, r, &me(), ioctl::DRM_IOCTL_GEM_CLOSE, &[0; 8], 0),
        Err(libc::EINVAL),
        "no GEM handle 0"
    );
    assert_eq!(
        call(&emu, r, &me(), ioctl::DRM_IOCTL_GEM_CLOSE, &[0; 8], 0),
        Err(libc::EINVAL)
    );
    // A render fh is not a KFD fh.
    assert_eq!(
        iowr(
            &emu,
            r,
            &me(),
            ioctl::AMDKFD_IOC_GET_VERSION,
            &sys::kfd_ioctl_get_version_args::default()
        )
        .map(|_| ()),
        Err(libc::ENOTTY)
    );
}

#[test]
fn teardown_gives_the_process_pages_of_dev_kfd_back() {
    use std::os::fd::AsRawFd;
    let (emu, _) = emulator();
    let kfd = emu.open(&NodeKind::Kfd, &me()).unwrap();
    let ev = sys::kfd_ioctl_create_event_args {
        event_type: sys::KFD_IOC_EVENT_SIGNAL,
        auto_reset: 1,
        ..Default::default()
    };
    let ev = iowr(&emu, kfd, &me(), ioctl::AMDKFD_IOC_CREATE_EVENT, &ev).unwrap();
    let off = ev.event_page_offset;
    assert!(off < 1 << 62 && off % 4096 == 0, "events offset {off:#x}");
    let fd = emu.backing_fd(&NodeKind::Kfd);
    // SAFETY: a fresh shared read-only mapping of the emulator's memfd.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            off as i64,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let slot = |i: usize| {
        // SAFETY: i < 512, inside the 4096-byte mapping.
        unsafe { std::ptr::read_volatile((p as *const u64).wrapping_add(i)) }
    };
    assert_eq!(slot(ev.event_slot_index as usize), u64::MAX, "unsignaled");
    emu.release(kfd);
    assert_eq!(slot(ev.event_slot_index as usize), 0, "page not punched");
    // SAFETY: unmaps the mapping made above.
    unsafe { libc::munmap(p, 4096) };
}

/// CRIU_OP arguments over buffers the emulator may write (through
/// process_vm_writev), hence the mutable borrows.
fn criu_args(
    op: u32,
    devs: &mut [u8],
    bos: &mut [u8],
    blob: &mut [u8],
    n: (u32, u32, u32),
) -> Vec<u8> {
    let mut a = process_info();
    let size = blob.len() as u64;
    for (off, v) in [
        (0, devs.as_mut_ptr() as u64),
        (8, bos.as_mut_ptr() as u64),
        (16, blob.as_mut_ptr() as u64),
        (24, size),
    ] {
        a[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }
    for (off, v) in [(32, n.0), (36, n.1), (40, n.2), (48, op)] {
        a[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    a
}

/// CRIU's GPU remapping (spec D.4): a BO checkpointed on GPU 0 is restored
/// onto GPU 1, and the process keeps addressing it by its old gpu_id.
#[test]
fn restore_onto_swapped_gpus_keeps_user_gpu_ids() {
    let p = Profile::builtin("mi100x2").unwrap();
    let fds = Table::default();
    let emu = Emulator::new(&p, Box::new(fds.clone())).unwrap();
    let (g0, g1) = (&p.gpus()[0], &p.gpus()[1]);
    let (id0, id1) = (g0.gpu_id.0, g1.gpu_id.0);
    let kfd = emu.open(&NodeKind::Kfd, &me()).unwrap();
    for (fd, g) in [(900, g0), (901, g1)] {
        let r = emu
            .open(
                &NodeKind::Render {
                    minor: g.drm_render_minor.0,
                },
                &me(),
            )
            .unwrap();
        fds.insert(fd, r);
    }
    for (fd, id) in [(900, id0), (901, id1)] {
        let a = sys::kfd_ioctl_acquire_vm_args {
            drm_fd: fd,
            gpu_id: id,
        };
        call(
            &emu,
            kfd,
            &me(),
            ioctl::AMDKFD_IOC_ACQUIRE_VM,
            uapi::bytes(&a),
            0,
        )
        .unwrap();
    }
    let al = sys::kfd_ioctl_alloc_memory_of_gpu_args {
        va_addr: 0x1000_0000,
        size: 8192,
        gpu_id: id0,
        flags: sys::KFD_IOC_ALLOC_MEM_FLAGS_VRAM,
        ..Default::default()
    };
    let al = iowr(&emu, kfd, &me(), ioctl::AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &al).unwrap();
    assert_eq!(al.handle >> 32, id0 as u64);
    let available = |gpu_id| {
        let a = sys::kfd_ioctl_get_available_memory_args {
            gpu_id,
            ..Default::default()
        };
        let fh = KFD.with(|k| k.get());
        iowr(&emu, fh, &me(), ioctl::AMDKFD_IOC_AVAILABLE_MEMORY, &a)
            .unwrap()
            .available
    };
    KFD.with(|k| k.set(kfd));
    assert_eq!(available(id0), g0.vram_size - 8192);

    let crit = CRIU_CAPS & cap_eff(me().tid) != 0;
    if !crit {
        println!(
            "SKIPPED the CRIU_OP half of restore_onto_swapped_gpus_keeps_user_gpu_ids: \
             this run lacks CAP_CHECKPOINT_RESTORE/CAP_SYS_ADMIN (run as root)"
        );
        return;
    }
    let info = call(
        &emu,
        kfd,
        &me(),
        ioctl::AMDKFD_IOC_CRIU_OP,
        &process_info(),
        56,
    )
    .unwrap();
    let info: sys::kfd_ioctl_criu_args = uapi::decode(&info);
    let n = (info.num_devices, info.num_bos, info.num_objects);
    assert_eq!(n, (2, 1, 0));
    let mut devs = vec![0u8; 32];
    let mut bos = vec![0u8; 48];
    let mut blob = vec![0u8; info.priv_data_size as usize];
    let ck = criu_args(criu_op::CHECKPOINT, &mut devs, &mut bos, &mut blob, n);
    call(&emu, kfd, &me(), ioctl::AMDKFD_IOC_CRIU_OP, &ck, 56).unwrap();
    emu.release(kfd);

    // The restored process: GPU 0's work goes to GPU 1 and vice versa.
    let kfd = emu.open(&NodeKind::Kfd, &me()).unwrap();
    KFD.with(|k| k.set(kfd));
    let swap = [(id0, id1, 901u32), (id1, id0, 900)];
    for (i, (user, actual, fd)) in swap.into_iter().enumerate() {
        let d = sys::kfd_criu_device_bucket {
            user_gpu_id: user,
            actual_gpu_id: actual,
            drm_fd: fd,
            pad: 0,
        };
        devs[i * 16..i * 16 + 16].copy_from_slice(uapi::bytes(&d));
    }
    let rs = criu_args(criu_op::RESTORE, &mut devs, &mut bos, &mut blob, n);
    call(&emu, kfd, &me(), ioctl::AMDKFD_IOC_CRIU_OP, &rs, 56).unwrap();
    let b: sys::kfd_criu_bo_bucket = uapi::decode(&bos);
    // GPU 1's memfd had no BO yet, so its first range is the restored one.
    assert_eq!(b.restored_offset, 4 << 30);
    assert_eq!(b.gpu_id, id0);
    // Addressed by user id 0, accounted on actual GPU 1.
    assert_eq!(available(id0), g1.vram_size - 8192);
    assert_eq!(available(id1), g0.vram_size);
    let mut resume = process_info();
    resume[44..48].copy_from_slice(&std::process::id().to_le_bytes());
    resume[48..52].copy_from_slice(&criu_op::RESUME.to_le_bytes());
    call(&emu, kfd, &me(), ioctl::AMDKFD_IOC_CRIU_OP, &resume, 56).unwrap();
    let free = sys::kfd_ioctl_free_memory_of_gpu_args { handle: al.handle };
    call(
        &emu,
        kfd,
        &me(),
        ioctl::AMDKFD_IOC_FREE_MEMORY_OF_GPU,
        uapi::bytes(&free),
        0,
    )
    .unwrap();
    assert_eq!(available(id0), g1.vram_size);
}

thread_local! {
    static KFD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[test]
fn kfd_1_13_runtime_enable_and_dbg_trap_without_a_debugger() {
    use kfd_abi::layout::{kfd_ioctl_dbg_trap_args, kfd_ioctl_runtime_enable_args};
    let (emu, _) = emulator();
    let kfd = emu.open(&NodeKind::Kfd, &me()).unwrap();
    let enable = |mode_mask| {
        let a = kfd_ioctl_runtime_enable_args {
            r_debug: 0x1234_5000,
            mode_mask,
            capabilities_mask: 0,
        };
        iowr(&emu, kfd, &me(), ioctl::AMDKFD_IOC_RUNTIME_ENABLE, &a)
    };
    enable(3).unwrap();
    assert_eq!(enable(1).err(), Some(libc::EBUSY), "enabled twice");
    enable(0).unwrap();
    enable(0).unwrap();
    enable(1).unwrap();
    let trap = |pid, op| {
        let a = kfd_ioctl_dbg_trap_args {
            pid,
            op,
            args: [0; 3],
        };
        iowr(&emu, kfd, &me(), ioctl::AMDKFD_IOC_DBG_TRAP, &a).err()
    };
    // No KFD process of that pid; no session yet (any op but ENABLE).
    assert_eq!(trap(0x7fff_fff0, 1), Some(libc::ESRCH));
    assert_eq!(trap(me().tgid, 3), Some(libc::EINVAL));
    assert_eq!(trap(me().tgid, 6), Some(libc::EINVAL));
    // ENABLE needs its event fd (fd 2**31 - 1 is not open).
    let a = kfd_ioctl_dbg_trap_args {
        pid: me().tgid,
        op: 0,
        args: [0, 0, 0x7fff_ffff << 32],
    };
    assert_eq!(
        iowr(&emu, kfd, &me(), ioctl::AMDKFD_IOC_DBG_TRAP, &a).err(),
        Some(libc::EBADF)
    );
    emu.release(kfd);
}

#[test]
fn kfd_version_follows_the_profile() {
    let mut p = Profile::builtin("mi100").unwrap();
    p.kfd_minor_version = 11;
    let emu = Emulator::new(&p, Box::new(Table::default())).unwrap();
    let kfd = emu.open(&NodeKind::Kfd, &me()).unwrap();
    let v = call(&emu, kfd, &me(), ioctl::AMDKFD_IOC_GET_VERSION, &[], 8).unwrap();
    let g: sys::kfd_ioctl_get_version_args = uapi::decode(&v);
    assert_eq!((g.major_version, g.minor_version), (1, 11));
    // 1.11 has no EXPORT_DMABUF, RUNTIME_ENABLE or DBG_TRAP.
    for cmd in [
        ioctl::AMDKFD_IOC_EXPORT_DMABUF,
        ioctl::AMDKFD_IOC_RUNTIME_ENABLE,
        ioctl::AMDKFD_IOC_DBG_TRAP,
    ] {
        assert_eq!(call(&emu, kfd, &me(), cmd, &[0; 32], 32), Err(libc::ENOTTY));
    }
    emu.release(kfd);
    p.kfd_minor_version = 19;
    assert!(p.validate().is_err(), "1.19 is past Linux 6.18");
}
