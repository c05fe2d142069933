//! The ioctls whose answer is a new file descriptor, served through the
//! seccomp listener of `kfd-emu supervise` (see `crate::supervise`):
//! CRIU_OP CHECKPOINT and RESTORE with one dma-buf per VRAM/GTT bucket, as
//! KFD's `criu_checkpoint_bos`/`criu_restore_bos` hand out, and
//! DRM_IOCTL_PRIME_HANDLE_TO_FD of an imported dma-buf.
//!
//! The op runs in the device model exactly as through FUSE (same checks,
//! errnos and fault injection); then each dma-buf is installed in the
//! caller (ADDFD), the buckets get their fd numbers, and the argument
//! struct is written back.  If the call is withdrawn (the caller got a
//! signal) after the op changed the model, the result is kept and replayed
//! to the restarted call with the same arguments from the same thread, so
//! the answer is idempotent: the op is not done twice.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex};

use super::dmabuf::{Dmabuf, Purpose};
use super::state::gem::Export;
use super::state::Open;
use super::uapi::{self, alloc, priv_blob as pb, sys};
use super::{Caller, Emulator, Replier};

/// Installs an fd in the caller of the call being answered.
pub trait FdInstaller {
    /// Returns the new fd number, or the errno why not (ENOENT: the call
    /// is no longer waiting).
    fn install(&self, file: BorrowedFd<'_>, cloexec: bool) -> Result<u32, i32>;
}

/// A finished op whose fds are still to be handed out.
struct Pending {
    /// (thread, request, argument bytes) of the call.
    key: (u32, u32, Vec<u8>),
    /// The argument struct to write back.
    out: Vec<u8>,
    /// The bucket array: where, its bytes, and the dmabuf of each bucket
    /// that gets one.
    bos_at: u64,
    buckets: Vec<u8>,
    exports: Vec<(usize, Arc<Dmabuf>)>,
}

/// Ops done whose answer did not reach the caller, for replay.
#[derive(Default)]
pub struct Replays(Mutex<VecDeque<Pending>>);

/// At most this many unanswered results are kept.
const REPLAYS: usize = 32;

impl Replays {
    fn take(&self, key: &(u32, u32, Vec<u8>)) -> Option<Pending> {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let i = q.iter().position(|p| &p.key == key)?;
        q.remove(i)
    }

    fn keep(&self, p: Pending) {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() == REPLAYS {
            q.pop_front();
        }
        q.push_back(p);
    }
}

/// A reply nobody reads: the supervised path takes the answer directly.
struct Unused;

impl Replier for Unused {
    fn reply(self: Box<Self>, _r: Result<Vec<u8>, i32>) {}
}

fn ioc_size(cmd: u32) -> usize {
    ((cmd >> 16) & 0x3fff) as usize
}

impl Emulator {
    /// Answers a trapped ioctl `cmd` (argument at `arg`) on emulated open
    /// `fh`: None when it is not one the supervisor serves (the kernel
    /// then runs it, through FUSE), else the call's result.
    pub fn fd_ioctl(
        &self,
        fh: u64,
        caller: &Caller,
        cmd: u32,
        arg: u64,
        inst: &dyn FdInstaller,
    ) -> Option<Result<(), i32>> {
        let kind = self.lock().opens.get(&fh).copied()?;
        let mut input = vec![0u8; ioc_size(cmd)];
        match kind {
            Open::Kfd { lead } if cmd == kfd_abi::ioctl::AMDKFD_IOC_CRIU_OP => {
                if super::mem::user_read(caller.tid, arg, &mut input).is_err() {
                    return Some(Err(libc::EFAULT));
                }
                let a: sys::kfd_ioctl_criu_args = uapi::decode(&input);
                if a.op != uapi::criu_op::CHECKPOINT && a.op != uapi::criu_op::RESTORE {
                    return None;
                }
                let key = (caller.tid, cmd, input.clone());
                if let Some(p) = self.replays.take(&key) {
                    log::info!(
                        "supervise: thread {} repeats an interrupted CRIU_OP: replaying its answer",
                        caller.tid
                    );
                    return Some(self.hand_out(caller, arg, p, inst));
                }
                Some(self.criu_with_fds(lead, caller, cmd, arg, input, key, inst))
            }
            Open::Kfd { lead }
                if cmd == kfd_abi::ioctl::AMDKFD_IOC_EXPORT_DMABUF
                    && self.shared.devs.kfd_minor >= 12 =>
            {
                if super::mem::user_read(caller.tid, arg, &mut input).is_err() {
                    return Some(Err(libc::EFAULT));
                }
                Some(self.export_dmabuf(lead, caller, arg, &input, inst))
            }
            Open::Render { .. } if cmd == kfd_abi::ioctl::DRM_IOCTL_PRIME_HANDLE_TO_FD => {
                if super::mem::user_read(caller.tid, arg, &mut input).is_err() {
                    return Some(Err(libc::EFAULT));
                }
                Some(self.prime_handle_to_fd(fh, caller, arg, &input, inst))
            }
            _ => None,
        }
    }

    /// EXPORT_DMABUF (KFD 1.12): KFD's checks (`kfd::export_dmabuf`), then
    /// a new fd of the BO's dma-buf, close-on-exec if the flags ask.
    fn export_dmabuf(
        &self,
        lead: u32,
        caller: &Caller,
        arg: u64,
        input: &[u8],
        inst: &dyn FdInstaller,
    ) -> Result<(), i32> {
        if caller.tgid != lead {
            return Err(libc::EBADF);
        }
        let mut a: uapi::layout::kfd_ioctl_export_dmabuf_args = uapi::decode(input);
        let d = {
            let mut st = self.lock();
            let key = super::kfd::export_dmabuf(&mut st, lead, &mut a)?;
            let p = st.procs.get(&lead).ok_or(libc::ESRCH)?;
            let bo = p.bos.get(&key).ok_or(libc::EINVAL)?;
            let map = bo.map.as_ref().ok_or(libc::EINVAL)?;
            let domain = if bo.flags & alloc::VRAM != 0 {
                sys::AMDGPU_GEM_DOMAIN_VRAM
            } else {
                sys::AMDGPU_GEM_DOMAIN_GTT
            };
            let source = super::dmabuf::Source {
                gpu: key.gpu,
                offset: bo.offset,
                domain,
            };
            st.devs
                .dmabufs
                .export(source, bo.size, map, Purpose::Export)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?
        };
        let fd = inst.install(d.file(), a.flags & libc::O_CLOEXEC as u32 != 0)?;
        a.dmabuf_fd = fd;
        super::mem::user_write(caller.tid, arg, uapi::bytes(&a))
    }

    /// PRIME_HANDLE_TO_FD (drm_prime_handle_to_fd_ioctl): a new fd of the
    /// object's dma-buf (one per BO, made at the first export of a
    /// GEM_CREATE BO, O_RDWR with `DRM_RDWR`, else O_RDONLY; userptr and
    /// per-VM BOs, which amdgpu refuses to export: EPERM).
    fn prime_handle_to_fd(
        &self,
        fh: u64,
        caller: &Caller,
        arg: u64,
        input: &[u8],
        inst: &dyn FdInstaller,
    ) -> Result<(), i32> {
        crate::fault::check(crate::fault::drm_op(uapi::drm::PRIME_HANDLE_TO_FD))?;
        let mut a: sys::drm_prime_handle = uapi::decode(input);
        let writable = a.flags & super::gem::DRM_RDWR != 0;
        let d = {
            let st = self.lock();
            match super::gem::export(st.render.get(&fh).ok_or(libc::EBADF)?, &a)? {
                Export::Dmabuf(d) => d,
                Export::Bo { source, size, map } => st
                    .devs
                    .dmabufs
                    .export_as(source, size, &map, Purpose::Share, writable)
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?,
            }
        };
        let fd = inst.install(d.file(), a.flags & super::gem::DRM_CLOEXEC != 0)?;
        a.fd = fd as i32;
        super::mem::user_write(caller.tid, arg, uapi::bytes(&a))
    }

    #[allow(clippy::too_many_arguments)]
    fn criu_with_fds(
        &self,
        lead: u32,
        caller: &Caller,
        cmd: u32,
        arg: u64,
        input: Vec<u8>,
        key: (u32, u32, Vec<u8>),
        inst: &dyn FdInstaller,
    ) -> Result<(), i32> {
        let out_size = input.len();
        let r = match self.kfd_ioctl(lead, caller, cmd, &input, out_size, Box::new(Unused)) {
            Some((_, r)) => r,
            // Only WAIT_EVENTS parks.
            None => unreachable!("a CRIU op never parks"),
        };
        let out = r?;
        let a: sys::kfd_ioctl_criu_args = uapi::decode(&out);
        let n = a.num_bos as usize;
        let mut buckets = vec![0u8; n * pb::BO_BUCKET];
        super::mem::user_read(caller.tid, a.bos, &mut buckets)?;
        let target = if a.op == uapi::criu_op::CHECKPOINT {
            lead
        } else {
            caller.tgid
        };
        let mut exports = Vec::new();
        {
            let st = self.lock();
            let p = st.procs.get(&target).ok_or(libc::ESRCH)?;
            for i in 0..n {
                let b: sys::kfd_criu_bo_bucket = uapi::nth(&buckets, i);
                if b.alloc_flags & (alloc::VRAM | alloc::GTT) == 0 {
                    continue;
                }
                let off = if a.op == uapi::criu_op::CHECKPOINT {
                    b.offset
                } else {
                    b.restored_offset
                };
                let gpu = p.pdd_by_user_id(b.gpu_id).ok_or(libc::EINVAL)?;
                let bo = p
                    .bos
                    .iter()
                    .find(|(k, bo)| k.gpu == gpu && bo.offset == off)
                    .map(|(_, bo)| bo)
                    .ok_or(libc::EINVAL)?;
                let map = bo.map.as_ref().ok_or(libc::EINVAL)?;
                let purpose = if a.op == uapi::criu_op::CHECKPOINT {
                    Purpose::Checkpoint
                } else {
                    Purpose::Restore
                };
                let domain = if b.alloc_flags & alloc::VRAM != 0 {
                    sys::AMDGPU_GEM_DOMAIN_VRAM
                } else {
                    sys::AMDGPU_GEM_DOMAIN_GTT
                };
                let source = super::dmabuf::Source {
                    gpu,
                    offset: off,
                    domain,
                };
                let d = st
                    .devs
                    .dmabufs
                    .export(source, bo.size, map, purpose)
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?;
                exports.push((i, d));
            }
        }
        let p = Pending {
            key,
            out,
            bos_at: a.bos,
            buckets,
            exports,
        };
        self.hand_out(caller, arg, p, inst)
    }

    /// Installs the dmabufs of `p` in the caller and writes the buckets
    /// and the argument struct; keeps `p` for a replay when the caller
    /// is gone from the call.
    fn hand_out(
        &self,
        caller: &Caller,
        arg: u64,
        mut p: Pending,
        inst: &dyn FdInstaller,
    ) -> Result<(), i32> {
        let off = std::mem::offset_of!(sys::kfd_criu_bo_bucket, dmabuf_fd);
        for (i, d) in &p.exports {
            match inst.install(d.file(), false) {
                Ok(fd) => uapi::put(&mut p.buckets, i * pb::BO_BUCKET + off, &fd),
                Err(e) => {
                    self.replays.keep(p);
                    return Err(e);
                }
            }
        }
        super::mem::user_write(caller.tid, p.bos_at, &p.buckets)?;
        super::mem::user_write(caller.tid, arg, &p.out)
    }
}
