//! One implemented opcode's table entry, below the families that list them and the
//! table that indexes them.

use super::ExecFn;
use crate::state::Target;

/// One implemented opcode.
#[derive(Debug)]
pub struct OpDef {
    pub op: u16,
    /// The mnemonic as LLVM's assembler spells it (without _e32/_e64 suffixes).
    pub name: &'static str,
    pub run: ExecFn,
    /// `Some(t)`: exists on `t` only (gfx942 takes gfx90a's entries, see `table::on_target`).
    pub only: Option<Target>,
}

/// A table entry present on both targets.
pub(crate) const fn def(op: u16, name: &'static str, run: ExecFn) -> OpDef {
    OpDef {
        op,
        name,
        run,
        only: None,
    }
}

/// A table entry of one target.
pub(crate) const fn def_on(t: Target, op: u16, name: &'static str, run: ExecFn) -> OpDef {
    OpDef {
        op,
        name,
        run,
        only: Some(t),
    }
}
