//! The crate-level error, and its one conversion to an errno for the C
//! boundary.

use crate::copy::CopyError;
use crate::env::EnvError;
use crate::image::ImageError;
use crate::matcher::MatchError;
use crate::plan::PlanError;
use crate::topology::TopologyError;

/// Any error of the core, with the context its layer added.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("host topology: {0}")]
    Topology(#[from] TopologyError),
    #[error("no host GPU assignment: {0}")]
    Match(#[from] MatchError),
    #[error("environment: {0}")]
    Env(#[from] EnvError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Copy(#[from] CopyError),
}

impl Error {
    /// The positive errno the C side returns negated: the OS error when
    /// there is one, otherwise the class of the failure.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Image(e) => e.raw_os_error().unwrap_or(libc::EINVAL),
            Error::Topology(TopologyError::Io { source, .. }) => {
                source.raw_os_error().unwrap_or(libc::EIO)
            }
            Error::Topology(_) => libc::EINVAL,
            Error::Match(_) => libc::ENODEV,
            Error::Env(_) => libc::EINVAL,
            Error::Plan(PlanError::Image(e)) => e.raw_os_error().unwrap_or(libc::EINVAL),
            Error::Plan(_) => libc::EINVAL,
            Error::Copy(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_keeps_os_errors() {
        let io = ImageError::Io {
            file: "f".into(),
            op: "open",
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        };
        assert_eq!(Error::from(io).errno(), libc::ENOENT);
        let m = MatchError::TooFewGpus { image: 2, host: 1 };
        assert_eq!(Error::from(m).errno(), libc::ENODEV);
        let c = CopyError::Timeout {
            gpu: crate::ids::GpuId(1),
            bo: 0,
            timeout: std::time::Duration::from_secs(1),
        };
        assert_eq!(Error::from(c).errno(), libc::ETIMEDOUT);
        let e = crate::env::parse_bool("KFD_NUMA_CHECK", "x").unwrap_err();
        let msg = Error::from(e).to_string();
        assert!(msg.contains("KFD_NUMA_CHECK"), "{msg}");
    }
}
