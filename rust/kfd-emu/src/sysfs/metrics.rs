//! amdgpu's `gpu_metrics` device attribute: the SMU's metrics table as a
//! binary file in the layout of `kgd_pp_interface.h`, a
//! `metrics_table_header` (`structure_size` u16, `format_revision` u8,
//! `content_revision` u8) then the fields of `gpu_metrics_v<format>_<content>`
//! at the offsets natural C alignment gives them (no packing), little
//! endian. What `rocm-smi --showmetrics` and librocm_smi read.
//!
//! Each part gets the revision its SMU driver gives: MI100 (arcturus,
//! gfx908) v1.1, MI200 (aldebaran, gfx90a) v1.3, MI300 (SMU 13.0.6, gfx
//! 9.4.x) v1.5, RDNA4 (SMU 14.0.2, gfx12) v1.3; other parts have no file
//! here. As the kernel does, the whole table starts as 0xFF bytes (every
//! field "not available": 0xFFFF, 0xFFFFFFFF, ...) and only what the
//! part's driver reports is set: the readings the other attributes show
//! (temperatures and power as hwmon's, idle; the DPM clocks of `pp_dpm_*`,
//! current and averaged over the window; activity as `gpu_busy_percent`
//! and `mem_busy_percent`, with its accumulators but on gfx12; the PCIe
//! link; gfx12's fan) and zero throttling, the load being the last
//! window's ([`Load`]). SMU 14.0.2's driver reports its average graphics
//! clock as the current one and leaves the energy, the firmware timestamp
//! and the accumulated activity "not available". What advances with
//! time advances ([`MetricsClock`]; the live files rewrite the table
//! every second): `system_clock_counter` (CLOCK_BOOTTIME, ns, as amdgpu
//! fills it in), `firmware_timestamp` (the SMU's, 10 ns units, from the
//! emulator's start) and `energy_accumulator` (the idle socket power
//! integrated over that time, in the SMU's 15.259 µJ units). Sensors the
//! emulator has no reading for (voltage regulators, HBM stacks, video
//! engines, XGMI link, Instinct parts' fan) stay "not available".

use super::load::Load;
use super::{idle_power, is_mi300_class, MetricsClock, IDLE_TEMPS};
use crate::profile::Gpu;

/// A field of a layout: name, width in bytes (also its alignment), count.
type Field = (&'static str, usize, usize);

/// `gpu_metrics_v1_1`'s fields after the header, in declaration order.
const V1_1: &[Field] = &[
    ("temperature_edge", 2, 1),
    ("temperature_hotspot", 2, 1),
    ("temperature_mem", 2, 1),
    ("temperature_vrgfx", 2, 1),
    ("temperature_vrsoc", 2, 1),
    ("temperature_vrmem", 2, 1),
    ("average_gfx_activity", 2, 1),
    ("average_umc_activity", 2, 1),
    ("average_mm_activity", 2, 1),
    ("average_socket_power", 2, 1),
    ("energy_accumulator", 8, 1),
    ("system_clock_counter", 8, 1),
    ("average_gfxclk_frequency", 2, 1),
    ("average_socclk_frequency", 2, 1),
    ("average_uclk_frequency", 2, 1),
    ("average_vclk0_frequency", 2, 1),
    ("average_dclk0_frequency", 2, 1),
    ("average_vclk1_frequency", 2, 1),
    ("average_dclk1_frequency", 2, 1),
    ("current_gfxclk", 2, 1),
    ("current_socclk", 2, 1),
    ("current_uclk", 2, 1),
    ("current_vclk0", 2, 1),
    ("current_dclk0", 2, 1),
    ("current_vclk1", 2, 1),
    ("current_dclk1", 2, 1),
    ("throttle_status", 4, 1),
    ("current_fan_speed", 2, 1),
    ("pcie_link_width", 2, 1),
    ("pcie_link_speed", 2, 1),
    ("padding", 2, 1),
    ("gfx_activity_acc", 4, 1),
    ("mem_activity_acc", 4, 1),
    ("temperature_hbm", 2, 4),
];

/// What `gpu_metrics_v1_3` adds to v1.1's fields (v1.2 added the first).
const V1_3_TAIL: &[Field] = &[
    ("firmware_timestamp", 8, 1),
    ("voltage_soc", 2, 1),
    ("voltage_gfx", 2, 1),
    ("voltage_mem", 2, 1),
    ("padding1", 2, 1),
    ("indep_throttle_status", 8, 1),
];

/// `gpu_metrics_v1_5`'s fields after the header, in declaration order.
const V1_5: &[Field] = &[
    ("temperature_hotspot", 2, 1),
    ("temperature_mem", 2, 1),
    ("temperature_vrsoc", 2, 1),
    ("curr_socket_power", 2, 1),
    ("average_gfx_activity", 2, 1),
    ("average_umc_activity", 2, 1),
    ("vcn_activity", 2, 4),
    ("jpeg_activity", 2, 32),
    ("energy_accumulator", 8, 1),
    ("system_clock_counter", 8, 1),
    ("throttle_status", 4, 1),
    ("gfxclk_lock_status", 4, 1),
    ("pcie_link_width", 2, 1),
    ("pcie_link_speed", 2, 1),
    ("xgmi_link_width", 2, 1),
    ("xgmi_link_speed", 2, 1),
    ("gfx_activity_acc", 4, 1),
    ("mem_activity_acc", 4, 1),
    ("pcie_bandwidth_acc", 8, 1),
    ("pcie_bandwidth_inst", 8, 1),
    ("pcie_l0_to_recov_count_acc", 8, 1),
    ("pcie_replay_count_acc", 8, 1),
    ("pcie_replay_rover_count_acc", 8, 1),
    ("pcie_nak_sent_count_acc", 4, 1),
    ("pcie_nak_rcvd_count_acc", 4, 1),
    ("xgmi_read_data_acc", 8, 8),
    ("xgmi_write_data_acc", 8, 8),
    ("firmware_timestamp", 8, 1),
    ("current_gfxclk", 2, 8),
    ("current_socclk", 2, 4),
    ("current_vclk0", 2, 4),
    ("current_dclk0", 2, 4),
    ("current_uclk", 2, 1),
    ("padding", 2, 1),
];

/// The header's size: the fields start after it.
const HEADER: usize = 4;

/// A metrics table being filled: its layout's field offsets and its bytes.
struct Table {
    fields: Vec<(&'static str, usize, usize, usize)>,
    bytes: Vec<u8>,
}

impl Table {
    /// A table of `fields` (after the header) of revision `format.content`,
    /// every field all ones, the header set.
    fn new(format: u8, content: u8, fields: &[Field]) -> Table {
        let (mut off, mut align) = (HEADER, 2);
        let mut laid = Vec::with_capacity(fields.len());
        for &(name, width, count) in fields {
            off = off.next_multiple_of(width);
            align = align.max(width);
            laid.push((name, off, width, count));
            off += width * count;
        }
        let size = off.next_multiple_of(align);
        let mut bytes = vec![0xff; size];
        bytes[..2].copy_from_slice(&(size as u16).to_le_bytes());
        bytes[2] = format;
        bytes[3] = content;
        Table {
            fields: laid,
            bytes,
        }
    }

    /// Sets element `index` of field `name` (a name of the layout).
    fn set_at(&mut self, name: &str, index: usize, v: u64) {
        let &(_, off, width, count) = self
            .fields
            .iter()
            .find(|f| f.0 == name)
            .unwrap_or_else(|| panic!("gpu_metrics: no field {name}"));
        assert!(index < count, "gpu_metrics: {name}[{index}] of {count}");
        let at = off + index * width;
        self.bytes[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
    }

    /// Sets the first `n` elements of `name` (all of a scalar with n 1).
    fn set_n(&mut self, name: &str, n: usize, v: u64) {
        (0..n).for_each(|i| self.set_at(name, i, v));
    }

    fn set(&mut self, name: &str, v: u64) {
        self.set_at(name, 0, v);
    }

    fn has(&self, name: &str) -> bool {
        self.fields.iter().any(|f| f.0 == name)
    }
}

/// The clock domains a table reports, as `gpu_metrics` names them, with
/// the `pp_dpm_*` file that lists their levels and the engine whose load
/// raises them ([`super::DPM_CLOCKS`]).
fn clock(name: &str) -> &'static super::DpmClock {
    let c = super::DPM_CLOCKS.iter().find(|c| c.metrics == name);
    c.unwrap_or_else(|| panic!("gpu_metrics: no clock {name}"))
}

/// The `gpu_metrics` file of `g` at `clock` with `load` (over the last
/// window), or `None` for parts it is not served for.
pub fn gpu_metrics(g: &Gpu, clock: MetricsClock, load: &Load) -> Option<Vec<u8>> {
    let mut t = match g.gfx_target_version {
        90008 => Table::new(1, 1, V1_1),
        90010 => Table::new(1, 3, &[V1_1, V1_3_TAIL].concat()),
        _ if is_mi300_class(g) => Table::new(1, 5, V1_5),
        _ if is_gfx12(g) => Table::new(1, 3, &[V1_1, V1_3_TAIL].concat()),
        _ => return None,
    };
    set_common(&mut t, g, load);
    if is_mi300_class(g) {
        set_v1_5(&mut t, g, load);
    } else {
        set_v1_1(&mut t, g, load);
    }
    set_clocked(&mut t, g, clock);
    Some(t.bytes)
}

/// RDNA4 (gfx12) parts: SMU 14.0.2, whose driver fills a v1.3 table but
/// no energy, firmware timestamp or accumulated activity.
fn is_gfx12(g: &Gpu) -> bool {
    (120000..130000).contains(&g.gfx_target_version)
}

/// The SMU's energy unit: 2^-16 J (15.259 µJ).
const ENERGY_UNITS_PER_JOULE: u128 = 1 << 16;

/// What advances with `clock`: the timestamps and the energy used.
fn set_clocked(t: &mut Table, g: &Gpu, clock: MetricsClock) {
    t.set("system_clock_counter", clock.boot_ns);
    if is_gfx12(g) {
        return;
    }
    if t.has("firmware_timestamp") {
        t.set("firmware_timestamp", clock.up_ns / 10);
    }
    let joules_e9 = u128::from(idle_power(g).1) * u128::from(clock.up_ns);
    let energy = joules_e9 * ENERGY_UNITS_PER_JOULE / 1_000_000_000;
    t.set("energy_accumulator", energy as u64);
}

/// hwmon's idle reading of the sensor `label`, degrees Celsius.
fn idle_temp(label: &str) -> u64 {
    let sensor = IDLE_TEMPS.iter().find(|e| e.1 == label);
    sensor.unwrap_or_else(|| panic!("no {label} sensor")).2
}

/// The fields every layout has: temperatures but edge, activity, PCIe
/// link, throttling and (but on gfx12) accumulated activity.
fn set_common(t: &mut Table, g: &Gpu, load: &Load) {
    t.set("temperature_hotspot", idle_temp("junction"));
    t.set("temperature_mem", idle_temp("mem"));
    t.set("average_gfx_activity", load.gfx.into());
    t.set("average_umc_activity", load.umc.into());
    t.set("throttle_status", 0);
    if !is_gfx12(g) {
        // u32 counters that wrap, as the SMU's do.
        t.set("gfx_activity_acc", load.gfx_acc & 0xffff_ffff);
        t.set("mem_activity_acc", load.mem_acc & 0xffff_ffff);
    }
    t.set("pcie_link_width", 16);
    t.set("pcie_link_speed", if is_mi300_class(g) { 320 } else { 160 });
}

/// v1.1's and v1.3's own fields: edge temperature, average power, the
/// average and current clocks (gfx12's current graphics clock is its
/// average, as its driver fills it), a fan on gfx12.
fn set_v1_1(t: &mut Table, g: &Gpu, load: &Load) {
    t.set("temperature_edge", idle_temp("edge"));
    t.set("average_mm_activity", 0);
    t.set("average_socket_power", idle_power(g).1);
    for name in ["gfxclk", "socclk", "uclk"] {
        let c = clock(name);
        let average = c.average(g, load);
        t.set(&format!("average_{name}_frequency"), average);
        let current = if is_gfx12(g) && name == "gfxclk" {
            average
        } else {
            c.current(g, load, None)
        };
        t.set(&format!("current_{name}"), current);
    }
    if t.has("indep_throttle_status") {
        t.set("indep_throttle_status", 0);
    }
    if super::has_fan(g) {
        t.set("current_fan_speed", super::IDLE_FAN_RPM);
    }
}

/// v1.5's own fields: current power, a graphics clock per XCC, a SoC
/// clock per AID (one per two XCCs), PCIe counters.
fn set_v1_5(t: &mut Table, g: &Gpu, load: &Load) {
    t.set("curr_socket_power", idle_power(g).1);
    t.set("gfxclk_lock_status", 0);
    let xccs = (g.num_xcc as usize).clamp(1, 8);
    for x in 0..xccs {
        t.set_at(
            "current_gfxclk",
            x,
            clock("gfxclk").current(g, load, Some(x)),
        );
    }
    let aids = xccs.div_ceil(2).min(4);
    t.set_n(
        "current_socclk",
        aids,
        clock("socclk").current(g, load, None),
    );
    t.set("current_uclk", clock("uclk").current(g, load, None));
    for f in [
        "pcie_bandwidth_acc",
        "pcie_bandwidth_inst",
        "pcie_l0_to_recov_count_acc",
        "pcie_replay_count_acc",
        "pcie_replay_rover_count_acc",
        "pcie_nak_sent_count_acc",
        "pcie_nak_rcvd_count_acc",
    ] {
        t.set(f, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    fn gpu(profile: &str) -> Gpu {
        Profile::builtin(profile).unwrap().gpus[0].clone()
    }

    /// The table of `profile`'s first GPU at `clock`, idle.
    fn idle_table(profile: &str, clock: MetricsClock) -> Option<Vec<u8>> {
        let g = gpu(profile);
        gpu_metrics(&g, clock, &Load::idle(g.num_xcc.max(1) as usize))
    }

    fn u16_at(b: &[u8], off: usize) -> u16 {
        u16::from_le_bytes([b[off], b[off + 1]])
    }

    #[test]
    fn layouts_are_the_kernels() {
        // sizeof kgd_pp_interface.h's v1_1, v1_3 and v1_5 (NUM_JPEG_ENG 32).
        for (profile, size, rev) in [("mi100", 96, 1), ("mi210x4", 120, 3), ("mi300x8", 360, 5)] {
            let b = idle_table(profile, MetricsClock::default()).unwrap();
            assert_eq!(b.len(), size, "{profile}");
            assert_eq!(u16_at(&b, 0) as usize, size, "{profile}");
            assert_eq!((b[2], b[3]), (1, rev), "{profile}");
        }
        // Offsets the header's comments and other fields pin down.
        let v13 = Table::new(1, 3, &[V1_1, V1_3_TAIL].concat());
        let off = |t: &Table, n: &str| t.fields.iter().find(|f| f.0 == n).unwrap().1;
        assert_eq!(off(&v13, "energy_accumulator"), 24);
        assert_eq!(off(&v13, "temperature_hbm"), 88);
        assert_eq!(off(&v13, "indep_throttle_status"), 112);
        let v15 = Table::new(1, 5, V1_5);
        assert_eq!(off(&v15, "energy_accumulator"), 88);
        assert_eq!(off(&v15, "xgmi_read_data_acc"), 176);
        assert_eq!(off(&v15, "current_uclk"), 352);
    }

    #[test]
    fn values_follow_the_other_attributes() {
        let b = idle_table("mi210x4", MetricsClock::default()).unwrap();
        // edge 35 C, hotspot 40, mem 38, vrgfx not available, power 40 W.
        assert_eq!(
            [4, 6, 8, 10, 22].map(|o| u16_at(&b, o)),
            [35, 40, 38, 0xffff, 40]
        );
        assert_eq!(u16_at(&b, 54), 500, "current_gfxclk");
        assert_eq!(u16_at(&b, 76), 160, "pcie_link_speed");
        assert_eq!(&b[32..40], &[0; 8], "system_clock_counter at 0");
        let b = idle_table("mi300x8", MetricsClock::default()).unwrap();
        // hotspot 40, mem 38, vrsoc n/a, current power 140 W, gfx 0 %.
        assert_eq!(
            [4, 6, 8, 10, 12].map(|o| u16_at(&b, o)),
            [40, 38, 0xffff, 140, 0]
        );
        let gfxclk: Vec<u16> = (0..8).map(|i| u16_at(&b, 312 + 2 * i)).collect();
        assert_eq!(gfxclk, [500; 8], "one per XCC");
        assert_eq!(u16_at(&b, 328 + 2 * 3), 500, "the fourth AID's socclk");
    }

    fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
    }

    #[test]
    fn timestamps_and_energy_advance() {
        let clock = MetricsClock {
            boot_ns: 5_000_000_000,
            up_ns: 2_000_000_000,
        };
        // v1.3: energy_accumulator 24, system_clock_counter 32,
        // firmware_timestamp 96; 40 W for 2 s = 80 J.
        let b = idle_table("mi210x4", clock).unwrap();
        assert_eq!(u64_at(&b, 32), 5_000_000_000);
        assert_eq!(u64_at(&b, 96), 200_000_000, "10 ns units");
        assert_eq!(u64_at(&b, 24), 80 << 16, "2^-16 J units");
        // v1.5: energy 88, clock 96, firmware 280 (after xgmi_write_data_acc); 140 W.
        let b = idle_table("mi300x8", clock).unwrap();
        assert_eq!(u64_at(&b, 96), 5_000_000_000);
        assert_eq!(u64_at(&b, 88), 280 << 16);
        let t = Table::new(1, 5, V1_5);
        let fw = t
            .fields
            .iter()
            .find(|f| f.0 == "firmware_timestamp")
            .unwrap()
            .1;
        assert_eq!(u64_at(&b, fw), 200_000_000);
        // v1.1 (MI100) has no firmware timestamp.
        assert!(idle_table("mi100", clock).is_some());
    }

    #[test]
    fn rdna4_has_smu_14_0_2s_table() {
        let clock = MetricsClock {
            boot_ns: 5_000_000_000,
            up_ns: 2_000_000_000,
        };
        let b = idle_table("rx9070xt", clock).unwrap();
        assert_eq!((b.len(), u16_at(&b, 0), b[2], b[3]), (120, 120, 1, 3));
        // edge 35 C, gfx 0 %, power 15 W, current gfxclk 500, fan 800 RPM.
        assert_eq!(
            [4, 16, 22, 54, 72].map(|o| u16_at(&b, o)),
            [35, 0, 15, 500, 800]
        );
        assert_eq!(u64_at(&b, 32), 5_000_000_000, "system_clock_counter");
        assert_eq!(u64_at(&b, 24), u64::MAX, "no energy on SMU 14.0.2");
        assert_eq!(u64_at(&b, 96), u64::MAX, "nor a firmware timestamp");
        assert_eq!(&b[80..88], &[0xff; 8], "nor accumulated activity");
    }

    /// A GPU whose XCCs 0 and 2 of 8 had waves the whole window (0 still
    /// has), whose memory was busy a quarter of it.
    fn busy_load(xccs: usize) -> Load {
        use crate::sysfs::load::{window, Busy, Totals};
        let b = |ns, now| Busy { ns, now };
        let prev = Totals {
            at_ns: 0,
            xcc: vec![b(0, false); xccs],
            ..Totals::default()
        };
        let mut now = Totals {
            at_ns: 1_000_000_000,
            xcc: vec![b(0, false); xccs],
            mem: b(250_000_000, false),
            ..Totals::default()
        };
        now.xcc[0] = b(1_000_000_000, true);
        if xccs > 2 {
            now.xcc[2] = b(1_000_000_000, false);
        }
        window(&prev, &now)
    }

    #[test]
    fn activity_and_clocks_follow_the_load() {
        let g = gpu("mi210x4");
        let b = gpu_metrics(&g, MetricsClock::default(), &busy_load(1)).unwrap();
        // v1.3: gfx 100 %, umc 25 %, average gfxclk at the top, uclk a
        // quarter up, current gfxclk at the top, accumulated 1 s and 0.25 s.
        let top = g.max_engine_clk_fcompute as u16;
        assert_eq!([16, 18].map(|o| u16_at(&b, o)), [100, 25]);
        assert_eq!(u16_at(&b, 40), top, "average_gfxclk_frequency");
        let uclk = 400 + (g.vram_clk_max.max(400) as u16 - 400) / 4;
        assert_eq!(u16_at(&b, 44), uclk, "average_uclk_frequency");
        assert_eq!(u16_at(&b, 54), top, "current_gfxclk");
        assert_eq!(
            u16_at(&b, 58),
            g.vram_clk_max.max(400) as u16,
            "current_uclk"
        );
        assert_eq!(u32::from_le_bytes(b[80..84].try_into().unwrap()), 100_000);
        assert_eq!(u32::from_le_bytes(b[84..88].try_into().unwrap()), 25_000);
        // v1.5: two of eight XCCs busy (25 %), XCC 0's clock up, XCC 2's
        // idle again.
        let g = gpu("mi300x8");
        let b = gpu_metrics(&g, MetricsClock::default(), &busy_load(8)).unwrap();
        assert_eq!([12, 14].map(|o| u16_at(&b, o)), [25, 25]);
        let gfxclk: Vec<u16> = (0..8).map(|i| u16_at(&b, 312 + 2 * i)).collect();
        let top = g.max_engine_clk_fcompute as u16;
        assert_eq!(gfxclk, [top, 500, 500, 500, 500, 500, 500, 500]);
    }
}
