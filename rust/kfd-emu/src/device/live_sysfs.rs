//! What the live sysfs files show ([`crate::sysfs::live`]), read from the
//! state under its lock: each GPU's memory use, and each process with
//! /dev/kfd open with its VRAM, resident waves, SDMA time and queues per
//! GPU, as KFD's procfs shows them (the topology's gpu_id, not the
//! process' own name for a GPU); and the engines' busy time.

use super::activity::Activity;
use super::state::State;
use super::uapi::queue_type;
use super::Emulator;
use crate::sysfs::live::{self, GpuUse, ProcGpu, ProcUse, QueueUse, Snapshot};
use crate::sysfs::load::Totals;

/// KFD's first PASID (amdgpu hands them out from 1 << 15 down the
/// 16-bit range): the process in slot N has PASID 0x8000 + N - 1.
const PASID_BASE: u32 = 0x8000;

impl Emulator {
    /// What the live sysfs files show now: the processes' waves and SDMA
    /// time as of the last [`Emulator::sample_activity`].
    pub fn sysfs_snapshot(&self) -> Snapshot {
        let st = self.lock();
        st.sysfs_snapshot(&self.shared.activity)
    }

    /// Takes the processes' waves and SDMA time the live files show next
    /// (on the live sysfs's tick, not at every call that writes them).
    pub fn sample_activity(&self) {
        self.shared.activity.sample();
    }

    /// Each GPU's engines' busy time so far.
    pub fn load_totals(&self) -> Vec<Totals> {
        self.shared.activity.totals()
    }
}

impl State {
    fn sysfs_snapshot(&self, a: &Activity) -> Snapshot {
        let gpus = (0..self.devs.gpus.len())
            .map(|g| {
                let u = self.usage(g);
                GpuUse {
                    vram: u.vram,
                    visible_vram: u.visible_vram,
                    gtt: u.gtt,
                }
            })
            .collect();
        let mut procs: Vec<ProcUse> = self.procs.values().map(|p| self.proc_use(p, a)).collect();
        procs.sort_by_key(|p| p.pid);
        Snapshot { gpus, procs }
    }

    fn proc_use(&self, p: &super::state::Proc, a: &Activity) -> ProcUse {
        let id = |gpu: usize| self.devs.gpus[gpu].id;
        let gpus = p
            .present()
            .map(|(gpu, _)| {
                let (waves, sdma_us) = a.process(p.lead, gpu);
                ProcGpu {
                    gpu_id: id(gpu),
                    vram: p.bos.bytes_on(gpu).vram,
                    waves,
                    sdma_us,
                }
            })
            .collect();
        let queues = p
            .queues
            .iter()
            .map(|(qid, q)| QueueUse {
                id: *qid,
                gpu_id: id(q.gpu),
                size: u64::from(q.ring_size),
                qtype: match q.qtype {
                    queue_type::SDMA => live::queue_type::SDMA,
                    queue_type::SDMA_XGMI => live::queue_type::SDMA_XGMI,
                    queue_type::SDMA_BY_ENG_ID => live::queue_type::SDMA_BY_ENG_ID,
                    _ => live::queue_type::COMPUTE,
                },
            })
            .collect();
        ProcUse {
            pid: p.lead,
            pasid: PASID_BASE + p.slot - 1,
            gpus,
            queues,
        }
    }
}
