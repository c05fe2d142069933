//! `include/kfd_client.h` must be exactly what cbindgen generates from this crate, and a C
//! program including it must link against the static library.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[path = "../../test-support/header.rs"]
mod header;

#[test]
fn committed_header_matches_the_crate() {
    header::check_committed_header(crate_dir(), &crate_dir().join("include/kfd_client.h"));
}

/// The static library cargo built for this test run: `cargo test` leaves it in `deps/` with
/// a hash (only `cargo build` copies it up), so take the newest `libkfd_client-*.a` there.
fn staticlib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let newest = std::fs::read_dir(deps)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("libkfd_client-") && n.ends_with(".a")
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok());
    match newest {
        Some(e) => e.path(),
        None => panic!(
            "no libkfd_client-*.a in {}: the crate must build as a staticlib",
            deps.display()
        ),
    }
}

/// `source` written to a fresh directory named `prefix`..., compiled (`$CC`, warnings as
/// errors) and linked against the static library: the directory (removed when dropped) and
/// the program's path.
fn build_c(prefix: &str, source: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let (out, src) = (tmp.path().join("prog"), tmp.path().join("prog.c"));
    std::fs::write(&src, source).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-Wall", "-Werror", "-I"])
        .arg(crate_dir().join("include"))
        .arg(&src)
        .arg(staticlib())
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&out)
        .status()
        .expect("run the C compiler");
    assert!(
        st.success(),
        "{cc} could not compile {} and link it against libkfd_client.a",
        src.display()
    );
    (tmp, out)
}

#[test]
fn c_program_links_and_reports_errors() {
    let (_tmp, out) = build_c(
        "kfd-client-link-",
        r#"#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "kfd_client.h"
int main(void)
{
	struct kfd_client *c = NULL;
	char msg[256];
	int ret = kfd_client_open(NULL);

	if (ret != -EINVAL)
		return 10;
	kfd_client_last_error(msg, sizeof(msg));
	if (!strstr(msg, "NULL"))
		return 11;
	if (kfd_client_close(NULL) != 0)
		return 12;
	ret = kfd_client_open(&c);
	printf("open=%d\n", ret);
	if (ret == 0)
		return kfd_client_close(c) == 0 ? 0 : 13;
	kfd_client_last_error(msg, sizeof(msg));
	printf("%s\n", msg);
	return msg[0] ? 0 : 14;
}
"#,
    );
    let run = Command::new(&out).output().unwrap();
    assert!(
        run.status.success(),
        "C program failed: {:?}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stdout)
    );
}

/// kfd-emu next to this test binary, or `$KFD_EMU`; see tests/emu.rs.
fn kfd_emu() -> PathBuf {
    if let Some(p) = std::env::var_os("KFD_EMU") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("kfd-emu");
    assert!(
        p.is_file(),
        "kfd-emu is not built at {}: run `cargo build -p kfd-emu` (same CARGO_TARGET_DIR) or \
         set KFD_EMU",
        p.display()
    );
    p
}

/// The C ABI end to end: BOs on every GPU, CPU writes through the returned address, an SDMA
/// copy VRAM -> GTT, a fill and a fence, all checked from C, under kfd-emu; the MMIO page
/// from open on (with the HDP flush register written by the submissions) and the doorbell
/// BO from the first queue on.
#[test]
fn c_program_copies_through_sdma_under_emulator() {
    let (_tmp, out) = build_c(
        "kfd-client-c-sdma-",
        r#"#include <errno.h>
#include <stdio.h>
#include <stdint.h>
#include "kfd_client.h"
#define SZ (256u << 10)
#define CHECK(x) do { int r_ = (x); if (r_) { char m_[512]; \
	kfd_client_last_error(m_, sizeof(m_)); \
	fprintf(stderr, "%s = %d: %s\n", #x, r_, m_); return 1; } } while (0)
int main(void)
{
	struct kfd_client *c;
	uint32_t n, i, j;

	CHECK(kfd_client_open(&c));
	CHECK(kfd_client_gpu_count(c, &n));
	for (i = 0; i < n; i++) {
		struct kfd_client_bo *vb, *gb, *fb;
		struct kfd_client_queue *q;
		uint64_t v, g, f, mva, msz, dva, dsz;
		uint32_t id, minor, *vp, *gp, *fp;

		CHECK(kfd_client_gpu_info(c, i, &id, &minor));
		CHECK(kfd_client_mmio_bo(c, id, &mva, &msz));
		if (!mva || msz != 4096)
			return 5;
		if (kfd_client_doorbell_bo(c, id, &dva, &dsz) != -ENOENT)
			return 6;
		CHECK(kfd_client_bo_alloc(c, id, SZ, KFD_CLIENT_MEM_VRAM, &v, &vb));
		CHECK(kfd_client_bo_alloc(c, id, SZ, KFD_CLIENT_MEM_GTT, &g, &gb));
		CHECK(kfd_client_bo_alloc(c, id, 4096, KFD_CLIENT_MEM_GTT, &f, &fb));
		vp = (uint32_t *)(uintptr_t)v;
		gp = (uint32_t *)(uintptr_t)g;
		fp = (uint32_t *)(uintptr_t)f;
		for (j = 0; j < SZ / 4; j++)
			vp[j] = j * 2654435761u + i;
		CHECK(kfd_client_sdma_queue_create(c, id, 8192, &q));
		CHECK(kfd_client_doorbell_bo(c, id, &dva, &dsz));
		if (!dva || dsz != 8192)
			return 7;
		CHECK(kfd_client_sdma_copy(q, v, g, SZ - 4096));
		CHECK(kfd_client_sdma_fill(q, g + SZ - 4096, 0x5a5a0000u | i, 4096));
		CHECK(kfd_client_sdma_fence(q, f, 77));
		CHECK(kfd_client_sdma_wait_idle(q, 20000));
		for (j = 0; j < SZ / 4; j++) {
			uint32_t want = j < (SZ - 4096) / 4 ? j * 2654435761u + i : 0x5a5a0000u | i;
			if (gp[j] != want) {
				fprintf(stderr, "GPU %u dword %u: %#x != %#x\n", id, j, gp[j], want);
				return 2;
			}
		}
		if (fp[0] != 77)
			return 3;
		if (*(volatile uint32_t *)(uintptr_t)mva != 1)
			return 8;
		if (kfd_client_close(c) != -EBUSY)
			return 4;
		CHECK(kfd_client_sdma_queue_destroy(q));
		CHECK(kfd_client_bo_free(vb));
		CHECK(kfd_client_bo_free(gb));
		CHECK(kfd_client_bo_free(fb));
	}
	CHECK(kfd_client_close(c));
	printf("c-sdma ok gpus=%u\n", n);
	return 0;
}
"#,
    );
    let run = Command::new(kfd_emu())
        .args(["run", "--profile", "mi100x2", "--"])
        .arg(&out)
        .output()
        .expect("spawn kfd-emu");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.contains("c-sdma ok gpus=2"),
        "C program under kfd-emu: {:?}\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
}
