//! `include/kfd_client.h` must be exactly what cbindgen generates from this crate, and a C
//! program including it must link against the static library.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn committed_header_matches_the_crate() {
    let header = crate_dir().join("include/kfd_client.h");
    let config =
        cbindgen::Config::from_file(crate_dir().join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir())
        .with_config(config)
        .generate()
        .expect("cbindgen could not read the crate")
        .write(&mut generated);
    let generated = String::from_utf8(generated).unwrap();
    if std::env::var_os("UPDATE_HEADER").is_some() {
        std::fs::write(&header, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&header).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date; regenerate it with UPDATE_HEADER=1 cargo test -p kfd-client --test header",
        header.display()
    );
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

#[test]
fn c_program_links_and_reports_errors() {
    let out = std::env::temp_dir().join(format!("kfd-client-link-{}", std::process::id()));
    let src = out.with_extension("c");
    std::fs::write(
        &src,
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
    )
    .unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(&src)
        .arg(staticlib())
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&out)
        .status()
        .expect("run the C compiler");
    assert!(
        st.success(),
        "{cc} could not compile/link against libkfd_client.a"
    );
    let run = Command::new(&out).output().unwrap();
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&src);
    assert!(
        run.status.success(),
        "C program failed: {:?}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stdout)
    );
}
