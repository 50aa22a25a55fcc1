"""Conversion from Python: deltacells.convert, append and write_anndata write
what the deltacells command writes, byte for byte; the console script is that
command; bad input raises the command's message and leaves no dataset."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import deltacells
from conftest import REPO, _missing, run

EXAMPLE = REPO / "examples" / "pbmc_1k.h5ad"


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (by path relative to it) and its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_dataset(ours: Path, theirs: Path, *, inputs_differ: bool = False) -> None:
    """The two datasets hold the same files with the same bytes, but for the
    time an append records in the manifest; with ``inputs_differ``, the
    manifests may also differ in the record of the inputs (the names they
    were read under)."""
    a, b = files_of(ours), files_of(theirs)
    assert sorted(a) == sorted(b)
    assert len(a) >= 5, a.keys()
    for name in a:
        if name == "manifest.json":
            ma, mb = json.loads(a[name]), json.loads(b[name])
            for m in (ma, mb):
                for entry in m["metadata"].get("appends", []):
                    entry.pop("time")
                if inputs_differ:
                    m["metadata"]["convert"].pop("inputs")
                    m["metadata"]["convert"].pop("gene_order_files")
            assert ma == mb
        else:
            assert a[name] == b[name], name


def command_error(binary: Path, *args: str | Path) -> str:
    """The message the command ends with (exit status 2), without its
    ``deltacells: STEP: `` prefix."""
    done = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    return line.split(": ", 2)[2]


# -- convert and append, against the command ---------------------------------


def test_convert_equals_the_command_on_the_example(tmp_path: Path, binary: Path) -> None:
    run(binary, "convert", "-q", "--tile-size", "300", "--level", "5", EXAMPLE, tmp_path / "cli")
    summary = deltacells.convert(EXAMPLE, tmp_path / "py", tile_size=300, level=5, progress=False)
    assert_same_dataset(tmp_path / "py", tmp_path / "cli")
    ds = deltacells.open_dataset(tmp_path / "py")
    assert (summary.cells, summary.genes, summary.tiles) == (1000, ds.n_genes, 4)
    assert summary.nonzeros == sum(ds.get_batch(range(1000)).to_scipy().nnz for _ in [0])
    assert summary.bytes == sum(p.stat().st_size for p in (tmp_path / "py" / "tiles").iterdir())
    assert summary.seconds > 0


def test_convert_every_option_equals_the_command(tmp_path: Path, binary: Path) -> None:
    """The options a user is likeliest to combine, each passed as the keyword
    of its flag: the same bytes as the command with those flags."""
    run(
        binary, "convert", "-q", "--tile-size", "256", "--chunks", "3", "--level", "3", "--gene-order-files", "0",
        "--no-obs-names", "--obs-tiles-per-file", "2", "--shuffle", "7", "--metadata", "lab=x", "--metadata",
        "run=2", "--threads", "1", EXAMPLE, EXAMPLE, tmp_path / "cli",
    )
    deltacells.convert(
        [EXAMPLE, str(EXAMPLE)], tmp_path / "py", tile_size=256, chunks=3, level=3, gene_order_files=0,
        obs_names=False, obs_tiles_per_file=2, shuffle=7, metadata={"lab": "x", "run": "2"}, threads=1,
        progress=False,
    )
    assert_same_dataset(tmp_path / "py", tmp_path / "cli")


def test_convert_golden_sources_equal_the_command(tmp_path: Path, binary: Path, golden: Path) -> None:
    names = ["tiny", "empty_chunk", "exceptions", "obs_kinds"]
    for name in names:
        source = golden / "sources" / f"{name}.h5ad"
        extra = ["--max-categories", "1000", "--obs-tiles-per-file", "2"] if name == "obs_kinds" else []
        run(binary, "convert", "-q", "--tile-size", "4", *extra, source, tmp_path / f"cli_{name}")
        options = {"max_categories": 1000, "obs_tiles_per_file": 2} if name == "obs_kinds" else {}
        deltacells.convert(source, tmp_path / f"py_{name}", tile_size=4, progress=False, **options)
        assert_same_dataset(tmp_path / f"py_{name}", tmp_path / f"cli_{name}")


def test_convert_and_append_pbmc_equal_the_command(tmp_path: Path, binary: Path, pbmc: tuple[Path, Path]) -> None:
    ctrl, stim = pbmc
    run(binary, "convert", "-q", "--level", "3", ctrl, tmp_path / "cli")
    run(binary, "append", "-q", tmp_path / "cli", stim)
    deltacells.convert(ctrl, tmp_path / "py", level=3, progress=False)
    summary = deltacells.append(tmp_path / "py", stim, progress=False)
    assert_same_dataset(tmp_path / "py", tmp_path / "cli")
    assert summary.outcome == "appended"
    assert summary.cells == summary.cells_before + summary.cells_added
    assert summary.inputs == (str(stim),)


# -- bad input: the command's message, no dataset ----------------------------


def test_missing_input_raises_the_commands_message(tmp_path: Path, binary: Path) -> None:
    missing = tmp_path / "nothing.h5ad"
    with pytest.raises(deltacells.InputNotFoundError) as raised:
        deltacells.convert(missing, tmp_path / "py", progress=False)
    assert isinstance(raised.value, FileNotFoundError)
    assert str(raised.value) == command_error(binary, "convert", missing, tmp_path / "cli")
    assert not (tmp_path / "py" / "manifest.json").exists()


def test_a_hostile_matrix_market_shape_raises_the_commands_message(tmp_path: Path, binary: Path) -> None:
    # a header that says 10^15 rows: refused before anything is sized by it
    folder = tmp_path / "huge"
    folder.mkdir()
    (folder / "matrix.mtx").write_text(
        "%%MatrixMarket matrix coordinate integer general\n1000000000000000 2 1\n1 1 5\n"
    )
    (folder / "features.tsv").write_text("g1\tG1\tGene Expression\n")
    (folder / "barcodes.tsv").write_text("AAAC-1\nAAAG-1\n")
    expected = command_error(binary, "convert", folder, tmp_path / "cli")
    assert "matrix.mtx, line 2" in expected
    with pytest.raises(deltacells.InvalidInputError) as raised:
        deltacells.convert(folder, tmp_path / "py", progress=False)
    assert isinstance(raised.value, deltacells.DeltacellsError)
    assert str(raised.value) == expected
    assert not (tmp_path / "py").exists()
    assert not (tmp_path / "cli").exists()


def test_fractions_raise_the_commands_message_and_leave_nothing(tmp_path: Path, binary: Path) -> None:
    import anndata

    adata = anndata.AnnData(sp.csr_matrix(np.array([[1.0, 0.0, 2.5], [0.0, 3.0, 0.0]], dtype=np.float32)))
    adata.obs_names = ["a", "b"]
    adata.var_names = ["g0", "g1", "g2"]
    adata.write_h5ad(tmp_path / "frac.h5ad")
    expected = command_error(binary, "convert", tmp_path / "frac.h5ad", tmp_path / "cli")
    with pytest.raises(deltacells.InvalidInputError) as from_file:
        deltacells.convert(tmp_path / "frac.h5ad", tmp_path / "py", progress=False)
    assert str(from_file.value) == expected
    assert "value 2.5 is not an integer count" in expected
    with pytest.raises(deltacells.InvalidInputError) as from_memory:
        deltacells.write_anndata(adata, tmp_path / "mem", name=str(tmp_path / "frac.h5ad"), progress=False)
    assert str(from_memory.value) == expected
    for out in ("py", "mem"):
        assert not (tmp_path / out).exists() or not any((tmp_path / out).iterdir())


def test_an_existing_dataset_is_kept_unless_overwrite(tmp_path: Path) -> None:
    deltacells.convert(EXAMPLE, tmp_path / "ds", tile_size=500, progress=False)
    before = files_of(tmp_path / "ds")
    with pytest.raises(deltacells.DatasetExistsError, match="overwrite=True"):
        deltacells.convert(EXAMPLE, tmp_path / "ds", progress=False)
    assert files_of(tmp_path / "ds") == before
    summary = deltacells.convert(EXAMPLE, tmp_path / "ds", overwrite=True, progress=False)
    assert summary.tiles == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"tile_size": 0}, deltacells.InvalidArgumentError, "tile_size must be at least 1"),
        ({"level": 23}, deltacells.InvalidArgumentError, "level must be at most 22"),
        ({"genes": "all"}, deltacells.InvalidArgumentError, "genes must be one of"),
        ({"input_format": "loom"}, deltacells.InvalidArgumentError, "input_format must be one of"),
        ({"metadata": {"a": 1}}, deltacells.ArgumentTypeError, "metadata: keys and values are strings"),
        ({"spill_dir": "/nonexistent/x"}, deltacells.InvalidArgumentError, "spill_dir="),
        ({"threads": 0}, deltacells.InvalidArgumentError, "threads must be at least 1"),
        ({"shuffle": -1}, deltacells.InvalidArgumentError, "shuffle must be at least 0"),
        ({"feature_type": " "}, deltacells.InvalidArgumentError, "feature_type: an empty name"),
        ({"gene_order": "a.npy", "gene_order_from": "ds"}, deltacells.InvalidArgumentError, "pass one"),
    ],
)
def test_bad_arguments_are_named(tmp_path: Path, kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        deltacells.convert(EXAMPLE, tmp_path / "ds", progress=False, **kwargs)
    assert not (tmp_path / "ds").exists()


def test_inputs_of_the_wrong_type_are_named(tmp_path: Path) -> None:
    with pytest.raises(deltacells.ArgumentTypeError, match="inputs"):
        deltacells.convert(42, tmp_path / "ds")  # type: ignore[arg-type]
    with pytest.raises(deltacells.InvalidArgumentError, match="no input files"):
        deltacells.convert([], tmp_path / "ds")
    with pytest.raises(deltacells.InvalidArgumentError, match="resume=True"):
        deltacells.append(tmp_path / "ds", EXAMPLE, resume=True)


# -- write_anndata: an AnnData object in memory -------------------------------


def small_anndata(matrix: object):
    """An AnnData of 7 cells and 5 genes with obs of several kinds, holding
    ``matrix`` as X."""
    import anndata
    import pandas as pd

    obs = pd.DataFrame(
        {
            "sample": pd.Categorical(["s1", "s2", "s1", "s1", "s2", "s3", "s1"]),
            "n": np.arange(7, dtype=np.int64) * 3,
            "score": np.array([0.5, np.nan, 1.5, 2.0, 0.0, -1.0, 3.25]),
            "flag": np.array([True, False, True, True, False, False, True]),
            "maybe": pd.array([1, None, 3, 4, None, 6, 7], dtype="Int32"),
            "ok": pd.array([True, None, False, True, True, None, False], dtype="boolean"),
            "level": pd.Categorical([3, 1, 2, 3, 1, 2, 3], categories=[1, 2, 3], ordered=True),
        },
        index=[f"cell{i}" for i in range(7)],
    )
    var = pd.DataFrame({"gene_ids": [f"ENSG{i}" for i in range(5)]}, index=[f"g{i}" for i in range(5)])
    return anndata.AnnData(X=matrix, obs=obs, var=var)


def counts_matrix() -> np.ndarray:
    rng = np.random.default_rng(3)
    dense = rng.poisson(1.2, size=(7, 5)).astype(np.int64)
    dense[2] = 0  # an empty cell
    dense[4, 1] = 70_000  # a count above 16 bits
    return dense


LAYOUTS = {
    "csr": sp.csr_matrix,
    "csc": sp.csc_matrix,
    "dense": np.asarray,
    "csr_array": sp.csr_array,
}
DTYPES = [np.int32, np.int64, np.uint32, np.float32, np.float64, np.uint16]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_write_anndata_equals_converting_its_h5ad(tmp_path: Path, layout: str, dtype: type) -> None:
    dense = counts_matrix()
    if np.dtype(dtype).itemsize < 4:
        dense = np.minimum(dense, 60_000)
    adata = small_anndata(LAYOUTS[layout](dense.astype(dtype)))
    adata.write_h5ad(tmp_path / "a.h5ad")
    deltacells.convert(tmp_path / "a.h5ad", tmp_path / "file", tile_size=3, progress=False)
    summary = deltacells.write_anndata(adata, tmp_path / "mem", tile_size=3, progress=False)
    assert_same_dataset(tmp_path / "mem", tmp_path / "file", inputs_differ=True)
    assert summary.cells == 7 and summary.tiles == 3
    got = deltacells.open_dataset(tmp_path / "mem").get_batch(range(7)).to_scipy().toarray()
    order = np.load(tmp_path / "mem" / "gene_order.npy")
    np.testing.assert_array_equal(got, dense[:, order])


def test_write_anndata_layers_raw_and_backed(tmp_path: Path, binary: Path) -> None:
    import anndata

    dense = counts_matrix()
    adata = small_anndata(np.log1p(dense).astype(np.float32))  # X is not counts
    adata.layers["counts"] = sp.csr_matrix(dense)
    adata.raw = anndata.AnnData(sp.csc_matrix(dense * 2), var=adata.var.copy())
    adata.write_h5ad(tmp_path / "a.h5ad")
    for matrix in ("layers/counts", "raw/X"):
        folder = matrix.replace("/", "_")
        deltacells.convert(tmp_path / "a.h5ad", tmp_path / f"file_{folder}", matrix=matrix, progress=False)
        deltacells.write_anndata(adata, tmp_path / f"mem_{folder}", matrix=matrix, progress=False)
        assert_same_dataset(tmp_path / f"mem_{folder}", tmp_path / f"file_{folder}", inputs_differ=True)
    # X is refused as the command refuses it, naming where the counts are
    expected = command_error(binary, "convert", tmp_path / "a.h5ad", tmp_path / "cli")
    with pytest.raises(deltacells.InvalidInputError) as raised:
        deltacells.write_anndata(adata, tmp_path / "mem_x", name=str(tmp_path / "a.h5ad"), progress=False)
    # the command names its flag, Python the keyword argument
    assert expected.endswith("raw/X holds counts; use --matrix raw/X")
    assert str(raised.value) == expected.replace("use --matrix raw/X", 'matrix="raw/X" converts it')
    # backed: X read in row blocks from the file
    backed = anndata.read_h5ad(tmp_path / "a.h5ad", backed="r")
    deltacells.write_anndata(backed, tmp_path / "mem_backed", matrix="layers/counts", progress=False)
    assert_same_dataset(tmp_path / "mem_backed", tmp_path / "file_layers_counts", inputs_differ=True)
    backed.file.close()


def test_write_anndata_of_golden_obs_kinds(tmp_path: Path, golden: Path) -> None:
    """Every obs kind of the conformance vectors (categoricals of int8/int16
    codes with missing values, over max_categories, nullable integers and
    booleans, NaN, strings with missing values) and var with a named index."""
    import anndata

    source = golden / "sources" / "obs_kinds.h5ad"
    options = {"max_categories": 1000, "obs_tiles_per_file": 2, "tile_size": 4, "progress": False}
    deltacells.convert(source, tmp_path / "file", **options)
    deltacells.write_anndata(anndata.read_h5ad(source), tmp_path / "mem", **options)
    assert_same_dataset(tmp_path / "mem", tmp_path / "file", inputs_differ=True)


def test_write_anndata_of_pbmc_equals_the_command(tmp_path: Path, binary: Path, pbmc: tuple[Path, Path]) -> None:
    import anndata

    ctrl = pbmc[0]
    run(binary, "convert", "-q", "--level", "3", ctrl, tmp_path / "cli")
    deltacells.write_anndata(anndata.read_h5ad(ctrl), tmp_path / "mem", level=3, progress=False)
    assert_same_dataset(tmp_path / "mem", tmp_path / "cli", inputs_differ=True)


def test_write_anndata_refuses_what_it_cannot_store(tmp_path: Path) -> None:
    import pandas as pd

    adata = small_anndata(sp.csr_matrix(counts_matrix()))
    adata.obs["when"] = pd.date_range("2020-01-01", periods=7)
    with pytest.raises(deltacells.ArgumentTypeError, match=r"obs\['when'\]: a column of dtype datetime64"):
        deltacells.write_anndata(adata, tmp_path / "ds", progress=False)
    assert not (tmp_path / "ds").exists()
    summary = deltacells.write_anndata(adata, tmp_path / "ds", obs_exclude=["when"], progress=False)
    assert summary.cells == 7
    assert "when" not in deltacells.open_dataset(tmp_path / "ds").obs.columns
    with pytest.raises(deltacells.ArgumentTypeError, match="AnnData"):
        deltacells.write_anndata(np.zeros((2, 2)), tmp_path / "x")  # type: ignore[arg-type]
    with pytest.raises(deltacells.InvalidArgumentError, match="no such layer"):
        deltacells.write_anndata(adata, tmp_path / "x", matrix="layers/counts")
    text = adata.copy()
    del text.obs["when"]
    text.X = np.array([["a"] * 5] * 7, dtype=object)
    with pytest.raises(deltacells.ArgumentTypeError, match="not numbers"):
        deltacells.write_anndata(text, tmp_path / "x", progress=False)
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())


# -- progress ------------------------------------------------------------------


def test_progress_shows_when_asked_and_not_when_not_interactive(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    deltacells.convert(EXAMPLE, tmp_path / "quiet", tile_size=500, level=3)  # stderr is not a terminal here
    assert capfd.readouterr().err == ""
    deltacells.convert(EXAMPLE, tmp_path / "shown", tile_size=500, level=3, progress=True)
    err = capfd.readouterr().err
    assert "converting" in err and "1.00k/1.00k" in err and "pbmc_1k.h5ad" in err


def test_notes_are_in_the_summary(tmp_path: Path) -> None:
    import anndata

    a = anndata.read_h5ad(EXAMPLE)
    a[:, ::-1].copy().write_h5ad(tmp_path / "reversed.h5ad")
    summary = deltacells.convert([EXAMPLE, tmp_path / "reversed.h5ad"], tmp_path / "ds", progress=False)
    assert len(summary.notes) == 1 and "aligned by gene name" in summary.notes[0]


# -- the console script --------------------------------------------------------


def test_console_script_is_the_command(tmp_path: Path, binary: Path) -> None:
    """The `deltacells` script pip installed beside this Python runs the
    command line: its help is the binary's, and it converts the same bytes."""
    script = Path(sys.executable).parent / "deltacells"
    if not script.is_file():
        _missing(f"no console script at {script} (pip install ./python installs it)")
    helped = subprocess.run([str(script), "convert", "--help"], capture_output=True, text=True)
    assert helped.returncode == 0
    assert helped.stdout == subprocess.run([str(binary), "convert", "--help"], capture_output=True, text=True).stdout
    done = subprocess.run([str(script), "convert", "-q", EXAMPLE, tmp_path / "script"], capture_output=True)
    assert done.returncode == 0, done.stderr
    run(binary, "convert", "-q", EXAMPLE, tmp_path / "cli")
    assert_same_dataset(tmp_path / "script", tmp_path / "cli")
    bad = subprocess.run([str(script), "convert", tmp_path / "none.h5ad", tmp_path / "x"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "none.h5ad" in bad.stderr
    usage = subprocess.run([str(script), "convert", "--tile-size", "0", "a", "b"], capture_output=True, text=True)
    assert usage.returncode == 2 and "--tile-size" in usage.stderr


def test_the_wheel_alone_converts_in_a_fresh_environment(tmp_path: Path) -> None:
    """A virtual environment with nothing but the wheel (and what pip installs
    for it) runs `deltacells --help` and a conversion: no cargo, no binary."""
    wheel_dir = os.environ.get("DELTACELLS_WHEEL_DIR", str(REPO / "target" / "wheels"))
    wheels = sorted(Path(wheel_dir).glob("deltacells-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        _missing(f"no wheel in {wheel_dir} (scripts/test.sh builds one)")
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    pip = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         str(wheels[-1])],
        capture_output=True, text=True,
    )
    assert pip.returncode == 0, pip.stderr
    script = env_dir / "bin" / "deltacells"
    helped = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "convert" in helped.stdout
    done = subprocess.run([str(script), "convert", "-q", EXAMPLE, tmp_path / "ds"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    checked = subprocess.run([str(script), "verify", tmp_path / "ds"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    code = "import deltacells, sys; s = deltacells.convert(sys.argv[1], sys.argv[2], progress=False); print(s.cells)"
    py = subprocess.run([str(env_dir / "bin" / "python"), "-c", code, str(EXAMPLE), str(tmp_path / "ds2")],
                        capture_output=True, text=True)
    assert py.returncode == 0 and py.stdout.strip() == "1000", py.stderr
    assert files_of(tmp_path / "ds") == files_of(tmp_path / "ds2")


def help_defaults(binary: Path, command: str) -> dict[str, str]:
    """Each option of ``deltacells COMMAND --help`` with its ``[default: ...]``."""
    text = run(binary, command, "--help").stdout
    found: dict[str, str] = {}
    for block in re.split(r"\n\s*(?=--[a-z])", text):
        name = re.match(r"--([a-z-]+)", block)
        default = re.search(r"\[default: ([^\]]+)\]", block)
        if name and default:
            found[name.group(1).replace("-", "_")] = default.group(1)
    return found


def test_the_python_signatures_take_the_command_lines_defaults(binary: Path) -> None:
    # One definition of each default (the library's), so the two front ends
    # cannot drift apart.
    names = ("tile_size", "chunks", "level", "gene_order_files", "max_categories", "obs_tiles_per_file")
    cli = help_defaults(binary, "convert")
    for function in (deltacells.convert, deltacells.write_anndata):
        parameters = inspect.signature(function).parameters
        assert {n: str(parameters[n].default) for n in names} == {n: cli[n] for n in names}, function.__name__
    compact_default = inspect.signature(deltacells.compact).parameters["level"].default
    assert str(compact_default) == help_defaults(binary, "compact")["level"]
