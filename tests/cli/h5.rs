//! Writing small .h5ad files for tests with the hdf5 crate, in the layouts
//! anndata uses (and some it does not, on purpose).

use std::path::Path;

use hdf5::types::VarLenUnicode;
use hdf5::H5Type;

/// Creates an HDF5 file that is really closed when the handle is dropped (the
/// "strong" close degree closes every object still open in it).
///
/// File locking is off: HDF5 opens files without close-on-exec, so a
/// `deltacells` child that another test thread starts while this file is open
/// inherits the descriptor and, with it, the lock, which then refuses a later
/// open of the same file in this process ("unable to lock file, errno = 11").
pub fn create(path: &Path) -> hdf5::File {
    unlocked().create(path).unwrap()
}

/// Opens an existing HDF5 file for editing, closed strongly and unlocked as
/// [`create`]'s files are.
pub fn open_rw(path: &Path) -> hdf5::File {
    unlocked().open_rw(path).unwrap()
}

fn unlocked() -> hdf5::file::FileBuilder {
    use hdf5::file::FileCloseDegree;
    let mut builder = hdf5::File::with_options();
    builder.with_fapl(|p| p.fclose_degree(FileCloseDegree::Strong).file_locking(false));
    builder
}

pub fn vlu(s: &str) -> VarLenUnicode {
    s.parse().expect("no NUL in test strings")
}

pub fn str_attr(loc: &hdf5::Location, name: &str, value: &str) {
    loc.new_attr::<VarLenUnicode>().create(name).unwrap().write_scalar(&vlu(value)).unwrap();
}

pub fn strings(group: &hdf5::Group, name: &str, values: &[String]) -> hdf5::Dataset {
    let v: Vec<VarLenUnicode> = values.iter().map(|s| vlu(s)).collect();
    let ds = group.new_dataset_builder().with_data(&v[..]).create(name).unwrap();
    str_attr(&ds, "encoding-type", "string-array");
    str_attr(&ds, "encoding-version", "0.2.0");
    ds
}

/// A dataframe group with an index (and no columns).
pub fn dataframe(file: &hdf5::File, name: &str, index_name: &str, index: &[String]) -> hdf5::Group {
    let g = file.create_group(name).unwrap();
    str_attr(&g, "encoding-type", "dataframe");
    str_attr(&g, "encoding-version", "0.2.0");
    str_attr(&g, "_index", index_name);
    g.new_attr::<f64>().shape(0).create("column-order").unwrap();
    strings(&g, index_name, index);
    g
}

/// Rows of (gene, value).
pub type Rows = Vec<Vec<(u32, f64)>>;

pub fn cells(n: usize, prefix: &str) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

pub fn genes(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("gene{i}")).collect()
}

/// How X is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Csr,
    Csc,
    Dense,
    /// CSR with the attributes of anndata before 0.7 (h5sparse_format).
    LegacyCsr,
}

fn write_1d<T: H5Type + Copy>(g: &hdf5::Group, name: &str, values: &[T]) {
    g.new_dataset_builder().with_data(values).create(name).unwrap();
}

/// Writes a matrix at `name` (X, raw/X, layers/L) with values converted to T.
pub fn matrix<T: H5Type + Copy>(
    file: &hdf5::File,
    name: &str,
    rows: &Rows,
    n_genes: usize,
    layout: Layout,
    conv: fn(f64) -> T,
) {
    let parent_and_leaf = name.rsplit_once('/');
    let parent = match parent_and_leaf {
        Some((p, _)) => file.group(p).unwrap_or_else(|_| file.create_group(p).unwrap()),
        None => file.group("/").unwrap(),
    };
    let leaf = parent_and_leaf.map_or(name, |(_, l)| l);
    let n_cells = rows.len();
    if layout == Layout::Dense {
        let mut dense = vec![conv(0.0); n_cells * n_genes];
        for (r, row) in rows.iter().enumerate() {
            for &(g, v) in row {
                dense[r * n_genes + g as usize] = conv(v);
            }
        }
        let arr = ndarray_like(&dense, n_cells, n_genes);
        parent.new_dataset_builder().with_data(&arr).create(leaf).unwrap();
        return;
    }
    let g = parent.create_group(leaf).unwrap();
    let (mut data, mut indices, mut indptr) = (Vec::new(), Vec::new(), vec![0i64]);
    if layout == Layout::Csc {
        for gene in 0..n_genes as u32 {
            for (r, row) in rows.iter().enumerate() {
                for &(gg, v) in row.iter().filter(|(gg, _)| *gg == gene) {
                    let _ = gg;
                    data.push(conv(v));
                    indices.push(r as i32);
                }
            }
            indptr.push(data.len() as i64);
        }
    } else {
        for row in rows {
            for &(gene, v) in row {
                data.push(conv(v));
                indices.push(gene as i32);
            }
            indptr.push(data.len() as i64);
        }
    }
    write_1d(&g, "data", &data);
    write_1d(&g, "indices", &indices);
    write_1d(&g, "indptr", &indptr);
    let shape = [n_cells as i64, n_genes as i64];
    match layout {
        Layout::LegacyCsr => {
            str_attr(&g, "h5sparse_format", "csr");
            g.new_attr::<i64>().shape(2).create("h5sparse_shape").unwrap().write_raw(&shape).unwrap();
        }
        _ => {
            str_attr(&g, "encoding-type", if layout == Layout::Csc { "csc_matrix" } else { "csr_matrix" });
            str_attr(&g, "encoding-version", "0.1.0");
            g.new_attr::<i64>().shape(2).create("shape").unwrap().write_raw(&shape).unwrap();
        }
    }
}

fn ndarray_like<T: Clone>(flat: &[T], rows: usize, cols: usize) -> ndarray::Array2<T> {
    ndarray::Array2::from_shape_vec((rows, cols), flat.to_vec()).unwrap()
}

/// An AnnData file with integer counts in X (CSR, f32), obs and var indexes.
pub fn write_counts(path: &Path, rows: &Rows, n_genes: usize, cell_prefix: &str) {
    let f = create(path);
    str_attr(&f, "encoding-type", "anndata");
    str_attr(&f, "encoding-version", "0.1.0");
    matrix(&f, "X", rows, n_genes, Layout::Csr, |v| v as f32);
    dataframe(&f, "obs", "_index", &cells(rows.len(), cell_prefix));
    dataframe(&f, "var", "gene_ids", &genes(n_genes));
}

/// Deterministic rows: counts mostly 1-3, skewed to low genes, some empty cells.
pub fn random_rows(n_cells: usize, n_genes: usize, seed: u64) -> Rows {
    let m = crate::util::synthetic_matrix(n_cells, n_genes as u32, seed);
    (0..m.n_rows())
        .map(|r| {
            let (g, c) = m.row(r);
            g.iter().zip(c).map(|(&g, &c)| (g, f64::from(c.min(60_000)))).collect()
        })
        .collect()
}
