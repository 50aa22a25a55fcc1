//! The input formats besides .h5ad: 10x Genomics .h5 (Cell Ranger 3 and 2
//! layouts) and Matrix Market (folders and files, gzip or not, either
//! orientation, entries in any order). The same cells in every form convert
//! to the same tiles, gene tables and obs as from .h5ad; bad files fail
//! naming the file and the place, with no output.

use std::io::Write;
use std::path::{Path, PathBuf};

use hdf5::types::FixedAscii;

use crate::h5::{self, Rows};
use crate::util::{listing, TestDir};

/// A feature of a 10x file or a features.tsv.
#[derive(Clone, Debug)]
pub struct Feature {
    pub id: String,
    pub name: String,
    pub kind: String,
    pub genome: String,
}

/// Gene Expression features gene0.. named sym0.., of genome GRCh38.
pub fn gene_features(n: usize) -> Vec<Feature> {
    h5::genes(n)
        .into_iter()
        .enumerate()
        .map(|(i, id)| Feature { id, name: format!("sym{i}"), kind: "Gene Expression".into(), genome: "GRCh38".into() })
        .collect()
}

fn fixed(values: impl Iterator<Item = String>) -> Vec<FixedAscii<64>> {
    values.map(|s| FixedAscii::from_ascii(s.as_bytes()).unwrap()).collect()
}

/// The cells' entries as Cell Ranger stores them, by barcode; `columns`
/// maps each row's gene to its feature.
fn by_barcode(rows: &Rows, columns: &[usize]) -> (Vec<i32>, Vec<i64>, Vec<i64>) {
    let (mut data, mut indices, mut indptr) = (Vec::new(), Vec::new(), vec![0i64]);
    for row in rows {
        for &(g, v) in row {
            data.push(v as i32);
            indices.push(columns[g as usize] as i64);
        }
        indptr.push(data.len() as i64);
    }
    (data, indices, indptr)
}

fn write_1d<T: hdf5::H5Type>(g: &hdf5::Group, name: &str, values: &[T]) {
    g.new_dataset_builder().with_data(values).create(name).unwrap();
}

/// A Cell Ranger 3 .h5 file: `rows` (cells of genes 0..) are written at the
/// features `columns[gene]` of `features` (others have no counts).
pub fn write_tenx3(path: &Path, rows: &Rows, features: &[Feature], columns: &[usize], barcodes: &[String]) {
    write_tenx3_with(path, rows, features, columns, barcodes, |_| {});
}

/// [`write_tenx3`], with `edit` applied to the `matrix` group before the
/// file is closed (reopening it in the test process could meet the lock a
/// child of another test inherited).
pub fn write_tenx3_with(
    path: &Path,
    rows: &Rows,
    features: &[Feature],
    columns: &[usize],
    barcodes: &[String],
    edit: impl FnOnce(&hdf5::Group),
) {
    let f = h5::create(path);
    let g = f.create_group("matrix").unwrap();
    let (data, indices, indptr) = by_barcode(rows, columns);
    write_1d(&g, "data", &data);
    write_1d(&g, "indices", &indices);
    write_1d(&g, "indptr", &indptr);
    write_1d(&g, "shape", &[features.len() as i32, rows.len() as i32]);
    write_1d(&g, "barcodes", &fixed(barcodes.iter().cloned()));
    let fg = g.create_group("features").unwrap();
    write_1d(&fg, "id", &fixed(features.iter().map(|f| f.id.clone())));
    write_1d(&fg, "name", &fixed(features.iter().map(|f| f.name.clone())));
    write_1d(&fg, "feature_type", &fixed(features.iter().map(|f| f.kind.clone())));
    write_1d(&fg, "genome", &fixed(features.iter().map(|f| f.genome.clone())));
    edit(&g);
}

/// A Cell Ranger 2 .h5 file: one group per genome.
pub fn write_tenx2(path: &Path, genomes: &[(&str, &Rows, &[Feature])], barcodes: &[String]) {
    let f = h5::create(path);
    for (genome, rows, features) in genomes {
        let g = f.create_group(genome).unwrap();
        let columns: Vec<usize> = (0..features.len()).collect();
        let (data, indices, indptr) = by_barcode(rows, &columns);
        write_1d(&g, "data", &data);
        write_1d(&g, "indices", &indices);
        write_1d(&g, "indptr", &indptr);
        write_1d(&g, "shape", &[features.len() as i32, rows.len() as i32]);
        write_1d(&g, "barcodes", &fixed(barcodes.iter().cloned()));
        write_1d(&g, "genes", &fixed(features.iter().map(|f| f.id.clone())));
        write_1d(&g, "gene_names", &fixed(features.iter().map(|f| f.name.clone())));
    }
}

/// How a Matrix Market input is written.
#[derive(Clone, Copy, Debug, Default)]
pub struct MtxForm {
    pub gzip: bool,
    /// Rows are cells (the pipelines write genes x cells).
    pub cells_by_genes: bool,
    /// Entries in a scrambled order instead of by cell.
    pub scrambled: bool,
    /// genes.tsv of two columns (Cell Ranger 2) instead of features.tsv of three.
    pub genes_tsv: bool,
    /// Before each file's name (GEO's `GSM1_`).
    pub prefix: &'static str,
}

fn write_text(path: &Path, text: &str, gzip: bool) {
    let path = if gzip { PathBuf::from(format!("{}.gz", path.display())) } else { path.to_path_buf() };
    let file = std::fs::File::create(path).unwrap();
    if gzip {
        let mut z = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
        z.write_all(text.as_bytes()).unwrap();
        z.finish().unwrap();
    } else {
        std::io::BufWriter::new(file).write_all(text.as_bytes()).unwrap();
    }
}

/// A Matrix Market input in `dir`; returns the matrix file's path.
pub fn write_mtx(dir: &Path, rows: &Rows, features: &[Feature], barcodes: &[String], form: MtxForm) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut entries: Vec<(usize, u32, f64)> =
        rows.iter().enumerate().flat_map(|(c, row)| row.iter().map(move |&(g, v)| (c, g, v))).collect();
    if form.scrambled {
        // a fixed permutation: every 7th entry first, and so on
        let n = entries.len();
        entries = (0..7).flat_map(|k| (k..n).step_by(7)).map(|i| entries[n - 1 - i]).collect();
    }
    let (n_rows, n_cols) =
        if form.cells_by_genes { (rows.len(), features.len()) } else { (features.len(), rows.len()) };
    let mut text = format!(
        "%%MatrixMarket matrix coordinate integer general\n%metadata_json: {{}}\n{n_rows} {n_cols} {}\n",
        entries.len()
    );
    for (c, g, v) in entries {
        let (r, k) = if form.cells_by_genes { (c + 1, g as usize + 1) } else { (g as usize + 1, c + 1) };
        text.push_str(&format!("{r} {k} {v}\n"));
    }
    let matrix = dir.join(format!("{}matrix.mtx", form.prefix));
    write_text(&matrix, &text, form.gzip);
    let features_text: String = features
        .iter()
        .map(|f| {
            if form.genes_tsv {
                format!("{}\t{}\n", f.id, f.name)
            } else {
                format!("{}\t{}\t{}\n", f.id, f.name, f.kind)
            }
        })
        .collect();
    let stem = if form.genes_tsv { "genes.tsv" } else { "features.tsv" };
    write_text(&dir.join(format!("{}{stem}", form.prefix)), &features_text, form.gzip);
    let barcodes_text: String = barcodes.iter().map(|b| format!("{b}\n")).collect();
    write_text(&dir.join(format!("{}barcodes.tsv", form.prefix)), &barcodes_text, form.gzip);
    if form.gzip {
        PathBuf::from(format!("{}.gz", matrix.display()))
    } else {
        matrix
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Every file of dataset `dir` but the manifest, by name, with its bytes.
fn dataset_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = listing(dir)
        .lines()
        .filter_map(|line| line.rsplit_once(" (").map(|(name, _)| name))
        .filter(|name| *name != "manifest.json")
        .map(|name| (name.to_string(), std::fs::read(dir.join(name)).unwrap()))
        .collect();
    files.sort();
    files
}

/// Asserts that two datasets' files (from [`dataset_files`]) are the same,
/// naming the first that differs.
fn same(got: &[(String, Vec<u8>)], want: &[(String, Vec<u8>)], what: &str) {
    let names = |files: &[(String, Vec<u8>)]| files.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(got), names(want), "{what}: the files");
    for ((name, g), (_, w)) in got.iter().zip(want) {
        assert!(g == w, "{what}: {name} differs from the .h5ad conversion's");
    }
}

const FAST: [&str; 4] = ["--level", "3", "--tile-size", "16"];

/// Converts `inputs` with `extra` arguments into `out`; the dataset's files.
fn convert(t: &TestDir, inputs: &[&Path], extra: &[&str], out: &str) -> Vec<(String, Vec<u8>)> {
    let mut args = vec!["convert", "-q"];
    args.extend(FAST);
    args.extend(extra);
    args.extend(inputs.iter().map(|p| s(p)));
    args.push(out);
    t.run(&args).expect_code(0);
    t.run(&["verify", "-q", out]).expect_code(0);
    dataset_files(&t.join(out))
}

/// Two Antibody Capture features among the genes (at 3 and 9): the genes'
/// columns among all the features.
fn with_antibodies(genes: &[Feature]) -> (Vec<Feature>, Vec<usize>) {
    let mut all = genes.to_vec();
    for (at, name) in [(3, "CD4"), (9, "CD8")] {
        let f = Feature {
            id: format!("{name}_TotalSeqB"),
            name: name.into(),
            kind: "Antibody Capture".into(),
            genome: String::new(),
        };
        all.insert(at, f);
    }
    let columns = all.iter().enumerate().filter(|(_, f)| f.kind == "Gene Expression").map(|(i, _)| i).collect();
    (all, columns)
}

#[test]
fn every_form_of_the_same_cells_converts_to_the_tiles_and_tables_of_the_h5ad() {
    let t = TestDir::new();
    let (n_cells, n_genes) = (45, 30);
    let rows = h5::random_rows(n_cells, n_genes, 5);
    let genes = gene_features(n_genes);
    let barcodes = h5::cells(n_cells, "cell");
    let h5ad = t.join("cells.h5ad");
    h5::write_counts(&h5ad, &rows, n_genes, "cell");
    let want = convert(&t, &[&h5ad], &["--no-var"], "from_h5ad");
    assert!(want.iter().any(|(n, _)| n.starts_with("tiles/")) && want.iter().any(|(n, _)| n.starts_with("obs/")));

    let (features, columns) = with_antibodies(&genes);
    let tenx3 = t.join("filtered_feature_bc_matrix.h5");
    write_tenx3(&tenx3, &rows, &features, &columns, &barcodes);
    let tenx2 = t.join("cr2.h5");
    write_tenx2(&tenx2, &[("GRCh38", &rows, &genes)], &barcodes);
    let folder = t.join("outs/filtered_feature_bc_matrix");
    write_mtx(&folder, &rows, &genes, &barcodes, MtxForm { gzip: true, ..Default::default() });
    let geo = write_mtx(
        &t.join("geo"),
        &rows,
        &features.iter().filter(|f| f.kind == "Gene Expression").cloned().collect::<Vec<_>>(),
        &barcodes,
        MtxForm { cells_by_genes: true, scrambled: true, genes_tsv: true, prefix: "GSM1_", ..Default::default() },
    );
    // Cell Ranger's folder with the antibodies among the features, plain text
    let antibodies = t.join("with_antibodies");
    let spread: Rows =
        rows.iter().map(|row| row.iter().map(|&(g, v)| (columns[g as usize] as u32, v)).collect()).collect();
    write_mtx(&antibodies, &spread, &features, &barcodes, MtxForm::default());

    for (input, name) in [
        (&tenx3, "from_10x3"),
        (&tenx2, "from_10x2"),
        (&folder, "from_folder"),
        (&geo, "from_geo_file"),
        (&antibodies, "from_antibodies_folder"),
    ] {
        same(&convert(&t, &[input], &["--no-var"], name), &want, name);
    }

    // var: indexed by feature id, with the name, the type and the genome
    convert(&t, &[&tenx3], &[], "with_var");
    let ds = deltacells::Dataset::open(s(&t.join("with_var"))).unwrap();
    let order = ds.gene_order().unwrap().unwrap();
    let stored = |column: Option<&str>| -> Vec<String> {
        let keys = ds.gene_keys(column).unwrap();
        let mut by_source = vec![String::new(); keys.len()];
        for (k, &g) in keys.into_iter().zip(&order) {
            by_source[g as usize] = k;
        }
        by_source
    };
    assert_eq!(stored(None), genes.iter().map(|f| f.id.clone()).collect::<Vec<_>>());
    assert_eq!(stored(Some("name")), genes.iter().map(|f| f.name.clone()).collect::<Vec<_>>());
    assert_eq!(stored(Some("genome")), vec!["GRCh38".to_string(); n_genes]);
    assert_eq!(stored(Some("feature_type")), vec!["Gene Expression".to_string(); n_genes]);
}

#[test]
fn formats_mix_in_one_conversion_in_plan_shards_and_append() {
    let t = TestDir::new();
    let n_genes = 25;
    let genes = gene_features(n_genes);
    let parts: Vec<Rows> = (0..3).map(|k| h5::random_rows(20 + 7 * k, n_genes, 40 + k as u64)).collect();
    let h5ads: Vec<PathBuf> = (0..3)
        .map(|k| {
            let p = t.join(&format!("part{k}.h5ad"));
            h5::write_counts(&p, &parts[k], n_genes, &format!("p{k}_"));
            p
        })
        .collect();
    let options = ["--no-var", "--obs-tiles-per-file", "1"];
    let want = convert(&t, &[&h5ads[0], &h5ads[1], &h5ads[2]], &options, "want");

    let tenx = t.join("part1.h5");
    write_tenx3(&tenx, &parts[1], &genes, &(0..n_genes).collect::<Vec<_>>(), &h5::cells(parts[1].len(), "p1_"));
    let mtx = t.join("part2");
    write_mtx(
        &mtx,
        &parts[2],
        &genes,
        &h5::cells(parts[2].len(), "p2_"),
        MtxForm { scrambled: true, ..Default::default() },
    );
    let mixed = [h5ads[0].as_path(), tenx.as_path(), mtx.as_path()];
    same(&convert(&t, &mixed, &options, "mixed"), &want, "mixed");

    // plan, shards and finalize read each input as convert did
    let mut args = vec!["plan", "-q", "--no-var", "--obs-tiles-per-file", "1"];
    args.extend(FAST);
    args.extend(mixed.iter().map(|p| s(p)));
    args.push("sharded");
    t.run(&args).expect_code(0);
    for k in ["1/3", "0/3", "2/3"] {
        t.run(&["shard", "-q", "sharded", "--shard", k]).expect_code(0);
    }
    t.run(&["finalize", "-q", "sharded"]).expect_code(0);
    same(&dataset_files(&t.join("sharded")), &want, "sharded");

    // append a 10x file and a Matrix Market folder to the .h5ad's dataset
    let mut args = vec!["convert", "-q", "--no-var"];
    args.extend(FAST);
    args.extend([s(&h5ads[0]), "appended"]);
    t.run(&args).expect_code(0);
    t.run(&["append", "-q", "appended", s(&tenx), s(&mtx)]).expect_code(0);
    t.run(&["verify", "-q", "appended"]).expect_code(0);
    let ds = deltacells::Dataset::open(s(&t.join("appended"))).unwrap();
    let all: Rows = parts.concat();
    assert_eq!(crate::convert::source_order(&ds), crate::convert::expected(&all));
}

#[test]
fn feature_types_and_genomes_are_chosen_or_refused_with_their_list() {
    let t = TestDir::new();
    let (n_cells, n_genes) = (12, 10);
    let rows = h5::random_rows(n_cells, n_genes, 9);
    let barcodes = h5::cells(n_cells, "b");
    let genes = gene_features(n_genes);

    // antibodies only: "Gene Expression" is refused, the type is chosen
    let antibodies: Vec<Feature> =
        genes.iter().map(|f| Feature { kind: "Antibody Capture".into(), genome: String::new(), ..f.clone() }).collect();
    let adt = t.join("adt.h5");
    write_tenx3(&adt, &rows, &antibodies, &(0..n_genes).collect::<Vec<_>>(), &barcodes);
    let err = t.run(&["convert", "-q", s(&adt), "out"]).expect_code(2).stderr();
    assert!(
        err.contains("adt.h5")
            && err.contains("no \"Gene Expression\" features; this file has \"Antibody Capture\" (10)"),
        "{err}"
    );
    assert!(!t.join("out/manifest.json").exists());
    t.run(&["convert", "-q", "--feature-type", "Antibody Capture", s(&adt), "adt"]).expect_code(0);
    let ds = deltacells::Dataset::open(s(&t.join("adt"))).unwrap();
    assert_eq!(crate::convert::source_order(&ds), crate::convert::expected(&rows));

    // a barnyard file: two genomes' genes
    let mut barnyard = genes.clone();
    for f in &mut barnyard[5..] {
        f.genome = "mm10".into();
    }
    let both = t.join("barnyard.h5");
    write_tenx3(&both, &rows, &barnyard, &(0..n_genes).collect::<Vec<_>>(), &barcodes);
    let err = t.run(&["convert", "-q", s(&both), "out"]).expect_code(2).stderr();
    assert!(err.contains("the genomes \"GRCh38\", \"mm10\": --genome chooses"), "{err}");
    t.run(&["convert", "-q", "--genome", "mm10", s(&both), "mouse"]).expect_code(0);
    let ds = deltacells::Dataset::open(s(&t.join("mouse"))).unwrap();
    assert_eq!(ds.n_genes(), 5);
    let mouse: Rows =
        rows.iter().map(|r| r.iter().filter(|&&(g, _)| g >= 5).map(|&(g, v)| (g - 5, v)).collect()).collect();
    assert_eq!(crate::convert::source_order(&ds), crate::convert::expected(&mouse));
    let err = t.run(&["convert", "-q", "--genome", "hg19", s(&both), "out"]).expect_code(2).stderr();
    assert!(err.contains("of genome \"hg19\"; they are of \"GRCh38\", \"mm10\""), "{err}");

    // Cell Ranger 2: a group per genome
    let cr2 = t.join("cr2.h5");
    write_tenx2(&cr2, &[("hg19", &rows, &genes), ("mm10", &rows, &genes)], &barcodes);
    let err = t.run(&["convert", "-q", s(&cr2), "out"]).expect_code(2).stderr();
    assert!(err.contains("the genomes hg19, mm10: --genome chooses"), "{err}");
    t.run(&["convert", "-q", "--genome", "hg19", s(&cr2), "hg19"]).expect_code(0);

    // --genome means nothing to Matrix Market; --matrix nothing to either
    let folder = t.join("mtx");
    write_mtx(&folder, &rows, &genes, &barcodes, MtxForm::default());
    let err = t.run(&["convert", "-q", "--genome", "hg19", s(&folder), "out"]).expect_code(2).stderr();
    assert!(err.contains("a Matrix Market input's features have none"), "{err}");
    let err = t.run(&["convert", "-q", "--matrix", "raw/X", s(&cr2), "out"]).expect_code(2).stderr();
    assert!(err.contains("raw/X: unsupported: a 10x Genomics .h5 input holds one matrix"), "{err}");
    // --input-format forces a format
    let err = t.run(&["convert", "-q", "--input-format", "h5ad", s(&cr2), "out"]).expect_code(2).stderr();
    assert!(err.contains("cr2.h5: X: not found"), "{err}");
    assert!(!t.join("out/manifest.json").exists());
}

/// Expects convert of `input` to fail with exit 2, every needle in its
/// message, and no output.
fn fails(t: &TestDir, input: &Path, needles: &[&str]) {
    let run = t.run(&["convert", "-q", s(input), "out"]).expect_code(2);
    let err = run.stderr();
    for n in needles {
        assert!(err.contains(n), "expected {n:?} in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    assert!(!t.join("out/manifest.json").exists(), "a failed convert left a manifest");
}

#[test]
fn bad_matrix_market_inputs_fail_naming_the_file_and_the_line() {
    let t = TestDir::new();
    let rows: Rows = vec![vec![(0, 1.0)], vec![(1, 2.0), (3, 4.0)], vec![(2, 1.0)]];
    let genes = gene_features(4);
    let barcodes = vec!["a".to_string(), "b".to_string(), "c".to_string()];
    let write = |name: &str, form: MtxForm| write_mtx(&t.join(name), &rows, &genes, &barcodes, form);
    let gz = MtxForm { gzip: true, ..Default::default() };

    // a truncated and a corrupt gzip stream
    let good = std::fs::read(write("good", gz)).unwrap();
    let m = write("truncated", gz);
    std::fs::write(&m, &good[..good.len() / 2]).unwrap();
    fails(&t, &t.join("truncated"), &["truncated", "matrix.mtx.gz", "the gzip stream ends early"]);
    let m = write("corrupt", gz);
    let mut bytes = good.clone();
    for b in &mut bytes[20..40] {
        *b ^= 0x5a;
    }
    std::fs::write(&m, &bytes).unwrap();
    fails(&t, &t.join("corrupt"), &["corrupt", "matrix.mtx.gz", "gzip stream"]);

    // the header against the features and barcodes, and against the entries
    let edit = |name: &str, from: &str, to: &str| {
        let m = write(name, MtxForm::default());
        let text = std::fs::read_to_string(&m).unwrap().replacen(from, to, 1);
        std::fs::write(&m, text).unwrap();
        t.join(name)
    };
    fails(
        &t,
        &edit("sizes", "\n4 3 4\n", "\n5 3 4\n"),
        &[
            "sizes",
            "matrix.mtx, line 3",
            "the sizes disagree: 5 x 3 (header), 4 features in features.tsv, 3 barcodes in barcodes.tsv",
        ],
    );
    fails(
        &t,
        &edit("outside", "\n3 3 1\n", "\n3 7 1\n"),
        &["matrix.mtx, line 7", "entry (3, 7) is outside the header's 4 x 3"],
    );
    fails(
        &t,
        &edit("fewer", "\n4 3 4\n", "\n4 3 5\n"),
        &["matrix.mtx", "the file ends after 4 entries, but the header says 5"],
    );
    fails(
        &t,
        &edit("more", "\n4 3 4\n", "\n4 3 3\n"),
        &["matrix.mtx, line 7", "more entries than the 3 the header says"],
    );
    fails(&t, &edit("garbled", "\n3 3 1\n", "\n3 3 one\n"), &["matrix.mtx, line 7", "\"3 3 one\" is not an entry"]);
    fails(&t, &edit("array", "coordinate", "array"), &["matrix.mtx, line 1", "a dense (array) matrix"]);
    // not counts: the message .h5ad inputs get
    fails(
        &t,
        &edit("negative", "\n4 2 4\n", "\n4 2 -3\n"),
        &["negative", "negative: matrix.mtx: cell 1 (b), gene 3 (gene3): value -3 is negative"],
    );
    fails(
        &t,
        &edit("fraction", "\n4 2 4\n", "\n4 2 2.5\n"),
        &["matrix.mtx: cell 1 (b), gene 3 (gene3): value 2.5 is not an integer count"],
    );
    fails(&t, &edit("huge", "\n4 2 4\n", "\n4 2 3000000000\n"), &["value 3000000000 is above the largest count"]);

    // as many genes as cells: the orientation cannot be told
    let square = write_mtx(&t.join("square"), &rows, &genes[..3], &barcodes, MtxForm::default());
    let _ = square;
    fails(&t, &t.join("square"), &["square", "as many features as barcodes"]);
    // files missing
    let lone = t.join("lone");
    std::fs::create_dir(&lone).unwrap();
    std::fs::copy(t.join("good/matrix.mtx.gz"), lone.join("matrix.mtx.gz")).unwrap();
    fails(
        &t,
        &lone,
        &["lone", "matrix.mtx.gz has no features.tsv.gz or features.tsv or genes.tsv.gz or genes.tsv beside it"],
    );
    let empty = t.join("empty");
    std::fs::create_dir(&empty).unwrap();
    fails(&t, &empty, &["empty", "no matrix.mtx or matrix.mtx.gz in this folder"]);
}

#[test]
fn duplicate_entries_are_summed_and_said() {
    let t = TestDir::new();
    let rows: Rows = vec![vec![(0, 1.0), (2, 2.0), (0, 3.0)], vec![(1, 5.0)]];
    let dir = t.join("dups");
    write_mtx(
        &dir,
        &rows,
        &gene_features(3),
        &["a".into(), "b".into()],
        MtxForm { scrambled: true, ..Default::default() },
    );
    let run = t.run(&["convert", s(&dir), "out"]).expect_code(0);
    assert!(run.stdout().contains("1 entries repeated a cell and gene of an earlier entry"), "{}", run.stdout());
    let ds = deltacells::Dataset::open(s(&t.join("out"))).unwrap();
    assert_eq!(crate::convert::source_order(&ds), vec![vec![(0, 4), (2, 2)], vec![(1, 5)]]);
    // the same as an .h5ad file, in one process and in shards
    let h5ad = t.join("dups.h5ad");
    h5::write_counts(&h5ad, &rows, 3, "c");
    let summary = t.run(&["convert", "-q", "--json", s(&h5ad), "from_h5ad"]).expect_code(0).json();
    assert_eq!(summary["summed_duplicates"], 1);
    t.run(&["plan", "-q", s(&h5ad), "sharded"]).expect_code(0);
    t.run(&["shard", "-q", "sharded", "--shard", "0/1"]).expect_code(0);
    let summary = t.run(&["finalize", "-q", "--json", "sharded"]).expect_code(0).json();
    assert_eq!(summary["summed_duplicates"], 1);
    // and appended
    let summary = t.run(&["append", "-q", "--json", "from_h5ad", s(&dir)]).expect_code(0).json();
    assert_eq!(summary["summed_duplicates"], 1);
}

#[test]
fn bad_10x_files_fail_naming_the_object() {
    let t = TestDir::new();
    let rows: Rows = vec![vec![(0, 1.0)], vec![(1, 2.0)]];
    let genes = gene_features(3);
    let bad = |name: &str, edit: &dyn Fn(&hdf5::Group)| {
        let p = t.join(name);
        write_tenx3_with(&p, &rows, &genes, &[0, 1, 2], &["a".into(), "b".into()], edit);
        p
    };
    let p = bad("indices.h5", &|g| {
        g.unlink("indices").unwrap();
        g.new_dataset_builder().with_data(&[0i64, 7]).create("indices").unwrap();
    });
    fails(&t, &p, &["indices.h5", "matrix/indices[1]", "index 7 outside 0..3"]);
    let p = bad("shape.h5", &|g| {
        g.unlink("shape").unwrap();
        g.new_dataset_builder().with_data(&[4i32, 2]).create("shape").unwrap();
    });
    fails(&t, &p, &["shape.h5", "matrix/features/feature_type: has 3 entries, but matrix/shape says 4 features"]);
    let p = bad("barcodes.h5", &|g| {
        g.unlink("barcodes").unwrap();
        g.new_dataset_builder().with_data(&fixed(["a".to_string()].into_iter())).create("barcodes").unwrap();
    });
    fails(&t, &p, &["barcodes.h5", "matrix/barcodes: has 1 barcodes, but the matrix has 2 cells"]);
}

/// The PBMC cells written as a 10x .h5 file and a Matrix Market folder; None
/// without the PBMC files.
pub fn pbmc_forms(t: &TestDir) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let (ctrl, _) = crate::util::pbmc()?;
    let counts = crate::convert::read_h5ad_rows(&ctrl);
    let rows: Rows = counts.iter().map(|r| r.iter().map(|&(g, c)| (g, f64::from(c))).collect()).collect();
    let file = deltacells::inputs::h5ad::H5adFile::open(&ctrl).unwrap();
    let names = file.dataframe_index("var").unwrap();
    let barcodes = file.dataframe_index("obs").unwrap();
    let features: Vec<Feature> = names
        .iter()
        .map(|n| Feature { id: n.clone(), name: n.clone(), kind: "Gene Expression".into(), genome: "GRCh38".into() })
        .collect();
    let tenx = t.join("pbmc_ctrl.h5");
    write_tenx3(&tenx, &rows, &features, &(0..features.len()).collect::<Vec<_>>(), &barcodes);
    let folder = t.join("pbmc_ctrl_mtx");
    write_mtx(&folder, &rows, &features, &barcodes, MtxForm { gzip: true, ..Default::default() });
    Some((ctrl, tenx, folder))
}

#[test]
fn pbmc_cells_in_each_form_convert_to_the_same_bytes() {
    let t = TestDir::new();
    let Some((ctrl, tenx, folder)) = pbmc_forms(&t) else { return };
    let want = convert(&t, &[&ctrl], &["--no-var"], "from_h5ad");
    same(&convert(&t, &[&tenx], &["--no-var"], "from_10x"), &want, "10x");
    same(&convert(&t, &[&folder], &["--no-var"], "from_mtx"), &want, "Matrix Market");
}

/// tests/data/zarr: one AnnData object written by anndata as .h5ad and as
/// zarr stores of every layout (tests/python/make_zarr_inputs.py).
fn zarr_inputs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/zarr")
}

#[test]
fn zarr_stores_of_every_layout_convert_to_the_dataset_of_the_h5ad() {
    let t = TestDir::new();
    let data = zarr_inputs();
    // obs of every kind (categoricals, ordered ones, integers, floats with
    // NaN, booleans, nullable integers and booleans, strings) and var columns
    let want = convert(&t, &[&data.join("cells.h5ad")], &[], "from_h5ad");
    assert!(want.iter().any(|(n, _)| n == "var.parquet"));
    for store in ["v2.zarr", "v3.zarr", "v3_sharded.zarr", "v3_csc.zarr", "v3_dense.zarr"] {
        same(&convert(&t, &[&data.join(store)], &[], store), &want, store);
    }
    // in shards, and mixed with the .h5ad
    let (h5ad, zarr) = (data.join("cells.h5ad"), data.join("v3_sharded.zarr"));
    let mut args = vec!["plan", "-q", "--obs-tiles-per-file", "1"];
    args.extend(FAST);
    args.extend([s(&zarr), s(&h5ad), "sharded"]);
    t.run(&args).expect_code(0);
    for k in ["1/2", "0/2"] {
        t.run(&["shard", "-q", "sharded", "--shard", k]).expect_code(0);
    }
    t.run(&["finalize", "-q", "sharded"]).expect_code(0);
    let both = convert(&t, &[&h5ad, &h5ad], &["--obs-tiles-per-file", "1"], "both_h5ad");
    same(&dataset_files(&t.join("sharded")), &both, "plan of zarr and h5ad");
    // --input-format forces it; a zarr store is a folder, not Matrix Market
    let copy = t.join("no_suffix");
    copy_dir(&zarr, &copy);
    same(&convert(&t, &[&copy], &[], "told"), &want, "a zarr store without .zarr");
    same(&convert(&t, &[&copy], &["--input-format", "zarr"], "forced"), &want, "--input-format zarr");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn bad_zarr_stores_fail_naming_the_array() {
    let t = TestDir::new();
    let data = zarr_inputs();
    // an unknown codec, named
    let store = t.join("codec.zarr");
    copy_dir(&data.join("v3.zarr"), &store);
    let meta = store.join("X/data/zarr.json");
    let text = std::fs::read_to_string(&meta).unwrap().replace("\"zstd\"", "\"lz77\"");
    std::fs::write(&meta, text).unwrap();
    fails(&t, &store, &["codec.zarr", "X/data", "lz77"]);
    // a chunk that does not decode
    let store = t.join("chunk.zarr");
    copy_dir(&data.join("v2.zarr"), &store);
    std::fs::write(store.join("X/indices/0"), b"not blosc").unwrap();
    fails(&t, &store, &["chunk.zarr", "X/indices"]);
    // indptr that disagrees with the shape
    let store = t.join("shape.zarr");
    copy_dir(&data.join("v2.zarr"), &store);
    let attrs = store.join("X/.zattrs");
    let text = std::fs::read_to_string(&attrs).unwrap().replace("    60,", "    61,");
    std::fs::write(&attrs, text).unwrap();
    fails(&t, &store, &["shape.zarr", "X/indptr: has 61 entries, but shape [61, 25] needs 62"]);
    // not a store
    let empty = t.join("empty.zarr");
    std::fs::create_dir(&empty).unwrap();
    fails(&t, &empty, &["empty.zarr", "not a zarr store"]);
}

#[test]
fn pbmc_cells_in_zarr_stores_convert_to_the_same_bytes() {
    let Some((ctrl, _)) = crate::util::pbmc() else { return };
    let t = TestDir::new();
    let want = convert(&t, &[&ctrl], &[], "from_h5ad");
    for form in ["2", "3-sharded"] {
        let store = t.join(&format!("pbmc_{form}.zarr"));
        crate::util::python_script("write_zarr.py", &[s(&ctrl), s(&store), form]);
        if !store.exists() {
            return; // (no Python: noted by python_script)
        }
        same(&convert(&t, &[&store], &[], &format!("zarr_{form}")), &want, form);
    }
}
