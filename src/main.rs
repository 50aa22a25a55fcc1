//! The `deltacells` command: runs the command line the library holds
//! (`deltacells::run_command_line`, which the Python package's console script
//! runs too) and exits with its status.

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(deltacells::run_command_line(std::env::args_os()))
}
