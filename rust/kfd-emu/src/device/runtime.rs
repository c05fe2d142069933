//! What KFD 1.12 and 1.13 added for the runtime: EXPORT_DMABUF's checks,
//! RUNTIME_ENABLE, and DBG_TRAP as a process without a debugger meets it.
//!
//! * RUNTIME_ENABLE (`kfd_ioctl_runtime_enable`): ROCr enables the runtime
//!   in hsa_init (with its `r_debug` and, where the GPU saves trap
//!   temporaries, TTMP_SAVE) and disables it at hsa_shut_down.  Enabling
//!   twice is EBUSY; enabling with user queues already made is EEXIST;
//!   disabling always succeeds.  No capability bit is defined.
//! * DBG_TRAP (`kfd_ioctl_set_debug_trap`): the target is a KFD process by
//!   pid (ESRCH otherwise); another process may be debugged only by its
//!   ptrace parent (EPERM, DISABLE exempt); every operation but ENABLE
//!   needs a session (EINVAL).  A process may open a session on itself:
//!   ENABLE records it (EALREADY twice, EBADF without the event fd) and
//!   copies the runtime info out as KFD does; DISABLE ends it.  The
//!   debug-hardware operations need an enabled runtime (EPERM); wave
//!   control, address watches, exception queries and snapshots are not
//!   emulated (EOPNOTSUPP, with a warning).
//!
//! KFD's CRIU private data carries neither state: a restored process
//! starts with the runtime disabled and no debug session, as on KFD.

use super::state::{Proc, RuntimeState, State, R};
use super::uapi::layout::{dbg_trap_op, runtime_enable};
use super::uapi::layout::{kfd_ioctl_dbg_trap_args, kfd_ioctl_runtime_enable_args};
use super::Caller;

/// RUNTIME_ENABLE on process `lead`.
pub fn runtime_enable(st: &mut State, lead: u32, a: &mut kfd_ioctl_runtime_enable_args) -> R<()> {
    let p = st.procs.get_mut(&lead).ok_or(libc::ESRCH)?;
    if a.mode_mask & runtime_enable::MODE_ENABLE == 0 {
        p.runtime = RuntimeState::default();
        return Ok(());
    }
    if p.runtime.enabled {
        return Err(libc::EBUSY);
    }
    if !p.queues.is_empty() {
        return Err(libc::EEXIST);
    }
    p.runtime = RuntimeState {
        enabled: true,
        r_debug: a.r_debug,
        ttmp_setup: a.mode_mask & runtime_enable::MODE_TTMP_SAVE != 0,
        debug_session: p.runtime.debug_session,
    };
    a.capabilities_mask = 0;
    Ok(())
}

/// `struct kfd_runtime_info` as DBG_TRAP ENABLE copies it out: r_debug,
/// runtime_state (0 disabled, 1 enabled), ttmp_setup.
fn runtime_info(p: &Proc) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&p.runtime.r_debug.to_le_bytes());
    b[8..12].copy_from_slice(&u32::from(p.runtime.enabled).to_le_bytes());
    b[12..].copy_from_slice(&u32::from(p.runtime.ttmp_setup).to_le_bytes());
    b
}

/// DBG_TRAP by `caller`.
pub fn dbg_trap(st: &mut State, caller: &Caller, a: &mut kfd_ioctl_dbg_trap_args) -> R<()> {
    let target = a.pid;
    let p = st.procs.get_mut(&target).ok_or(libc::ESRCH)?;
    if target != caller.tgid
        && a.op != dbg_trap_op::DISABLE
        && super::tracer_of(target).is_none_or(|t| t == 0 || super::tgid_of(t) != Some(caller.tgid))
    {
        return Err(libc::EPERM);
    }
    if a.op != dbg_trap_op::ENABLE && !p.runtime.debug_session {
        return Err(libc::EINVAL);
    }
    if dbg_trap_op::HW_OPS.contains(&a.op) && !p.runtime.enabled {
        return Err(libc::EPERM);
    }
    match a.op {
        dbg_trap_op::ENABLE => {
            if p.runtime.debug_session {
                return Err(libc::EALREADY);
            }
            let (rinfo_ptr, rinfo_size, dbg_fd) =
                (a.args[1], a.args[2] as u32, (a.args[2] >> 32) as i32);
            if !fd_is_open(caller.tgid, dbg_fd) {
                return Err(libc::EBADF);
            }
            let info = runtime_info(p);
            let n = (rinfo_size as usize).min(info.len());
            super::mem::user_write(caller.tid, rinfo_ptr, &info[..n])?;
            p.runtime.debug_session = true;
            a.args[2] = (a.args[2] & !0xffff_ffff) | info.len() as u64;
            Ok(())
        }
        dbg_trap_op::DISABLE => {
            p.runtime.debug_session = false;
            Ok(())
        }
        op if op <= dbg_trap_op::LAST => {
            log::warn!(
                "kfd-emu: AMDKFD_IOC_DBG_TRAP operation {op} on process {target}: debugger \
                 operations are not emulated"
            );
            Err(libc::EOPNOTSUPP)
        }
        _ => Err(libc::EINVAL),
    }
}

fn fd_is_open(tgid: u32, fd: i32) -> bool {
    fd >= 0 && std::fs::symlink_metadata(format!("/proc/{tgid}/fd/{fd}")).is_ok()
}
