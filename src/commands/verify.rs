use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use indicatif::{HumanBytes, HumanCount, ProgressBar, ProgressStyle};

use crate::verify::{self, VerifyProgress};

use crate::cli::VerifyArgs;

struct Bar(ProgressBar);

impl VerifyProgress for Bar {
    fn start(&self, _tiles: u64, bytes: u64) {
        self.0.set_length(bytes);
    }
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
}

pub(crate) fn run(args: &VerifyArgs) -> anyhow::Result<u8> {
    super::set_threads(args.threads)?;
    let started = Instant::now();
    let store = super::open_store(&args.dataset, &args.store).context("verify")?;
    let bar = if super::show_progress(args.quiet) {
        let style = ProgressStyle::with_template(
            "verify {bar:30} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {eta}",
        )
        .expect("valid template");
        ProgressBar::new(0).with_style(style)
    } else {
        ProgressBar::hidden()
    };
    let read = crate::dataset::ReadOptions {
        cache_dir: args.cache_dir.as_ref().map(std::path::PathBuf::from),
        ..Default::default()
    };
    let mut report = verify::verify_with(store.as_ref(), &Bar(bar.clone()), &read).context("verify")?;
    bar.finish_and_clear();
    if args.cache {
        let root = crate::obs::localize::cache_root(args.cache_dir.as_deref().map(std::path::Path::new));
        let (problems, checked) = verify::verify_cache(store.as_ref(), &root).context("verify --cache")?;
        eprintln!("verify: {checked} cached obs columns checked in {}", root.display());
        report.ok &= problems.is_empty();
        report.problems.extend(problems);
    }
    if args.json {
        super::print_json(&report)?;
    } else {
        let mut out = std::io::stdout().lock();
        for p in &report.problems {
            writeln!(out, "{}: [{}] {}", store.location(&p.file), p.rule, p.message)?;
        }
        let summary = format!(
            "{}, {}, {} nonzeros, {} read in {:.2} s",
            super::progress::plural(report.tiles_checked as u64, "tile", "tiles"),
            super::progress::plural(report.cells, "cell", "cells"),
            HumanCount(report.nnz),
            HumanBytes(report.bytes_read),
            started.elapsed().as_secs_f64()
        );
        if report.ok {
            writeln!(out, "ok: {}: {summary}", report.dataset)?;
        } else {
            let problems = super::progress::plural(report.problems.len() as u64, "problem", "problems");
            writeln!(out, "FAILED: {}: {problems}; {summary}", report.dataset)?;
        }
    }
    super::report_stats(store.as_ref(), &args.store, started, args.json);
    Ok(if report.ok { 0 } else { 1 })
}
