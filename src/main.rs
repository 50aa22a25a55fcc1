use std::process::ExitCode;

use clap::Parser;

mod cli;
mod commands;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match commands::run(cli) {
        Ok(code) => code,
        Err(err) => {
            if err.chain().any(|e| {
                e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            match commands::advice(&err) {
                Some(advice) => eprintln!("deltacells: {err:#}; {advice}"),
                None => eprintln!("deltacells: {err:#}"),
            }
            ExitCode::from(2)
        }
    }
}
