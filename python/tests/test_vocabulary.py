"""Batches in a model's gene vocabulary (genes=), checked against a SciPy
reference built from the input .h5ad on real cells (the bundled 1,000 PBMC
cells, in several tiles), locally and from an S3 server."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deltacells
from conftest import REPO, S3_ENV, run


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> tuple[Path, sp.csr_matrix, list[str], list[str]]:
    """The PBMC cells with a var column of IDs, converted into tiles of 300
    cells: (dataset, counts in the input's gene order, gene names, IDs)."""
    import anndata

    adata = anndata.read_h5ad(REPO / "examples" / "pbmc_1k.h5ad")
    ids = [f"ENSG{j:011d}" for j in range(adata.n_vars)]
    adata.var["gene_ids"] = ids
    folder = tmp_path_factory.mktemp("vocab")
    adata.write_h5ad(folder / "in.h5ad")
    run(binary, "convert", "-q", "--tile-size", "300", "--chunks", "4", folder / "in.h5ad", folder / "ds")
    x = sp.csr_matrix(adata.X).astype(np.int64)
    return folder / "ds", x, list(adata.var_names), ids


def reference(x: sp.csr_matrix, names: list[str], genes: list[str], cells: np.ndarray) -> np.ndarray:
    """Rows `cells` of x with columns `genes` (by name; absent ones zero)."""
    where = {n: j for j, n in enumerate(names)}
    dense = x[cells].toarray()
    out = np.zeros((len(cells), len(genes)), dtype=np.int64)
    for k, gene in enumerate(genes):
        if gene in where:
            out[:, k] = dense[:, where[gene]]
    return out


def model_genes(names: list[str], seed: int = 0) -> list[str]:
    """A vocabulary as a model has one: half the dataset's genes, reordered,
    and as many it lacks, interleaved."""
    rng = np.random.default_rng(seed)
    present = list(rng.choice(names, size=len(names) // 2, replace=False))
    absent = [f"NOT_A_GENE_{i}" for i in range(len(present))]
    mixed = present + absent
    return [mixed[i] for i in rng.permutation(len(mixed))]


def check_batch(batch: deltacells.Batch, want: np.ndarray) -> None:
    x = batch.to_scipy()
    assert x.shape == want.shape
    assert x.has_sorted_indices
    assert batch.data.dtype == np.int32 and batch.indices.dtype == np.int32
    assert (x.data != 0).all()
    np.testing.assert_array_equal(x.toarray(), want)


def test_get_batch_in_a_vocabulary_matches_the_reference(source) -> None:
    root, x, names, _ = source
    ds = deltacells.open_dataset(str(root))
    genes = model_genes(names)
    cells = np.random.default_rng(1).integers(0, ds.n_cells, 400)  # every tile, with repeats
    check_batch(ds.get_batch(cells, genes=genes), reference(x, names, genes, cells))
    vocabulary = ds.vocabulary(genes)
    assert (vocabulary.n_genes, vocabulary.present) == (len(genes), len(names) // 2)
    check_batch(ds.get_batch(range(250, 700), genes=vocabulary), reference(x, names, genes, np.arange(250, 700)))
    # Without genes= nothing changes: stored columns.
    assert ds.get_batch([3]).shape == (1, ds.n_genes)


def test_source_order_is_the_input_files_order(source) -> None:
    root, x, names, _ = source
    ds = deltacells.open_dataset(str(root))
    assert ds.gene_order is not None and not np.array_equal(ds.gene_order, np.arange(ds.n_genes))
    cells = np.arange(ds.n_cells)
    batch = ds.get_batch(cells, genes="source")
    check_batch(batch, x.toarray())
    adata = ds.to_anndata(range(100))  # the default (source_gene_order) reads through the same map
    np.testing.assert_array_equal(adata.X.toarray(), x[:100].toarray())
    assert list(adata.var_names) == names


def test_another_var_column_matches_the_same_genes(source) -> None:
    root, x, names, ids = source
    ds = deltacells.open_dataset(str(root))
    genes = model_genes(names, seed=3)
    by_id = [ids[names.index(g)] if g in names else g for g in genes]
    cells = np.arange(0, ds.n_cells, 7)
    a = ds.get_batch(cells, genes=genes).to_scipy()
    b = ds.get_batch(cells, genes=by_id, gene_column="gene_ids").to_scipy()
    assert (a != b).nnz == 0
    with pytest.raises(deltacells.UnknownNameError, match="gene_column 'ensembl'.*gene_ids"):
        ds.get_batch(cells, genes=by_id, gene_column="ensembl")


def test_the_loader_writes_each_cell_in_the_vocabulary(source) -> None:
    root, x, names, _ = source
    ds = deltacells.open_dataset(str(root))
    genes = model_genes(names, seed=5)
    plain = list(ds.batches(128, seed=4))
    mapped = list(ds.batches(128, seed=4, genes=genes))
    assert len(plain) == len(mapped) == 8
    seen = []
    for p, m in zip(plain, mapped, strict=True):
        np.testing.assert_array_equal(p.cells, m.cells)  # the same cells, in the same order
        check_batch(m.X, reference(x, names, genes, m.cells))
        seen.extend(m.cells)
    assert sorted(seen) == list(range(ds.n_cells))


def test_to_anndata_in_a_vocabulary(source) -> None:
    root, x, names, ids = source
    ds = deltacells.open_dataset(str(root))
    genes = model_genes(names, seed=7)[:300]
    adata = ds.to_anndata(range(50), genes=genes)
    assert list(adata.var_names) == genes
    np.testing.assert_array_equal(adata.X.toarray(), reference(x, names, genes, np.arange(50)))
    import pandas as pd

    for gene, gene_id in zip(genes, adata.var["gene_ids"], strict=True):
        if gene in names:
            assert gene_id == ids[names.index(gene)]
        else:
            assert pd.isna(gene_id)  # an absent gene's row is empty


def test_the_report_counts_what_the_vocabulary_keeps(source) -> None:
    root, x, names, _ = source
    ds = deltacells.open_dataset(str(root))
    genes = model_genes(names, seed=9)
    report = ds.vocabulary_report(genes)
    kept = [names.index(g) for g in genes if g in names]
    nnz_per_gene = np.bincount(x.indices, minlength=len(names))
    assert report.genes == len(genes)
    assert report.present == len(kept) and report.absent == len(genes) - len(kept)
    assert report.stored_genes == len(names) and report.left_out == len(names) - len(kept)
    assert report.nonzeros == x.nnz
    assert report.nonzeros_left_out == x.nnz - int(nnz_per_gene[kept].sum())
    assert 0 < report.fraction_left_out < 1


def test_bad_vocabularies_are_refused_by_name(source) -> None:
    root, _, names, _ = source
    ds = deltacells.open_dataset(str(root))
    with pytest.raises(deltacells.InvalidArgumentError, match="given twice"):
        ds.get_batch([0], genes=[names[0], names[1], names[0]])
    with pytest.raises(deltacells.InvalidArgumentError, match="genes: the list is empty"):
        ds.get_batch([0], genes=[])
    with pytest.raises(deltacells.InvalidArgumentError, match="not a list of gene names"):
        ds.get_batch([0], genes=names[0])
    with pytest.raises(deltacells.ArgumentTypeError, match="entry 1"):
        ds.get_batch([0], genes=[names[0], 5])
    with pytest.raises(deltacells.InvalidArgumentError, match="gene_column goes with genes="):
        ds.get_batch([0], gene_column="gene_ids")
    with pytest.raises(deltacells.InvalidArgumentError, match="genes: the list is empty"):
        ds.batches(genes=[])
    with pytest.warns(deltacells.VocabularyWarning, match="none of the 2 genes"):
        batch = ds.get_batch([0, 1], genes=["NOPE", "NADA"])
    assert batch.shape == (2, 2) and batch.nnz == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds.get_batch([0], genes=[names[0], "NOPE"])  # unknown names are absent genes, not an error


def test_a_vocabulary_belongs_to_its_dataset(source, pbmc_dataset: Path) -> None:
    root, _, names, _ = source
    ds = deltacells.open_dataset(str(root))
    other = deltacells.open_dataset(str(pbmc_dataset))
    vocabulary = ds.vocabulary(names[:10])
    with pytest.raises(deltacells.InvalidArgumentError, match="built for"):
        other.get_batch([0], genes=vocabulary)


def test_a_bucket_gives_the_local_batches(
    source, binary: Path, s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, x, names, _ = source
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    run(binary, "convert", "-q", "--tile-size", "300", "--endpoint", s3_server, Path(root).parent / "in.h5ad",
        "s3://test/vocab")
    remote = deltacells.open_dataset("s3://test/vocab", endpoint=s3_server, cache_dir=str(tmp_path / "c"))
    genes = model_genes(names, seed=11)
    cells = np.arange(0, remote.n_cells, 3)
    check_batch(remote.get_batch(cells, genes=genes), reference(x, names, genes, cells))
    for batch in remote.batches(200, seed=1, genes=genes):
        check_batch(batch.X, reference(x, names, genes, batch.cells))


def test_torch_batches_have_the_vocabularys_columns(source, torch) -> None:
    from deltacells.torch import CellDataset

    root, x, names, _ = source
    genes = model_genes(names, seed=13)
    data = CellDataset(str(root), batch_size=256, genes=genes, transform=lambda b: b)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2)
    cells = []
    for batch in loader:
        check_batch(batch.X, reference(x, names, genes, batch.cells))
        cells.extend(batch.cells)
    assert sorted(cells) == list(range(1000))
    tensors = next(iter(CellDataset(str(root), batch_size=64, genes=genes)))
    assert tuple(tensors["X"].shape) == (64, len(genes))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.integers(0, 14052), min_size=1, max_size=200, unique=True),
    absent=st.integers(0, 20),
    cells=st.lists(st.integers(0, 999), min_size=0, max_size=50),
)
def test_any_vocabulary_matches_the_reference(source, picks: list[int], absent: int, cells: list[int]) -> None:
    root, x, names, _ = source
    ds = deltacells.open_dataset(str(root))
    genes = [names[p] for p in picks] + [f"absent_{i}" for i in range(absent)]
    if len(set(genes)) != len(genes):  # a name repeated in the input's var: listed once here
        genes = list(dict.fromkeys(genes))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", deltacells.VocabularyWarning)
        batch = ds.get_batch(np.array(cells, dtype=np.int64), genes=genes)
    check_batch(batch, reference(x, names, genes, np.array(cells, dtype=np.int64)))


def scaled_reference(
    x: sp.csr_matrix, names: list[str], genes: list[str], cells: np.ndarray, target: float | None, over: str,
    log1p: bool,
) -> np.ndarray:
    """The reference of a scaled batch, in float64: the cells' counts in the
    vocabulary, each cell scaled to `target` (summed over every stored gene,
    or over the vocabulary's), then ln(1 + x)."""
    counts = reference(x, names, genes, cells).astype(np.float64)
    if target is not None:
        totals = np.asarray(x[cells].sum(axis=1)).ravel() if over == "stored" else counts.sum(axis=1)
        scale = np.divide(target, totals, out=np.zeros_like(totals, dtype=np.float64), where=totals > 0)
        counts *= scale[:, None]
    return np.log1p(counts) if log1p else counts


FORMS = [
    dict(normalize=1e4),
    dict(normalize=1e4, normalize_over="output"),
    dict(log1p=True),
    dict(normalize=1e4, log1p=True),
    dict(dense=True),
    dict(normalize=1e4, log1p=True, dense=True),
    dict(normalize=500.0, normalize_over="output", log1p=True, dense=True),
]


def as_dense(x: deltacells.Batch | np.ndarray) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.to_scipy().toarray()


def check_form(x: deltacells.Batch | np.ndarray, form: dict, want: np.ndarray) -> None:
    scaled = form.get("normalize") is not None or form.get("log1p", False)
    if form.get("dense"):
        assert isinstance(x, np.ndarray) and x.flags.c_contiguous and x.shape == want.shape
        assert x.dtype == (np.float32 if scaled else np.int32)
    else:
        assert isinstance(x, deltacells.Batch) and x.data.dtype == (np.float32 if scaled else np.int32)
        assert x.to_scipy().has_sorted_indices
    np.testing.assert_allclose(as_dense(x), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", FORMS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
@pytest.mark.parametrize("vocab", [False, True], ids=["stored genes", "vocabulary"])
def test_values_and_forms_match_the_reference(source, form: dict, vocab: bool) -> None:
    root, x, names, _ = source
    ds = deltacells.open_dataset(str(root))
    genes = model_genes(names, seed=17) if vocab else None
    columns = genes if vocab else [names[g] for g in ds.gene_order]  # the stored columns, by name
    cells = np.random.default_rng(2).integers(0, ds.n_cells, 300)
    want = scaled_reference(x, names, columns, cells, form.get("normalize"), form.get("normalize_over", "stored"),
                            form.get("log1p", False))
    if not form.get("normalize") and not form.get("log1p"):
        want = want.astype(np.int64)
    check_form(ds.get_batch(cells, genes=genes, **form), form, want)
    seen = 0
    for batch in ds.batches(128, seed=3, genes=genes, **form):
        want = scaled_reference(x, names, columns, batch.cells, form.get("normalize"),
                                form.get("normalize_over", "stored"), form.get("log1p", False))
        check_form(batch.X, form, want)
        seen += len(batch)
    assert seen == ds.n_cells


def test_top_k_gives_each_cells_highest_genes(source) -> None:
    root, x, names, _ = source
    ds = deltacells.open_dataset(str(root))
    genes = model_genes(names, seed=19)
    stored_rank = {names[g]: j for j, g in enumerate(ds.gene_order)}  # lower: more counts over the dataset
    for form in [dict(top_k=50), dict(top_k=2000, normalize=1e4, log1p=True)]:
        k = form["top_k"]
        for batch in ds.batches(200, seed=5, genes=genes, **form):
            assert batch.top_k.shape == (len(batch), k) and batch.top_k.dtype == np.int32
            assert batch.top_k_values.dtype == np.float32
            values = scaled_reference(x, names, genes, batch.cells, form.get("normalize"), "stored",
                                      form.get("log1p", False))
            for r in range(len(batch)):
                nonzero = np.flatnonzero(values[r])
                # Highest value first; ties to the gene with the lower stored column.
                ranked = sorted(nonzero, key=lambda j: (-values[r, j], stored_rank[genes[j]]))[:k]
                got = batch.top_k[r]
                n = min(k, len(nonzero))
                assert (got[n:] == -1).all()
                np.testing.assert_allclose(batch.top_k_values[r, :n], values[r, ranked], rtol=1e-5)
                # Equal values may differ in order only where float32 makes them equal.
                same = got[:n] == np.array(ranked, dtype=np.int32)
                assert same.all() or np.allclose(values[r, got[:n]], values[r, ranked], rtol=1e-6)


def test_ties_in_top_k_go_to_the_gene_stored_first(source) -> None:
    root, x, names, _ = source
    ds = deltacells.open_dataset(str(root))
    batch = next(iter(ds.batches(64, shuffle=False, top_k=5)))
    for r in range(len(batch)):
        row = batch.X.to_scipy()[r].toarray().ravel()
        order = sorted(np.flatnonzero(row), key=lambda j: (-row[j], j))[:5]  # stored columns
        np.testing.assert_array_equal(batch.top_k[r, :len(order)], order)


def test_bad_values_are_refused_naming_the_argument(source) -> None:
    root, *_ = source
    ds = deltacells.open_dataset(str(root))
    for bad in [0, -1.0, float("nan"), float("inf"), True, "1e4"]:
        with pytest.raises(deltacells.InvalidArgumentError, match="normalize"):
            ds.get_batch([0], normalize=bad)
        with pytest.raises(deltacells.InvalidArgumentError, match="normalize"):
            ds.batches(normalize=bad)
    for bad in [0, -3, 1.5, ds.n_genes + 1]:
        with pytest.raises(deltacells.InvalidArgumentError, match="top_k"):
            ds.batches(top_k=bad)
    with pytest.raises(deltacells.InvalidArgumentError, match="normalize_over"):
        ds.get_batch([0], normalize=10.0, normalize_over="vocabulary")
    with pytest.raises(deltacells.InvalidArgumentError, match="dense"):
        ds.get_batch([0], dense="yes")
    # Nothing asked: counts stay int32 counts in a CSR batch.
    batch = ds.get_batch([0, 1])
    assert isinstance(batch, deltacells.Batch) and batch.data.dtype == np.int32


def test_forms_from_a_bucket_match_the_local_ones(
    source, binary: Path, s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, x, names, _ = source
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    run(binary, "convert", "-q", "--tile-size", "300", "--chunks", "4", "--endpoint", s3_server,
        Path(root).parent / "in.h5ad", "s3://test/forms")
    remote = deltacells.open_dataset("s3://test/forms", endpoint=s3_server, cache_dir=str(tmp_path / "c"))
    here = deltacells.open_dataset(str(root))
    genes = model_genes(names, seed=23)
    form = dict(normalize=1e4, log1p=True, dense=True, top_k=16)
    for a, b in zip(here.batches(250, seed=2, genes=genes, **form), remote.batches(250, seed=2, genes=genes, **form),
                    strict=True):
        np.testing.assert_array_equal(a.cells, b.cells)
        np.testing.assert_array_equal(a.X, b.X)
        np.testing.assert_array_equal(a.top_k, b.top_k)
    cells = np.arange(0, 1000, 9)
    np.testing.assert_array_equal(remote.get_batch(cells, genes=genes, normalize=1e4, dense=True),
                                  here.get_batch(cells, genes=genes, normalize=1e4, dense=True))


def test_torch_gives_dense_tensors_that_pin(source, torch) -> None:
    from deltacells.torch import CellDataset

    root, x, names, _ = source
    genes = model_genes(names, seed=29)
    data = CellDataset(str(root), batch_size=100, genes=genes, normalize=1e4, log1p=True, dense=True, top_k=8)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2)
    n = 0
    for batch in loader:
        X = batch["X"]
        assert X.layout == torch.strided and X.dtype == torch.float32 and tuple(X.shape) == (100, len(genes))
        want = scaled_reference(x, names, genes, batch["cells"].numpy(), 1e4, "stored", True)
        np.testing.assert_allclose(X.numpy(), want, rtol=1e-5, atol=1e-6)
        assert tuple(batch["top_k"].shape) == (100, 8)
        n += X.shape[0]
    assert n == 1000
    # pin_memory=True works with dense batches (pinning itself needs an accelerator).
    pinned = list(torch.utils.data.DataLoader(CellDataset(str(root), batch_size=250, dense=True), batch_size=None,
                                              pin_memory=True))
    assert sum(b["X"].shape[0] for b in pinned) == 1000 and pinned[0]["X"].dtype == torch.float32
    if torch.cuda.is_available():
        assert pinned[0]["X"].is_pinned()


def test_dtype_float32_gives_the_counts_as_floats(source) -> None:
    root, x, names, _ = source
    ds = deltacells.open_dataset(str(root))
    cells = np.arange(0, 1000, 11)
    want = reference(x, names, names, cells)  # genes="source": the input's columns
    sparse = ds.get_batch(cells, genes="source", dtype=np.float32)
    assert isinstance(sparse, deltacells.Batch) and sparse.data.dtype == np.float32
    np.testing.assert_array_equal(sparse.to_scipy().toarray(), want)
    dense = ds.get_batch(cells, genes="source", dtype="float32", dense=True)
    assert dense.dtype == np.float32
    np.testing.assert_array_equal(dense, want)
    for batch in ds.batches(500, genes="source", dtype=np.float32, dense=True):
        np.testing.assert_array_equal(batch.X, reference(x, names, names, batch.cells))
    assert ds.get_batch(cells, dtype=np.int32).data.dtype == np.int32  # counts, as without dtype
    with pytest.raises(deltacells.InvalidArgumentError, match="dtype int32: normalize and log1p"):
        ds.get_batch(cells, normalize=10.0, dtype=np.int32)
    for bad in [np.float64, "int64", "counts"]:
        with pytest.raises(deltacells.InvalidArgumentError, match="dtype"):
            ds.batches(dtype=bad)


def test_unsorted_columns_hold_the_same_counts(source) -> None:
    root, x, names, _ = source
    ds = deltacells.open_dataset(str(root))
    genes = model_genes(names, seed=31)
    cells = np.arange(0, 1000, 3)
    batch = ds.get_batch(cells, genes=genes, sorted_columns=False)
    m = batch.to_scipy()
    assert m.shape == (len(cells), len(genes)) and batch.data.dtype == np.int32
    np.testing.assert_array_equal(m.toarray(), reference(x, names, genes, cells))
    # Each cell's columns in the stored order (by total counts), not sorted.
    stored = {names[g]: j for j, g in enumerate(ds.gene_order)}
    rank = np.array([stored.get(g, -1) for g in genes])
    for r in range(0, len(cells), 50):
        row = m.indices[m.indptr[r]:m.indptr[r + 1]]
        assert (np.diff(rank[row]) > 0).all()
    unsorted = [b for b in ds.batches(250, seed=1, genes=genes, sorted_columns=False)]
    plain = [b for b in ds.batches(250, seed=1, genes=genes)]
    for a, b in zip(unsorted, plain, strict=True):
        assert (a.X.to_scipy() != b.X.to_scipy()).nnz == 0
    with pytest.raises(deltacells.InvalidArgumentError, match="sorted_columns"):
        ds.get_batch(cells, genes=genes, sorted_columns="no")
