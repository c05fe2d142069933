//! Engine choice: which engine copies a BO ([`choose_engine`]), and the
//! engines of one GPU worker or lane ([`Engines`]), which bracket the CPU's
//! access to VRAM with HDP barriers.  A new copy engine is chosen here.

use super::{cpu, CopyEngine, CopyError, GpuEngine};
use crate::bo::{self, BoRef};
use crate::env::{self, EnginePolicy};

/// Which engine handles a BO under `policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Cpu,
    Sdma,
}

/// Engine selection.  `auto`: SDMA for VRAM BOs when the GPU has a working
/// SDMA engine and the BO a dmabuf (real hardware), the CPU for the rest
/// (GTT, BOs KFD exported no dmabuf for, the emulator, a GPU whose DMA ring
/// refused us).  Forced choices fail when their engine cannot reach the BO.
pub fn choose_engine(
    policy: EnginePolicy,
    bo: &BoRef<'_>,
    sdma_available: bool,
) -> Result<EngineKind, CopyError> {
    let no = |why: &str| CopyError::NoEngine {
        gpu: bo.gpu,
        bo: bo.index,
        why: why.into(),
    };
    let can_cpu = bo.cpu_map.is_some();
    let can_sdma = sdma_available && bo.dmabuf.is_some();
    match policy {
        EnginePolicy::Cpu if can_cpu => Ok(EngineKind::Cpu),
        EnginePolicy::Cpu => Err(no(
            "CRIU_ROCM_COPY_ENGINE=cpu but the BO has no CPU mapping",
        )),
        EnginePolicy::Sdma if can_sdma => Ok(EngineKind::Sdma),
        EnginePolicy::Sdma => Err(no(
            "CRIU_ROCM_COPY_ENGINE=sdma but the BO has no dmabuf or the GPU no SDMA path",
        )),
        EnginePolicy::Auto => {
            if can_sdma && bo.alloc_flags & bo::ALLOC_VRAM != 0 {
                Ok(EngineKind::Sdma)
            } else if can_cpu {
                Ok(EngineKind::Cpu)
            } else if can_sdma {
                Ok(EngineKind::Sdma)
            } else {
                Err(no("neither a CPU mapping nor a dmabuf with SDMA"))
            }
        }
    }
}

/// The engines of one GPU worker (or lane).
pub struct Engines<'a> {
    pub policy: EnginePolicy,
    pub cpu: Option<cpu::CpuEngine>,
    pub sdma: Option<Box<dyn GpuEngine + 'a>>,
    /// Whether the SDMA engine copies BOs (false under policy `cpu`, where
    /// it is there for HDP barriers only).
    pub sdma_copies: bool,
    /// The bytes of the memory budget for the CPU window and the pages
    /// file's write buffer (besides what an SDMA engine holds).
    pub budget: u64,
    /// The BOs may change while copied (a pre-dump: the process runs): the
    /// CPU engines read each slice once into memory of their own
    /// ([`cpu::CpuEngine::live`]).
    pub live: bool,
}

impl<'a> Engines<'a> {
    /// A CPU engine and a pages-file write buffer within `budget` bytes
    /// (see [`env::lane_split`]), plus the SDMA engine if the device has
    /// one (under policy `cpu` it only issues HDP barriers).
    pub fn new(policy: EnginePolicy, budget: u64, sdma: Option<Box<dyn GpuEngine + 'a>>) -> Self {
        Engines {
            policy,
            cpu: Some(cpu::CpuEngine::new(env::lane_split(budget).0)),
            sdma_copies: policy != EnginePolicy::Cpu,
            sdma,
            budget,
            live: false,
        }
    }

    /// For BOs that may change while they are copied (see [`Self::live`]).
    pub fn set_live(&mut self) {
        self.live = true;
        self.set_window(env::lane_split(self.budget).0);
    }

    /// A CPU engine (live or not, as these engines are) with a mapping
    /// window within `window` bytes.
    pub(super) fn set_window(&mut self, window: u64) {
        self.cpu = Some(if self.live {
            cpu::CpuEngine::live(window)
        } else {
            cpu::CpuEngine::new(window)
        });
    }

    /// CPU-only engines for another lane of the same GPU, within `budget`.
    pub(super) fn another_lane(&self, budget: u64) -> Engines<'a> {
        let mut e = Engines::new(EnginePolicy::Cpu, budget, None);
        e.live = self.live;
        e.set_window(env::lane_split(budget).0);
        e
    }

    /// Bytes of the pages file's write buffer of a lane with these engines.
    pub(super) fn write_buffer(&self) -> usize {
        env::lane_split(self.budget).1 as usize
    }

    /// Moves one piece with the engine `policy` picks for it (`f` does the
    /// moving); CPU access to a VRAM BO is bracketed by HDP barriers when
    /// the GPU has an engine that can issue them.
    pub(super) fn with_engine<T>(
        &mut self,
        bo: &BoRef<'_>,
        f: impl FnOnce(&mut dyn CopyEngine) -> Result<T, CopyError>,
    ) -> Result<(EngineKind, T), CopyError> {
        let kind = choose_engine(self.policy, bo, self.sdma.is_some() && self.sdma_copies)?;
        let missing = |what: &str| CopyError::NoEngine {
            gpu: bo.gpu,
            bo: bo.index,
            why: format!("{what} engine not set up"),
        };
        match kind {
            EngineKind::Sdma => {
                let sdma = self.sdma.as_deref_mut().ok_or_else(|| missing("SDMA"))?;
                Ok((kind, f(sdma)?))
            }
            EngineKind::Cpu => {
                let cpu = self.cpu.as_mut().ok_or_else(|| missing("CPU"))?;
                let hdp = match self.sdma.as_deref_mut() {
                    Some(g) if bo.alloc_flags & bo::ALLOC_VRAM != 0 => Some(g),
                    _ => None,
                };
                match hdp {
                    Some(g) => {
                        g.hdp_barrier(bo)?;
                        let r = f(cpu)?;
                        g.hdp_barrier(bo)?;
                        Ok((kind, r))
                    }
                    None => Ok((kind, f(cpu)?)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::tests::*;

    /// Under `auto` VRAM goes by the GPU engine and GTT by the CPU; under
    /// `cpu` the CPU copies VRAM between two HDP barriers, GTT without.
    #[test]
    fn vram_goes_by_sdma_and_cpu_access_to_vram_is_hdp_bracketed() {
        let dev = device(1 << 20);
        let bo = |index, flags| BoRef {
            index,
            gpu: GpuId(1),
            addr: GpuVa(0x10000 * (index as u64 + 1)),
            size: 4096,
            alloc_flags: flags,
            cpu_map: Some((dev.as_fd(), MmapOffset(4096 * index as u64))),
            dmabuf: Some(dev.as_fd()),
        };
        let vram = bo(0, bo::ALLOC_VRAM | bo::ALLOC_PUBLIC);
        let gtt = bo(1, bo::ALLOC_GTT);
        for (policy, want) in [
            (EnginePolicy::Auto, vec!["copy 0"]),
            (EnginePolicy::Cpu, vec!["hdp 0", "hdp 0"]),
        ] {
            let (gpu, log) = FakeGpu::new();
            let mut e = Engines::new(policy, 4096, Some(Box::new(gpu)));
            for b in [&vram, &gtt] {
                let (kind, ()) = e
                    .with_engine(b, |eng| eng.read_bo(b, &mut io::sink()))
                    .unwrap();
                let expect = if b.index == 0 && policy == EnginePolicy::Auto {
                    EngineKind::Sdma
                } else {
                    EngineKind::Cpu
                };
                assert_eq!(kind, expect, "{policy:?}, BO {}", b.index);
            }
            assert_eq!(*log.lock().unwrap(), want, "{policy:?}");
        }
    }

    #[test]
    fn engine_selection() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let fd = f.as_fd();
        let vram = bo::ALLOC_VRAM;
        use EngineKind::*;
        use EnginePolicy as P;
        // Emulator: no dmabuf → CPU.
        assert_eq!(
            choose_engine(P::Auto, &bo_ref(Some(fd), None, vram), true).unwrap(),
            Cpu
        );
        // Hardware (a dmabuf), VRAM → SDMA.
        assert_eq!(
            choose_engine(P::Auto, &bo_ref(Some(fd), Some(fd), vram), true).unwrap(),
            Sdma
        );
        // GTT → CPU even with a dmabuf; so is PUBLIC VRAM only without SDMA.
        assert_eq!(
            choose_engine(P::Auto, &bo_ref(Some(fd), Some(fd), bo::ALLOC_GTT), true).unwrap(),
            Cpu
        );
        assert_eq!(
            choose_engine(
                P::Auto,
                &bo_ref(Some(fd), Some(fd), vram | bo::ALLOC_PUBLIC),
                true
            )
            .unwrap(),
            Sdma
        );
        // No SDMA on this device → CPU fallback.
        assert_eq!(
            choose_engine(P::Auto, &bo_ref(Some(fd), Some(fd), vram), false).unwrap(),
            Cpu
        );
        assert!(choose_engine(P::Auto, &bo_ref(None, None, vram), true).is_err());
        assert_eq!(
            choose_engine(P::Cpu, &bo_ref(Some(fd), Some(fd), vram), true).unwrap(),
            Cpu
        );
        let e = choose_engine(P::Sdma, &bo_ref(Some(fd), None, vram), true).unwrap_err();
        assert!(
            e.to_string().contains("CRIU_ROCM_COPY_ENGINE=sdma") && e.to_string().contains("BO 4")
        );
        assert!(choose_engine(P::Cpu, &bo_ref(None, Some(fd), vram), true).is_err());
    }
}
