//! `kfd-emu` command line.

use std::process::ExitCode;

use kfd_emu::profile::{self, Profile};

fn usage() -> ExitCode {
    eprintln!(
        "usage: kfd-emu profiles\n\
         \x20      kfd-emu topology (--profile NAME | --profile-file F)...\n\
         \x20      kfd-emu run (--profile NAME | --profile-file F)... [--state-dir D] -- CMD [ARG...]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        return usage();
    };
    match cmd.as_str() {
        "profiles" => {
            for n in profile::builtin_names() {
                match Profile::builtin(n) {
                    Ok(p) => println!("{n:10} {}", p.description),
                    Err(e) => println!("{n:10} BROKEN: {e}"),
                }
            }
            ExitCode::SUCCESS
        }
        "topology" => {
            let mut name = None;
            let mut file = None;
            let mut it = args[1..].iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--profile" => name = it.next().cloned(),
                    "--profile-file" => file = it.next().map(std::path::PathBuf::from),
                    _ => return usage(),
                }
            }
            match Profile::load(name.as_deref(), file.as_deref()) {
                Ok(p) => {
                    print!("{}", kfd_emu::topology::render(&p));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("kfd-emu: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => usage(),
    }
}
