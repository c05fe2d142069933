//! The float modes hipcc's kernels start in: the kernel descriptor's FLOAT_ROUND_MODE_32,
//! FLOAT_ROUND_MODE_16_64, FLOAT_DENORM_MODE_32 and FLOAT_DENORM_MODE_16_64 (COMPUTE_PGM_RSRC1
//! bits 12..20, MODE's low byte at wave start). The engine rounds to nearest even and keeps
//! f32, f16 and f64 denormals (MODE 0xf0) and implements no other float mode, so every
//! committed kernel must start there: a fixture whose kernels need flushing or another
//! rounding needs those modes implemented first.

mod common;
use common::launch::Gpu;
use gfx9::Target;

/// MODE's float byte the engine implements: round to nearest even, denormals kept.
const IEEE_DENORMS_KEPT: u32 = 0xf0;

#[test]
fn every_fixture_kernel_starts_in_the_float_mode_the_engine_implements() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hip");
    let mut kernels = 0;
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("fixtures directory") {
        let name = entry
            .expect("entry")
            .file_name()
            .into_string()
            .expect("UTF-8");
        let Some(stem) = name.strip_suffix(".co") else {
            continue;
        };
        let (prog, target) = match stem.rsplit_once('-') {
            Some((p, "gfx908")) => (p, Target::Gfx908),
            Some((p, "gfx90a")) => (p, Target::Gfx90a),
            _ => panic!("{name}: not <prog>-<gfx908|gfx90a>.co"),
        };
        for (kernel, code) in Gpu::new(prog, target).kernel_codes() {
            kernels += 1;
            let float_mode = code.mode() & 0xff;
            if float_mode != IEEE_DENORMS_KEPT {
                wrong.push(format!("{name} {kernel}: float mode {float_mode:#x}"));
            }
        }
    }
    assert!(kernels > 0, "no kernels in {}", dir.display());
    assert!(
        wrong.is_empty(),
        "kernels starting in a float mode other than {IEEE_DENORMS_KEPT:#x}: {wrong:?}"
    );
}
