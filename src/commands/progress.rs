//! What the commands show while they work and when they are done: the
//! progress bar of a conversion or an append, and numbers in human units.

use std::path::Path;

use indicatif::{HumanCount, ProgressBar, ProgressState, ProgressStyle};

use crate::convert::ConvertProgress;

/// The progress bar: cells done of the phase's total, rate, ETA, current file.
/// Notes go above it (or straight to stderr when there is no bar).
pub(crate) struct Bar {
    pub(crate) bar: ProgressBar,
    pub(crate) quiet: bool,
}

impl Bar {
    pub(crate) fn new(quiet: bool) -> Bar {
        Bar { bar: progress_bar(quiet), quiet }
    }
}

impl ConvertProgress for Bar {
    fn note(&self, message: &str) {
        if !self.quiet {
            self.bar.suspend(|| eprintln!("deltacells: note: {message}"));
        }
    }
    fn phase(&self, name: &str, total_cells: u64) {
        super::phase_started(name);
        // A phase of unknown length (scanning) spins instead of showing a full bar at 0/0.
        self.bar.set_style(if total_cells == 0 { spinner_style() } else { bar_style() });
        self.bar.set_length(total_cells);
        self.bar.set_position(0);
        self.bar.set_prefix(name.to_string());
    }
    fn file(&self, path: &Path) {
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        // The name of an input at a pre-signed URL ends with its signature.
        self.bar.set_message(crate::redact::redact(&name).into_owned());
    }
    fn advance(&self, cells: u64) {
        self.bar.inc(cells);
    }
}

/// A rate in human units: `950 cells/s`, `19.5 k cells/s`, `1.25 M cells/s`.
pub(crate) fn human_rate(per_second: f64, unit: &str) -> String {
    if per_second >= 1e6 {
        format!("{:.2} M {unit}/s", per_second / 1e6)
    } else if per_second >= 1e4 {
        format!("{:.1} k {unit}/s", per_second / 1e3)
    } else {
        format!("{} {unit}/s", HumanCount(per_second as u64))
    }
}

/// `1 tile`, `2 tiles`.
pub(crate) fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", HumanCount(n), if n == 1 { one } else { many })
}

/// The file on a line of its own (so that a long name is never cut), the bar below.
fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix:>10} {msg}\n{bar:30} {human_pos}/{human_len} cells, {rate}, ETA {eta}")
        .expect("valid template")
        .with_key("rate", |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = w.write_str(&human_rate(state.per_sec(), "cells"));
        })
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix:>10} {spinner} {msg}").expect("valid template")
}

/// A progress bar on a terminal, else nothing.
pub(crate) fn progress_bar(quiet: bool) -> ProgressBar {
    if super::show_progress(quiet) {
        ProgressBar::new(0).with_style(spinner_style())
    } else {
        ProgressBar::hidden()
    }
}
