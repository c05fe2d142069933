//! Compute-wave save/restore of the shader engine's dispatches, as the CP
//! and KFD's gfx9 trap handler do it when KFD evicts a queue with wavefront
//! save (CRIU's PROCESS_INFO does).
//!
//! Saving: between two rounds (every wave at an instruction boundary) the
//! live waves of a dispatch go into the queue's context save area, the
//! process memory libhsakmt registered at CREATE_QUEUE (one XCC's area, in
//! the layout of `gfx9::cwsr`; its header at offset 0 is libhsakmt's), and
//! the dispatch's progress and wave list into the control stack, which goes
//! back to the CP model (the MQD's companion pages: CHECKPOINT returns it in
//! the queue's private data). The dispatch then leaves the engine.
//!
//! Restoring: when the queue runs again (UNPAUSE, or RESUME after a
//! RESTORE, on this emulator or another) the CP model hands the engine the
//! dispatch at the read pointer with the control stack; the waves are
//! rebuilt from the save area alone. Anything that does not fit (a damaged
//! control stack or wave block, another packet at the read pointer) ends
//! the dispatch with [`Outcome::Restore`] naming the field: the queue gets
//! a queue error, the daemon goes on.

use gfx9::cwsr::{self, Alloc, ControlStack, Header, SaveWriter};
use gfx9::launch::{self, Placement};

use super::sched::{scratch_slot, Group, Run, Slot, State};
use super::{Launch, Outcome};
use crate::device::vm::GpuRange;

/// A queue's context save area (one XCC's) in the process' GPU VM:
/// CREATE_QUEUE's `ctx_save_restore_address` and `_size`, and the control
/// stack size (the area's first `ctl_stack_size` bytes hold its header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaveArea {
    pub addr: u64,
    pub size: u32,
    pub ctl_stack_size: u32,
}

/// Save the dispatch queue `queue` of process `lead` runs; `vm` is the
/// process' GPU VM as the queue's GPU sees it now.
pub struct SaveJob {
    pub lead: u32,
    pub queue: u32,
    pub area: SaveArea,
    pub vm: GpuRange,
}

/// What saving a queue came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Saved {
    /// The engine runs no dispatch of the queue (it ended meanwhile).
    Idle,
    /// The waves are in the save area; the control stack.
    Stack(Vec<u8>),
    /// The waves could not be saved (they run on): why.
    Failed(String),
}

/// The wave allocation of a dispatch: its kernel descriptor's registers and
/// the workgroup's LDS.
fn alloc_of(l: &Launch) -> cwsr::Result<Alloc> {
    Alloc::from_descriptor(l.target, l.code.rsrc1, l.code.rsrc3, l.lds as u32)
}

fn text(e: cwsr::Error) -> String {
    e.to_string()
}

/// Saves the live waves of `run` into the area of `job`; returns the
/// control stack. Nothing of `run` changes: on an error it runs on.
pub fn save(run: &Run, job: &SaveJob) -> Result<Vec<u8>, String> {
    let a = job.area;
    let mut area = vec![0u8; a.size as usize];
    let head = area
        .get_mut(..Header::SIZE)
        .ok_or_else(|| format!("the context save area ({} bytes) holds no header", a.size))?;
    job.vm.read(a.addr, head).map_err(|f| {
        format!(
            "the context save area's header at {:#x} is not readable: {f}",
            a.addr
        )
    })?;
    let l = &run.launch;
    let alloc = alloc_of(l).map_err(text)?;
    let mut w = SaveWriter::new(l.target, &mut area, a.ctl_stack_size).map_err(text)?;
    let running = run.groups.len() as u64;
    w.begin_dispatch(
        l.key.index,
        l.packet,
        alloc,
        run.next_group as u32,
        (run.next_group - running) as u32,
    )
    .map_err(text)?;
    let mut order: Vec<&Group> = run.groups.iter().collect();
    order.sort_by_key(|g| g.linear);
    for g in order {
        save_group(&mut w, g, alloc.lds_bytes as usize)?;
    }
    let saved = w.finish().map_err(text)?;
    let (start, end) = (a.ctl_stack_size as usize, saved.wg_state_offset as usize);
    job.vm
        .write(a.addr + start as u64, &area[start..end])
        .map_err(|f| format!("the context save area's wave area is not writable: {f}"))?;
    Ok(saved.control_stack)
}

/// The live waves of one workgroup, the first with the LDS.
fn save_group(w: &mut SaveWriter<'_>, g: &Group, lds_bytes: usize) -> Result<(), String> {
    let mut lds = g.lds.clone();
    lds.resize(lds_bytes, 0);
    let live = g.waves.iter().filter(|s| s.state != State::Done);
    for (i, s) in live.enumerate() {
        let at_barrier = s.state == State::Barrier;
        let l = (i == 0).then_some(&lds[..]);
        let k = s.wave.id_in_group as u8;
        w.save(&s.wave, g.linear as u32, k, at_barrier, false, l)
            .map_err(text)?;
    }
    Ok(())
}

/// Rebuilds the dispatch `launch` describes from its control stack and the
/// queue's save area (a launch without them starts afresh).
pub fn restore(mut launch: Launch) -> Result<Run, Outcome> {
    let Some((area, stack)) = launch.resume.take() else {
        return Ok(Run::new(launch));
    };
    let damaged = |what| Outcome::Restore { what };
    let (d, bytes) = read_saved(&launch, area, &stack).map_err(damaged)?;
    let sa = cwsr::SaveArea::open(launch.target, &bytes, area.ctl_stack_size, &stack)
        .map_err(|e| damaged(text(e)))?;
    let groups = rebuild_groups(&launch, &sa, &d).map_err(damaged)?;
    let mut run = Run::new(launch);
    run.groups = groups;
    run.next_group = d.next_workgroup as u64;
    run.waves = d.waves.len() as u64;
    claim_scratch(&mut run).map_err(damaged)?;
    Ok(run)
}

/// The control stack's dispatch, and the used part of the save area (its
/// header, the wave blocks the control stack lists) read from the VM.
fn read_saved(
    l: &Launch,
    a: SaveArea,
    stack: &[u8],
) -> Result<(cwsr::DispatchState, Vec<u8>), String> {
    let (d, end) = check_stack(l.target, stack, a)?;
    let d = one_dispatch(d, l)?;
    let ctl = a.ctl_stack_size as usize;
    let mut area = vec![0u8; a.size as usize];
    let unreadable = |f| {
        format!(
            "the context save area at {:#x} is not readable: {f}",
            a.addr
        )
    };
    l.vm.read(a.addr, &mut area[..Header::SIZE])
        .map_err(unreadable)?;
    l.vm.read(a.addr + ctl as u64, &mut area[ctl..end])
        .map_err(unreadable)?;
    Ok((d, area))
}

/// What a control stack says alone, without the queue's memory (checked
/// at RESTORE, and again when the queue runs): the stream whole, one
/// dispatch, and wave blocks that fit in save area `a` after its control
/// stack.  Returns the dispatch and the end of the used area.
pub fn check_stack(
    target: gfx9::Target,
    stack: &[u8],
    a: SaveArea,
) -> Result<(cwsr::DispatchState, usize), String> {
    let cs = ControlStack::decode(target, stack).map_err(text)?;
    let used = cs.wave_area_used() as usize;
    let [d] = <[_; 1]>::try_from(cs.dispatches).map_err(|ds| {
        format!(
            "control stack: dispatches: {}, a queue runs one at a time",
            ds.len()
        )
    })?;
    let ctl = a.ctl_stack_size as usize;
    let end = ctl
        .checked_add(used)
        .filter(|&e| e <= a.size as usize && ctl >= Header::SIZE)
        .ok_or_else(|| {
            format!(
                "control stack: waves: {used:#x} bytes of wave blocks after a {ctl:#x}-byte \
                 control stack do not fit in the {:#x}-byte context save area",
                a.size
            )
        })?;
    Ok((d, end))
}

/// The control stack's only dispatch, which must be the launch's: the
/// packet at the read pointer, with its kernel's allocation.
fn one_dispatch(d: cwsr::DispatchState, l: &Launch) -> Result<cwsr::DispatchState, String> {
    if d.dispatch_id != l.key.index {
        return Err(format!(
            "control stack: dispatch[0].dispatch_id: {}, the read pointer is at packet {}",
            d.dispatch_id, l.key.index
        ));
    }
    if d.packet != l.packet {
        return Err("control stack: dispatch[0].packet: not the packet at the read pointer".into());
    }
    let want = alloc_of(l).map_err(text)?;
    if d.alloc != want {
        return Err(format!(
            "control stack: dispatch[0].alloc: {:?}, the kernel's descriptor asks for {want:?}",
            d.alloc
        ));
    }
    if d.next_workgroup as u64 > l.grid.group_count() {
        return Err(format!(
            "control stack: dispatch[0].next_workgroup: {} of {} workgroups",
            d.next_workgroup,
            l.grid.group_count()
        ));
    }
    Ok(d)
}

/// The saved workgroups, each with its waves and LDS.
fn rebuild_groups(
    l: &Launch,
    sa: &cwsr::SaveArea<'_>,
    d: &cwsr::DispatchState,
) -> Result<Vec<Group>, String> {
    let mut groups: Vec<Group> = Vec::new();
    let mut lds = vec![0u8; alloc_of(l).map_err(text)?.lds_bytes as usize];
    for (i, rec) in d.waves.iter().enumerate() {
        let first = rec.first_of_group;
        let mut wave = sa.wave(0, i, first.then_some(&mut lds[..])).map_err(text)?;
        let id = l.grid.group_id(rec.workgroup as u64);
        let extent = l.grid.extent(id);
        if rec.wave_in_group as u32 >= launch::Grid::waves(extent) {
            return Err(format!(
                "control stack: dispatch[0].wave[{i}].wave_in_group: {} in a workgroup of {} \
                 waves",
                rec.wave_in_group,
                launch::Grid::waves(extent)
            ));
        }
        let at = Placement {
            group: id,
            extent,
            wave: rec.wave_in_group as u32,
            scratch_offset: 0,
        };
        launch::seat_wave(&mut wave, &l.regs, &at);
        if first {
            let mut group_lds = lds.clone();
            group_lds.truncate(l.lds);
            groups.push(Group {
                linear: rec.workgroup as u64,
                lds: group_lds,
                waves: Vec::new(),
            });
        }
        let Some(g) = groups.last_mut() else {
            return Err(
                "control stack: dispatch[0].wave[0]: not the first of its workgroup".into(),
            );
        };
        g.waves.push(Slot {
            scratch: scratch_slot(&wave),
            state: if rec.at_barrier {
                State::Barrier
            } else {
                State::Ready
            },
            wave,
        });
    }
    Ok(groups)
}

/// The restored waves keep the scratch slots they had: each must be one the
/// queue's scratch has, and no two the same; the others are free again.
fn claim_scratch(run: &mut Run) -> Result<(), String> {
    let slots = run.launch.scratch.map_or(0, |(_, n)| n);
    let mut taken = vec![false; slots as usize];
    for g in &run.groups {
        for s in &g.waves {
            let Some(k) = s.scratch else {
                if run.launch.scratch.is_some() {
                    return Err(format!(
                        "workgroup {} wave {}: no scratch slot in TTMP13, the dispatch has a \
                         private segment",
                        g.linear, s.wave.id_in_group
                    ));
                }
                continue;
            };
            if k >= slots || std::mem::replace(&mut taken[k as usize], true) {
                return Err(format!(
                    "workgroup {} wave {}: scratch slot {k} in TTMP13 is not a free one of the \
                     queue's {slots}",
                    g.linear, s.wave.id_in_group
                ));
            }
        }
    }
    let top = taken.iter().rposition(|&t| t).map_or(0, |k| k as u64 + 1);
    run.next_scratch = top;
    run.free_scratch = (0..top).filter(|&k| !taken[k as usize]).collect();
    Ok(())
}
