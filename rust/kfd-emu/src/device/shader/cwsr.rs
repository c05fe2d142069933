//! Compute-wave save/restore of the shader engine's dispatches, as the CP
//! and KFD's gfx9 trap handler do it when KFD evicts a queue with wavefront
//! save (CRIU's PROCESS_INFO does).
//!
//! Saving: between two rounds (every wave at an instruction boundary) the
//! live waves of a dispatch go into the queue's context save area, the
//! process memory libhsakmt registered at CREATE_QUEUE (in the layout of
//! `gfx9::cwsr`; its header at offset 0 is libhsakmt's), and the dispatch's
//! progress and wave list into the control stack, which goes back to the CP
//! model (the MQD's companion pages: CHECKPOINT returns it in the queue's
//! private data). The dispatch then leaves the engine.
//!
//! On a GPU of several XCCs (MI300's partitions) the CP hands the
//! dispatch's workgroups to the XCCs round-robin (XCC `x` of `n` runs the
//! linear indices `x`, `x + n`, ...), KFD gives each XCC its own MQD and
//! control stack and points XCC `x` at `x` times the per-XCC size into the
//! save area: each XCC's waves go into its own slice and its own control
//! stack (`gfx9::cwsr::Xcc`), and a restore rebuilds the waves of every
//! XCC.
//!
//! Restoring: when the queue runs again (UNPAUSE, or RESUME after a
//! RESTORE, on this emulator or another) the CP model hands the engine the
//! dispatch at the read pointer with the control stack; the waves are
//! rebuilt from the save area alone. Anything that does not fit (a damaged
//! control stack or wave block, another packet at the read pointer) ends
//! the dispatch with [`Outcome::Restore`] naming the field: the queue gets
//! a queue error, the daemon goes on.

use gfx9::cwsr::{self, Alloc, ControlStack, Header, SaveWriter, Xcc};
use gfx9::launch::{self, Placement};

use super::sched::{scratch_slot, Group, Run, Slot, State};
use super::{Launch, Outcome};
use crate::device::vm::GpuRange;

/// A queue's context save area (XCC 0's) in the process' GPU VM:
/// CREATE_QUEUE's `ctx_save_restore_address` and `_size` (one XCC's), and
/// the control stack size (the area's first `ctl_stack_size` bytes hold
/// its header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaveArea {
    pub addr: u64,
    pub size: u32,
    pub ctl_stack_size: u32,
}

impl SaveArea {
    /// XCC `x`'s slice: KFD points XCC `x`'s MQD `x` per-XCC sizes into
    /// the area libhsakmt allocated for all of them.
    pub fn of_xcc(self, x: u16) -> SaveArea {
        SaveArea {
            addr: self.addr + u64::from(x) * u64::from(self.size),
            ..self
        }
    }
}

/// Save the dispatch queue `queue` of process `lead` runs; `vm` is the
/// process' GPU VM as the queue's GPU sees it now, `xccs` the XCCs of the
/// queue's GPU.
pub struct SaveJob {
    pub lead: u32,
    pub queue: u32,
    pub area: SaveArea,
    pub xccs: u16,
    pub vm: GpuRange,
}

/// What saving a queue came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Saved {
    /// The engine runs no dispatch of the queue (it ended meanwhile).
    Idle,
    /// The waves are in the save area; the control stack of each XCC.
    Stack(Vec<Vec<u8>>),
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

/// XCC `index` of `count`.
fn xcc(index: usize, count: usize) -> Xcc {
    Xcc {
        index: index as u16,
        count: count as u16,
    }
}

/// `what` about XCC `x`, named where the GPU has several.
fn on_xcc(x: Xcc, what: String) -> String {
    if x.count > 1 {
        format!("XCC {}: {what}", x.index)
    } else {
        what
    }
}

/// Saves the live waves of `run` into the area of `job`, each XCC's into
/// its slice; returns the control stack of each XCC. Nothing of `run`
/// changes: on an error it runs on.
pub fn save(run: &Run, job: &SaveJob) -> Result<Vec<Vec<u8>>, String> {
    let n = job.xccs.max(1) as usize;
    (0..n)
        .map(|x| save_xcc(run, job, xcc(x, n)).map_err(|e| on_xcc(xcc(x, n), e)))
        .collect()
}

/// The running workgroups of `run` the CP handed XCC `x`, in order.
fn groups_of(run: &Run, x: Xcc) -> Vec<&Group> {
    let mut order: Vec<&Group> = run
        .groups
        .iter()
        .filter(|g| x.owns(g.linear as u32))
        .collect();
    order.sort_by_key(|g| g.linear);
    order
}

/// The live waves each of `n` XCCs runs of `run` (for the log).
pub fn waves_per_xcc(run: &Run, n: usize) -> Vec<usize> {
    (0..n)
        .map(|x| {
            groups_of(run, xcc(x, n))
                .iter()
                .map(|g| g.waves.iter().filter(|s| s.state != State::Done).count())
                .sum()
        })
        .collect()
}

/// XCC `x`'s waves into its slice of the save area; its control stack.
fn save_xcc(run: &Run, job: &SaveJob, x: Xcc) -> Result<Vec<u8>, String> {
    let a = job.area.of_xcc(x.index);
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
    let mut w = SaveWriter::for_xcc(l.target, &mut area, a.ctl_stack_size, x).map_err(text)?;
    let order = groups_of(run, x);
    let started = x.below(run.next_group as u32);
    w.begin_dispatch(
        l.key.index,
        l.packet,
        alloc,
        run.next_group as u32,
        started - order.len() as u32,
    )
    .map_err(text)?;
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
    let Some((area, stacks)) = launch.resume.take() else {
        return Ok(Run::new(launch));
    };
    let damaged = |what| Outcome::Restore { what };
    let saved = check_stacks(launch.target, &stacks, area).map_err(damaged)?;
    let (mut groups, mut waves) = (Vec::new(), 0);
    for (i, (stack, (d, end))) in stacks.iter().zip(&saved).enumerate() {
        let x = xcc(i, stacks.len());
        let on = |what| damaged(on_xcc(x, what));
        let a = area.of_xcc(x.index);
        let bytes = read_saved(&launch, a, *end).map_err(on)?;
        let d = one_dispatch(d, &launch).map_err(on)?;
        let sa = cwsr::SaveArea::open(launch.target, &bytes, a.ctl_stack_size, stack)
            .map_err(|e| on(text(e)))?;
        groups.extend(rebuild_groups(&launch, &sa, d).map_err(on)?);
        waves += d.waves.len() as u64;
    }
    groups.sort_by_key(|g| g.linear);
    let mut run = Run::new(launch);
    run.groups = groups;
    run.next_group = saved[0].0.next_workgroup as u64;
    run.waves = waves;
    claim_scratch(&mut run).map_err(damaged)?;
    seat_groups(&mut run).map_err(damaged)?;
    Ok(run)
}

/// The restored workgroups go to CUs of their XCC that the queue's CU
/// mask (restored with the queue) enables, as the CP's restore places
/// them: their waves read their new slots in HW_ID.
fn seat_groups(run: &mut Run) -> Result<(), String> {
    for g in 0..run.groups.len() {
        let (linear, n) = (run.groups[g].linear, run.groups[g].waves.len());
        let x = run.xcc_of(linear);
        let seat = run.cus.reseat(x, n, run.launch.lds).ok_or_else(|| {
            format!(
                "workgroup {linear} was saved on XCC {x}, where the queue's CU mask enables no CU"
            )
        })?;
        let group_x = run.launch.grid.group_id(linear)[0];
        for (s, slot) in run.groups[g].waves.iter_mut().zip(&seat.waves) {
            slot.seat(&mut s.wave, group_x);
        }
        run.groups[g].seat = seat;
    }
    Ok(())
}

/// The used part of one XCC's save area (its header, the wave blocks its
/// control stack lists, which end at `end`) read from the VM.
fn read_saved(l: &Launch, a: SaveArea, end: usize) -> Result<Vec<u8>, String> {
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
    Ok(area)
}

/// What the control stacks of a queue's XCCs say alone ([`check_stack`]
/// each, against its XCC's slice of save area `a`), and that they tell of
/// one dispatch: every XCC's record names its XCC and the XCC count, and
/// the dispatch id, packet, allocation and next workgroup of XCC 0's.
/// Returns each XCC's dispatch and the end of its used area.
pub fn check_stacks(
    target: gfx9::Target,
    stacks: &[Vec<u8>],
    a: SaveArea,
) -> Result<Vec<(cwsr::DispatchState, usize)>, String> {
    let n = stacks.len();
    let mut out: Vec<(cwsr::DispatchState, usize)> = Vec::with_capacity(n);
    for (i, stack) in stacks.iter().enumerate() {
        let x = xcc(i, n);
        let (d, end) = check_stack(target, stack, a.of_xcc(x.index)).map_err(|e| on_xcc(x, e))?;
        if d.xcc != x {
            return Err(on_xcc(
                x,
                format!(
                    "control stack: dispatch[0].xcc: XCC {} of {}, the stack of XCC {i} of {n}",
                    d.xcc.index, d.xcc.count
                ),
            ));
        }
        if let Some((d0, _)) = out.first() {
            same_dispatch(d0, &d).map_err(|e| on_xcc(x, e))?;
        }
        out.push((d, end));
    }
    Ok(out)
}

/// XCC `d`'s record tells of XCC 0's dispatch `d0`.
fn same_dispatch(d0: &cwsr::DispatchState, d: &cwsr::DispatchState) -> Result<(), String> {
    let field = if d.dispatch_id != d0.dispatch_id {
        "dispatch_id"
    } else if d.packet != d0.packet {
        "packet"
    } else if d.alloc != d0.alloc {
        "alloc"
    } else if d.next_workgroup != d0.next_workgroup {
        "next_workgroup"
    } else {
        return Ok(());
    };
    Err(format!(
        "control stack: dispatch[0].{field}: not XCC 0's (dispatch {}, next workgroup {}; XCC \
         0's: dispatch {}, next workgroup {})",
        d.dispatch_id, d.next_workgroup, d0.dispatch_id, d0.next_workgroup
    ))
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
fn one_dispatch<'d>(
    d: &'d cwsr::DispatchState,
    l: &Launch,
) -> Result<&'d cwsr::DispatchState, String> {
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
            ..Placement::default()
        };
        launch::seat_wave(&mut wave, &l.regs, &at);
        if first {
            let mut group_lds = lds.clone();
            group_lds.truncate(l.lds);
            groups.push(Group {
                linear: rec.workgroup as u64,
                lds: group_lds,
                waves: Vec::new(),
                seat: Default::default(),
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

/// The restored waves keep the scratch slots they had: each must be one
/// its XCC's slice of the queue's scratch has, and no two of an XCC the
/// same; the others are free again.
fn claim_scratch(run: &mut Run) -> Result<(), String> {
    let slots = run.launch.scratch.map_or(0, |sc| sc.slots);
    let mut taken = vec![vec![false; slots as usize]; run.scratch.len()];
    for g in &run.groups {
        let x = run.xcc_of(g.linear);
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
            if k >= slots || std::mem::replace(&mut taken[x][k as usize], true) {
                return Err(format!(
                    "workgroup {} wave {}: scratch slot {k} in TTMP13 is not a free one of the \
                     {slots} of XCC {x}'s slice of the queue's scratch",
                    g.linear, s.wave.id_in_group
                ));
            }
        }
    }
    for (pool, taken) in run.scratch.iter_mut().zip(taken) {
        let top = taken.iter().rposition(|&t| t).map_or(0, |k| k as u64 + 1);
        pool.next = top;
        pool.free = (0..top).filter(|&k| !taken[k as usize]).collect();
    }
    Ok(())
}
