//! One dispatch's waves: workgroups are admitted while the emulated GPU
//! has room for their waves (a CU of their XCC the queue's CU mask enables
//! has wave slots and LDS for them, `cus`, and their XCC's slice of the
//! queue's scratch has slots for them),
//! each wave runs in turns of [`TURN`] instructions, `s_barrier` holds a
//! wave until every live wave of its workgroup got there, `s_sleep` gives
//! the rest of the slice away.  A spinning wave therefore never keeps the
//! others (or other dispatches) from running.

use std::time::Instant;

use gfx9::exec::{CodeCache, Stop};
use gfx9::launch::{self, Grid, Placement};
use gfx9::state::sreg;
use gfx9::Wave;

use super::cus::{Cus, Seat};
use super::gpumem::GpuMemory;
use super::{Launch, Outcome};
use crate::device::vm::GpuRange;

/// Instructions a wave runs per turn.
pub const TURN: u64 = 2048;
/// The dispatch packet a wave's dispatch ptr points at.
const AQL_PACKET_BYTES: u32 = 64;
/// Waves of one dispatch resident at once.
pub const RESIDENT_WAVES: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    Ready,
    Barrier,
    Asleep,
    Done,
}

pub(super) struct Slot {
    pub wave: Wave,
    pub state: State,
    pub scratch: Option<u64>,
}

pub(super) struct Group {
    /// The workgroup's linear index (X fastest).
    pub linear: u64,
    pub lds: Vec<u8>,
    pub waves: Vec<Slot>,
    /// Its CU and its waves' slots there (in the order of `waves`).
    pub seat: Seat,
}

/// The TTMP in which the SPI model leaves a wave's scratch slot (plus one;
/// 0: none) at launch, as the hardware's SPI keeps what it assigned a wave
/// where user code cannot change it: a wave rebuilt from a context save
/// area gets the TTMPs back and so its slot (the trap handler saves them;
/// the emulator runs no trap handler of its own that would use them).
const SCRATCH_SLOT_TTMP: usize = sreg::TTMP0 + 13;

fn set_scratch_slot(w: &mut Wave, slot: Option<u64>) {
    w.set_sgpr(SCRATCH_SLOT_TTMP, slot.map_or(0, |s| s as u32 + 1));
}

/// The scratch slot a wave's TTMP names (None: none).
pub(super) fn scratch_slot(w: &Wave) -> Option<u64> {
    w.sgpr(SCRATCH_SLOT_TTMP).checked_sub(1).map(u64::from)
}

/// The scratch wave slots of one XCC's slice: those free again, and the
/// first never handed out.
#[derive(Clone, Debug, Default)]
pub(super) struct SlotPool {
    pub free: Vec<u64>,
    pub next: u64,
}

/// What a slice of a dispatch came to.
pub enum Progress {
    /// Instructions retired in the slice (0: every wave slept or waited).
    Running(u64),
    Finished(Outcome),
}

pub struct Run {
    pub launch: Launch,
    pub mem: GpuMemory,
    pub(super) groups: Vec<Group>,
    pub(super) next_group: u64,
    group_count: u64,
    spare: Vec<Wave>,
    /// Each XCC's scratch wave slots.
    pub(super) scratch: Vec<SlotPool>,
    /// The CUs the queue's CU mask gives the dispatch, and their load.
    pub(super) cus: Cus,
    /// Whether the daemon said that a workgroup's XCC has no CU enabled.
    starved: bool,
    pub instructions: u64,
    /// Lane operations of those instructions (gfx9's `Wave::lanes`).
    pub lanes: u64,
    pub waves: u64,
    pub started: Instant,
    /// CPU time the worker spent on the dispatch.
    pub cpu: std::time::Duration,
    /// M0 of the `s_sendmsg sendmsg(MSG_INTERRUPT)`s since the worker last
    /// delivered them.
    pub interrupts: Vec<u32>,
    /// The XCCs with waves resident at the end of the last slice (None
    /// before the first), which the worker's activity counts read.
    pub(super) xccs_after: Option<Vec<usize>>,
}

impl Run {
    pub fn new(mut launch: Launch) -> Run {
        let vm = std::mem::replace(&mut launch.vm, GpuRange::from_spans(0, 0, Vec::new()));
        let group_count = launch.grid.group_count();
        let mut mem = GpuMemory::new(vm);
        let scratch = vec![SlotPool::default(); launch.cus.len().max(1)];
        let cus = Cus::new(launch.wave_slots, &launch.cus);
        mem.read_once(launch.regs.kernarg, launch.code.kernarg_size);
        mem.read_once(launch.regs.packet, Some(AQL_PACKET_BYTES));
        Run {
            launch,
            mem,
            groups: Vec::new(),
            next_group: 0,
            group_count,
            spare: Vec::new(),
            scratch,
            cus,
            starved: false,
            instructions: 0,
            lanes: 0,
            waves: 0,
            started: Instant::now(),
            cpu: Default::default(),
            interrupts: Vec::new(),
            xccs_after: None,
        }
    }

    pub(super) fn resident(&self) -> usize {
        self.groups.iter().map(|g| g.waves.len()).sum()
    }

    /// The XCC the CP hands workgroup `linear` to: round-robin over the
    /// partition's XCCs.
    pub(super) fn xcc_of(&self, linear: u64) -> usize {
        (linear % self.scratch.len() as u64) as usize
    }

    /// A scratch slot of XCC `x`'s slice for a new wave, if it has one.
    fn scratch_slot(&mut self, x: usize) -> Option<u64> {
        let slots = self.launch.scratch?.slots;
        let pool = &mut self.scratch[x];
        if let Some(s) = pool.free.pop() {
            return Some(s);
        }
        (pool.next < slots).then(|| {
            pool.next += 1;
            pool.next - 1
        })
    }

    fn scratch_free(&self, x: usize) -> u64 {
        self.launch.scratch.map_or(u64::MAX, |sc| {
            let pool = &self.scratch[x];
            pool.free.len() as u64 + (sc.slots - pool.next)
        })
    }

    /// Starts workgroups while there is room; an error when not even one
    /// workgroup fits the queue's scratch.
    fn admit(&mut self) -> Result<(), Outcome> {
        while self.next_group < self.group_count {
            let id = self.launch.grid.group_id(self.next_group);
            let extent = self.launch.grid.extent(id);
            let n = Grid::waves(extent) as usize;
            let resident = self.resident();
            let x = self.xcc_of(self.next_group);
            let free = self.scratch_free(x);
            if resident > 0 && (resident + n > RESIDENT_WAVES || free < n as u64) {
                return Ok(());
            }
            if free < n as u64 {
                return Err(Outcome::Illegal {
                    stop: format!(
                        "the queue's scratch has {free} wave slots per XCC, a workgroup needs {n}"
                    ),
                    pc: 0,
                });
            }
            let Some(seat) = self.cus.place(x, n, self.launch.lds) else {
                self.starve(x);
                return Ok(());
            };
            self.start_group(id, extent, x, seat);
            self.next_group += 1;
        }
        Ok(())
    }

    /// Says once that workgroups wait because the queue's CU mask enables
    /// no CU of XCC `x` (the hardware's queue hangs so).
    fn starve(&mut self, x: usize) {
        if self.cus.any_on(x) || std::mem::replace(&mut self.starved, true) {
            return;
        }
        let k = &self.launch.key;
        log::warn!(
            "kfd-emu: process {} queue {} packet {}: the queue's CU mask enables no CU of \
             XCC {x}: its workgroups wait",
            k.lead,
            k.queue,
            k.index
        );
    }

    /// Starts workgroup `id` (the next one) with its waves on its XCC `x`,
    /// in the slots of `seat`, each with a slot of that XCC's scratch slice.
    fn start_group(&mut self, id: [u32; 3], extent: [u32; 3], x: usize, seat: Seat) {
        let target = self.launch.target;
        let n = seat.waves.len();
        let (wave_bytes, regs) = match self.launch.scratch {
            Some(sc) => (
                sc.wave_bytes,
                self.launch.regs.with_scratch_at(x as u64 * sc.xcc_bytes),
            ),
            None => (0, self.launch.regs),
        };
        let mut waves = Vec::with_capacity(n);
        for k in 0..n {
            let scratch = self.scratch_slot(x);
            let mut wave = self.spare.pop().unwrap_or_else(|| Wave::new(target, 0));
            let at = Placement {
                group: id,
                extent,
                wave: k as u32,
                scratch_offset: (scratch.unwrap_or(0) * wave_bytes) as u32,
                slot: seat.waves[k],
            };
            let l = &self.launch;
            launch::start_wave(&mut wave, target, l.object, &l.code, &l.grid, &regs, &at);
            set_scratch_slot(&mut wave, scratch);
            waves.push(Slot {
                wave,
                state: State::Ready,
                scratch,
            });
        }
        self.waves += n as u64;
        self.groups.push(Group {
            linear: self.next_group,
            lds: vec![0; self.launch.lds],
            waves,
            seat,
        });
    }

    /// One turn of every resident wave; admits and retires workgroups.
    pub fn slice(&mut self, cache: &mut CodeCache) -> Progress {
        if let Err(o) = self.admit() {
            return Progress::Finished(o);
        }
        let mut ran = 0;
        for g in 0..self.groups.len() {
            for w in 0..self.groups[g].waves.len() {
                if let Err(o) = self.turn(g, w, cache, &mut ran) {
                    return Progress::Finished(o);
                }
            }
            self.settle(g);
        }
        self.retire();
        if self.groups.is_empty() && self.next_group >= self.group_count {
            return Progress::Finished(Outcome::Done {
                waves: self.waves,
                instructions: self.instructions,
            });
        }
        Progress::Running(ran)
    }

    /// Runs wave `w` of group `g` for a turn if it is ready.
    fn turn(
        &mut self,
        g: usize,
        w: usize,
        cache: &mut CodeCache,
        ran: &mut u64,
    ) -> Result<(), Outcome> {
        let group = &mut self.groups[g];
        let slot = &mut group.waves[w];
        if slot.state != State::Ready {
            return Ok(());
        }
        let (before, lanes) = (slot.wave.retired, slot.wave.lanes);
        let stop = slot.wave.run(&mut self.mem, &mut group.lds, cache, TURN);
        let n = slot.wave.retired - before;
        *ran += n;
        self.instructions += n;
        self.lanes += slot.wave.lanes - lanes;
        slot.state = match stop {
            Stop::Budget => State::Ready,
            Stop::Endpgm => State::Done,
            Stop::Barrier => State::Barrier,
            Stop::Sleep(_) => State::Asleep,
            Stop::Interrupt(data) => {
                self.interrupts.push(data);
                State::Ready
            }
            Stop::Trap(code) => {
                let pc = slot.wave.pc.wrapping_sub(4);
                return Err(Outcome::Trap { code, pc });
            }
            Stop::Halt => {
                let pc = slot.wave.pc.wrapping_sub(4);
                return Err(Outcome::Trap { code: 0xff, pc });
            }
            Stop::Fault { pc, .. }
                if self
                    .mem
                    .last_fault
                    .as_ref()
                    .is_some_and(|f| f.process_gone()) =>
            {
                return Err(Outcome::Gone { pc });
            }
            Stop::Fault { fault, pc } => {
                let detail = self
                    .mem
                    .last_fault
                    .as_ref()
                    .map_or_else(|| "no BO there".into(), |f| f.to_string());
                return Err(Outcome::Fault { fault, pc, detail });
            }
            Stop::Illegal { pc, .. } => {
                return Err(Outcome::Illegal {
                    stop: stop.to_string(),
                    pc,
                })
            }
        };
        Ok(())
    }

    /// Wakes sleepers for the next slice, and releases group `g`'s barrier
    /// once every live wave waits at it.
    fn settle(&mut self, g: usize) {
        let waves = &mut self.groups[g].waves;
        for s in waves.iter_mut().filter(|s| s.state == State::Asleep) {
            s.state = State::Ready;
        }
        let live = waves.iter().filter(|s| s.state != State::Done);
        if live.clone().count() > 0 && live.clone().all(|s| s.state == State::Barrier) {
            for s in waves.iter_mut().filter(|s| s.state == State::Barrier) {
                s.state = State::Ready;
            }
        }
    }

    /// Drops finished workgroups, keeping their waves and scratch slots.
    fn retire(&mut self) {
        let mut k = 0;
        while k < self.groups.len() {
            if self.groups[k].waves.iter().all(|s| s.state == State::Done) {
                let g = self.groups.swap_remove(k);
                let x = self.xcc_of(g.linear);
                self.cus.release(x, &g.seat, self.launch.lds);
                for s in g.waves {
                    self.scratch[x].free.extend(s.scratch);
                    self.spare.push(s.wave);
                }
            } else {
                k += 1;
            }
        }
    }
}
