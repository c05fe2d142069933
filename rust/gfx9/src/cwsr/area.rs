//! A queue's context save area (one XCC's): saving every wave of the queue into it and
//! rebuilding them from it.
//!
//! The area is `ctl_stack_size + wave area` bytes (see [`layout::wave_area_size`]):
//! `[0, 40)` the header libhsakmt fills, `[40, ctl_stack_size)` room for the control stack
//! (on gfx9 the CP keeps it one page after the MQD instead; KFD copies it here only when a
//! debugger asks, GET_QUEUE_WAVE_STATE), `[ctl_stack_size, ...)` the wave area, filled upward
//! one wave block after the other. libhsakmt before ROCm 6.2 put the debugger's memory at the
//! end of the area (`debug_offset = size - debug_size`); the wave area stops there.
//!
//! [`layout::wave_area_size`]: super::layout::wave_area_size

use super::layout::{Header, WaveBlock};
use super::stack::{ControlStack, DispatchState, SavedWave, Xcc, HEADER_BYTES};
use super::wave::{restore_wave, save_wave};
use super::{Alloc, Error, Result};
use crate::state::{Target, Wave};

/// Where the wave area of `area` ends: the area's end, or the debugger memory's start when
/// libhsakmt placed it inside the area.
fn wave_area_end(area: &[u8], ctl_stack_size: usize) -> Result<usize> {
    if !ctl_stack_size.is_multiple_of(4096)
        || ctl_stack_size < Header::SIZE + HEADER_BYTES
        || ctl_stack_size > area.len()
    {
        return Err(Error::new(
            "ctl_stack_size",
            format!(
                "{ctl_stack_size:#x} is no page-aligned control stack inside an area of {:#x} bytes",
                area.len()
            ),
        ));
    }
    let h = Header::read(area)?;
    let debug = h.debug_offset as usize;
    if h.debug_size != 0 && debug >= ctl_stack_size && debug < area.len() {
        Ok(debug)
    } else {
        Ok(area.len())
    }
}

/// What a save produced: the control stack (the CP's, for the MQD's companion pages) and the
/// MQD's view of the area.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Saved {
    pub control_stack: Vec<u8>,
    /// CP_HQD_CNTL_STACK_OFFSET: `ctl_stack_size - control_stack.len()`.
    pub cntl_stack_offset: u32,
    /// CP_HQD_WG_STATE_OFFSET: `ctl_stack_size + wave area bytes used`.
    pub wg_state_offset: u32,
    pub ctl_stack_size: u32,
}

impl Saved {
    /// What KFD's `get_wave_state` does for a debugger: the header's `wave_state` fields and a
    /// copy of the control stack where it would be in the area.
    pub fn publish(&self, area: &mut [u8]) -> Result<()> {
        let ctl = self.ctl_stack_size as usize;
        let start = self.cntl_stack_offset as usize;
        if area.len() < ctl || start < Header::SIZE || start > ctl {
            return Err(Error::new(
                "area",
                format!(
                    "{} bytes cannot hold a {ctl:#x}-byte control stack from {start:#x}",
                    area.len()
                ),
            ));
        }
        Header {
            control_stack_offset: self.cntl_stack_offset,
            control_stack_size: self.control_stack.len() as u32,
            wave_state_offset: self.wg_state_offset,
            wave_state_size: self.wg_state_offset - self.ctl_stack_size,
            ..Header::default()
        }
        .write_wave_state(area);
        area[start..ctl].copy_from_slice(&self.control_stack);
        Ok(())
    }
}

/// Saves the waves of one queue, dispatch by dispatch, into its context save area.
pub struct SaveWriter<'a> {
    target: Target,
    area: &'a mut [u8],
    ctl_stack_size: usize,
    end: usize,
    cursor: usize,
    stack: ControlStack,
    xcc: Xcc,
}

impl<'a> SaveWriter<'a> {
    /// `area` is one XCC's context save area, `ctl_stack_size` the queue's (CREATE_QUEUE's
    /// `ctl_stack_size`, the MQD's CP_HQD_CNTL_STACK_SIZE).
    pub fn new(target: Target, area: &'a mut [u8], ctl_stack_size: u32) -> Result<Self> {
        let ctl = ctl_stack_size as usize;
        let end = wave_area_end(area, ctl)?;
        Ok(SaveWriter {
            target,
            area,
            ctl_stack_size: ctl,
            end,
            cursor: ctl,
            stack: ControlStack::default(),
            xcc: Xcc::ONE,
        })
    }

    /// The writer of XCC `xcc`'s slice of a multi-XCC queue's save area:
    /// its dispatches list that XCC's workgroups (see [`Xcc`]).
    pub fn for_xcc(
        target: Target,
        area: &'a mut [u8],
        ctl_stack_size: u32,
        xcc: Xcc,
    ) -> Result<Self> {
        let mut w = SaveWriter::new(target, area, ctl_stack_size)?;
        w.xcc = xcc;
        Ok(w)
    }

    /// Starts the waves of another dispatch in flight.
    pub fn begin_dispatch(
        &mut self,
        dispatch_id: u64,
        packet: [u8; 64],
        alloc: Alloc,
        next_workgroup: u32,
        workgroups_done: u32,
    ) -> Result<()> {
        alloc
            .check(self.target)
            .map_err(|e| e.within(&format!("dispatch[{}].alloc", self.stack.dispatches.len())))?;
        self.stack.dispatches.push(DispatchState {
            dispatch_id,
            packet,
            alloc,
            next_workgroup,
            workgroups_done,
            xcc: self.xcc,
            waves: Vec::new(),
        });
        Ok(())
    }

    /// Saves one wave of the current dispatch. The waves of a workgroup come one after the
    /// other; the first of them carries the workgroup's LDS (`lds` given), the others not.
    pub fn save(
        &mut self,
        wave: &Wave,
        workgroup: u32,
        wave_in_group: u8,
        at_barrier: bool,
        halted: bool,
        lds: Option<&[u8]>,
    ) -> Result<()> {
        let n = self.stack.dispatches.len();
        let d = self
            .stack
            .dispatches
            .last_mut()
            .ok_or_else(|| Error::new("dispatch", "a wave saved before any dispatch"))?;
        let field = format!("dispatch[{}].wave[{}]", n - 1, d.waves.len());
        if wave.target != self.target {
            return Err(Error::new(
                format!("{field}.target"),
                format!("a {:?} wave on a {:?} queue", wave.target, self.target),
            ));
        }
        let first = d.waves.last().map(|w| w.workgroup) != Some(workgroup);
        if first != lds.is_some() {
            return Err(Error::new(
                format!("{field}.lds"),
                format!(
                    "the {} wave of workgroup {workgroup} {} the LDS",
                    if first { "first" } else { "a later" },
                    if first { "must carry" } else { "cannot carry" }
                ),
            ));
        }
        let out = &mut self.area[self.cursor..self.end];
        let used = save_wave(wave, &d.alloc, lds, out).map_err(|e| e.within(&field))?;
        d.waves.push(SavedWave {
            offset: (self.cursor - self.ctl_stack_size) as u32,
            workgroup,
            wave_in_group,
            first_of_group: first,
            at_barrier,
            halted,
        });
        self.cursor += used;
        Ok(())
    }

    /// Encodes the control stack and checks it decodes to what was saved (a save that cannot
    /// be resumed must not succeed).
    pub fn finish(self) -> Result<Saved> {
        let bytes = self.stack.encode()?;
        let room = self.ctl_stack_size - Header::SIZE;
        if bytes.len() > room {
            return Err(Error::new(
                "control stack",
                format!(
                    "{} bytes for {} waves do not fit in the {room} of a {:#x}-byte control stack",
                    bytes.len(),
                    self.stack.wave_count(),
                    self.ctl_stack_size
                ),
            ));
        }
        let back = ControlStack::decode(self.target, &bytes)?;
        if back != self.stack {
            return Err(Error::new(
                "control stack",
                "does not decode to the waves saved",
            ));
        }
        Ok(Saved {
            cntl_stack_offset: (self.ctl_stack_size - bytes.len()) as u32,
            wg_state_offset: self.cursor as u32,
            ctl_stack_size: self.ctl_stack_size as u32,
            control_stack: bytes,
        })
    }
}

/// A saved queue, read back: the control stack checked against the area it describes.
pub struct SaveArea<'a> {
    target: Target,
    area: &'a [u8],
    ctl_stack_size: usize,
    stack: ControlStack,
}

impl<'a> SaveArea<'a> {
    /// `control_stack` is the used part of the control stack (from the MQD's companion
    /// pages, `[cntl_stack_offset, ctl_stack_size)`).
    pub fn open(
        target: Target,
        area: &'a [u8],
        ctl_stack_size: u32,
        control_stack: &[u8],
    ) -> Result<Self> {
        let ctl = ctl_stack_size as usize;
        let end = wave_area_end(area, ctl)?;
        if control_stack.len() > ctl - Header::SIZE {
            return Err(Error::new(
                "control stack",
                format!(
                    "{} bytes, more than a {ctl:#x}-byte control stack holds",
                    control_stack.len()
                ),
            ));
        }
        let stack = ControlStack::decode(target, control_stack)?;
        let used = stack.wave_area_used();
        if used > (end - ctl) as u64 {
            return Err(Error::new(
                "control stack: waves",
                format!(
                    "their blocks take {used:#x} bytes, the wave area has {:#x}",
                    end - ctl
                ),
            ));
        }
        Ok(SaveArea {
            target,
            area,
            ctl_stack_size: ctl,
            stack,
        })
    }

    pub fn stack(&self) -> &ControlStack {
        &self.stack
    }

    /// Rebuilds wave `w` of dispatch `d`; for the first wave of a workgroup, `lds` receives
    /// the workgroup's LDS (pass the workgroup's LDS there, nothing for the other waves).
    pub fn wave(&self, d: usize, w: usize, lds: Option<&mut [u8]>) -> Result<Wave> {
        let field = format!("dispatch[{d}].wave[{w}]");
        let disp = self
            .stack
            .dispatches
            .get(d)
            .ok_or_else(|| Error::new(format!("dispatch[{d}]"), "no such dispatch"))?;
        let rec = disp
            .waves
            .get(w)
            .ok_or_else(|| Error::new(field.clone(), "no such wave"))?;
        if rec.first_of_group != lds.is_some() {
            return Err(Error::new(
                format!("{field}.lds"),
                "the first wave of a workgroup restores its LDS, the others none",
            ));
        }
        let start = self.ctl_stack_size + rec.offset as usize;
        let len = WaveBlock::of(&disp.alloc).slot_bytes(rec.first_of_group);
        let block = &self.area[start..start + len];
        restore_wave(self.target, &disp.alloc, block, lds).map_err(|e| e.within(&field))
    }
}
