//! Checks every opcode table entry against LLVM's disassembler: an instruction word built
//! from the entry's encoding and opcode must disassemble to the entry's mnemonic, on the
//! entry's targets: gfx908 and gfx90a with the host's llvm-mc-15, gfx942 (which LLVM 15
//! does not know) with LLVM 21's llvm-mc in test-rocm64's Debian sid chroot
//! (build/rocm64/sid, or $ROCM64_CHROOT), run through the chroot's own dynamic loader. A
//! target whose llvm-mc is missing is counted and printed as skipped, never passed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gfx9::decode::{decode, Encoding};
use gfx9::exec::{lookup, on_target, opcodes};
use gfx9::Target;

/// How to run an llvm-mc that knows a target.
struct LlvmMc {
    program: PathBuf,
    /// Arguments before llvm-mc's own (the chroot's loader and library path).
    prefix: Vec<String>,
    name: String,
}

impl LlvmMc {
    fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.prefix);
        c
    }

    fn runs(&self) -> bool {
        self.command()
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

fn rocm64_chroot() -> PathBuf {
    std::env::var_os("ROCM64_CHROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/rocm64/sid"))
}

/// The llvm-mc for `t`, or why there is none.
fn llvm_mc(t: Target) -> Result<LlvmMc, String> {
    let tool = match t {
        Target::Gfx908 | Target::Gfx90a => LlvmMc {
            program: "llvm-mc-15".into(),
            prefix: Vec::new(),
            name: "llvm-mc-15".into(),
        },
        Target::Gfx942 => {
            let root = rocm64_chroot();
            let libs = ["usr/lib/x86_64-linux-gnu", "usr/lib/llvm-21/lib"]
                .map(|l| root.join(l).display().to_string())
                .join(":");
            LlvmMc {
                program: root.join("lib64/ld-linux-x86-64.so.2"),
                prefix: vec![
                    "--library-path".into(),
                    libs,
                    root.join("usr/lib/llvm-21/bin/llvm-mc")
                        .display()
                        .to_string(),
                ],
                name: format!("llvm-mc 21 of {}", root.display()),
            }
        }
    };
    if tool.runs() {
        return Ok(tool);
    }
    Err(match t {
        Target::Gfx942 => format!(
            "{} does not run (test/rocm64/chroot.sh builds the chroot with llvm-21)",
            tool.name
        ),
        _ => format!("{} is not installed (apt-get install llvm-15)", tool.name),
    })
}

/// Candidate words for opcode `op` of `enc`: operand fields vary because the
/// disassembler rejects instructions whose unused fields are not zero.
fn candidates(enc: Encoding, op: u32) -> Vec<Vec<u32>> {
    let lit = 0x3f80_0000;
    let vop3 = |s2: u32| {
        vec![
            (0b110100 << 26) | (op << 16) | 4,
            (256 + 6) | ((256 + 2) << 9) | (s2 << 18),
        ]
    };
    match enc {
        Encoding::Sop2 => vec![vec![(0b10 << 30) | (op << 23) | (4 << 16) | (2 << 8) | 6]],
        Encoding::Sopk => vec![
            vec![(0b1011 << 28) | (op << 23) | (4 << 16) | 1],
            vec![(0b1011 << 28) | (op << 23) | (4 << 16) | 1, lit],
        ],
        Encoding::Sop1 => vec![
            vec![(0x17d << 23) | (4 << 16) | (op << 8) | 6],
            vec![(0x17d << 23) | (4 << 16) | (op << 8)],
            vec![(0x17d << 23) | (op << 8) | 6],
        ],
        Encoding::Sopc => vec![vec![(0x17e << 23) | (op << 16) | (2 << 8) | 6]],
        Encoding::Sopp => vec![
            vec![(0x17f << 23) | (op << 16)],
            vec![(0x17f << 23) | (op << 16) | 1],
        ],
        Encoding::Smem => [(1, 4), (1, 0), (0, 4), (0, 0)]
            .iter()
            .map(|&(imm, sd)| {
                vec![
                    (0b110000 << 26) | (op << 18) | (imm << 17) | (sd << 6) | 1,
                    0x10,
                ]
            })
            .chain([vec![(0b110000 << 26) | (op << 18) | (4 << 6), 0]])
            .collect(),
        Encoding::Vop2 => vec![
            vec![(op << 25) | (4 << 17) | (2 << 9) | (256 + 6)],
            vec![(op << 25) | (4 << 17) | (2 << 9) | (256 + 6), lit],
        ],
        Encoding::Vop1 => vec![
            vec![(0x3f << 25) | (4 << 17) | (op << 9) | (256 + 6)],
            vec![(0x3f << 25) | (op << 9)],
        ],
        Encoding::Vopc => vec![vec![(0x3e << 25) | (op << 17) | (2 << 9) | (256 + 6)]],
        Encoding::Vop3 => vec![
            vop3(256 + 8),
            vop3(0),
            vec![(0b110100 << 26) | (op << 16) | 4, 2 | (4 << 9)],
            vec![(0b110100 << 26) | (op << 16) | 4, 256 + 6],
            vec![(0b110100 << 26) | (op << 16) | 4, 0],
            vec![(0b110100 << 26) | (op << 16), 256 + 6],
            vec![(0b110100 << 26) | (op << 16), 0],
        ],
        Encoding::Vop3p => [256 + 8, 0]
            .iter()
            .map(|&s2| {
                vec![
                    (0x1a7 << 23) | (op << 16) | 4,
                    (256 + 6) | ((256 + 2) << 9) | (s2 << 18) | (3 << 27),
                ]
            })
            .chain([vec![(0x1a7 << 23) | (op << 16) | 4, 6 | (3 << 27)]])
            .collect(),
        Encoding::Ds => {
            let mut v = Vec::new();
            for d0 in [4, 0] {
                for d1 in [6, 0] {
                    for vd in [8, 0] {
                        v.push(vec![
                            (0b110110 << 26) | (op << 17),
                            2 | (d0 << 8) | (d1 << 16) | (vd << 24),
                        ]);
                    }
                }
            }
            v
        }
        Encoding::Flat | Encoding::Global | Encoding::Scratch => {
            let seg = match enc {
                Encoding::Flat => 0,
                Encoding::Scratch => 1,
                _ => 2,
            };
            let mut v = Vec::new();
            for d in [4, 0] {
                for vd in [8, 0] {
                    for sa in [0x7f, 0, 2] {
                        v.push(vec![
                            (0b110111 << 26) | (op << 18) | (seg << 14),
                            2 | (d << 8) | (sa << 16) | (vd << 24),
                        ]);
                    }
                }
            }
            v
        }
        Encoding::Mubuf => [(2, 4), (0, 4), (2, 0), (0, 0)]
            .iter()
            .map(|&(va, vd)| {
                vec![
                    (0b111000 << 26) | (op << 18),
                    va | (vd << 8) | (1 << 16) | (0x80 << 24),
                ]
            })
            .collect(),
    }
}

fn line(words: &[u32]) -> String {
    words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .map(|b| format!("{b:#04x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `s_mov_b32 s101, 0x12345678`: a line between candidates, so that the junk an invalid
/// candidate decodes into cannot shift the answers of the ones after it.
const SEPARATOR: [u32; 2] = [0xbee5_00ff, 0x1234_5678];
const SEPARATOR_TEXT: &str = "s_mov_b32 s101, 0x12345678";

/// Disassembles each line; `None` where llvm-mc calls the candidate's first word invalid.
fn disassemble(mc: &LlvmMc, t: Target, lines: &[String]) -> Vec<Option<String>> {
    let sep = line(&SEPARATOR);
    // Four s_nops after each candidate: the disassembler resumes after an invalid word
    // four bytes on, and the junk it decodes there must not swallow the separator.
    let pad = line(&[0xbf80_0000; 4]);
    let input: Vec<String> = lines
        .iter()
        .flat_map(|l| [format!("{l} {pad}"), sep.clone()])
        .collect();
    let mut child = mc
        .command()
        .args([
            "-arch=amdgcn",
            &format!("-mcpu={}", t.name()),
            "-disassemble",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("llvm-mc runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.join("\n").as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("llvm-mc finishes");
    let err = String::from_utf8_lossy(&out.stderr);
    let bad: Vec<usize> = err
        .lines()
        .filter_map(|l| {
            l.strip_prefix("<stdin>:")?
                .strip_suffix(": warning: invalid instruction encoding")
        })
        .filter_map(|pos| pos.strip_suffix(":1")?.parse().ok())
        .collect();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut groups = vec![Vec::new()];
    for l in stdout
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('.'))
    {
        if l == SEPARATOR_TEXT {
            groups.push(Vec::new());
        } else if let Some(g) = groups.last_mut() {
            g.push(l.split_whitespace().next().unwrap_or("").to_string());
        }
    }
    (0..lines.len())
        .map(|k| {
            let first = groups.get(k).and_then(|g| g.first().cloned());
            if bad.contains(&(2 * k + 1)) {
                None
            } else {
                first
            }
        })
        .collect()
}

fn mnemonic(s: &str) -> &str {
    s.trim_end_matches("_e32").trim_end_matches("_e64")
}

fn scratch_name(name: &str) -> Option<String> {
    name.strip_prefix("global_")
        .filter(|n| !n.starts_with("atomic"))
        .map(|n| format!("scratch_{n}"))
}

/// (encoding, opcode, expected mnemonic) of every entry on `t`.
fn expectations(t: Target) -> Vec<(Encoding, u32, String)> {
    use Encoding::*;
    let mut v = Vec::new();
    for enc in [
        Sop2, Sopk, Sop1, Sopc, Sopp, Smem, Vop2, Vop1, Vopc, Vop3, Vop3p, Ds, Flat, Global, Mubuf,
    ] {
        for d in opcodes(enc).iter().flat_map(|s| s.iter()) {
            if on_target(d, t) {
                v.push((enc, d.op as u32, d.name.to_string()));
                if let Some(op3) = promoted(enc, d.op as u32, d.name) {
                    v.push((Vop3, op3, d.name.to_string()));
                }
                if enc == Global {
                    if let Some(n) = scratch_name(d.name) {
                        v.push((Scratch, d.op as u32, n));
                    }
                }
            }
        }
    }
    v
}

/// The VOP3 opcode of a VOP1/VOP2/VOPC entry (VOPC at 0x000, VOP2 at 0x100, VOP1 at
/// 0x140), for the opcodes that have a VOP3 form.
fn promoted(enc: Encoding, op: u32, name: &str) -> Option<u32> {
    let no_vop3 = [
        "v_madmk",
        "v_madak",
        "v_fmamk",
        "v_fmaak",
        "v_swap_b32",
        "v_accvgpr_mov_b32",
        "v_readfirstlane_b32",
        "v_dot2c_f32_f16",
        "v_dot4c_i32_i8",
    ];
    if no_vop3.iter().any(|p| name.starts_with(p)) {
        return None;
    }
    match enc {
        Encoding::Vopc => Some(op),
        Encoding::Vop2 => Some(0x100 + op),
        Encoding::Vop1 => Some(0x140 + op),
        _ => None,
    }
}

fn check_target(mc: &LlvmMc, t: Target) -> (usize, Vec<String>) {
    let exp = expectations(t);
    let mut found: Vec<Option<(Vec<u32>, String)>> = vec![None; exp.len()];
    for round in 0..12 {
        let todo: Vec<usize> = (0..exp.len()).filter(|&k| found[k].is_none()).collect();
        let tries: Vec<(usize, Vec<u32>)> = todo
            .iter()
            .filter_map(|&k| {
                candidates(exp[k].0, exp[k].1)
                    .get(round)
                    .map(|w| (k, w.clone()))
            })
            .collect();
        if tries.is_empty() {
            break;
        }
        let lines: Vec<String> = tries.iter().map(|(_, w)| line(w)).collect();
        for ((k, w), got) in tries.into_iter().zip(disassemble(mc, t, &lines)) {
            if let Some(g) = got {
                found[k] = Some((w, g));
            }
        }
    }
    let mut failures = Vec::new();
    for ((enc, op, name), f) in exp.iter().zip(&found) {
        match f {
            None => failures.push(format!(
                "{enc} {op:#x} {name}: llvm-mc accepts no candidate word"
            )),
            Some((_, g)) if mnemonic(g) != name => failures.push(format!(
                "{enc} {op:#x}: table says {name}, llvm-mc says {g}"
            )),
            Some((w, _)) => check_decode(t, w, *enc, *op, name, &mut failures),
        }
    }
    (exp.len(), failures)
}

/// Our decoder must agree on the encoding, opcode, length and table entry of the word.
/// (Words are padded as llvm-mc saw them: an instruction that always carries a literal
/// takes it from the padding when the candidate had none.)
fn check_decode(
    t: Target,
    w: &[u32],
    enc: Encoding,
    op: u32,
    name: &str,
    failures: &mut Vec<String>,
) {
    let padded: Vec<u32> = w.iter().copied().chain([0xbf80_0000; 2]).collect();
    let table_name = match enc {
        Encoding::Scratch => name.replacen("scratch_", "global_", 1),
        _ => name.to_string(),
    };
    match decode(&padded) {
        Ok(i)
            if i.enc == enc && i.op as u32 == op && (i.len as usize / 4).abs_diff(w.len()) <= 1 =>
        {
            if lookup(t, &i).map(|d| d.name) != Some(table_name.as_str()) {
                failures.push(format!("{enc} {op:#x} {name}: lookup disagrees"));
            }
        }
        other => failures.push(format!("{enc} {op:#x} {name}: decode gives {other:?}")),
    }
}

fn check_with_llvm_mc(t: Target) {
    let mc = match llvm_mc(t) {
        Ok(mc) => mc,
        Err(why) => {
            println!("SKIPPED {t:?} table against llvm-mc: {why}");
            return;
        }
    };
    let (n, failures) = check_target(&mc, t);
    println!(
        "{t:?}: {n} opcode entries checked against {}, {} failures",
        mc.name,
        failures.len()
    );
    assert!(failures.is_empty(), "{t:?}:\n{}", failures.join("\n"));
}

#[test]
fn every_table_entry_matches_llvm_mc() {
    check_with_llvm_mc(Target::Gfx908);
    check_with_llvm_mc(Target::Gfx90a);
}

#[test]
fn every_gfx942_table_entry_matches_llvm_mc_21() {
    check_with_llvm_mc(Target::Gfx942);
}
