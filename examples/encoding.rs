//! Every encoding choice measured on real cells: bytes per nonzero,
//! single-thread decode and encode speed, for each gene order, zstd level,
//! chunk count and tile size, one choice at a time (the others at convert's
//! defaults: genes sorted by total counts, level 19, 8 chunks, 10,000 cells).
//!
//! usage: cargo run --release --example encoding -- PBMC_DIR OUT.json [--quick]
//!
//! PBMC_DIR holds pbmc_ctrl.h5ad and pbmc_stim.h5ad (../shared/data/fetch-pbmc.sh).
//! Two inputs: the PBMC cells (14,053 genes), and a wide one of about 35,000
//! genes made from them: each ctrl cell beside a stim cell (28,106 genes), padded
//! with 6,894 genes never detected. Prints a markdown table per choice and
//! writes every figure to OUT.json (benches/encoding.py plots them). `--quick`
//! uses 2,000 cells, level 3 and levels up to 9, to check that it runs.

use std::time::Instant;

use deltacells::convert::gene_order_from_totals;
use deltacells::format::{decode_tile_into, CsrMatrix, TileEncoder};
use deltacells::inputs::h5ad::H5adFile;
use deltacells::inputs::to_counts;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::json;

/// The cells of both PBMC files, as counts.
fn pbmc(dir: &str) -> anyhow::Result<Vec<CsrMatrix>> {
    let mut parts = Vec::new();
    for name in ["pbmc_ctrl.h5ad", "pbmc_stim.h5ad"] {
        let file = H5adFile::open(&std::path::Path::new(dir).join(name))?;
        let x = file.matrix("X")?;
        let raw = x.read_rows(0..x.n_rows())?;
        let counts = to_counts(&raw, x.n_cols() as u32, None).map_err(|e| anyhow::anyhow!("{name}: {e:?}"))?;
        parts.push(counts.0);
    }
    Ok(parts)
}

/// The first `n` rows of `m`.
fn first_rows(m: &CsrMatrix, n: usize) -> CsrMatrix {
    let mut out = CsrMatrix::empty(m.n_cols);
    for r in 0..n.min(m.n_rows()) {
        out.push_row_from(m, r);
    }
    out
}

/// Each row of `a` beside the same row of `b`, then `pad` empty columns.
fn side_by_side(a: &CsrMatrix, b: &CsrMatrix, pad: u32) -> CsrMatrix {
    let mut out = CsrMatrix::empty(a.n_cols + b.n_cols + pad);
    for r in 0..a.n_rows().min(b.n_rows()) {
        let (ga, ca) = a.row(r);
        let (gb, cb) = b.row(r);
        out.indices.extend_from_slice(ga);
        out.data.extend_from_slice(ca);
        out.indices.extend(gb.iter().map(|&g| g + a.n_cols));
        out.data.extend_from_slice(cb);
        out.indptr.push(out.indices.len() as u64);
    }
    out
}

/// The positions that sort genes by decreasing total counts (convert's order).
fn by_totals(m: &CsrMatrix) -> Vec<u32> {
    inverse(&gene_order_from_totals(&m.column_totals()))
}

fn inverse(order: &[u32]) -> Vec<u32> {
    let mut position = vec![0u32; order.len()];
    for (j, &g) in order.iter().enumerate() {
        position[g as usize] = j as u32;
    }
    position
}

/// Bytes, encode seconds and median decode seconds (1 thread) of `m` in tiles
/// of `tile_size` cells.
fn measure(m: &CsrMatrix, tile_size: usize, chunks: usize, level: i32) -> anyhow::Result<(u64, f64, f64)> {
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let encoder = TileEncoder::new(chunks, level);
    let tiles: Vec<CsrMatrix> = (0..m.n_rows())
        .step_by(tile_size)
        .map(|start| {
            let mut t = CsrMatrix::empty(m.n_cols);
            for r in start..(start + tile_size).min(m.n_rows()) {
                t.push_row_from(m, r);
            }
            t
        })
        .collect();
    let started = Instant::now();
    let blobs: Vec<Vec<u8>> = one.install(|| tiles.iter().map(|t| encoder.encode(t)).collect::<Result<_, _>>())?;
    let encode = started.elapsed().as_secs_f64();
    let mut out = CsrMatrix::default();
    let mut runs = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        for blob in &blobs {
            one.install(|| decode_tile_into(blob, None, &mut out))?;
        }
        runs.push(started.elapsed().as_secs_f64());
    }
    runs.sort_by(f64::total_cmp);
    Ok((blobs.iter().map(|b| b.len() as u64).sum(), encode, runs[2]))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (dir, out_path, quick) = match &args[..] {
        [_, d, o] => (d.clone(), o.clone(), false),
        [_, d, o, q] if q == "--quick" => (d.clone(), o.clone(), true),
        _ => anyhow::bail!("usage: encoding PBMC_DIR OUT.json [--quick]"),
    };
    let parts = pbmc(&dir)?;
    let cells = if quick { 2_000 } else { 10_000 };
    let mut both = CsrMatrix::empty(parts[0].n_cols);
    for p in &parts {
        both.append(p);
    }
    let wide_source = side_by_side(&parts[0], &parts[1], 35_000 - 2 * parts[0].n_cols);
    let inputs = [("PBMC, 14,053 genes", both), ("PBMC side by side, 35,000 genes", wide_source)];
    let levels: &[i32] = if quick { &[1, 3, 9] } else { &[1, 3, 9, 15, 19, 22] };
    let base = if quick { 3 } else { 19 };
    let tile_sizes: &[usize] = if quick { &[500, 1_000, 2_000] } else { &[1_000, 2_000, 5_000, 10_000, 20_000] };
    let mut results = Vec::new();
    for (name, source) in &inputs {
        let sorted = source.with_columns(&by_totals(source));
        let mut random_order: Vec<u32> = (0..source.n_cols).collect();
        random_order.shuffle(&mut rand_pcg::Pcg64Mcg::seed_from_u64(1));
        let mut runs: Vec<(&str, String, CsrMatrix, usize, usize, i32)> = Vec::new();
        let tile = first_rows(&sorted, cells);
        for (label, m) in [
            ("sorted by total counts", tile.clone()),
            ("source order", first_rows(source, cells)),
            ("random order", first_rows(&source.with_columns(&inverse(&random_order)), cells)),
        ] {
            runs.push(("gene order", label.to_string(), m, cells, 8, base));
        }
        for &level in levels {
            runs.push(("zstd level", level.to_string(), tile.clone(), cells, 8, level));
        }
        for chunks in [1, 2, 4, 8, 16] {
            runs.push(("chunks", chunks.to_string(), tile.clone(), cells, chunks, base));
        }
        let many = first_rows(&sorted, 2 * cells);
        for &size in tile_sizes {
            runs.push(("tile size", size.to_string(), many.clone(), size, 8, base));
        }
        let mut current = "";
        for (choice, value, m, tile_size, chunks, level) in runs {
            if choice != current {
                println!("\n{name}: {choice} (others: sorted genes, level {base}, 8 chunks, {cells} cells per tile)\n");
                println!("| {choice:24} | bytes/nonzero | decode M nnz/s | encode M nnz/s |");
                println!("|{}|---------------|----------------|----------------|", "-".repeat(26));
                current = choice;
            }
            let (bytes, encode, decode) = measure(&m, tile_size, chunks, level)?;
            let nnz = m.nnz() as f64;
            println!(
                "| {value:24} | {:13.3} | {:14.1} | {:14.2} |",
                bytes as f64 / nnz,
                nnz / decode / 1e6,
                nnz / encode / 1e6
            );
            results.push(json!({
                "input": name, "choice": choice, "value": value, "cells": m.n_rows(), "nnz": m.nnz(),
                "n_genes": m.n_cols, "tile_size": tile_size, "chunks": chunks, "level": level,
                "bytes": bytes, "encode_seconds": encode, "decode_seconds": decode,
            }));
        }
    }
    std::fs::write(&out_path, serde_json::to_string_pretty(&results)?)?;
    eprintln!("wrote {out_path}");
    Ok(())
}
