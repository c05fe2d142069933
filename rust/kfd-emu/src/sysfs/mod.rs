//! The sysfs a host with the profile's GPUs shows, beside the KFD topology
//! itself: where the kernel puts each piece, and the links to it.
//!
//! * `/sys/devices/virtual/kfd/kfd/topology`: the KFD topology (the only
//!   place libhsakmt reads it), with `/sys/class/kfd/kfd` a link to
//!   `/sys/devices/virtual/kfd/kfd` as the kernel's device class makes it.
//! * One PCI function per GPU, `/sys/devices/pci<dom>:<bus>/<dom>:<bus>:<dev>.<fn>`
//!   (ids, class, NUMA node, uevent), with its DRM render minor below it in
//!   `drm/renderD<minor>`, linked from `/sys/class/drm/renderD<minor>` and
//!   `/sys/dev/char/226:<minor>`.  Real GPUs sit behind PCIe bridges; here
//!   each GPU's bus is a root bus of its own.
//!   Beside the PCI attributes: amdgpu's device attributes and its hwmon
//!   device (`hwmon/hwmon<GPU index>`), what rocm-smi reads, with an idle
//!   GPU's readings (`amdgpu_attribute_entries`, `hwmon_entries`), and the
//!   binary `gpu_metrics` table with the same readings (`metrics`).
//! * With more than one CPU node in the profile, `/sys/devices/system/node`
//!   lists that many nodes (libhsakmt reads `nodeN/cpu*/cache` for every CPU
//!   node of the topology; libnuma counts the `node*` directories).  The
//!   host's CPUs are dealt out to them round robin; a node left with none
//!   (more nodes than CPUs) gets CPU `N mod ncpus` as well.  The kernel
//!   still has its own nodes only, so a memory policy naming an emulated
//!   node the host lacks fails in `mbind` (EINVAL), as it would for any
//!   node the kernel does not know.
//!
//! * Each CPU node's `cpu_core_id_base` is the APIC id of its first host
//!   CPU ([`host_profile`]): libhsakmt names a CPU node after the
//!   `/proc/cpuinfo` entry with that id.
//!
//! * What changes as the GPUs are used (memory use, KFD's per-process
//!   directories) is written again while the emulator runs: [`live`].
//!
//! Everything here but [`live::Tree`] is data ([`overlays`] is pure); the
//! runner mounts it.

use std::fmt::Write as _;

pub mod live;
pub mod load;
mod metrics;

/// The moment a `gpu_metrics` table is taken at ([`metrics`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetricsClock {
    /// CLOCK_BOOTTIME, ns.
    pub boot_ns: u64,
    /// Since the emulator started (the SMU's uptime), ns.
    pub up_ns: u64,
}

impl MetricsClock {
    /// Now, for an emulator started at `start`.
    pub fn since(start: std::time::Instant) -> MetricsClock {
        // SAFETY: an all-zero timespec is valid; clock_gettime fills it.
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        // SAFETY: `ts` is writable; CLOCK_BOOTTIME always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        MetricsClock {
            boot_ns: ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
            up_ns: start.elapsed().as_nanos() as u64,
        }
    }
}

use crate::profile::{Gpu, Profile};

/// DRM's character-device major.
pub const DRM_MAJOR: u32 = 226;

/// One entry an overlay adds, path relative to the overlay's directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    Dir(String),
    File(String, String),
    /// A binary file (`gpu_metrics`).
    Bytes(String, Vec<u8>),
    Symlink(String, String),
    /// The KFD topology tree of the profile, rooted here.
    Topology(String),
}

/// A directory covered by a tmpfs that re-exposes the original's entries
/// except `replace`, then adds `entries`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlay {
    pub dir: String,
    pub replace: Vec<String>,
    pub entries: Vec<Entry>,
}

/// What the overlays need to know of the host.
#[derive(Clone, Debug, Default)]
pub struct Host {
    /// Online CPU numbers (`/sys/devices/system/cpu/online`).
    pub cpus: Vec<u32>,
    /// Entries of `/sys/devices/system/node` (to hide the host's nodes).
    pub node_entries: Vec<String>,
    /// APIC id of each CPU number (`/proc/cpuinfo`), where known.
    pub apicids: Vec<(u32, u32)>,
}

impl Host {
    /// Reads what [`overlays`] needs from the running system.
    pub fn probe() -> Host {
        let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online")
            .map(|s| parse_cpu_list(s.trim()))
            .unwrap_or_default();
        let node_entries = std::fs::read_dir("/sys/devices/system/node")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let apicids = std::fs::read_to_string("/proc/cpuinfo")
            .map(|s| parse_apicids(&s))
            .unwrap_or_default();
        Host {
            cpus: if cpus.is_empty() { vec![0] } else { cpus },
            node_entries,
            apicids,
        }
    }
}

/// (processor, apicid) pairs of `/proc/cpuinfo` (x86; other
/// architectures have no apicid lines and give none).
pub fn parse_apicids(cpuinfo: &str) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut proc = None;
    for line in cpuinfo.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        match k.trim() {
            "processor" => proc = v.trim().parse::<u32>().ok(),
            "apicid" => {
                if let (Some(p), Ok(a)) = (proc, v.trim().parse::<u32>()) {
                    out.push((p, a));
                }
            }
            _ => {}
        }
    }
    out
}

/// The profile as this host backs it: each CPU node's `cpu_core_id_base`
/// is the APIC id of the first host CPU dealt to it (see [`node_cpus`]),
/// as KFD fills it in from the CPUs of a NUMA node. libhsakmt looks the
/// node's marketing name up in `/proc/cpuinfo` by that id.
pub fn host_profile(p: &Profile, host: &Host) -> Profile {
    let mut p = p.clone();
    let n = p.cpus.len();
    for (i, cpu) in p.cpus.iter_mut().enumerate() {
        let first = node_cpus(&host.cpus, i, n).first().copied();
        if let Some(apicid) = first.and_then(|c| {
            host.apicids
                .iter()
                .find(|(proc, _)| *proc == c)
                .map(|(_, a)| *a)
        }) {
            cpu.cpu_core_id_base = apicid;
        }
    }
    p
}

/// Parses a kernel CPU list (`0-3,8,10-11`).
pub fn parse_cpu_list(s: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    v.extend(a..=b);
                }
            }
            None => v.extend(part.parse::<u32>().ok()),
        }
    }
    v
}

/// Formats CPU numbers as a kernel CPU list.
fn cpu_list(cpus: &[u32]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// Formats CPU numbers as a kernel cpumap (hex words of 32 bits, comma
/// separated, most significant first).
fn cpu_map(cpus: &[u32]) -> String {
    let words = cpus.iter().max().map_or(1, |m| *m as usize / 32 + 1);
    let mut w = vec![0u32; words];
    for c in cpus {
        w[*c as usize / 32] |= 1 << (c % 32);
    }
    w.iter()
        .rev()
        .map(|x| format!("{x:08x}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The PCI root bus directory and function name of a GPU.
pub fn pci_names(g: &Gpu) -> (String, String) {
    let bus = (g.location_id >> 8) & 0xff;
    let dev = (g.location_id >> 3) & 0x1f;
    let func = g.location_id & 7;
    (
        format!("pci{:04x}:{bus:02x}", g.domain),
        format!("{:04x}:{bus:02x}:{dev:02x}.{func}", g.domain),
    )
}

/// PCI class: MI300-class parts are processing accelerators, earlier
/// Instinct parts display controllers of subclass "other".
fn pci_class(g: &Gpu) -> u32 {
    if g.gfx_target_version >= 90400 {
        0x120000
    } else {
        0x038000
    }
}

/// Path of a GPU's render minor below `/sys/devices`.
pub fn render_dev_path(g: &Gpu) -> String {
    let (root, func) = pci_names(g);
    format!("{root}/{func}/drm/renderD{}", g.drm_render_minor)
}

fn pci_entries(g: &Gpu, index: usize, gtt_size: u64) -> Vec<Entry> {
    let (root, func) = pci_names(g);
    let dir = format!("{root}/{func}");
    let minor = g.drm_render_minor.0;
    let class = pci_class(g);
    let mut uevent = String::new();
    let _ = writeln!(uevent, "DRIVER=amdgpu");
    let _ = writeln!(uevent, "PCI_CLASS={class:X}");
    let _ = writeln!(uevent, "PCI_ID={:04X}:{:04X}", g.vendor_id, g.device_id);
    let _ = writeln!(
        uevent,
        "PCI_SUBSYS_ID={:04X}:{:04X}",
        g.vendor_id, g.device_id
    );
    let _ = writeln!(uevent, "PCI_SLOT_NAME={func}");
    let mut v = vec![
        Entry::File(format!("{dir}/vendor"), format!("{:#06x}\n", g.vendor_id)),
        Entry::File(format!("{dir}/device"), format!("{:#06x}\n", g.device_id)),
        Entry::File(
            format!("{dir}/subsystem_vendor"),
            format!("{:#06x}\n", g.vendor_id),
        ),
        Entry::File(
            format!("{dir}/subsystem_device"),
            format!("{:#06x}\n", g.device_id),
        ),
        Entry::File(format!("{dir}/revision"), "0x00\n".into()),
        Entry::File(format!("{dir}/class"), format!("{class:#08x}\n")),
        Entry::File(format!("{dir}/numa_node"), format!("{}\n", g.numa_node)),
        Entry::File(format!("{dir}/uevent"), uevent),
        Entry::Symlink(format!("{dir}/subsystem"), "../../../bus/pci".into()),
    ];
    // The primary node beside the render node: libdrm names a device by
    // it (`drmGetPrimaryDeviceNameFromFd` lists `device/drm` for `card*`).
    for (name, m) in [("renderD", minor), ("card", card_minor(g))] {
        v.extend(drm_minor_entries(&dir, &func, name, m));
    }
    v.extend(amdgpu_attribute_entries(g, &dir, gtt_size));
    let idle = load::Load::idle(g.num_xcc.max(1) as usize);
    if let Some(table) = metrics::gpu_metrics(g, MetricsClock::default(), &idle) {
        v.push(Entry::Bytes(format!("{dir}/gpu_metrics"), table));
    }
    v.extend(hwmon_entries(g, &dir, index));
    v
}

/// MI300-class parts (gfx 9.4 and later Instinct parts): PCIe 5, a power
/// sensor that reads the current draw, no edge temperature, partitions.
fn is_mi300_class(g: &Gpu) -> bool {
    (90400..100000).contains(&g.gfx_target_version)
}

/// RDNA parts (gfx 10 and later): cooled by a fan of their own.
fn has_fan(g: &Gpu) -> bool {
    g.gfx_target_version >= 100000
}

/// amdgpu's device attributes beside the PCI ones, as rocm-smi reads them
/// (an idle GPU: lowest DPM levels current, nothing busy). VRAM totals
/// are the profile's; the "used" ones start at 0 and follow the device
/// model's allocations ([`live`]). `gtt_size`: see [`gtt_size`].
fn amdgpu_attribute_entries(g: &Gpu, dir: &str, gtt_size: u64) -> Vec<Entry> {
    let link_speed = if is_mi300_class(g) { "32.0" } else { "16.0" };
    let mut files: Vec<(String, String)> = [
        ("mem_info_vram_total", g.vram_size.to_string()),
        ("mem_info_vram_used", "0".into()),
        ("mem_info_vis_vram_total", g.vram_size.to_string()),
        ("mem_info_vis_vram_used", "0".into()),
        ("mem_info_vram_vendor", "samsung".into()),
        ("mem_info_gtt_total", gtt_size.to_string()),
        ("mem_info_gtt_used", "0".into()),
        ("power_dpm_force_performance_level", "auto".into()),
        ("pp_dpm_pcie", format!("0: {link_speed}GT/s, x16 *")),
        ("current_link_speed", format!("{link_speed} GT/s PCIe")),
        ("max_link_speed", format!("{link_speed} GT/s PCIe")),
        ("current_link_width", "16".into()),
        ("max_link_width", "16".into()),
        ("unique_id", format!("{:016x}", g.unique_id)),
        ("product_name", g.marketing_name.clone()),
        ("vbios_version", format!("113-D{:04X}-100", g.device_id)),
        ("pcie_replay_count", "0".into()),
    ]
    .map(|(name, text)| (name.to_owned(), text))
    .into();
    files.extend(activity_files(
        g,
        &load::Load::idle(g.num_xcc.max(1) as usize),
    ));
    if g.unique_id != 0 {
        // The board's serial from its FRU EEPROM (absent without one);
        // here the ASIC's serial number.
        files.push(("serial_number".into(), format!("{:016X}", g.unique_id)));
    }
    if is_mi300_class(g) {
        files.push(("current_compute_partition".into(), "SPX".into()));
        files.push(("current_memory_partition".into(), "NPS1".into()));
    }
    files_in(dir, files)
}

/// What drives a clock's DPM level up: the shader engine or memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Follows {
    Gfx,
    Mem,
}

/// A clock domain with two DPM levels: its `pp_dpm_*` file, its name in
/// `gpu_metrics`, its idle level (MHz) and what raises it to the other.
#[derive(Clone, Copy, Debug)]
pub struct DpmClock {
    pub file: &'static str,
    pub metrics: &'static str,
    pub idle: u64,
    pub follows: Follows,
}

/// The clocks amdgpu lists levels of: a busy engine runs its clock at the
/// top level, an idle one at the lowest (as the SMU's DPM does under load).
pub const DPM_CLOCKS: [DpmClock; 4] = [
    DpmClock {
        file: "pp_dpm_sclk",
        metrics: "gfxclk",
        idle: 500,
        follows: Follows::Gfx,
    },
    DpmClock {
        file: "pp_dpm_mclk",
        metrics: "uclk",
        idle: 400,
        follows: Follows::Mem,
    },
    DpmClock {
        file: "pp_dpm_fclk",
        metrics: "fclk",
        idle: 400,
        follows: Follows::Mem,
    },
    DpmClock {
        file: "pp_dpm_socclk",
        metrics: "socclk",
        idle: 500,
        follows: Follows::Gfx,
    },
];

impl DpmClock {
    /// The top level, MHz: the profile's engine and memory clocks.
    pub fn top(&self, g: &Gpu) -> u64 {
        match self.metrics {
            "gfxclk" => u64::from(g.max_engine_clk_fcompute).max(self.idle),
            "uclk" => u64::from(g.vram_clk_max).max(self.idle),
            "fclk" => 1200,
            _ => 1100,
        }
    }

    /// Whether its engine is busy now (the graphics clock: of XCC `xcc`,
    /// or of any with `None`).
    pub fn busy(&self, load: &load::Load, xcc: Option<usize>) -> bool {
        match (self.follows, xcc) {
            (Follows::Mem, _) => load.mem_now,
            (Follows::Gfx, None) => load.gfx_now(),
            (Follows::Gfx, Some(x)) => load.xcc_now.get(x).copied().unwrap_or(false),
        }
    }

    /// The current clock, MHz (see [`DpmClock::busy`]).
    pub fn current(&self, g: &Gpu, load: &load::Load, xcc: Option<usize>) -> u64 {
        if self.busy(load, xcc) {
            self.top(g)
        } else {
            self.idle
        }
    }

    /// The average clock over the window: the levels weighted by the
    /// engine's activity.
    pub fn average(&self, g: &Gpu, load: &load::Load) -> u64 {
        let pct = u64::from(match self.follows {
            Follows::Gfx => load.gfx,
            Follows::Mem => load.umc,
        });
        self.idle + (self.top(g) - self.idle) * pct / 100
    }

    /// Its `pp_dpm_*` text: the levels, the current one starred.
    fn levels(&self, g: &Gpu, load: &load::Load) -> String {
        let busy = self.busy(load, None);
        let star = |on: bool| if on { " *" } else { "" };
        format!(
            "0: {}Mhz{}\n1: {}Mhz{}",
            self.idle,
            star(!busy),
            self.top(g),
            star(busy)
        )
    }
}

/// The attributes that follow the engines' load (as `(name, text)`, text
/// without its newline): `gpu_busy_percent`, `mem_busy_percent` and the
/// DPM levels of [`DPM_CLOCKS`].
pub fn activity_files(g: &Gpu, load: &load::Load) -> Vec<(String, String)> {
    let mut v = vec![
        ("gpu_busy_percent".to_owned(), load.gfx.to_string()),
        ("mem_busy_percent".to_owned(), load.umc.to_string()),
    ];
    for c in &DPM_CLOCKS {
        v.push((c.file.to_owned(), c.levels(g, load)));
    }
    v
}

/// amdgpu's GTT size by default: three quarters of system memory (the
/// profile's CPU nodes together).
fn gtt_size(p: &Profile) -> u64 {
    p.cpus.iter().map(|c| c.mem_size).sum::<u64>() / 4 * 3
}

/// Files `(name, text)` in `dir`, each text a line.
fn files_in(dir: &str, files: Vec<(String, String)>) -> Vec<Entry> {
    files
        .into_iter()
        .map(|(name, text)| Entry::File(format!("{dir}/{name}"), format!("{text}\n")))
        .collect()
}

/// An idle GPU's temperature sensors: hwmon's `temp<n>`, label, reading
/// and critical temperature in degrees Celsius (MI300-class parts lack
/// the first, edge).
const IDLE_TEMPS: [(u32, &str, u64, u64); 3] = [
    (1, "edge", 35, 100),
    (2, "junction", 40, 110),
    (3, "mem", 38, 95),
];

/// An RDNA board's fan at idle, RPM (hwmon's `fan1_input`).
const IDLE_FAN_RPM: u64 = 800;

/// An idle GPU's power: its cap and reading in watts, and the hwmon file
/// of the reading (the average on earlier parts, the current draw on
/// MI300-class ones).
fn idle_power(g: &Gpu) -> (u64, u64, &'static str) {
    if is_mi300_class(g) {
        (750, 140, "power1_input")
    } else if has_fan(g) {
        (304, 15, "power1_average")
    } else {
        (300, 40, "power1_average")
    }
}

/// The GPU's hwmon device `hwmon<index>` below its PCI function `dir`
/// (amdgpu's sensors, idle readings): temperatures in millidegrees
/// (edge, junction, memory; MI300-class parts have no edge sensor), power
/// in microwatts (the average on earlier parts, the current draw on
/// MI300-class ones) with its cap, and a fan on RDNA boards only
/// (Instinct boards are passively cooled).
fn hwmon_entries(g: &Gpu, dir: &str, index: usize) -> Vec<Entry> {
    let hw = format!("{dir}/hwmon/hwmon{index}");
    let mut files: Vec<(String, String)> = vec![("name".into(), "amdgpu".into())];
    for (n, label, now, crit) in IDLE_TEMPS {
        if n == 1 && is_mi300_class(g) {
            continue;
        }
        files.push((format!("temp{n}_label"), label.into()));
        files.push((format!("temp{n}_input"), (now * 1000).to_string()));
        files.push((format!("temp{n}_crit"), (crit * 1000).to_string()));
        files.push((
            format!("temp{n}_emergency"),
            ((crit + 5) * 1000).to_string(),
        ));
    }
    let (cap_w, idle_w, reading) = idle_power(g);
    files.push((reading.into(), (idle_w * 1_000_000).to_string()));
    files.push(("power1_label".into(), "PPT".into()));
    for (name, w) in [
        ("power1_cap", cap_w),
        ("power1_cap_max", cap_w),
        ("power1_cap_default", cap_w),
        ("power1_cap_min", 0),
    ] {
        files.push((name.into(), (w * 1_000_000).to_string()));
    }
    if has_fan(g) {
        let rpm = IDLE_FAN_RPM.to_string();
        for (name, v) in [
            ("fan1_input", rpm.as_str()),
            ("fan1_max", "3300"),
            ("pwm1", "51"),
            ("pwm1_max", "255"),
            ("pwm1_min", "0"),
            ("pwm1_enable", "2"),
        ] {
            files.push((name.into(), v.into()));
        }
    }
    let mut v = files_in(&hw, files);
    let func = dir.rsplit('/').next().unwrap_or_default();
    v.push(Entry::Symlink(
        format!("{hw}/device"),
        format!("../../../{func}"),
    ));
    v
}

/// A GPU's primary (card) minor: its render minor less 128, as DRM
/// numbers the two minors of one device.
pub fn card_minor(g: &Gpu) -> u32 {
    g.drm_render_minor.0 - 128
}

/// One DRM minor's directory below a GPU's PCI function `dir`.
fn drm_minor_entries(dir: &str, func: &str, name: &str, minor: u32) -> Vec<Entry> {
    let rdir = format!("{dir}/drm/{name}{minor}");
    vec![
        Entry::File(format!("{rdir}/dev"), format!("{DRM_MAJOR}:{minor}\n")),
        Entry::File(
            format!("{rdir}/uevent"),
            format!(
                "MAJOR={DRM_MAJOR}\nMINOR={minor}\nDEVNAME=dri/{name}{minor}\nDEVTYPE=drm_minor\n"
            ),
        ),
        Entry::Symlink(format!("{rdir}/device"), format!("../../../{func}")),
        Entry::Symlink(
            format!("{rdir}/subsystem"),
            "../../../../../class/drm".into(),
        ),
    ]
}

/// The CPUs of emulated CPU node `n` of `count`.
pub fn node_cpus(host_cpus: &[u32], n: usize, count: usize) -> Vec<u32> {
    let mut v: Vec<u32> = host_cpus
        .iter()
        .enumerate()
        .filter(|(i, _)| i % count == n)
        .map(|(_, c)| *c)
        .collect();
    if v.is_empty() && !host_cpus.is_empty() {
        v.push(host_cpus[n % host_cpus.len()]);
    }
    v
}

fn node_entries(p: &Profile, host: &Host) -> Vec<Entry> {
    let n = p.cpus.len();
    let all = if n == 1 {
        "0".to_owned()
    } else {
        format!("0-{}", n - 1)
    };
    let mut v: Vec<Entry> = [
        "possible",
        "online",
        "has_cpu",
        "has_memory",
        "has_normal_memory",
    ]
    .iter()
    .map(|f| Entry::File((*f).into(), format!("{all}\n")))
    .collect();
    for (i, cpu) in p.cpus.iter().enumerate() {
        let dir = format!("node{i}");
        let cpus = node_cpus(&host.cpus, i, n);
        v.push(Entry::Dir(dir.clone()));
        for c in &cpus {
            v.push(Entry::Symlink(
                format!("{dir}/cpu{c}"),
                format!("../../cpu/cpu{c}"),
            ));
        }
        v.push(Entry::File(
            format!("{dir}/cpulist"),
            format!("{}\n", cpu_list(&cpus)),
        ));
        v.push(Entry::File(
            format!("{dir}/cpumap"),
            format!("{}\n", cpu_map(&cpus)),
        ));
        let dist: Vec<String> = (0..n)
            .map(|j| if i == j { "10" } else { "32" }.to_owned())
            .collect();
        v.push(Entry::File(
            format!("{dir}/distance"),
            format!("{}\n", dist.join(" ")),
        ));
        let kb = cpu.mem_size / 1024;
        v.push(Entry::File(
            format!("{dir}/meminfo"),
            format!("Node {i} MemTotal:       {kb} kB\nNode {i} MemFree:        {kb} kB\nNode {i} MemUsed:        0 kB\n"),
        ));
    }
    v
}

/// `/sys/module/amdgpu`, as a loaded amdgpu module shows it: rocminfo
/// (since ROCm 6) checks `initstate` for "live" instead of running lsmod,
/// rocm-smi looks for the module there, and ROCm reads some of its
/// parameters (values: the module's defaults).
fn module_entries() -> Vec<Entry> {
    let mut v = vec![
        Entry::File("amdgpu/initstate".into(), "live\n".into()),
        Entry::File("amdgpu/refcnt".into(), "0\n".into()),
        Entry::Dir("amdgpu/holders".into()),
    ];
    for (name, value) in MODULE_PARAMETERS {
        v.push(Entry::File(
            format!("amdgpu/parameters/{name}"),
            format!("{value}\n"),
        ));
    }
    v
}

/// The amdgpu parameters ROCm's libraries and tools read, with the
/// module's defaults.
const MODULE_PARAMETERS: [(&str, &str); 6] = [
    ("noretry", "-1"),
    ("mtype_local", "0"),
    ("sched_policy", "0"),
    ("hws_max_conc_proc", "-1"),
    ("cwsr_enable", "1"),
    ("ras_enable", "-1"),
];

/// The overlays, parents before children (the runner mounts them in
/// this order).
pub fn overlays(p: &Profile, host: &Host) -> Vec<Overlay> {
    let mut out = vec![devices_overlay(p), kfd_device_overlay()];
    out.extend(node_overlay(p, host));
    out.push(Overlay {
        dir: "/sys/module".into(),
        replace: vec!["amdgpu".into()],
        entries: module_entries(),
    });
    out.push(class_overlay(p));
    out.push(dev_char_overlay(p));
    out
}

/// `/sys/devices`: each GPU's PCI function on a root bus of its own.
fn devices_overlay(p: &Profile) -> Overlay {
    let mut roots: Vec<String> = Vec::new();
    let mut pci = Vec::new();
    for (i, g) in p.gpus.iter().enumerate() {
        let (root, _) = pci_names(g);
        if !roots.contains(&root) {
            roots.push(root);
        }
        pci.extend(pci_entries(g, i, gtt_size(p)));
    }
    Overlay {
        dir: live::DEVICES.into(),
        replace: roots,
        entries: pci,
    }
}

/// `/sys/devices/virtual/kfd`: the KFD device, its topology and its
/// (live) directory of processes.
fn kfd_device_overlay() -> Overlay {
    Overlay {
        dir: live::VIRTUAL.into(),
        replace: vec!["kfd".into()],
        entries: vec![
            Entry::Topology("kfd/kfd/topology".into()),
            Entry::Dir(live::PROC_DIR.into()),
            Entry::Symlink("kfd/kfd/subsystem".into(), "../../../../class/kfd".into()),
        ],
    }
}

/// `/sys/devices/system/node` with the profile's CPU nodes, when it has
/// more than one (with one, the host's own nodes stay).
fn node_overlay(p: &Profile, host: &Host) -> Option<Overlay> {
    if p.cpus.len() <= 1 {
        return None;
    }
    let ours = [
        "possible",
        "online",
        "has_cpu",
        "has_memory",
        "has_normal_memory",
    ];
    Some(Overlay {
        dir: "/sys/devices/system/node".into(),
        replace: host
            .node_entries
            .iter()
            .filter(|e| e.starts_with("node") || ours.contains(&e.as_str()))
            .cloned()
            .collect(),
        entries: node_entries(p, host),
    })
}

/// Every DRM minor of the profile (render and primary) as (name, minor,
/// path of its directory below `/sys`).
fn drm_minors(p: &Profile) -> Vec<(String, u32, String)> {
    let mut v = Vec::new();
    for g in &p.gpus {
        let (root, func) = pci_names(g);
        for (name, minor) in [("renderD", g.drm_render_minor.0), ("card", card_minor(g))] {
            let target = format!("devices/{root}/{func}/drm/{name}{minor}");
            v.push((format!("{name}{minor}"), minor, target));
        }
    }
    v
}

/// `/sys/class`: the kfd class's device and the drm class's minors.
fn class_overlay(p: &Profile) -> Overlay {
    let mut class = vec![
        Entry::Symlink("kfd/kfd".into(), "../../devices/virtual/kfd/kfd".into()),
        Entry::File("drm/version".into(), "drm 1.1.0 20060810\n".into()),
    ];
    for (name, _, target) in drm_minors(p) {
        class.push(Entry::Symlink(
            format!("drm/{name}"),
            format!("../../{target}"),
        ));
    }
    Overlay {
        dir: "/sys/class".into(),
        replace: vec!["kfd".into(), "drm".into()],
        entries: class,
    }
}

/// `/sys/dev/char`: `226:<minor>` of every DRM minor.
fn dev_char_overlay(p: &Profile) -> Overlay {
    let links: Vec<(String, String)> = drm_minors(p)
        .into_iter()
        .map(|(_, minor, target)| (format!("{DRM_MAJOR}:{minor}"), format!("../../{target}")))
        .collect();
    Overlay {
        dir: "/sys/dev/char".into(),
        replace: links.iter().map(|(n, _)| n.clone()).collect(),
        entries: links
            .into_iter()
            .map(|(n, t)| Entry::Symlink(n, t))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_round_trip() {
        assert_eq!(parse_cpu_list("0-3,8,10-11"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_map(&[0, 1]), "00000003");
        assert_eq!(cpu_map(&[1, 33]), "00000002,00000002");
    }

    #[test]
    fn cpu_nodes_take_host_apic_ids() {
        let info = "processor\t: 0\napicid\t\t: 0\n\nprocessor\t: 1\napicid\t\t: 8\n";
        assert_eq!(parse_apicids(info), vec![(0, 0), (1, 8)]);
        let p = Profile::builtin("mi210x4").unwrap();
        let host = Host {
            cpus: vec![0, 1],
            node_entries: vec![],
            apicids: parse_apicids(info),
        };
        let h = host_profile(&p, &host);
        assert_eq!(h.cpus[0].cpu_core_id_base, 0);
        assert_eq!(h.cpus[1].cpu_core_id_base, 8);
        assert_eq!(h.gpus, p.gpus);
    }

    #[test]
    fn nodes_share_out_host_cpus() {
        assert_eq!(node_cpus(&[0, 1], 0, 2), vec![0]);
        assert_eq!(node_cpus(&[0, 1], 1, 2), vec![1]);
        assert_eq!(node_cpus(&[0, 1], 3, 4), vec![1]);
        assert_eq!(node_cpus(&[0, 1, 2, 3], 0, 2), vec![0, 2]);
    }

    fn file<'a>(o: &'a Overlay, suffix: &str) -> Option<&'a str> {
        o.entries.iter().find_map(|e| match e {
            Entry::File(f, text) if f.ends_with(suffix) => Some(text.as_str()),
            _ => None,
        })
    }

    #[test]
    fn gpus_show_amdgpu_attributes_and_hwmon() {
        let host = Host::default();
        for (name, edge) in [("mi210x4", true), ("mi300x8", false)] {
            let p = Profile::builtin(name).unwrap();
            let o = overlays(&p, &host);
            let devices = &o[0];
            assert_eq!(devices.dir, "/sys/devices");
            for (i, g) in p.gpus.iter().enumerate() {
                let (root, func) = pci_names(g);
                let dir = format!("{root}/{func}");
                let vram = file(devices, &format!("{dir}/mem_info_vram_total")).unwrap();
                assert_eq!(vram, format!("{}\n", g.vram_size));
                let gtt = file(devices, &format!("{dir}/mem_info_gtt_total")).unwrap();
                assert_eq!(gtt, format!("{}\n", gtt_size(&p)));
                assert!(gtt_size(&p) > 0);
                let serial = file(devices, &format!("{dir}/serial_number")).unwrap();
                assert_eq!(serial, format!("{:016X}\n", g.unique_id));
                let hw = format!("{dir}/hwmon/hwmon{i}");
                assert_eq!(file(devices, &format!("{hw}/name")), Some("amdgpu\n"));
                assert_eq!(file(devices, &format!("{hw}/temp1_input")).is_some(), edge);
                assert!(file(devices, &format!("{hw}/temp2_input")).is_some());
                assert!(file(devices, &format!("{hw}/fan1_input")).is_none());
                assert!(devices.entries.contains(&Entry::Symlink(
                    format!("{hw}/device"),
                    format!("../../../{func}")
                )));
            }
            let chr = o.last().unwrap();
            assert_eq!(chr.dir, "/sys/dev/char");
            assert_eq!(chr.replace.len(), 2 * p.gpus.len());
        }
    }
}
