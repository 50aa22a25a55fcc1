//! The command line: one file per subcommand (arguments in, calls into the
//! library, results out), and [`main`], which the `deltacells` binary and the
//! Python package's console script both run.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use crate::inputs::InputOptions;
use crate::storage::{self, Storage};

use crate::cli::{Cli, Command, StoreArgs};

use advice::advice;

mod advice;
mod append;
mod compact;
mod convert;
mod export;
mod info;
mod obs;
mod progress;
mod shard;
mod verify;

/// Runs the command line `args` (the program's name first, as in
/// `std::env::args_os`) and returns its exit status: 0 on success, 1 when
/// verify found bad data, 2 on any error (said on stderr as
/// `deltacells: ...`). Usage errors, `--help` and `--version` are printed by
/// clap with its status; nothing here ends the process, so that a caller
/// (the Python package) gets the status back.
pub fn main<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::Parser;
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return err.exit_code().clamp(0, 255) as u8;
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            if err.chain().any(|e| {
                e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return 0;
            }
            // The one way out of every error: no credential of a URL in it
            // (inputs, outputs and stores quote theirs) is printed.
            let message = match advice(&err) {
                Some(advice) => format!("{err:#}; {advice}"),
                None => format!("{err:#}"),
            };
            eprintln!("deltacells: {}", crate::redact::redact(&message));
            2
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Convert(args) => convert::run(&args),
        Command::Append(args) => append::run(&args),
        Command::Compact(args) => compact::run(&args),
        Command::Plan(args) => convert::run_plan(&args),
        Command::Shard(args) => shard::run(&args),
        Command::Finalize(args) => shard::run_finalize(&args),
        Command::Export(args) => export::run(&args),
        Command::Info(args) => info::run(&args),
        Command::Obs(cmd) => obs::run(&cmd),
        Command::Verify(args) => verify::run(&args),
    }
}

/// `given` paths, then those `--inputs-from FILE` lists one per line (blank
/// lines and `#` comments skipped).
pub(crate) fn input_paths(given: &[String], inputs_from: Option<&str>) -> anyhow::Result<Vec<std::path::PathBuf>> {
    use anyhow::Context;
    let mut inputs: Vec<std::path::PathBuf> = given.iter().map(std::path::PathBuf::from).collect();
    if let Some(list) = inputs_from {
        let text = std::fs::read_to_string(list).with_context(|| format!("--inputs-from {list}"))?;
        let lines = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
        inputs.extend(lines.map(std::path::PathBuf::from));
    }
    Ok(inputs)
}

/// How the command reads its inputs (`reading`: their format, features) and
/// reaches those at URLs: the object-store options and, with `--download-inputs`, the folder they are downloaded into whole
/// (`--download-dir`, else a temporary folder, returned to be removed when
/// the command ends), saying how much disk that needs; `urls` are the inputs
/// that may be read (all of a plan's, for a shard: hence "up to").
pub(crate) fn input_options(
    store: &StoreArgs,
    download: &crate::cli::DownloadArgs,
    reading: &crate::cli::ReadingArgs,
    urls: &[std::path::PathBuf],
    up_to: bool,
) -> anyhow::Result<(InputOptions, Option<tempfile::TempDir>)> {
    let mut options = InputOptions {
        remote: crate::inputs::remote::RemoteOptions {
            store: store.options(),
            download_dir: None,
            block_cache: download.block_cache(),
        },
        reading: reading.reading()?,
        provided: Vec::new(),
    };
    if !download.download_inputs {
        return Ok((options, None));
    }
    let (dir, temp) = match download.download_dir.as_deref() {
        Some(dir) => (dir.to_path_buf(), None),
        None => {
            let temp = tempfile::Builder::new().prefix("deltacells-inputs-").tempdir()?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    let urls: Vec<&std::path::PathBuf> = urls.iter().filter(|p| crate::inputs::remote::is_url(p)).collect();
    let bytes: u64 = urls.iter().filter_map(|p| crate::inputs::input_size(p, &options)).sum();
    eprintln!(
        "deltacells: note: --download-inputs: {} inputs at URLs are downloaded whole into {} before they are read: {}{} of free disk needed there",
        urls.len(),
        dir.display(),
        if up_to { "up to " } else { "" },
        indicatif::HumanBytes(bytes)
    );
    options.remote.download_dir = Some(dir);
    Ok((options, temp))
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

/// Opens a dataset root as `--anonymous` and `--endpoint` say (inputs at
/// URLs are reached the same way: see [`input_options`]).
pub(crate) fn open_store(dataset: &str, args: &StoreArgs) -> anyhow::Result<Arc<dyn Storage>> {
    Ok(storage::open_with(dataset, &args.options())?)
}

/// The phases of the command so far (scanning, gene order, converting), with
/// the time each began, for `--stats`.
static PHASES: std::sync::Mutex<Vec<(String, Instant)>> = std::sync::Mutex::new(Vec::new());

/// Notes that the phase `name` begins now.
pub(crate) fn phase_started(name: &str) {
    PHASES.lock().unwrap_or_else(|e| e.into_inner()).push((name.to_string(), Instant::now()));
}

/// Seconds spent in each phase, in order (a phase entered twice counts once
/// per entry), up to now.
fn phase_seconds() -> Vec<(String, f64)> {
    let phases = PHASES.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    phases
        .iter()
        .enumerate()
        .map(|(i, (name, began))| {
            let ended = phases.get(i + 1).map_or(now, |(_, next)| *next);
            (name.clone(), ended.duration_since(*began).as_secs_f64())
        })
        .collect()
}

/// What `--stats` prints: requests, bytes and seconds of the whole command.
#[derive(serde::Serialize)]
struct IoReport {
    requests: u64,
    bytes: u64,
    /// Attempts that failed transiently and were tried again.
    retries: u64,
    uploads: u64,
    bytes_uploaded: u64,
    /// Of inputs at URLs (read by ranges).
    input_requests: u64,
    input_bytes: u64,
    seconds: f64,
    /// Seconds per phase of a conversion, in order.
    phases: Vec<(String, f64)>,
}

/// Prints the storage's request count, bytes (read and written) and the elapsed time to stderr
/// when `--stats` was given (as JSON with `--json`).
pub(crate) fn report_stats(store: &dyn Storage, args: &StoreArgs, started: Instant, json: bool) {
    if !args.stats {
        return;
    }
    let (requests, bytes) = store.stats().snapshot();
    let (uploads, bytes_uploaded) = store.stats().uploads();
    let (input_requests, input_bytes) = crate::inputs::remote::input_stats().snapshot();
    let report = IoReport {
        requests,
        bytes,
        retries: store.stats().retries(),
        uploads,
        bytes_uploaded,
        input_requests,
        input_bytes,
        seconds: started.elapsed().as_secs_f64(),
        phases: phase_seconds(),
    };
    if json {
        eprintln!("{}", serde_json::json!({ "io": report }));
    } else {
        if report.input_requests > 0 {
            eprintln!(
                "io: inputs at URLs: {} requests, {} fetched",
                report.input_requests,
                indicatif::HumanBytes(report.input_bytes)
            );
        }
        let written = if report.uploads > 0 {
            format!("; {} objects written, {}", report.uploads, indicatif::HumanBytes(report.bytes_uploaded))
        } else {
            String::new()
        };
        let retried = match report.retries {
            0 => String::new(),
            n => format!(" ({n} failed attempts retried)"),
        };
        eprintln!(
            "io: {} requests{retried}, {} fetched{written}, {:.2} s",
            report.requests,
            indicatif::HumanBytes(report.bytes),
            report.seconds
        );
        if !report.phases.is_empty() {
            let phases: Vec<String> = report.phases.iter().map(|(name, s)| format!("{name} {s:.2} s")).collect();
            eprintln!("phases: {}", phases.join(", "));
        }
    }
}

/// `--spill-dir`, when given, must be a folder that exists.
pub(crate) fn check_spill_dir(dir: Option<&std::path::Path>) -> anyhow::Result<()> {
    match dir {
        Some(d) if !d.is_dir() => anyhow::bail!("--spill-dir {}: not a folder (it must exist)", d.display()),
        _ => Ok(()),
    }
}

/// Parses the `K/N` of option `flag`.
pub(crate) fn parse_k_of_n(flag: &str, text: &str) -> anyhow::Result<(usize, usize)> {
    let parsed = text.split_once('/').and_then(|(k, n)| Some((k.trim().parse().ok()?, n.trim().parse().ok()?)));
    match parsed {
        Some((k, n)) if n > 0 && k < n => Ok((k, n)),
        Some((k, n)) => anyhow::bail!("{flag} {k}/{n}: K must be from 0 to N-1"),
        None => anyhow::bail!("{flag} {text:?}: expected K/N, for example 0/8"),
    }
}
