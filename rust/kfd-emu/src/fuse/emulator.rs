//! Glue between the FUSE transport and the device model: one
//! [`FileOps`] per device node, delegating to the shared
//! [`device::Emulator`].

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::device::{self, Emulator, NodeKind};
use crate::fuse::{Caller, FileOps, IoctlReply};
use crate::profile::Profile;
use crate::runner::{Devices, NodeSpec};

struct NodeOps {
    emu: Arc<Emulator>,
    node: NodeKind,
}

/// Hands the transport's reply to the device model's `Replier`.
struct Reply(IoctlReply);

impl device::Replier for Reply {
    fn reply(self: Box<Self>, r: Result<Vec<u8>, i32>) {
        self.0.reply(r)
    }

    fn request_id(&self) -> Option<u64> {
        Some(self.0.unique())
    }
}

fn device_caller(c: &Caller) -> device::Caller {
    device::Caller {
        tid: c.tid,
        tgid: c.tgid,
    }
}

impl FileOps for NodeOps {
    fn open(&self, caller: &Caller) -> Result<u64, i32> {
        self.emu.open(&self.node, &device_caller(caller))
    }

    fn release(&self, fh: u64) {
        self.emu.release(fh)
    }

    fn ioctl(
        &self,
        fh: u64,
        caller: &Caller,
        cmd: u32,
        arg: u64,
        input: &[u8],
        out_size: u32,
        reply: IoctlReply,
    ) {
        self.emu.ioctl(
            fh,
            &device_caller(caller),
            cmd,
            arg,
            input,
            out_size,
            Box::new(Reply(reply)),
        )
    }

    fn interrupt(&self, unique: u64) -> bool {
        self.emu.interrupt(&self.node, unique)
    }
}

/// Where a node appears in the namespace.
pub fn node_path(node: &NodeKind) -> PathBuf {
    match node {
        NodeKind::Kfd => PathBuf::from("/dev/kfd"),
        NodeKind::Render { minor } => PathBuf::from(format!("/dev/dri/renderD{minor}")),
    }
}

/// Creates the emulator for `profile` and the nodes to serve.
pub fn devices(profile: &Profile) -> io::Result<Devices> {
    let emu = Arc::new(Emulator::new(profile)?);
    let mut nodes = Vec::new();
    for node in emu.nodes() {
        nodes.push(NodeSpec {
            path: node_path(&node),
            backing: emu.backing_fd(&node).try_clone_to_owned()?,
            ops: Arc::new(NodeOps {
                emu: emu.clone(),
                node,
            }),
        });
    }
    let e = emu.clone();
    Ok(Devices {
        nodes,
        shutdown: Box::new(move || e.shutdown()),
    })
}
