//! The device state machine: processes (KFD contexts), their per-GPU data,
//! BOs, queues, events and parked waits.  Pure state plus the memfd
//! backends; no knowledge of FUSE or of ioctl encodings.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use super::mem::{Mapping, Memfd};
use super::uapi::{self, alloc, kfd_off, queue_type};
use super::Replier;

pub mod bos;
pub mod gem;
pub mod idr;
pub mod svm;

/// A GPU as the emulator serves it (immutable after start).
pub struct Gpu {
    pub id: u32,
    pub minor: u32,
    pub vram_size: u64,
    pub vram_public: bool,
    pub max_sdma_queues: u32,
    /// SDMA engines, PCIe and XGMI (`sdma_engine_id` counts them).
    pub sdma_engines: u32,
    /// Global wave sync entries (0: the GPU has none).
    pub num_gws: u32,
    /// XNACK can be switched per process (GC 9.4.2 and later GFX9).
    pub per_process_xnack: bool,
    /// What the render node reports (AMDGPU_INFO).
    pub asic: super::asic::Asic,
    pub mem: Memfd,
    /// XCCs of the node: KFD keeps one compute MQD and control stack per XCC.
    pub num_xcc: u32,
    /// The control stack size of one XCC KFD computes for the node
    /// ([`kfd_abi::criu::ctl_stack_size`]), the most a queue's can be.
    pub ctl_stack_size: u32,
    /// The context save area size of one XCC KFD computes for the node
    /// ([`kfd_abi::criu::cwsr_size`]), the most a queue's can be.
    pub cwsr_size: u32,
}

impl Gpu {
    /// The GC IP version (major, minor, stepping) of the GPU (gfx90a is
    /// 9.0.10 as a target but GC 9.4.2).
    pub fn gc_version(&self) -> (u32, u32, u32) {
        let v = self.asic.gfx.hw;
        (v.0, v.1, v.2)
    }
}

pub struct Devices {
    pub gpus: Vec<Gpu>,
    pub kfd: Memfd,
    /// The dmabufs handed out for VRAM/GTT BOs (`kfd-emu supervise`).
    pub dmabufs: super::dmabuf::Registry,
    /// DRM_IOCTL_GEM_CHANGE_HANDLE works (`Profile::gem_change_handle`).
    pub gem_change_handle: bool,
    /// The KFD interface's minor version (the profile's).
    pub kfd_minor: u32,
}

impl Devices {
    pub fn index_of(&self, gpu_id: u32) -> Option<usize> {
        self.gpus.iter().position(|g| g.id == gpu_id)
    }
}

/// What an emulated open is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Open {
    /// A /dev/kfd open bound to the context of process `lead`.
    Kfd { lead: u32 },
    /// A render node open of GPU index `gpu`; `authenticated` as the
    /// kernel's drm_file (its opener had CAP_SYS_ADMIN).
    Render { gpu: usize, authenticated: bool },
}

impl Open {
    /// The GPU index of a render node open.
    pub fn render_gpu(&self) -> Option<usize> {
        match *self {
            Open::Render { gpu, .. } => Some(gpu),
            Open::Kfd { .. } => None,
        }
    }
}

/// Memory use of one GPU, read from the state when a query needs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub vram: u64,
    pub visible_vram: u64,
    pub gtt: u64,
}

/// A reply and the answer to give it.
pub type Answer = (Box<dyn Replier>, Result<Vec<u8>, i32>);

/// Replies to send once the state lock is released.
pub type Done = Vec<Answer>;

pub type R<T> = Result<T, i32>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BoKey {
    pub gpu: usize,
    pub idr: u32,
}

pub struct Bo {
    pub va: u64,
    pub size: u64,
    pub flags: u32,
    /// mmap offset: render memfd range (VRAM/GTT), kfd memfd offset
    /// (DOORBELL/MMIO), the CPU address (USERPTR).
    pub offset: u64,
    pub user_addr: u64,
    /// The daemon's view of VRAM/GTT contents.
    pub map: Option<Arc<Mapping>>,
    /// GPU indices this BO is mapped on.
    pub mapped: BTreeSet<usize>,
    /// An import of another BO's dma-buf (IMPORT_DMABUF): its memory is
    /// that BO's (`offset` and `map` are the exporter's), which freeing
    /// the import leaves alone.
    pub imported: bool,
}

impl Bo {
    pub fn mem_type(&self) -> u32 {
        self.flags & alloc::TYPE_MASK
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queue {
    pub gpu: usize,
    pub qtype: u32,
    pub ring_base: u64,
    pub ring_size: u32,
    pub rptr_addr: u64,
    pub wptr_addr: u64,
    pub percent: u32,
    pub priority: u32,
    pub eop_addr: u64,
    pub eop_size: u64,
    pub ctx_addr: u64,
    pub ctx_size: u32,
    pub ctl_stack_size: u32,
    /// Byte offset of this queue's doorbell inside its pdd's doorbell slice.
    pub doorbell_index: u32,
    pub sdma_id: u32,
    /// Emulated read pointer (bytes, monotonic like the hardware's).
    pub rptr: u64,
    /// Set when the engine met a packet it cannot execute.
    pub halted: bool,
    /// SET_CU_MASK's mask (empty: all CUs).
    pub cu_mask: Vec<u32>,
    /// The AQL packet processor's view of a COMPUTE_AQL queue.
    pub aql: AqlState,
    /// What the SDMA engine keeps between passes (not checkpointed).
    pub engine: EngineState,
}

/// An SDMA queue's engine state between passes.  A checkpoint does not carry
/// it: a restored queue starts the packet at its read pointer afresh.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineState {
    /// The packet at read pointer `.0` (a POLL_REGMEM, or an ATOMIC that
    /// loops) found its condition false in `.1` passes so far.
    pub waiting: Option<(u64, u32)>,
    /// TIMESTAMP_SET: the engine's local counter minus the GPU clock
    /// (wrapping).
    pub local_ts: u64,
}

/// What the packet processor keeps of a queue between passes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AqlState {
    /// The doorbell value at the last look; the queue is looked at again
    /// when it changes, or while `waiting`.
    pub doorbell: Option<u64>,
    /// A packet is pending: its header is not written yet, a barrier
    /// waits for its dependencies, or the queue waits for scratch.
    pub waiting: bool,
    /// The dispatch at the read pointer runs on the shader engine.
    pub running: bool,
    /// The dispatch at the read pointer waits for the runtime to grow the
    /// queue's scratch (queue error 1 raised, `queue_inactive_signal` not
    /// yet back to 0).
    pub scratch_wait: bool,
    /// The control stacks of the dispatch at the read pointer, one per
    /// XCC of the GPU, whose waves are in the queue's context save area
    /// (an eviction saved them): the CP's companion pages of each XCC's
    /// MQD, which CHECKPOINT returns and RESTORE writes back.  Empty: none.
    pub saved: Vec<Vec<u8>>,
    /// The packet whose start the CP stamped on its completion signal.
    pub started: Option<u64>,
}

impl Queue {
    /// Whether the queue's own properties let the scheduler map it (KFD's
    /// QUEUE_IS_ACTIVE without the process' eviction): a ring, its base
    /// and a non-zero share.  UPDATE_QUEUE unmaps a queue by clearing one.
    pub fn is_mappable(&self) -> bool {
        self.ring_size > 0 && self.ring_base != 0 && self.percent > 0
    }

    pub fn is_sdma(&self) -> bool {
        matches!(
            self.qtype,
            queue_type::SDMA | queue_type::SDMA_XGMI | queue_type::SDMA_BY_ENG_ID
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub etype: u32,
    pub auto_reset: bool,
    pub signaled: bool,
    pub node_id: u32,
    pub trigger_data: u32,
    /// What a memory event reports to its waiter.
    pub exception: MemoryException,
    /// KFD 1.14's event age: how often the event was signalled, from 1
    /// (0 means "no age" to WAIT_EVENTS and is never reached).
    pub age: u64,
}

/// What RUNTIME_ENABLE and DBG_TRAP ENABLE set (`kfd_runtime_info`, and
/// whether a debug session is open).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeState {
    pub enabled: bool,
    pub r_debug: u64,
    pub ttmp_setup: bool,
    pub debug_session: bool,
}

/// A new event's age (`kfd_event_init`... sets it to 1: 0 is reserved).
pub const FIRST_EVENT_AGE: u64 = 1;

/// A memory event's exception data (KFD's `kfd_hsa_memory_exception_data`,
/// which the ABI layer encodes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemoryException {
    /// Nothing happened yet (all zero).
    #[default]
    None,
    /// A GPU page fault: page not present at `page` on the GPU the process
    /// calls `gpu_id`.
    NotPresent { page: u64, gpu_id: u32 },
    /// Restored from a CRIU image: KFD's bytes, carried as they were.
    Saved([u8; 32]),
}

/// How a parked WAIT_EVENTS ends (KFD's `wait_result`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fired {
    /// A memory event's exception data.
    Memory(MemoryException),
    /// A signal event's age, to a waiter that passed one (KFD 1.14).
    Age(u64),
}

pub enum WaitEnd {
    /// The wait's condition holds; what the fired events report, by
    /// position in the caller's list.
    Complete(Vec<(usize, Fired)>),
    Timeout,
    /// An event of the wait was destroyed.
    Fail,
}

/// The ABI side of a parked wait: it turns the wait's end into the
/// caller's answer (the state machine knows no ioctl encoding).
pub trait WaitReply: Send {
    fn answer(self: Box<Self>, end: R<WaitEnd>) -> Answer;
    /// The transport's id of the request (see [`Replier::request_id`]).
    fn request_id(&self) -> Option<u64>;
}

pub struct SignalPage {
    pub map: Arc<Mapping>,
    /// BO handle when user space supplied the page (dGPU flow).
    pub handle: Option<u64>,
}

pub struct Waiter {
    pub tid: u32,
    pub events: Vec<(u32, bool)>,
    /// Per event: whether the caller passed a last event age (KFD 1.14),
    /// so that the event's age is written back when it fired.
    pub aged: Vec<bool>,
    pub all: bool,
    pub deadline: Option<Instant>,
    pub reply: Box<dyn WaitReply>,
}

impl Waiter {
    fn satisfied(&self) -> bool {
        if self.all {
            self.events.iter().all(|e| e.1)
        } else {
            self.events.iter().any(|e| e.1)
        }
    }
    pub fn finish(self, end: R<WaitEnd>) -> Answer {
        self.reply.answer(end)
    }

    /// Completes the wait as KFD does: the exception data of each memory
    /// event that fired goes to the caller (copy_signaled_event_data).
    pub fn complete(self, events: &BTreeMap<u32, Event>) -> Answer {
        let fired = self
            .events
            .iter()
            .enumerate()
            .filter_map(|(i, (id, active))| {
                let e = events.get(id).filter(|_| *active)?;
                match e.etype {
                    uapi::event_type::MEMORY => Some((i, Fired::Memory(e.exception))),
                    uapi::event_type::SIGNAL if self.aged[i] => Some((i, Fired::Age(e.age))),
                    _ => None,
                }
            })
            .collect();
        self.finish(Ok(WaitEnd::Complete(fired)))
    }
}

/// The start of a resolved GPU VA range: usable without the state lock
/// (the `Arc` keeps a VRAM/GTT mapping alive; a USERPTR range is the
/// process' memory, EFAULT once it is gone).
pub enum Span {
    /// Offset into a VRAM/GTT BO's daemon mapping.
    Map(Arc<Mapping>, u64),
    /// CPU address in process `pid` (USERPTR).
    User(u32, u64),
}

impl Span {
    /// The span `off` bytes further.
    pub fn at(&self, off: u64) -> Span {
        match self {
            Span::Map(m, o) => Span::Map(m.clone(), o + off),
            Span::User(pid, a) => Span::User(*pid, a + off),
        }
    }

    pub fn read(&self, buf: &mut [u8]) -> bool {
        match self {
            Span::Map(m, off) => m.read(*off, buf),
            Span::User(pid, addr) => super::mem::user_read(*pid, *addr, buf).is_ok(),
        }
    }

    pub fn write(&self, data: &[u8]) -> bool {
        match self {
            Span::Map(m, off) => m.write(*off, data),
            Span::User(pid, addr) => super::mem::user_write(*pid, *addr, data).is_ok(),
        }
    }
}

/// SET_MEMORY_POLICY's arguments as KFD keeps them in the qpd: the cache
/// policies (0 coherent, 1 non-coherent) and the APE1 aperture, in 64 KiB
/// units (`base > limit`: no APE1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemPolicy {
    pub default: u32,
    pub alternate: u32,
    pub ape1_base: u64,
    pub ape1_limit: u64,
}

/// Per-process-device state (KFD's `kfd_process_device` and its `qpd`).
///
/// `scratch_va`, `trap` and `mem_policy` are what KFD keeps per pdd and
/// programs into the queues' hardware state; KFD's CRIU checkpoint does not
/// carry them (its device record is a reserved word), so neither does ours:
/// a restored process has them unset until it sets them again, as on KFD.
pub struct Pdd {
    pub user_id: u32,
    /// KFD created no pdd for this GPU: the device cgroup of the process
    /// that opened /dev/kfd denies the GPU's render node.  The entry only
    /// keeps `pdds` indexed by GPU; no ioctl finds it, and CRIU's device
    /// lists leave it out.
    pub denied: bool,
    /// The render-node open whose VM this pdd adopted.
    pub vm: Option<u64>,
    pub doorbells: Option<Mapping>,
    /// SET_SCRATCH_BACKING_VA: SH_HIDDEN_PRIVATE_BASE (the scratch backing
    /// VA >> 16 as the caller passes it).
    pub scratch_va: Option<u64>,
    /// SET_TRAP_HANDLER: (TBA, TMA) of the second-level trap handler.
    pub trap: Option<(u64, u64)>,
    pub mem_policy: Option<MemPolicy>,
    /// ALLOC_QUEUE_GWS: the queue the GPU's global wave sync is bound to
    /// (one per process and GPU).
    pub gws_queue: Option<u32>,
}

pub struct Proc {
    pub lead: u32,
    /// The start time of the process `lead` named when it opened
    /// /dev/kfd (`/proc/PID/stat` field 22; None if it could not be
    /// read): KFD's process is the mm's, so a later process with the same
    /// pid is another one (see [`State::stale`]).
    pub start: Option<u64>,
    /// Names the process in its /dev/kfd mmap offsets (see
    /// `uapi::kfd_off`).
    pub slot: u32,
    /// An offset naming `slot` went to user space (CREATE_QUEUE's
    /// doorbell, a DOORBELL or MMIO BO, CREATE_EVENT's events page), or
    /// the process was restored into it: the slot is the process' own for
    /// good (see [`State::claim_slot`]).
    pub slot_pinned: bool,
    pub kfd_opens: usize,
    pub pdds: Vec<Pdd>,
    pub bos: bos::Bos,
    pub queues: BTreeMap<u32, Queue>,
    pub events: BTreeMap<u32, Event>,
    pub signal_page: Option<SignalPage>,
    pub waiters: Vec<Waiter>,
    /// Queues evicted for a checkpoint (PROCESS_INFO .. UNPAUSE).
    pub paused: bool,
    /// CRIU-restored and not yet resumed: queues stay evicted.
    pub restore_pending: bool,
    pub xnack: bool,
    /// RUNTIME_ENABLE's and DBG_TRAP's state (KFD 1.13).
    pub runtime: RuntimeState,
    /// SVM ranges and their attributes (AMDKFD_IOC_SVM).
    pub svm: svm::Svm,
}

impl Proc {
    pub fn evicted(&self) -> bool {
        self.paused || self.restore_pending
    }

    pub fn pdd_by_user_id(&self, id: u32) -> Option<usize> {
        self.pdds.iter().position(|p| p.user_id == id && !p.denied)
    }

    /// The GPU indices this process has a pdd for, in GPU order.
    pub fn present(&self) -> impl Iterator<Item = (usize, &Pdd)> + '_ {
        self.pdds.iter().enumerate().filter(|(_, d)| !d.denied)
    }

    /// How many GPUs the process has a pdd for (KFD's `n_pdds`).
    pub fn n_pdds(&self) -> usize {
        self.present().count()
    }

    pub fn handle(&self, key: BoKey) -> u64 {
        ((self.pdds[key.gpu].user_id as u64) << 32) | key.idr as u64
    }

    pub fn key_of_handle(&self, handle: u64) -> R<BoKey> {
        let gpu = self
            .pdd_by_user_id((handle >> 32) as u32)
            .ok_or(libc::EINVAL)?;
        let key = BoKey {
            gpu,
            idr: handle as u32,
        };
        if !self.bos.contains_key(&key) {
            return Err(libc::EINVAL);
        }
        Ok(key)
    }

    /// Signals event `id` (SET_EVENT, or the interrupt path).
    pub fn signal(&mut self, id: u32, done: &mut Done) {
        let Some(ev) = self.events.get_mut(&id) else {
            return;
        };
        // set_event: the age never wraps back to 0 (no age) or 1.
        ev.age = match ev.age.wrapping_add(1) {
            0 => 2,
            a => a,
        };
        let mut had_waiters = false;
        for w in &mut self.waiters {
            for e in &mut w.events {
                if e.0 == id {
                    e.1 = true;
                    had_waiters = true;
                }
            }
        }
        ev.signaled = !ev.auto_reset || !had_waiters;
        self.complete_waiters(done);
    }

    fn complete_waiters(&mut self, done: &mut Done) {
        let mut i = 0;
        while i < self.waiters.len() {
            if self.waiters[i].satisfied() {
                done.push(self.waiters.swap_remove(i).complete(&self.events));
            } else {
                i += 1;
            }
        }
    }

    /// Answers waits whose timeout passed; returns the next deadline.
    pub fn expire_waiters(&mut self, now: Instant, done: &mut Done) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut i = 0;
        while i < self.waiters.len() {
            match self.waiters[i].deadline {
                Some(d) if d <= now => {
                    done.push(self.waiters.swap_remove(i).finish(Ok(WaitEnd::Timeout)));
                    continue;
                }
                Some(d) => next = Some(next.map_or(d, |n| n.min(d))),
                None => {}
            }
            i += 1;
        }
        next
    }

    /// The SDMA TRAP interrupt with context id `ctx`, as KFD handles it
    /// (kfd_signal_event_interrupt with 28 valid id bits).  When the slot
    /// of event `ctx` on the signal page was written (the mailbox write
    /// before the TRAP), that event alone is signalled.  Otherwise the
    /// context id is taken as invalid and every signal event whose slot
    /// was written is.  Signalled events' slots are re-armed.  An event
    /// whose slot nobody wrote is never signalled.
    pub fn trap(&mut self, ctx: u32, done: &mut Done) {
        let Some(page) = &self.signal_page else {
            return;
        };
        let slots = (page.map.len() / 8).min(uapi::SIGNAL_EVENT_LIMIT as u64);
        let written = |id: u32| {
            (id as u64) < slots
                && page
                    .map
                    .read_u64(id as u64 * 8)
                    .is_some_and(|v| v != uapi::UNSIGNALED_SLOT)
        };
        let gpu_signalled =
            |e: &Event| e.etype == uapi::event_type::SIGNAL || e.etype == uapi::event_type::DEBUG;
        let hit: Vec<u32> = match self.events.get(&ctx) {
            Some(e) if written(ctx) => {
                if gpu_signalled(e) {
                    vec![ctx]
                } else {
                    Vec::new()
                }
            }
            _ => self
                .events
                .iter()
                .filter(|(&id, e)| gpu_signalled(e) && written(id))
                .map(|(&id, _)| id)
                .collect(),
        };
        for &id in &hit {
            page.map.write_u64(id as u64 * 8, uapi::UNSIGNALED_SLOT);
        }
        for id in hit {
            self.signal(id, done);
        }
    }

    /// A GPU page fault of the process on GPU index `gpu` at `va` (an
    /// engine access outside the GPU's VM), as KFD reports one
    /// (kfd_signal_vm_fault_event): every memory event of the process gets
    /// the fault as its exception data (page not present, the faulting
    /// page, the GPU's id) and is signalled.  ROCr's handler prints "Memory
    /// access fault by GPU node-N" and aborts.
    pub fn vm_fault(&mut self, gpu: usize, va: u64, done: &mut Done) {
        let fault = MemoryException::NotPresent {
            page: va & !(uapi::PAGE - 1),
            gpu_id: self.pdds[gpu].user_id,
        };
        let ids: Vec<u32> = self
            .events
            .iter()
            .filter(|(_, e)| e.etype == uapi::event_type::MEMORY)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.events.get_mut(&id).expect("listed above").exception = fault;
            self.signal(id, done);
        }
    }

    /// Whether anything of the process depends on its slot: offsets user
    /// space may have mapped, or daemon state in the slot's ranges.
    pub fn slot_bound(&self) -> bool {
        self.slot_pinned
            || !self.queues.is_empty()
            || self
                .signal_page
                .as_ref()
                .is_some_and(|s| s.handle.is_none())
            || self
                .bos
                .values()
                .any(|b| matches!(b.mem_type(), alloc::DOORBELL | alloc::MMIO_REMAP))
    }

    pub fn doorbell_offset(&self, gpu: usize, index: u32) -> u64 {
        kfd_off::encode(kfd_off::DOORBELL, self.slot, gpu, index as u64 * 8)
    }
}

pub struct GpuAlloc {
    pub vram_used: u64,
    pub next_offset: u64,
}

pub struct State {
    pub devs: Arc<Devices>,
    pub opens: HashMap<u64, Open>,
    pub next_fh: u64,
    pub procs: HashMap<u32, Proc>,
    pub gpu_alloc: Vec<GpuAlloc>,
    /// The process whose SDMA packets the engine is executing outside the
    /// lock (see `sdma`).  Ioctls that would pull memory or queues from
    /// under it wait until it is None again.
    pub sdma_busy: Option<u32>,
    /// Where the search for a free slot starts (see `free_slot`).
    next_slot: u32,
    /// What each render-node open holds (GEM objects, VM, contexts).
    pub render: HashMap<u64, gem::RenderFile>,
    /// The GEM_CREATE BOs by (GPU, render-memfd offset), while a handle,
    /// BO list or dma-buf keeps them (see [`State::sweep_gem`]).
    gem_bos: HashMap<(usize, u64), GemBo>,
    /// The BOs of `gem_bos` whose last reference went since the last
    /// [`State::sweep_gem`].
    gem_released: gem::Released,
    /// Bytes of the GTT BOs of `gem_bos` per GPU, kept as they come and
    /// go (the live sysfs files read it after every allocation).
    gem_gtt: Vec<u64>,
    /// GPU resets per GPU (hung IBs and injected resets).
    pub resets: Vec<u64>,
    /// Render-memfd ranges of freed BOs (GPU, offset, bytes) whose pages
    /// go back after the lock is dropped ([`State::take_freed`]).
    freed: Vec<(usize, u64, u64)>,
    /// Processes ended since [`State::take_ended`] (their engine counts
    /// go with them).
    ended: Vec<u32>,
}

/// A GEM_CREATE BO as the device knows it.
struct GemBo {
    obj: std::sync::Weak<gem::GemObj>,
    size: u64,
    vram: bool,
}

/// How [`State::claim_slot`] moved a process, for undoing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotMove {
    pub lead: u32,
    /// The slot the process had.
    pub from: u32,
    /// The slot it has now.
    pub to: u32,
    /// The process that held `to` and got `from` in exchange.
    pub swapped: Option<u32>,
}

pub fn page_align(v: u64) -> Option<u64> {
    v.checked_add(uapi::PAGE - 1).map(|x| x & !(uapi::PAGE - 1))
}

impl State {
    pub fn new(devs: Arc<Devices>) -> State {
        let gpus = devs.gpus.len();
        let gpu_alloc = devs
            .gpus
            .iter()
            .map(|_| GpuAlloc {
                vram_used: 0,
                next_offset: uapi::RENDER_OFFSET_BASE,
            })
            .collect();
        State {
            devs,
            opens: HashMap::new(),
            next_fh: 1,
            procs: HashMap::new(),
            gpu_alloc,
            sdma_busy: None,
            next_slot: 1,
            render: HashMap::new(),
            gem_bos: HashMap::new(),
            gem_released: Default::default(),
            gem_gtt: vec![0; gpus],
            resets: vec![0; gpus],
            freed: Vec::new(),
            ended: Vec::new(),
        }
    }

    /// A slot for a new process: the first free one from `next_slot` on,
    /// round robin like pids.  A slot freed by a process that exits is not
    /// handed out again soon, so it is still free when the process is
    /// restored and claims it back (`claim_slot`).
    fn free_slot(&mut self) -> R<u32> {
        let used: BTreeSet<u32> = self.procs.values().map(|p| p.slot).collect();
        let slot = (self.next_slot..=kfd_off::MAX_SLOT)
            .chain(1..self.next_slot)
            .find(|s| !used.contains(s))
            .ok_or(libc::ENOMEM)?;
        self.next_slot = slot % kfd_off::MAX_SLOT + 1;
        Ok(slot)
    }

    /// Whether the process of `tgid` here is not the one that started at
    /// `start`: that one exited and the release of its /dev/kfd has not
    /// arrived yet (FUSE sends it asynchronously), while a new process
    /// with its pid (a restore's, say) opens /dev/kfd.
    pub fn stale(&self, tgid: u32, start: Option<u64>) -> bool {
        self.procs.get(&tgid).is_some_and(|p| p.start != start)
    }

    /// Ends the stale process of `tgid` (see [`State::stale`]) as its last
    /// release would, and forgets its opens, so that their late releases
    /// find nothing.
    pub fn end_stale(&mut self, tgid: u32) -> Done {
        let mut done = Done::new();
        self.opens
            .retain(|_, o| !matches!(o, Open::Kfd { lead } if *lead == tgid));
        self.end_proc(tgid, &mut done);
        done
    }

    pub fn open_kfd(&mut self, tgid: u32, start: Option<u64>) -> R<u64> {
        if !self.procs.contains_key(&tgid) {
            let slot = self.free_slot()?;
            // kfd_init_apertures: a pdd for every GPU the opener's device
            // cgroup lets it read and write the render node of.
            let list = super::devcgroup::devices_list(tgid);
            let pdds = self
                .devs
                .gpus
                .iter()
                .map(|g| Pdd {
                    user_id: g.id,
                    denied: list
                        .as_deref()
                        .is_some_and(|l| !super::devcgroup::list_allows(l, g.minor)),
                    vm: None,
                    doorbells: None,
                    scratch_va: None,
                    trap: None,
                    mem_policy: None,
                    gws_queue: None,
                })
                .collect();
            self.procs.insert(
                tgid,
                Proc {
                    lead: tgid,
                    start,
                    slot,
                    slot_pinned: false,
                    kfd_opens: 0,
                    pdds,
                    bos: Default::default(),
                    queues: BTreeMap::new(),
                    events: BTreeMap::new(),
                    signal_page: None,
                    waiters: Vec::new(),
                    paused: false,
                    restore_pending: false,
                    xnack: false,
                    runtime: RuntimeState::default(),
                    svm: Default::default(),
                },
            );
        }
        self.procs.get_mut(&tgid).unwrap().kfd_opens += 1;
        Ok(self.new_fh(Open::Kfd { lead: tgid }))
    }

    pub fn open_render(&mut self, gpu: usize, authenticated: bool) -> u64 {
        let fh = self.new_fh(Open::Render { gpu, authenticated });
        self.render.insert(fh, gem::RenderFile::new(gpu));
        fh
    }

    /// VRAM, CPU-visible VRAM and GTT in use on `gpu`: VRAM BOs, and the
    /// system memory BOs (GTT and userptr) its page tables map.
    pub fn usage(&self, gpu: usize) -> Usage {
        let vram = self.gpu_alloc[gpu].vram_used;
        let gtt = self.gem_gtt[gpu]
            + self
                .procs
                .values()
                .map(|p| p.bos.bytes_on(gpu).sysmem)
                .sum::<u64>();
        Usage {
            vram,
            // Small-BAR boards refuse host-visible VRAM (ALLOC_MEMORY).
            visible_vram: if self.devs.gpus[gpu].vram_public {
                vram
            } else {
                0
            },
            gtt,
        }
    }

    fn new_fh(&mut self, o: Open) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.opens.insert(fh, o);
        fh
    }

    /// Drops an open; the last /dev/kfd open of a process frees its
    /// context, VRAM and queues.
    pub fn release(&mut self, fh: u64) -> Done {
        let mut done = Done::new();
        match self.opens.remove(&fh) {
            Some(Open::Kfd { lead }) => {
                let last = self.procs.get_mut(&lead).map(|p| {
                    p.kfd_opens -= 1;
                    p.kfd_opens == 0
                });
                if last == Some(true) {
                    self.end_proc(lead, &mut done);
                }
            }
            Some(Open::Render { .. }) => {
                // Its GEM handles, mappings, contexts and lists go.
                self.render.remove(&fh);
                self.sweep_gem();
                // A VM whose render file is gone cannot be used again; the
                // kernel keeps the drm_file alive through the pdd instead.
            }
            None => {}
        }
        done
    }

    /// Frees the context, VRAM and queues of process `lead`.
    fn end_proc(&mut self, lead: u32, done: &mut Done) {
        let Some(p) = self.procs.remove(&lead) else {
            return;
        };
        for w in p.waiters {
            done.push(w.finish(Err(libc::EINTR)));
        }
        for (k, bo) in &p.bos {
            self.free_bo_memory(k.gpu, bo);
        }
        // The slot is reused by a later process: give its doorbell, signal
        // and MMIO pages back now.
        self.punch_slot(p.slot);
        self.ended.push(lead);
    }

    /// Zeroes the doorbell, events and MMIO ranges of `slot`.
    fn punch_slot(&self, slot: u32) {
        for ty in [kfd_off::DOORBELL, kfd_off::EVENTS, kfd_off::MMIO] {
            let base = kfd_off::encode(ty, slot, 0, 0);
            self.devs.kfd.punch(base, kfd_off::SLOT_SPAN);
        }
    }

    /// Gives process `lead` slot `slot` and drops its daemon mappings of
    /// the old one (the doorbells are mapped again on first use).  Only for
    /// processes of which nothing depends on their slot.
    fn set_slot(&mut self, lead: u32, slot: u32) {
        let p = self.procs.get_mut(&lead).unwrap();
        debug_assert!(!p.slot_pinned && p.queues.is_empty());
        p.slot = slot;
        for d in &mut p.pdds {
            d.doorbells = None;
        }
    }

    /// CRIU RESTORE: moves process `lead` to `slot`, the one its image
    /// recorded, so that the /dev/kfd offsets it had mapped before the
    /// checkpoint name its own doorbells and events page again (KFD finds
    /// the process at mmap time; the emulator can only keep the offsets
    /// valid).  A free slot is taken.  A slot held by a process of which
    /// nothing depends on it yet (typically another restore target that
    /// has only opened /dev/kfd) is swapped with it.  Anything else is
    /// EBUSY, logged, with no state changed; so is a restoring process
    /// that already handed out offsets of its own slot.  Both slots start
    /// zeroed, as a fresh one does.
    pub fn claim_slot(&mut self, lead: u32, slot: u32) -> R<Option<SlotMove>> {
        let p = self.procs.get(&lead).ok_or(libc::ESRCH)?;
        let from = p.slot;
        if from == slot {
            return Ok(None);
        }
        if p.slot_bound() {
            log::warn!(
                "RESTORE of process {lead}: its image needs /dev/kfd slot {slot}, but \
                 it already handed out mmap offsets of its slot {from}: EBUSY"
            );
            return Err(libc::EBUSY);
        }
        let holder = self
            .procs
            .values()
            .find(|q| q.slot == slot)
            .map(|q| (q.lead, q.slot_bound()));
        if let Some((other, true)) = holder {
            log::warn!(
                "RESTORE of process {lead}: /dev/kfd slot {slot}, which its image \
                 records (its doorbell and events mmap offsets name it), belongs to process \
                 {other}, which uses it: EBUSY"
            );
            return Err(libc::EBUSY);
        }
        let swapped = holder.map(|h| h.0);
        self.set_slot(lead, slot);
        if let Some(other) = swapped {
            self.set_slot(other, from);
        }
        self.punch_slot(slot);
        self.punch_slot(from);
        log::info!(
            "RESTORE of process {lead}: moved from /dev/kfd slot {from} to its \
             image's slot {slot}{}",
            swapped.map_or(String::new(), |o| format!(
                " (process {o} gets slot {from})"
            ))
        );
        Ok(Some(SlotMove {
            lead,
            from,
            to: slot,
            swapped,
        }))
    }

    /// Undoes [`State::claim_slot`] after a failed RESTORE (which left
    /// nothing in the process that depends on the slot).
    pub fn undo_slot_move(&mut self, m: SlotMove) {
        self.set_slot(m.lead, m.from);
        if let Some(other) = m.swapped {
            self.set_slot(other, m.to);
        }
        self.punch_slot(m.to);
        self.punch_slot(m.from);
    }

    /// `drm_gem_mmap`'s checks of an mmap of `len` bytes at `offset`
    /// through render open `fh`: the offset must be where a VRAM or GTT BO
    /// of the GPU starts and the mapping must fit in it (EINVAL), and the
    /// BO's `vma_node` must admit the file (EACCES): the file whose VM the
    /// BO's process adopted when the BO was made (ACQUIRE_VM, or CRIU
    /// RESTORE's `drm_fd`: `drm_vma_node_allow` at allocation), or a file
    /// holding a GEM handle of it (a PRIME import); a BO several processes
    /// hold (an IMPORT_DMABUF keeps the exporter's offset) admits the file
    /// of any of them, as its one `vma_node` does.  KFD makes none of its
    /// BOs `NO_CPU_ACCESS` (VRAM without the PUBLIC flag only lacks
    /// CPU_ACCESS_REQUIRED: what lies past the visible BAR faults when
    /// touched), so `amdgpu_gem_object_mmap` refuses none of them:
    /// libhsakmt maps every VRAM BO it allocates, PROT_NONE when the host
    /// may not access it.
    pub fn render_mmap(&self, fh: u64, offset: u64, len: u64) -> R<()> {
        let Some(Open::Render { gpu, .. }) = self.opens.get(&fh).copied() else {
            return Err(libc::EBADF);
        };
        let pages = len.div_ceil(uapi::PAGE);
        // Every KFD holder of the BO: its allocator and the processes
        // that imported it (IMPORT_DMABUF keeps the exporter's offset).
        let holders: Vec<_> = self
            .procs
            .values()
            .filter_map(|p| p.bos.at_offset(gpu, offset).map(|(_, b)| (p, b)))
            .collect();
        let Some(&(_, bo)) = holders.first() else {
            return self.gem_mmap(fh, gpu, offset, pages);
        };
        if bo.size.div_ceil(uapi::PAGE) < pages {
            return Err(libc::EINVAL);
        }
        let allowed = |(p, b): &(&Proc, &Bo)| {
            p.pdds.get(gpu).and_then(|d| d.vm) == Some(fh)
                || b.map
                    .as_ref()
                    .zip(self.render.get(&fh))
                    .is_some_and(|(m, f)| f.holds(m))
        };
        if !holders.iter().any(allowed) {
            return Err(libc::EACCES);
        }
        Ok(())
    }

    /// [`State::render_mmap`] of a GEM_CREATE BO: the file must hold a
    /// handle of it (EACCES), the mapping fit (EINVAL), and the BO have
    /// CPU access (EPERM).
    fn gem_mmap(&self, fh: u64, gpu: usize, offset: u64, pages: u64) -> R<()> {
        let Some(b) = self.gem_bos.get(&(gpu, offset)) else {
            return Err(libc::EINVAL);
        };
        let Some(obj) = self.render.get(&fh).and_then(|f| f.object_at(offset)) else {
            return Err(libc::EACCES);
        };
        if b.size.div_ceil(uapi::PAGE) < pages {
            return Err(libc::EINVAL);
        }
        let no_cpu = u64::from(uapi::sys::AMDGPU_GEM_CREATE_NO_CPU_ACCESS);
        if obj.info().flags & no_cpu != 0 {
            return Err(libc::EPERM);
        }
        Ok(())
    }

    /// GEM_CREATE on GPU `gpu`: the BO, in VRAM when the plan wants it
    /// and it fits (else GTT, where the plan allows it: ENOMEM).
    pub fn gem_create(&mut self, gpu: usize, plan: &gem::CreatePlan) -> R<Arc<gem::GemObj>> {
        let mut placed = None;
        if plan.wants_vram() {
            match self.reserve(gpu, alloc::VRAM, plan.size) {
                Ok(r) => placed = Some((r, true)),
                Err(libc::ENOMEM) if plan.gtt_fallback() => {}
                Err(e) => return Err(e),
            }
        }
        let ((offset, map), vram) = match placed {
            Some(p) => p,
            None => (self.reserve(gpu, alloc::GTT, plan.size)?, false),
        };
        let domain = if vram {
            uapi::sys::AMDGPU_GEM_DOMAIN_VRAM
        } else {
            uapi::sys::AMDGPU_GEM_DOMAIN_GTT
        };
        let source = super::dmabuf::Source {
            gpu,
            offset,
            domain,
        };
        let info = gem::BoInfo {
            domains: plan.domains,
            flags: plan.flags,
            align_pages: plan.align_pages,
            ..Default::default()
        };
        let obj = Arc::new(
            gem::GemObj::new(gem::GemKind::Bo { source, map }, plan.size, info)
                .noting_release(self.gem_released.clone()),
        );
        if !vram {
            self.gem_gtt[gpu] += plan.size;
        }
        self.gem_bos.insert(
            (gpu, offset),
            GemBo {
                obj: Arc::downgrade(&obj),
                size: plan.size,
                vram,
            },
        );
        Ok(obj)
    }

    /// The GEM_CREATE BO at render-memfd `offset` of GPU `gpu`, if it
    /// lives.
    pub fn gem_bo(&self, gpu: usize, offset: u64) -> Option<Arc<gem::GemObj>> {
        self.gem_bos.get(&(gpu, offset))?.obj.upgrade()
    }

    /// Frees the GEM_CREATE BOs nothing refers to any more (no handle in
    /// any file, no BO list) as the last drm_gem_object_put does: those
    /// whose object noted its release since the last sweep.  One that was
    /// exported keeps its memory (see `dmabuf`'s module comment).
    pub fn sweep_gem(&mut self) {
        let dead =
            std::mem::take(&mut *self.gem_released.lock().unwrap_or_else(|e| e.into_inner()));
        for super::dmabuf::Source { gpu, offset, .. } in dead {
            let Some(b) = self.gem_bos.remove(&(gpu, offset)) else {
                continue;
            };
            if !b.vram {
                self.gem_gtt[gpu] -= b.size;
            }
            if self.devs.dmabufs.get(gpu, offset).is_some() {
                continue;
            }
            if b.vram {
                self.gpu_alloc[gpu].vram_used -= b.size;
            }
            self.freed.push((gpu, offset, b.size));
        }
    }

    pub fn free_bo_memory(&mut self, gpu: usize, bo: &Bo) {
        if bo.imported {
            return;
        }
        let t = bo.mem_type();
        if t == alloc::VRAM {
            self.gpu_alloc[gpu].vram_used -= bo.size;
        }
        if t == alloc::VRAM || t == alloc::GTT {
            self.devs.dmabufs.forget(gpu, bo.offset);
            self.freed.push((gpu, bo.offset, bo.size));
        }
    }

    /// The freed BOs' ranges, for [`State::give_back`] once the lock is dropped.
    /// KFD frees a process' memory in a work item (kfd_process_wq) and
    /// TTM a BO's pages in delayed work: no other process' ioctl waits for
    /// it, and giving back a GiB of memfd pages takes about 0.15 s of CPU.  Offsets are
    /// handed out once (`GpuAlloc::next_offset` only grows), so no BO can
    /// have been placed in a range before it is punched.
    pub fn take_freed(&mut self) -> Vec<(usize, u64, u64)> {
        std::mem::take(&mut self.freed)
    }

    /// The processes ended since the last call (their leads).
    pub fn take_ended(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.ended)
    }

    /// Punches the ranges [`State::take_freed`] returned (freed BOs read
    /// as zero).
    pub fn give_back(devs: &Devices, freed: Vec<(usize, u64, u64)>) {
        for (gpu, off, len) in freed {
            devs.gpus[gpu].mem.punch(off, len);
        }
    }

    /// Reserves a render-memfd range (and VRAM budget) for a VRAM/GTT BO.
    pub fn reserve(&mut self, gpu: usize, mem_type: u32, size: u64) -> R<(u64, Arc<Mapping>)> {
        let g = &self.devs.gpus[gpu];
        let a = &self.gpu_alloc[gpu];
        if mem_type == alloc::VRAM
            && a.vram_used
                .checked_add(size)
                .is_none_or(|u| u > g.vram_size)
        {
            return Err(libc::ENOMEM);
        }
        let off = a.next_offset;
        if off
            .checked_add(size)
            .is_none_or(|e| e > uapi::RENDER_MEMFD_SIZE)
        {
            return Err(libc::ENOMEM);
        }
        let map = g.mem.map(off, size)?;
        let a = &mut self.gpu_alloc[gpu];
        a.next_offset = off + size;
        if mem_type == alloc::VRAM {
            a.vram_used += size;
        }
        Ok((off, Arc::new(map)))
    }

    /// Queues of type class `sdma` on GPU `gpu` across all processes.
    /// The lowest SDMA id free on `gpu` that is on engine `engine` of
    /// `engines` (KFD numbers an SDMA queue `engine + engines * slot`).
    pub fn free_sdma_id_on(&self, gpu: usize, engine: u32, engines: u32) -> u32 {
        let used: BTreeSet<u32> = self
            .procs
            .values()
            .flat_map(|p| p.queues.values())
            .filter(|q| q.gpu == gpu && q.is_sdma())
            .map(|q| q.sdma_id)
            .collect();
        (0..)
            .map(|slot| engine + engines * slot)
            .find(|id| !used.contains(id))
            .unwrap_or(engine)
    }

    pub fn queues_on(&self, gpu: usize, sdma: bool) -> u32 {
        self.procs
            .values()
            .flat_map(|p| p.queues.values())
            .filter(|q| q.gpu == gpu && q.is_sdma() == sdma)
            .count() as u32
    }

    /// The doorbell slice mapping of a pdd, created on first use.
    pub fn doorbells(&mut self, lead: u32, gpu: usize) -> R<()> {
        let devs = self.devs.clone();
        let p = self.procs.get_mut(&lead).ok_or(libc::ESRCH)?;
        if p.pdds[gpu].doorbells.is_none() {
            let off = kfd_off::encode(kfd_off::DOORBELL, p.slot, gpu, 0);
            let m = devs.kfd.map(off, uapi::DOORBELL_SLICE)?;
            p.pdds[gpu].doorbells = Some(m);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State::new(Arc::new(Devices {
            gpus: Vec::new(),
            kfd: Memfd::new("kfd-emu-test-kfd", uapi::kfd_off::MEMFD_SIZE).unwrap(),
            dmabufs: Default::default(),
            gem_change_handle: false,
            kfd_minor: 18,
        }))
    }

    /// A process is its pid and start time: opens by the same process
    /// share it; one with another start time is another process, and the
    /// old one's late releases leave it alone.
    #[test]
    fn a_process_is_its_pid_and_its_start_time() {
        let mut st = state();
        let a = st.open_kfd(77, Some(100)).unwrap();
        let b = st.open_kfd(77, Some(100)).unwrap();
        assert!(!st.stale(77, Some(100)));
        assert_eq!(st.procs[&77].kfd_opens, 2);
        assert!(st.stale(77, Some(101)));
        assert!(!st.stale(78, Some(101)), "no process, nothing stale");
        st.end_stale(77);
        assert!(!st.procs.contains_key(&77));
        let c = st.open_kfd(77, Some(101)).unwrap();
        assert_eq!(st.procs[&77].kfd_opens, 1);
        assert_eq!(st.procs[&77].start, Some(101));
        st.release(a);
        st.release(b);
        assert_eq!(
            st.procs[&77].kfd_opens, 1,
            "a late release ended the new process"
        );
        st.release(c);
        assert!(!st.procs.contains_key(&77));
    }
}
