//! Coverage of real code: every instruction of the code objects that HIP programs run must
//! decode and be implemented. The code comes from three places, gathered at test time:
//!
//! - test/hip's programs, compiled by hipcc for gfx908 and gfx90a (committed code objects
//!   of our own sources, `tests/fixtures/hip/*.co`, rebuilt by test/hip/fixtures.sh);
//! - ROCclr's blit kernels: HIP 5.2 keeps their OpenCL source in libamdhip64 and compiles
//!   it through comgr when a device is opened; the test takes the source from the installed
//!   library and compiles it the same way with Debian's clang-15 and device libraries;
//! - ROCr's blit and fill kernels: raw machine code inside libhsa-runtime64 (the gfx8
//!   encoding ROCr 5.2 also loads on gfx9), found by the scalar loads that open them.
//!
//! LLVM disassembles (llvm-objdump-15 for code objects, llvm-mc-15 for raw code); each
//! instruction's words then go through gfx9's decoder and opcode tables, which must agree
//! with LLVM on the length and the mnemonic. A missing tool or library is counted and
//! printed as skipped with the reason, never passed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gfx9::decode::decode;
use gfx9::exec::lookup;
use gfx9::Target;

const OBJDUMP: &str = "llvm-objdump-15";
const LLVM_MC: &str = "llvm-mc-15";
const CLANG: &str = "clang-15";
const LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";
const TARGETS: [Target; 2] = [Target::Gfx908, Target::Gfx90a];

fn cpu(t: Target) -> &'static str {
    t.name()
}

/// One instruction as LLVM disassembled it.
#[derive(Debug)]
struct Insn {
    addr: u64,
    mnemonic: String,
    words: Vec<u32>,
}

/// Code of one origin for one target.
struct Code {
    origin: String,
    target: Target,
    insns: Vec<Insn>,
}

fn runs(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs a command, returns its standard output or why it failed.
fn output(cmd: &mut Command, input: Option<&str>) -> Result<String, String> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(text) = input {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    drop(stdin);
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{what}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// llvm-objdump's listing of a code object: `\tmnemonic operands // ADDR: WORD WORD`.
fn objdump(path: &Path, t: Target) -> Result<Vec<Insn>, String> {
    let text = output(
        Command::new(OBJDUMP)
            .args(["-d", &format!("--mcpu={}", cpu(t))])
            .arg(path),
        None,
    )?;
    let mut insns = Vec::new();
    for line in text.lines().filter(|l| l.starts_with('\t')) {
        let (asm, enc) = line
            .rsplit_once("//")
            .ok_or_else(|| format!("{}: unparsed line {line:?}", path.display()))?;
        let (addr, words) = enc
            .trim()
            .split_once(':')
            .ok_or_else(|| format!("{}: unparsed line {line:?}", path.display()))?;
        let addr = u64::from_str_radix(addr.trim(), 16).map_err(|e| format!("{line:?}: {e}"))?;
        let words = words
            .split_whitespace()
            .take_while(|w| w.len() == 8)
            .map(|w| u32::from_str_radix(w, 16))
            .collect::<Result<Vec<u32>, _>>()
            .map_err(|e| format!("{line:?}: {e}"))?;
        let mnemonic = asm.split_whitespace().next().unwrap_or("").to_string();
        insns.push(Insn {
            addr,
            mnemonic,
            words,
        });
    }
    Ok(insns)
}

/// llvm-mc's disassembly of raw code, with `-show-encoding` giving each instruction's bytes.
fn disassemble_raw(code: &[u32], t: Target) -> Result<Vec<Insn>, String> {
    let input: Vec<String> = code
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .map(|b| format!("{b:#04x}"))
        .collect();
    let text = output(
        Command::new(LLVM_MC).args([
            "-arch=amdgcn",
            &format!("-mcpu={}", cpu(t)),
            "-disassemble",
            "-show-encoding",
        ]),
        Some(&input.join(" ")),
    )?;
    let mut insns = Vec::new();
    let mut addr = 0;
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| l.contains("encoding:"))
    {
        let (asm, enc) = line.split_once(';').expect("encoding comment");
        let bytes: Vec<u8> = enc
            .trim()
            .trim_start_matches("encoding:")
            .trim()
            .trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .map(|b| u8::from_str_radix(b.trim().trim_start_matches("0x"), 16))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{line:?}: {e}"))?;
        let words: Vec<u32> = bytes
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("whole words")))
            .collect();
        let len = 4 * words.len() as u64;
        insns.push(Insn {
            addr,
            mnemonic: asm.split_whitespace().next().unwrap_or("").to_string(),
            words,
        });
        addr += len;
    }
    let covered: u64 = insns.iter().map(|i| 4 * i.words.len() as u64).sum();
    if covered != 4 * code.len() as u64 {
        return Err(format!(
            "llvm-mc decoded {covered} of {} bytes",
            4 * code.len()
        ));
    }
    Ok(insns)
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hip")
}

/// test/hip's programs: `<prog>-<arch>.co`.
fn hip_programs() -> Result<Vec<Code>, String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .map_err(|e| format!("{}: {e}", fixtures_dir().display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "co"))
        .collect();
    paths.sort();
    let mut codes = Vec::new();
    for p in paths {
        let name = p
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        let t = TARGETS
            .into_iter()
            .find(|t| name.ends_with(cpu(*t)))
            .ok_or_else(|| format!("{}: no target in the name", p.display()))?;
        codes.push(Code {
            origin: format!("test/hip {name}"),
            target: t,
            insns: objdump(&p, t)?,
        });
    }
    if codes.is_empty() {
        return Err(format!("no code objects in {}", fixtures_dir().display()));
    }
    Ok(codes)
}

/// The NUL-terminated strings of `bytes` that contain `needle`.
fn strings_with(bytes: &[u8], needle: &str) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter_map(|s| std::str::from_utf8(s).ok())
        .filter(|s| s.contains(needle))
        .map(str::to_string)
        .collect()
}

/// ROCclr kernels this engine does not run, by a word of their source, and why.
const ROCCLR_LEFT_OUT: [(&str, &str); 2] = [
    (
        "image2d_array_t",
        "the image blits are MIMG code, which HIP runs only for image (hipArray) copies",
    ),
    (
        "__ockl_gws_init",
        "gwsInit sets up GWS for cooperative multi-device launches; GWS is not modelled",
    ),
];

/// ROCclr's blit kernel sources in libamdhip64, compiled for both targets as comgr compiles
/// them (OpenCL 2.0 with the ROCm device libraries), less [`ROCCLR_LEFT_OUT`].
fn rocclr_blits(tmp: &Path) -> Result<Vec<Code>, String> {
    let lib = format!("{LIBDIR}/libamdhip64.so.5");
    let bytes = std::fs::read(&lib).map_err(|e| format!("{lib}: {e}"))?;
    let mut sources = strings_with(&bytes, "__kernel void __amd_rocclr_");
    for (word, why) in ROCCLR_LEFT_OUT {
        let before = sources.len();
        sources.retain(|s| !s.contains(word));
        println!(
            "ROCclr blit kernels: {} source(s) left out: {why}",
            before - sources.len()
        );
    }
    if sources.is_empty() {
        return Err(format!("{lib}: no ROCclr blit kernel source found"));
    }
    let bitcode = format!("{LIBDIR}/amdgcn/bitcode");
    if !Path::new(&bitcode).join("opencl.bc").exists() {
        return Err(format!("{bitcode}/opencl.bc is missing (rocm-device-libs)"));
    }
    let src = tmp.join("rocclr-blit.cl");
    std::fs::write(&src, sources.join("\n")).map_err(|e| e.to_string())?;
    let mut codes = Vec::new();
    for t in TARGETS {
        let obj = tmp.join(format!("rocclr-blit-{}.co", cpu(t)));
        output(
            Command::new(CLANG)
                .args([
                    "-x",
                    "cl",
                    "-cl-std=CL2.0",
                    "-O3",
                    "-target",
                    "amdgcn-amd-amdhsa",
                ])
                .arg(format!("-mcpu={}", cpu(t)))
                .arg(format!("--rocm-device-lib-path={bitcode}"))
                .arg(&src)
                .arg("-o")
                .arg(&obj),
            None,
        )?;
        codes.push(Code {
            origin: "ROCclr blit kernels".into(),
            target: t,
            insns: objdump(&obj, t)?,
        });
    }
    Ok(codes)
}

/// ROCr's blit and fill kernels: raw gfx8/gfx9 code in libhsa-runtime64 that opens with
/// `s_load_dwordx4 s[4:7], s[0:1], 0x0` and runs to the first `s_endpgm`.
fn rocr_blits() -> Result<Vec<Code>, String> {
    const OPENING: [u32; 2] = [0xc00a_0100, 0];
    const ENDPGM: u32 = 0xbf81_0000;
    let lib = format!("{LIBDIR}/libhsa-runtime64.so.1");
    let bytes = std::fs::read(&lib).map_err(|e| format!("{lib}: {e}"))?;
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    let mut kernels = Vec::new();
    for start in (0..words.len().saturating_sub(1)).filter(|&k| words[k..k + 2] == OPENING) {
        let Some(len) = words[start..].iter().take(512).position(|w| *w == ENDPGM) else {
            continue;
        };
        kernels.push((start, &words[start..=start + len]));
    }
    if kernels.is_empty() {
        return Err(format!("{lib}: no blit kernel found"));
    }
    let mut codes = Vec::new();
    for t in TARGETS {
        for (start, code) in &kernels {
            codes.push(Code {
                origin: format!("ROCr blit kernel at {lib}+{:#x}", 4 * start),
                target: t,
                insns: disassemble_raw(code, t)?,
            });
        }
    }
    Ok(codes)
}

/// LLVM's mnemonic without the encoding suffixes, as the opcode tables name it (SCRATCH
/// shares GLOBAL's table and its names).
fn table_name(mnemonic: &str) -> String {
    let m = ["_e32", "_e64", "_sdwa", "_dpp"]
        .iter()
        .fold(mnemonic, |m, s| m.strip_suffix(s).unwrap_or(m));
    match m.strip_prefix("scratch_") {
        Some(rest) => format!("global_{rest}"),
        None => m.to_string(),
    }
}

/// What is wrong with one instruction, if anything.
fn check(t: Target, i: &Insn) -> Result<(), String> {
    if i.mnemonic.starts_with('<') || i.words.is_empty() {
        return Err("LLVM does not decode it".into());
    }
    let mut padded = i.words.clone();
    padded.extend([0xbf80_0000; 2]);
    let instr = decode(&padded).map_err(|e| format!("does not decode: {e}"))?;
    if instr.len as usize != 4 * i.words.len() {
        return Err(format!(
            "decoded as {} bytes, LLVM says {}",
            instr.len,
            4 * i.words.len()
        ));
    }
    let def = lookup(t, &instr).ok_or_else(|| {
        format!(
            "not implemented: opcode {:#x} of {} on {t:?}",
            instr.op, instr.enc
        )
    })?;
    if def.name != table_name(&i.mnemonic) {
        return Err(format!("the table calls it {}", def.name));
    }
    Ok(())
}

/// Per origin group: instruction count and distinct mnemonics; failures by mnemonic.
#[derive(Default)]
struct Tally {
    insns: usize,
    distinct: BTreeMap<String, bool>,
}

fn tally(codes: &[Code], failures: &mut BTreeMap<String, Vec<String>>) -> Tally {
    let mut t = Tally::default();
    for c in codes {
        for i in &c.insns {
            t.insns += 1;
            let key = format!("{} ({:?})", table_name(&i.mnemonic), c.target);
            let verdict = check(c.target, i);
            let ok = verdict.is_ok();
            *t.distinct.entry(key.clone()).or_insert(true) &= ok;
            if let Err(why) = verdict {
                let seen = failures.entry(format!("{key}: {why}")).or_default();
                if seen.len() < 3 {
                    seen.push(format!("{} at {:#x}", c.origin, i.addr));
                }
            }
        }
    }
    t
}

#[test]
fn real_code_decodes_and_is_implemented() {
    for tool in [OBJDUMP, LLVM_MC] {
        if !runs(tool) {
            println!(
                "SKIPPED real_code_decodes_and_is_implemented: {tool} is not installed (apt-get install llvm-15)"
            );
            return;
        }
    }
    let tmp = tempfile::Builder::new()
        .prefix("gfx9-coverage-")
        .tempdir()
        .expect("temporary directory");
    let rocclr = if runs(CLANG) {
        rocclr_blits(tmp.path())
    } else {
        Err(format!(
            "{CLANG} is not installed (apt-get install hipcc brings it)"
        ))
    };
    let groups = [
        ("test/hip programs", hip_programs()),
        ("ROCclr blit kernels", rocclr),
        ("ROCr blit kernels", rocr_blits()),
    ];
    drop(tmp);

    let mut failures = BTreeMap::new();
    let mut all = BTreeMap::new();
    let mut skipped = 0;
    for (name, codes) in &groups {
        match codes {
            Ok(codes) => {
                let t = tally(codes, &mut failures);
                let ok = t.distinct.values().filter(|v| **v).count();
                println!(
                    "{name}: {} code objects, {} instructions, {ok} of {} distinct opcodes (per target) run",
                    codes.len(),
                    t.insns,
                    t.distinct.len()
                );
                for (k, v) in t.distinct {
                    *all.entry(k).or_insert(true) &= v;
                }
            }
            Err(why) => {
                skipped += 1;
                println!("SKIPPED {name}: {why}");
            }
        }
    }
    let ok = all.values().filter(|v| **v).count();
    println!(
        "all: {ok} of {} distinct opcodes (per target) run; {skipped} source(s) skipped",
        all.len()
    );
    let report: Vec<String> = failures
        .iter()
        .map(|(what, seen)| format!("{what} [{}]", seen.join("; ")))
        .collect();
    assert!(
        report.is_empty(),
        "{} problems:\n{}",
        report.len(),
        report.join("\n")
    );
}
