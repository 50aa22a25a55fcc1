//! One file per subcommand: arguments in, calls into the library, results out.

use std::io::IsTerminal;
use std::process::ExitCode;

use crate::cli::{Cli, Command};

mod convert;
mod export;
mod info;
mod obs;
mod verify;

pub(crate) fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Convert(args) => convert::run(&args),
        Command::Export(args) => export::run(&args),
        Command::Info(args) => info::run(&args),
        Command::Obs(cmd) => obs::run(&cmd),
        Command::Verify(args) => verify::run(&args),
    }
}

/// Sets the number of rayon worker threads, when asked.
pub(crate) fn set_threads(threads: Option<usize>) -> anyhow::Result<()> {
    if let Some(n) = threads {
        rayon::ThreadPoolBuilder::new().num_threads(n.max(1)).build_global()?;
    }
    Ok(())
}

/// Whether progress bars may be drawn: stderr is a terminal and not `--quiet`.
pub(crate) fn show_progress(quiet: bool) -> bool {
    !quiet && std::io::stderr().is_terminal()
}

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}
