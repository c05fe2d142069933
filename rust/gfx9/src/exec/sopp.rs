//! SOPP: program control (branches, barrier, waits, traps).

use super::opdef::{def, OpDef};
use super::{bad, Cx, Flow, Step, Stop};
use crate::decode::Instr;

/// PC-relative target: the next instruction plus simm16 dwords.
fn target(cx: &Cx<'_>, i: &Instr) -> u64 {
    let next = cx.w.pc.wrapping_add(i.len as u64);
    next.wrapping_add((i.simm16 as i16 as i64 * 4) as u64)
}

fn branch_if(cx: &mut Cx<'_>, i: &Instr, taken: bool) -> Step {
    Ok(if taken {
        Flow::Jump(target(cx, i))
    } else {
        Flow::Next
    })
}

fn next(_: &mut Cx<'_>, _: &Instr) -> Step {
    Ok(Flow::Next)
}

/// s_sendmsg: simm16[3:0] is the message. Compute code sends only MSG_INTERRUPT (1); the
/// graphics messages and the trap handler's save/system messages are not modelled.
fn sendmsg(cx: &mut Cx<'_>, i: &Instr) -> Step {
    const MSG_INTERRUPT: u16 = 1;
    if i.simm16 & 0xf != MSG_INTERRUPT {
        return Err(bad("s_sendmsg", "only MSG_INTERRUPT is modelled"));
    }
    Ok(Flow::Yield(Stop::Interrupt(cx.w.m0())))
}

pub static SOPP: &[OpDef] = &[
    def(0x00, "s_nop", next),
    def(0x01, "s_endpgm", |_, _| Ok(Flow::Yield(Stop::Endpgm))),
    def(0x02, "s_branch", |cx, i| branch_if(cx, i, true)),
    def(0x04, "s_cbranch_scc0", |cx, i| branch_if(cx, i, !cx.w.scc)),
    def(0x05, "s_cbranch_scc1", |cx, i| branch_if(cx, i, cx.w.scc)),
    def(0x06, "s_cbranch_vccz", |cx, i| {
        branch_if(cx, i, cx.w.vcc() == 0)
    }),
    def(0x07, "s_cbranch_vccnz", |cx, i| {
        branch_if(cx, i, cx.w.vcc() != 0)
    }),
    def(0x08, "s_cbranch_execz", |cx, i| {
        branch_if(cx, i, cx.w.exec() == 0)
    }),
    def(0x09, "s_cbranch_execnz", |cx, i| {
        branch_if(cx, i, cx.w.exec() != 0)
    }),
    def(0x0a, "s_barrier", |_, _| Ok(Flow::Yield(Stop::Barrier))),
    // Memory completes in order within the instruction that issues it: nothing to wait for.
    def(0x0c, "s_waitcnt", next),
    def(0x0d, "s_sethalt", |_, i| {
        Ok(if i.simm16 & 1 != 0 {
            Flow::Yield(Stop::Halt)
        } else {
            Flow::Next
        })
    }),
    def(0x0e, "s_sleep", |_, i| {
        Ok(Flow::Yield(Stop::Sleep(i.simm16 & 0x7f)))
    }),
    def(0x0f, "s_setprio", next),
    def(0x10, "s_sendmsg", sendmsg),
    def(0x12, "s_trap", |_, i| {
        Ok(Flow::Yield(Stop::Trap(i.simm16 as u8)))
    }),
    // The owner of the code cache invalidates it when code memory changes.
    def(0x13, "s_icache_inv", next),
    def(0x14, "s_incperflevel", next),
    def(0x15, "s_decperflevel", next),
    def(0x1c, "s_set_gpr_idx_off", next),
];
