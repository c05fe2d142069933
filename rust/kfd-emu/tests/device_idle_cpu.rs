//! The emulated GPU polls doorbells (shared mappings give no write
//! notification); this checks the poll backs off so an idle SDMA queue
//! costs little CPU.  Its own test binary, so process CPU time is the
//! emulator's alone.

use std::time::{Duration, Instant};

use kfd_emu::device::uapi::{alloc, kfd as nr, queue_type};
use kfd_emu::device::{Caller, Emulator, NodeKind};
use kfd_emu::profile::Profile;

mod model;
use model::{kfd_iowr, me, Table};

fn cpu_time() -> Duration {
    let mut ru: libc::rusage = unsafe_zeroed();
    // SAFETY: getrusage writes the local struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn unsafe_zeroed() -> libc::rusage {
    // SAFETY: rusage is plain integers; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

fn call(emu: &Emulator, fh: u64, c: &Caller, n: u32, input: &[u8]) -> Result<Vec<u8>, i32> {
    model::call(emu, fh, c, kfd_iowr(n, input.len()), input, input.len())
}

#[test]
fn idle_sdma_queue_costs_little_cpu() {
    let p = Profile::builtin("mi100").unwrap();
    let (gpu_id, minor) = (p.gpus()[0].gpu_id.0, p.gpus()[0].drm_render_minor.0);
    let fds = Table::default();
    let emu = Emulator::new(&p, Box::new(fds.clone())).unwrap();
    let me = me();
    let kfd = emu.open(&NodeKind::Kfd, &me).unwrap();
    let render = emu.open(&NodeKind::Render { minor }, &me).unwrap();
    fds.insert(900, render);
    let mut vm = [0u8; 8];
    vm[0..4].copy_from_slice(&900u32.to_le_bytes());
    vm[4..8].copy_from_slice(&gpu_id.to_le_bytes());
    call(&emu, kfd, &me, nr::ACQUIRE_VM, &vm).unwrap();
    let mut a = [0u8; 40];
    a[0..8].copy_from_slice(&0x1000_0000u64.to_le_bytes());
    a[8..16].copy_from_slice(&8192u64.to_le_bytes());
    a[32..36].copy_from_slice(&gpu_id.to_le_bytes());
    a[36..40].copy_from_slice(&alloc::GTT.to_le_bytes());
    call(&emu, kfd, &me, nr::ALLOC_MEMORY_OF_GPU, &a).unwrap();
    let mut q = [0u8; 88];
    q[0..8].copy_from_slice(&0x1000_0000u64.to_le_bytes());
    q[8..16].copy_from_slice(&0x1000_1008u64.to_le_bytes());
    q[16..24].copy_from_slice(&0x1000_1000u64.to_le_bytes());
    q[32..36].copy_from_slice(&4096u32.to_le_bytes());
    q[36..40].copy_from_slice(&gpu_id.to_le_bytes());
    q[40..44].copy_from_slice(&queue_type::SDMA.to_le_bytes());
    q[44..48].copy_from_slice(&100u32.to_le_bytes());
    call(&emu, kfd, &me, nr::CREATE_QUEUE, &q).unwrap();

    std::thread::sleep(Duration::from_millis(100));
    let (c0, t0) = (cpu_time(), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let (cpu, wall) = (cpu_time() - c0, t0.elapsed());
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    eprintln!(
        "idle SDMA queue: {cpu:?} CPU in {wall:?} ({:.2}% of a core)",
        share * 100.0
    );
    // The engine wakes about once a millisecond: 1.4% of a core on a quiet
    // machine, up to 5% measured with the other core saturated (each wake-up
    // then costs more). A spinning engine takes a whole core: 10% tells the
    // two apart without failing on a loaded machine.
    assert!(
        share < 0.10,
        "engine uses {:.1}% of a core while idle",
        share * 100.0
    );
    emu.shutdown();
}
