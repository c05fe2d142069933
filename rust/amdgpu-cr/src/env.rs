//! Environment knobs.
//!
//! The names and syntax of the upstream knobs are kept so that existing
//! deployments behave the same: the seven `KFD_*_CHECK` booleans (restore),
//! `KFD_MAX_BUFFER_SIZE` (dump and restore).  Ours: `CRIU_ROCM_COPY_ENGINE`,
//! `KFD_COMPRESS` and `KFD_COMPRESS_THREADS` (dump).
//!
//! Every parser takes a lookup function so tests do not touch the process
//! environment; `from_env` variants read the real one through [`knob`],
//! where a value set with [`set_knob`] (CRIU's `--gpu-knob NAME=VALUE`
//! option, from the command line or any CRIU configuration file, which is
//! how a knob reaches a `criu swrk` that container engines start) replaces
//! the environment's.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::bo::PAGE_SIZE;

/// Errors in an environment variable; they name the variable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvError {
    #[error("{var}={value:?}: {reason}")]
    Invalid {
        var: &'static str,
        value: String,
        reason: String,
    },
}

fn invalid(var: &'static str, value: &str, reason: impl Into<String>) -> EnvError {
    EnvError::Invalid {
        var,
        value: value.to_owned(),
        reason: reason.into(),
    }
}

/// The private key (PKCS#8 PEM) a dump signs its images with
/// (`validate::signature`).
pub const SIGN_KEY_VAR: &str = "CRIU_ROCM_SIGN_KEY";
/// The public key (PEM) whose signature a restore and `gpu-check` require.
pub const VERIFY_KEY_VAR: &str = "CRIU_ROCM_VERIFY_KEY";

/// The SHA-256 (`sha256:<64 hex digits>`) of the `amdgpu-signature.img`
/// a restore requires besides the key's signature: that dump's images and
/// no older or other signed ones (`validate::signature`).
pub const VERIFY_SIGNATURE_VAR: &str = "CRIU_ROCM_VERIFY_SIGNATURE";

/// Every knob criu-rocm reads, by its environment variable's name.
pub const KNOBS: [&str; 15] = [
    "KFD_FW_VER_CHECK",
    "KFD_SDMA_FW_VER_CHECK",
    "KFD_CACHES_COUNT_CHECK",
    "KFD_NUM_GWS_CHECK",
    "KFD_VRAM_SIZE_CHECK",
    "KFD_NUMA_CHECK",
    "KFD_CAPABILITY_CHECK",
    MAX_BUFFER_SIZE_VAR,
    COPY_ENGINE_VAR,
    COMPRESS_VAR,
    COMPRESS_THREADS_VAR,
    SIGN_KEY_VAR,
    VERIFY_KEY_VAR,
    VERIFY_SIGNATURE_VAR,
    STREAM_TIMEOUT_VAR,
];

/// Knob values set by options; they replace the environment's.
static OVERRIDES: Mutex<BTreeMap<&'static str, String>> = Mutex::new(BTreeMap::new());

fn overrides() -> std::sync::MutexGuard<'static, BTreeMap<&'static str, String>> {
    OVERRIDES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why `--gpu-knob` refused its argument.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KnobError {
    #[error("{0:?} is not NAME=VALUE")]
    Syntax(String),
    #[error("{name:?} is not a GPU knob (known: {known})", known = KNOBS.join(", "))]
    Unknown { name: String },
    #[error(transparent)]
    Invalid(#[from] EnvError),
}

/// Validates `NAME=VALUE` (a knob of [`KNOBS`] and a value its parser
/// takes) and makes VALUE the knob's value for this process, in place of
/// the environment's.  A later call for the same knob replaces an earlier.
pub fn set_knob(arg: &str) -> Result<(&'static str, String), KnobError> {
    let (name, value) = arg
        .split_once('=')
        .ok_or_else(|| KnobError::Syntax(arg.to_owned()))?;
    let name = *KNOBS
        .iter()
        .find(|k| **k == name)
        .ok_or_else(|| KnobError::Unknown {
            name: name.to_owned(),
        })?;
    match name {
        MAX_BUFFER_SIZE_VAR => {
            parse_max_buffer_size(Some(value))?;
        }
        COPY_ENGINE_VAR => {
            parse_engine_policy(Some(value))?;
        }
        COMPRESS_VAR => {
            parse_compress(Some(value))?;
        }
        COMPRESS_THREADS_VAR => {
            parse_compress_threads(Some(value))?;
        }
        // A configuration file may come with the images (a container's
        // annotations): it must not swap the key the images are checked
        // against for another.
        VERIFY_KEY_VAR | VERIFY_SIGNATURE_VAR if knob(name).is_some_and(|set| set != value) => {
            return Err(invalid(
                name,
                value,
                format!(
                    "already {:?}; the required key cannot be replaced",
                    knob(name).unwrap_or_default()
                ),
            )
            .into());
        }
        VERIFY_SIGNATURE_VAR => {
            parse_signature_digest(value)?;
        }
        // Key files are read where they are used, which names the file.
        SIGN_KEY_VAR | VERIFY_KEY_VAR if !value.is_empty() => {}
        SIGN_KEY_VAR | VERIFY_KEY_VAR => {
            return Err(invalid(name, value, "no key file named").into())
        }
        STREAM_TIMEOUT_VAR => {
            parse_stream_timeout(Some(value))?;
        }
        _ => {
            parse_bool(name, value)?;
        }
    }
    overrides().insert(name, value.to_owned());
    Ok((name, value.to_owned()))
}

/// A [`VERIFY_SIGNATURE_VAR`] value: `sha256:` and 64 hex digits.
pub fn parse_signature_digest(value: &str) -> Result<[u8; 32], EnvError> {
    value
        .strip_prefix("sha256:")
        .and_then(unhex)
        .and_then(|v| <[u8; 32]>::try_from(v).ok())
        .ok_or_else(|| {
            invalid(
                VERIFY_SIGNATURE_VAR,
                value,
                "not \"sha256:<64 hex digits>\" (the SHA-256 of amdgpu-signature.img)",
            )
        })
}

/// The bytes of a string of hex digits; `None` for anything else.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// The value of knob `var`: set by an option, else from the environment.
pub fn knob(var: &str) -> Option<String> {
    if let Some(v) = overrides().get(var) {
        return Some(v.clone());
    }
    std::env::var(var).ok()
}

/// The knobs that are set, each with its value and where it came from
/// (`--gpu-knob`, or `environment`), for the log.
pub fn knobs_in_effect() -> Vec<String> {
    KNOBS
        .iter()
        .filter_map(|k| {
            if let Some(v) = overrides().get(k) {
                let env = std::env::var(k)
                    .map(|e| format!(", replacing {k}={e} of the environment"))
                    .unwrap_or_default();
                Some(format!("{k}={v} (from --gpu-knob{env})"))
            } else {
                std::env::var(k)
                    .ok()
                    .map(|v| format!("{k}={v} (from the environment)"))
            }
        })
        .collect()
}

/// Parses a boolean knob: `0`/`NO` → false, `1`/`YES` → true (any case).
pub fn parse_bool(var: &'static str, value: &str) -> Result<bool, EnvError> {
    match value.trim().to_ascii_uppercase().as_str() {
        "0" | "NO" => Ok(false),
        "1" | "YES" => Ok(true),
        _ => Err(invalid(var, value, "expected 0, 1, NO or YES")),
    }
}

/// Which compatibility checks the matcher applies besides the properties
/// that must always be equal.  All enabled by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checks {
    /// `KFD_FW_VER_CHECK`: source fw_version ≤ host fw_version.
    pub fw_version: bool,
    /// `KFD_SDMA_FW_VER_CHECK`: source sdma_fw_version ≤ host.
    pub sdma_fw_version: bool,
    /// `KFD_CACHES_COUNT_CHECK`: source caches_count ≤ host.
    pub caches_count: bool,
    /// `KFD_NUM_GWS_CHECK`: source num_gws ≤ host.
    pub num_gws: bool,
    /// `KFD_VRAM_SIZE_CHECK`: source vram_size ≤ host.
    pub vram_size: bool,
    /// `KFD_NUMA_CHECK`: GPUs sharing a CPU node keep sharing one.
    pub numa: bool,
    /// `KFD_CAPABILITY_CHECK`: capability words equal.
    pub capability: bool,
}

impl Default for Checks {
    fn default() -> Self {
        Checks {
            fw_version: true,
            sdma_fw_version: true,
            caches_count: true,
            num_gws: true,
            vram_size: true,
            numa: true,
            capability: true,
        }
    }
}

impl Checks {
    /// Reads the knobs from the process environment.
    pub fn from_env() -> Result<Self, EnvError> {
        Self::from_lookup(knob)
    }

    /// Reads the knobs through `get` (unset → enabled).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, EnvError> {
        let mut c = Checks::default();
        let knobs: [(&'static str, &mut bool); 7] = [
            ("KFD_FW_VER_CHECK", &mut c.fw_version),
            ("KFD_SDMA_FW_VER_CHECK", &mut c.sdma_fw_version),
            ("KFD_CACHES_COUNT_CHECK", &mut c.caches_count),
            ("KFD_NUM_GWS_CHECK", &mut c.num_gws),
            ("KFD_VRAM_SIZE_CHECK", &mut c.vram_size),
            ("KFD_NUMA_CHECK", &mut c.numa),
            ("KFD_CAPABILITY_CHECK", &mut c.capability),
        ];
        for (var, slot) in knobs {
            if let Some(v) = get(var) {
                *slot = parse_bool(var, &v)?;
            }
        }
        Ok(c)
    }
}

/// `KFD_MAX_BUFFER_SIZE`: the budget of the memory a dump (or restore) of a
/// process spends on moving GPU memory, over all its GPUs and lanes:
/// mapping windows, SDMA staging buffers and pages-file write buffers.
pub const MAX_BUFFER_SIZE_VAR: &str = "KFD_MAX_BUFFER_SIZE";

/// Parses a size with C `strtoul(s, 0)` number syntax (decimal, `0x` hex,
/// leading-`0` octal, optional leading `+`) and an optional `K`/`k`, `M` or
/// `G` binary suffix.  Unlike upstream, anything else (sign `-`, junk after
/// the number, overflow) is an error rather than silently ignored.
pub fn parse_size(var: &'static str, value: &str) -> Result<u64, EnvError> {
    let s = value.trim_start();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(invalid(var, value, "negative size"));
    }
    let (radix, digits) = if let Some(rest) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))
    {
        (16, rest)
    } else if s.len() > 1 && s.starts_with('0') && s.as_bytes()[1].is_ascii_digit() {
        (8, &s[1..])
    } else {
        (10, s)
    };
    let end = digits
        .find(|c: char| !c.is_digit(radix))
        .unwrap_or(digits.len());
    let (num, suffix) = digits.split_at(end);
    if num.is_empty() {
        return Err(invalid(var, value, "no number"));
    }
    let n = u64::from_str_radix(num, radix).map_err(|_| invalid(var, value, "number too large"))?;
    let shift = match suffix {
        "" => 0,
        "k" | "K" => 10,
        "M" => 20,
        "G" => 30,
        other => {
            return Err(invalid(
                var,
                value,
                format!("unknown suffix {other:?} (use K, M or G)"),
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| invalid(var, value, "size overflows 64 bits"))
}

/// Parses `KFD_MAX_BUFFER_SIZE`: `None` = no cap (unset or 0).  The value
/// must be page aligned: the SDMA path registers the staging buffer as a
/// userptr BO, which the kernel requires to be page aligned.
pub fn parse_max_buffer_size(value: Option<&str>) -> Result<Option<u64>, EnvError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let n = parse_size(MAX_BUFFER_SIZE_VAR, value)?;
    if n == 0 {
        return Ok(None);
    }
    if n % PAGE_SIZE != 0 {
        return Err(invalid(
            MAX_BUFFER_SIZE_VAR,
            value,
            format!("{n} is not a multiple of the page size {PAGE_SIZE}"),
        ));
    }
    Ok(Some(n))
}

/// Reads `KFD_MAX_BUFFER_SIZE` from the process environment.
pub fn max_buffer_size_from_env() -> Result<Option<u64>, EnvError> {
    parse_max_buffer_size(knob(MAX_BUFFER_SIZE_VAR).as_deref())
}

/// The memory budget when `KFD_MAX_BUFFER_SIZE` sets none.  Upstream
/// stages a whole BO per GPU (so a 16 GiB BO costs 16 GiB of RAM per GPU);
/// copying in windows of a few MiB is as fast and keeps memory bounded.
pub const DEFAULT_STAGING: u64 = 64 << 20;

/// The most bytes of a lane's budget spent on its pages-file write buffer.
pub const MAX_WRITE_BUFFER: u64 = 1 << 20;

/// One GPU's share of the budget of a whole dump or restore of a process
/// (`cap`, or [`DEFAULT_STAGING`]) over `gpus` GPUs, page aligned, and at
/// least two pages (a window and a write buffer): the budget's floor.
pub fn gpu_share(cap: Option<u64>, gpus: usize) -> u64 {
    let budget = cap.unwrap_or(DEFAULT_STAGING);
    let share = budget / gpus.max(1) as u64 / PAGE_SIZE * PAGE_SIZE;
    share.max(2 * PAGE_SIZE)
}

/// How a lane spends a `budget` of at least two pages: (CPU mapping
/// window, pages-file write buffer).  The buffer takes an eighth, at least
/// a page and at most [`MAX_WRITE_BUFFER`]; the window the rest.
pub fn lane_split(budget: u64) -> (u64, u64) {
    let budget = budget.max(2 * PAGE_SIZE) / PAGE_SIZE * PAGE_SIZE;
    let buffer = (budget / 8 / PAGE_SIZE * PAGE_SIZE).clamp(PAGE_SIZE, MAX_WRITE_BUFFER);
    (budget - buffer, buffer)
}

/// Staging size for one GPU worker: the largest BO it copies, capped by
/// `cap` (or [`DEFAULT_STAGING`]), rounded up to a page, at least a page.
pub fn staging_size(cap: Option<u64>, largest_bo: u64) -> u64 {
    let cap = cap.unwrap_or(DEFAULT_STAGING).max(PAGE_SIZE);
    let want = largest_bo.min(cap).max(1);
    want.div_ceil(PAGE_SIZE) * PAGE_SIZE
}

/// `CRIU_ROCM_COPY_ENGINE`: how BO contents are moved.
pub const COPY_ENGINE_VAR: &str = "CRIU_ROCM_COPY_ENGINE";

/// Copy engine choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EnginePolicy {
    /// SDMA when the kernel gave a dmabuf fd, else the CPU mapping.
    #[default]
    Auto,
    /// Always map the BO through the render node and copy with the CPU.
    Cpu,
    /// Always SDMA; BOs without a dmabuf fd are an error.
    Sdma,
}

impl EnginePolicy {
    /// The knob's value for this policy (what [`parse_engine_policy`] reads).
    pub fn as_str(self) -> &'static str {
        match self {
            EnginePolicy::Auto => "auto",
            EnginePolicy::Cpu => "cpu",
            EnginePolicy::Sdma => "sdma",
        }
    }
}

/// Parses `CRIU_ROCM_COPY_ENGINE` (`auto`, `cpu`, `sdma`, any case).
pub fn parse_engine_policy(value: Option<&str>) -> Result<EnginePolicy, EnvError> {
    match value.map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(EnginePolicy::Auto),
        Some(v) => match v.as_str() {
            "" | "auto" => Ok(EnginePolicy::Auto),
            "cpu" => Ok(EnginePolicy::Cpu),
            "sdma" => Ok(EnginePolicy::Sdma),
            _ => Err(invalid(
                COPY_ENGINE_VAR,
                value.unwrap_or_default(),
                "expected cpu, sdma or auto",
            )),
        },
    }
}

/// Reads `CRIU_ROCM_COPY_ENGINE` from the process environment.
pub fn engine_policy_from_env() -> Result<EnginePolicy, EnvError> {
    parse_engine_policy(knob(COPY_ENGINE_VAR).as_deref())
}

/// `KFD_COMPRESS`: whether the dump compresses the pages files.
pub const COMPRESS_VAR: &str = "KFD_COMPRESS";
/// `KFD_COMPRESS_THREADS`: compressing copy lanes (threads, each with its
/// own zstd compressor) per GPU.
pub const COMPRESS_THREADS_VAR: &str = "KFD_COMPRESS_THREADS";

/// zstd levels `KFD_COMPRESS` accepts (zstd's without `--ultra`), so the
/// levels criu-rocm writes.
pub const ZSTD_LEVELS: std::ops::RangeInclusive<i32> = 1..=19;
/// Level when `KFD_COMPRESS=zstd` names none (zstd's default).
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

/// Parses `KFD_COMPRESS`: unset, empty, `0`, `no` or `none` → `None`
/// (upstream's layout, the default); `zstd` or `zstd:LEVEL` → the zstd
/// level (1..=19, default 3).
pub fn parse_compress(value: Option<&str>) -> Result<Option<i32>, EnvError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let v = value.trim().to_ascii_lowercase();
    match v.as_str() {
        "" | "0" | "no" | "none" => return Ok(None),
        "zstd" => return Ok(Some(ZSTD_DEFAULT_LEVEL)),
        _ => {}
    }
    let Some(level) = v.strip_prefix("zstd:") else {
        return Err(invalid(
            COMPRESS_VAR,
            value,
            "expected none, zstd or zstd:LEVEL",
        ));
    };
    match level.parse::<i32>() {
        Ok(l) if ZSTD_LEVELS.contains(&l) => Ok(Some(l)),
        _ => Err(invalid(
            COMPRESS_VAR,
            value,
            format!(
                "the zstd level must be {} to {}",
                ZSTD_LEVELS.start(),
                ZSTD_LEVELS.end()
            ),
        )),
    }
}

/// Parses `KFD_COMPRESS_THREADS`: `None` (unset or empty) → the CPU cores
/// shared out among the GPUs; `0` or `1`: one lane per GPU; at most 64.
/// Fewer when the memory budget cannot hold their compressors
/// (`copy::zstd_lanes`).
pub fn parse_compress_threads(value: Option<&str>) -> Result<Option<u32>, EnvError> {
    let Some(value) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    match value.trim().parse::<u32>() {
        Ok(n) if n <= 64 => Ok(Some(n)),
        _ => Err(invalid(
            COMPRESS_THREADS_VAR,
            value,
            "expected a number of threads from 0 to 64",
        )),
    }
}

/// Reads `KFD_COMPRESS` and `KFD_COMPRESS_THREADS`: the zstd level and
/// threads (`None` threads: the default), or `None` for no compression.
pub fn compress_from_env() -> Result<Option<(i32, Option<u32>)>, EnvError> {
    let threads = parse_compress_threads(knob(COMPRESS_THREADS_VAR).as_deref())?;
    Ok(parse_compress(knob(COMPRESS_VAR).as_deref())?.map(|l| (l, threads)))
}

/// `CRIU_ROCM_STREAM_TIMEOUT`: seconds an image streamer may take no
/// GPU image byte (dump) or give none (restore) before the dump or
/// restore fails (`--stream`).
pub const STREAM_TIMEOUT_VAR: &str = "CRIU_ROCM_STREAM_TIMEOUT";

/// [`STREAM_TIMEOUT_VAR`] when unset.
pub const DEFAULT_STREAM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Parses [`STREAM_TIMEOUT_VAR`]: whole seconds from 1 to 86400; unset or
/// empty: [`DEFAULT_STREAM_TIMEOUT`].
pub fn parse_stream_timeout(value: Option<&str>) -> Result<std::time::Duration, EnvError> {
    let Some(value) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(DEFAULT_STREAM_TIMEOUT);
    };
    match value.trim().parse::<u64>() {
        Ok(n) if (1..=86400).contains(&n) => Ok(std::time::Duration::from_secs(n)),
        _ => Err(invalid(
            STREAM_TIMEOUT_VAR,
            value,
            "expected whole seconds from 1 to 86400",
        )),
    }
}

/// Reads [`STREAM_TIMEOUT_VAR`].
pub fn stream_timeout_from_env() -> Result<std::time::Duration, EnvError> {
    parse_stream_timeout(knob(STREAM_TIMEOUT_VAR).as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn stream_timeout() {
        assert_eq!(parse_stream_timeout(None), Ok(DEFAULT_STREAM_TIMEOUT));
        assert_eq!(
            parse_stream_timeout(Some(" 2 ")),
            Ok(std::time::Duration::from_secs(2))
        );
        for bad in ["0", "-1", "1.5", "86401", "x"] {
            assert!(parse_stream_timeout(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn booleans() {
        for (v, want) in [
            ("0", false),
            ("no", false),
            ("No", false),
            ("1", true),
            ("YES", true),
            ("yes", true),
        ] {
            assert_eq!(parse_bool("X", v), Ok(want), "{v}");
        }
        let e = parse_bool("KFD_NUMA_CHECK", "true")
            .unwrap_err()
            .to_string();
        assert!(e.contains("KFD_NUMA_CHECK"), "{e}");
    }

    #[test]
    fn checks_from_lookup() {
        let env: HashMap<&str, &str> =
            HashMap::from([("KFD_VRAM_SIZE_CHECK", "0"), ("KFD_FW_VER_CHECK", "no")]);
        let c = Checks::from_lookup(|k| env.get(k).map(|v| v.to_string())).unwrap();
        assert!(!c.vram_size && !c.fw_version);
        assert!(c.sdma_fw_version && c.numa && c.capability && c.caches_count && c.num_gws);
        let e =
            Checks::from_lookup(|k| (k == "KFD_CAPABILITY_CHECK").then(|| "2".into())).unwrap_err();
        assert!(e.to_string().contains("KFD_CAPABILITY_CHECK"));
        assert_eq!(Checks::from_lookup(|_| None).unwrap(), Checks::default());
    }

    #[test]
    fn sizes_follow_strtoul_base_0() {
        let p = |s| parse_size("V", s);
        assert_eq!(p("4096"), Ok(4096));
        assert_eq!(p("0x1000"), Ok(4096));
        assert_eq!(p("0X1000"), Ok(4096));
        assert_eq!(p("010000"), Ok(4096));
        assert_eq!(p("0"), Ok(0));
        assert_eq!(p("  +8K"), Ok(8192));
        assert_eq!(p("4k"), Ok(4096));
        assert_eq!(p("2M"), Ok(2 << 20));
        assert_eq!(p("0x10M"), Ok(16 << 20));
        assert_eq!(p("1G"), Ok(1 << 30));
        assert!(p("").is_err());
        assert!(p("-1").is_err());
        assert!(p("12T").is_err());
        assert!(p("09").is_err(), "9 is not an octal digit");
        assert!(p("0x").is_err());
        assert!(p("18446744073709551616").is_err());
        assert!(p("17179869184G").is_err());
        let e = p("1m").unwrap_err().to_string();
        assert!(e.contains("V=\"1m\"") && e.contains("suffix"), "{e}");
    }

    #[test]
    fn max_buffer_size() {
        assert_eq!(parse_max_buffer_size(None), Ok(None));
        assert_eq!(parse_max_buffer_size(Some("0")), Ok(None));
        assert_eq!(parse_max_buffer_size(Some("1M")), Ok(Some(1 << 20)));
        let e = parse_max_buffer_size(Some("5000")).unwrap_err().to_string();
        assert!(
            e.contains("KFD_MAX_BUFFER_SIZE") && e.contains("page size"),
            "{e}"
        );
    }

    #[test]
    fn one_budget_over_gpus_and_lanes() {
        assert_eq!(gpu_share(None, 1), DEFAULT_STAGING);
        assert_eq!(gpu_share(None, 8), DEFAULT_STAGING / 8);
        assert_eq!(gpu_share(Some(32 << 20), 3), 2730 * 4096);
        assert_eq!(gpu_share(Some(4096), 8), 8192, "the floor");
        assert_eq!(lane_split(32 << 20), (31 << 20, 1 << 20));
        assert_eq!(lane_split(4 << 20), (3584 << 10, 512 << 10));
        assert_eq!(lane_split(8192), (4096, 4096));
        for b in [8192u64, 1 << 20, 5 << 20, 64 << 20, 1 << 30] {
            let (w, buf) = lane_split(b);
            assert!(w + buf <= b && w >= PAGE_SIZE && buf >= PAGE_SIZE, "{b}");
        }
    }

    #[test]
    fn staging_policy() {
        assert_eq!(staging_size(None, 100), 4096);
        assert_eq!(staging_size(None, 1 << 40), DEFAULT_STAGING);
        assert_eq!(staging_size(Some(1 << 20), 1 << 40), 1 << 20);
        assert_eq!(staging_size(Some(1 << 30), 8192), 8192);
        assert_eq!(staging_size(Some(4096), 0), 4096);
    }

    #[test]
    fn the_required_key_is_never_replaced() {
        // The only test that sets CRIU_ROCM_VERIFY_KEY in this process.
        assert!(set_knob("CRIU_ROCM_VERIFY_KEY=/etc/criu-rocm/pub.pem").is_ok());
        assert!(set_knob("CRIU_ROCM_VERIFY_KEY=/etc/criu-rocm/pub.pem").is_ok());
        let e = set_knob("CRIU_ROCM_VERIFY_KEY=/tmp/attacker.pem")
            .unwrap_err()
            .to_string();
        assert!(e.contains("the required key cannot be replaced"), "{e}");
        assert_eq!(
            knob("CRIU_ROCM_VERIFY_KEY").as_deref(),
            Some("/etc/criu-rocm/pub.pem")
        );
        overrides().remove("CRIU_ROCM_VERIFY_KEY");
        // Nor the required signature digest (the only test that sets it).
        let d = format!("sha256:{}", "ab".repeat(32));
        assert!(set_knob(&format!("CRIU_ROCM_VERIFY_SIGNATURE={d}")).is_ok());
        let e = set_knob(&format!(
            "CRIU_ROCM_VERIFY_SIGNATURE=sha256:{}",
            "cd".repeat(32)
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("cannot be replaced"), "{e}");
        overrides().remove("CRIU_ROCM_VERIFY_SIGNATURE");
        let e = set_knob("CRIU_ROCM_VERIFY_SIGNATURE=sha256:ab")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not \"sha256:<64 hex digits>\""), "{e}");
    }

    #[test]
    fn knobs_set_by_option_replace_the_environment() {
        // Knobs no other test reads, so the process-wide table stays private to this test.
        assert_eq!(
            set_knob("KFD_NUM_GWS_CHECK=0"),
            Ok(("KFD_NUM_GWS_CHECK", "0".into()))
        );
        assert_eq!(knob("KFD_NUM_GWS_CHECK").as_deref(), Some("0"));
        assert!(!Checks::from_env().unwrap().num_gws);
        assert!(knobs_in_effect().contains(&"KFD_NUM_GWS_CHECK=0 (from --gpu-knob)".to_owned()));
        set_knob("KFD_NUM_GWS_CHECK=yes").unwrap();
        assert!(Checks::from_env().unwrap().num_gws);
        assert!(matches!(
            set_knob("KFD_NUM_GWS_CHECK"),
            Err(KnobError::Syntax(_))
        ));
        let e = set_knob("KFD_NUMA=0").unwrap_err().to_string();
        assert!(
            e.contains("\"KFD_NUMA\" is not a GPU knob") && e.contains("KFD_NUMA_CHECK"),
            "{e}"
        );
        let e = set_knob("KFD_CAPABILITY_CHECK=off")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("KFD_CAPABILITY_CHECK") && e.contains("expected 0"),
            "{e}"
        );
        assert_eq!(
            knob("KFD_CAPABILITY_CHECK"),
            std::env::var("KFD_CAPABILITY_CHECK").ok()
        );
        let e = set_knob("KFD_MAX_BUFFER_SIZE=5000")
            .unwrap_err()
            .to_string();
        assert!(e.contains("page size"), "{e}");
        assert!(set_knob("CRIU_ROCM_COPY_ENGINE=gpu").is_err());
    }

    #[test]
    fn compress_knobs() {
        assert_eq!(parse_compress(None), Ok(None));
        assert_eq!(parse_compress(Some("none")), Ok(None));
        assert_eq!(parse_compress(Some("0")), Ok(None));
        assert_eq!(parse_compress(Some("zstd")), Ok(Some(3)));
        assert_eq!(parse_compress(Some("ZSTD:19")), Ok(Some(19)));
        assert_eq!(parse_compress(Some("zstd:1")), Ok(Some(1)));
        for bad in ["zstd:0", "zstd:20", "zstd:x", "lz4", "zstd:"] {
            let e = parse_compress(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(COMPRESS_VAR), "{bad}: {e}");
        }
        assert_eq!(parse_compress_threads(None), Ok(None));
        assert_eq!(parse_compress_threads(Some("")), Ok(None));
        assert_eq!(parse_compress_threads(Some("0")), Ok(Some(0)));
        assert_eq!(parse_compress_threads(Some(" 4 ")), Ok(Some(4)));
        assert!(parse_compress_threads(Some("65")).is_err());
        assert!(parse_compress_threads(Some("-1")).is_err());
        assert!(set_knob("KFD_COMPRESS=zstd:25").is_err());
        assert!(set_knob("KFD_COMPRESS_THREADS=many").is_err());
    }

    #[test]
    fn engine_policy() {
        assert_eq!(parse_engine_policy(None), Ok(EnginePolicy::Auto));
        assert_eq!(parse_engine_policy(Some("CPU")), Ok(EnginePolicy::Cpu));
        assert_eq!(parse_engine_policy(Some("sdma")), Ok(EnginePolicy::Sdma));
        let e = parse_engine_policy(Some("gpu")).unwrap_err().to_string();
        assert!(e.contains(COPY_ENGINE_VAR), "{e}");
    }
}
