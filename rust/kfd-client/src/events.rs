//! KFD signal events, arranged as the thunk does on discrete GPUs: the process's signal
//! page is a GTT BO whose handle goes with the first CREATE_EVENT; an event fires when its
//! 8-byte slot in that page no longer holds the "unsignaled" value and an interrupt (SDMA
//! TRAP) makes KFD look. Waits are retried on EINTR with the remaining timeout, so a
//! checkpoint (which interrupts the wait) is invisible to the caller.

use std::time::{Duration, Instant};

use kfd_abi::handle::Error as IoctlError;
use kfd_abi::ids::{EventId, GpuId, GpuVa};
use kfd_abi::sys;

use crate::{Bo, KfdClient, MemKind};

/// A slot's value while its event is not signaled.
pub const UNSIGNALED_SLOT: u64 = u64::MAX;
/// Bytes of the signal page: one 8-byte slot per possible signal event.
pub const SIGNAL_PAGE_BYTES: u64 = sys::KFD_SIGNAL_EVENT_LIMIT as u64 * 8;

/// What a wait ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitResult {
    Signaled,
    TimedOut,
}

/// Why an event operation failed.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error(transparent)]
    Client(#[from] crate::Error),
    #[error("/dev/kfd: event {event}: {source}")]
    Ioctl { event: EventId, source: IoctlError },
    #[error("/dev/kfd: creating a signal event on GPU {}: {source}", .gpu.get())]
    Create { gpu: GpuId, source: IoctlError },
    #[error("/dev/kfd: event {event}: KFD reported wait result {result}")]
    WaitFailed { event: EventId, result: u32 },
}

/// The process's signal page and the events created on it.
#[derive(Debug)]
pub struct Events<'c> {
    client: &'c KfdClient,
    page: Bo<'c>,
    attached: bool,
}

/// One auto-reset signal event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub id: EventId,
    /// GPU VA of the event's slot: a FENCE there followed by a TRAP signals it.
    pub slot_va: GpuVa,
}

impl<'c> Events<'c> {
    /// Allocates the signal page on `gpu` (GPU-mapped there, so that GPU's engines can
    /// write slots). Every slot starts unsignaled.
    pub fn new(client: &'c KfdClient, gpu: GpuId) -> Result<Self, EventError> {
        let page = client.alloc(gpu, SIGNAL_PAGE_BYTES, MemKind::Gtt)?;
        page.volatile().fill(0xff);
        Ok(Self {
            client,
            page,
            attached: false,
        })
    }

    /// Creates an auto-reset signal event.
    pub fn create(&mut self) -> Result<Event, EventError> {
        let gpu = self.page.gpu();
        let mut a = sys::kfd_ioctl_create_event_args {
            // The first signal event hands KFD the page; later ones must not.
            event_page_offset: if self.attached {
                0
            } else {
                self.page.handle().0
            },
            event_type: sys::KFD_IOC_EVENT_SIGNAL,
            auto_reset: 1,
            ..Default::default()
        };
        let id = self
            .client
            .kfd()
            .create_event(&mut a)
            .map_err(|source| EventError::Create { gpu, source })?;
        self.attached = true;
        let slot = u64::from(a.event_slot_index) * 8;
        Ok(Event {
            id,
            slot_va: GpuVa(self.page.va().0 + slot),
        })
    }

    pub fn destroy(&self, e: Event) -> Result<(), EventError> {
        self.client
            .kfd()
            .destroy_event(e.id)
            .map_err(|source| EventError::Ioctl {
                event: e.id,
                source,
            })
    }

    /// Signals `e` from the CPU (SET_EVENT).
    pub fn set(&self, e: Event) -> Result<(), EventError> {
        self.client
            .kfd()
            .set_event(e.id)
            .map_err(|source| EventError::Ioctl {
                event: e.id,
                source,
            })
    }

    /// Waits for `e` up to `timeout`, retrying interrupted waits with the time left.
    pub fn wait(&self, e: Event, timeout: Duration) -> Result<WaitResult, EventError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX);
            let mut data = [sys::kfd_event_data {
                event_id: e.id.0,
                ..Default::default()
            }];
            match self.client.kfd().wait_events(&mut data, true, ms) {
                Ok(r) if r == sys::KFD_IOC_WAIT_RESULT_COMPLETE => return Ok(WaitResult::Signaled),
                Ok(r) if r == sys::KFD_IOC_WAIT_RESULT_TIMEOUT => return Ok(WaitResult::TimedOut),
                Ok(result) => {
                    return Err(EventError::WaitFailed {
                        event: e.id,
                        result,
                    })
                }
                Err(err) if err.is_eintr() => continue,
                Err(source) => {
                    return Err(EventError::Ioctl {
                        event: e.id,
                        source,
                    })
                }
            }
        }
    }
}
