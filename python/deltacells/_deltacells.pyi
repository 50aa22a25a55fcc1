"""Type stubs of the Rust extension (python/src/lib.rs). Use the Python API
(deltacells.open_dataset) rather than these directly."""

from collections.abc import Iterator
from typing import Any, Self, final

import numpy as np
import numpy.typing as npt

from ._types import ConvertDefaults, Form, LoaderOptions, _ConvertOptions, _Reaching

#: A batch in a form (indptr, indices, data, top_k, top_k_values): CSR
#: (indptr int64, indices int32, data int32 or float32) or dense (no
#: indptr or indices; data 2-D), with top-k tokens or not.
_Formed = tuple[
    npt.NDArray[np.int64] | None,
    npt.NDArray[np.int32] | None,
    npt.NDArray[np.int32] | npt.NDArray[np.float32],
    npt.NDArray[np.int32] | None,
    npt.NDArray[np.float32] | None,
]
#: A batch of the loader: its cells (int64), then as _Formed.
_LoaderBatch = tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int64] | None,
    npt.NDArray[np.int32] | None,
    npt.NDArray[np.int32] | npt.NDArray[np.float32],
    npt.NDArray[np.int32] | None,
    npt.NDArray[np.float32] | None,
]

__version__: str
__all__ = [
    "ARCHIVE_LEVEL",
    "DEFAULT_CACHE_BYTES",
    "FAST_LEVEL",
    "INPUT_FORMATS",
    "RawBatches",
    "RawCollection",
    "RawDataset",
    "RawGeneMap",
    "RawPlan",
    "__version__",
    "append_files",
    "compact_dataset",
    "cache_root",
    "collection_file",
    "column_path",
    "convert_anndata",
    "convert_defaults",
    "convert_files",
    "loader_defaults",
    "redact",
    "register_exceptions",
    "run_command_line",
]

@final
class RawDataset:
    def __new__(
        cls,
        root: str,
        threads: int | None = None,
        anonymous: bool = False,
        endpoint: str | None = None,
        cache_bytes: int = ...,
        version: bytes | None = None,
        cache_dir: str | None = None,
    ) -> Self: ...
    @property
    def n_cells(self) -> int: ...
    @property
    def n_genes(self) -> int: ...
    @property
    def n_tiles(self) -> int: ...
    @property
    def location(self) -> str: ...
    @property
    def versions_followed(self) -> int: ...
    def tile_cells(self) -> npt.NDArray[np.int64]: ...
    def io_stats(self) -> tuple[int, int, int]: ...
    def manifest_json(self) -> str: ...
    def version(self) -> bytes: ...
    def var_names(self) -> list[str] | None: ...
    def gene_order(self) -> npt.NDArray[np.int32] | None: ...
    def var_parquet(self) -> bytes | None: ...
    def get_batch(
        self, cells: npt.NDArray[np.int64], genes: RawGeneMap | None = None
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.int32]]: ...
    def get_range(
        self, start: int, end: int, genes: RawGeneMap | None = None
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.int32]]: ...
    def column_nonzeros(self) -> npt.NDArray[np.uint64]: ...
    def get_formed(
        self, cells: npt.NDArray[np.int64], form: Form, genes: RawGeneMap | None = None
    ) -> _Formed: ...
    def read_tile(
        self, tile: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.int32]]: ...
    def decode_all(self) -> tuple[float, int, int]: ...
    def plan_epoch(
        self,
        cells: npt.NDArray[np.int64] | None,
        options: LoaderOptions,
        weights: npt.NDArray[np.float64] | None = None,
        num_samples: int | None = None,
    ) -> RawPlan: ...
    def batches(self, plan: RawPlan, genes: RawGeneMap | None = None, form: Form | None = None) -> RawBatches: ...
    def gathers(
        self,
        lists: list[npt.NDArray[np.int64]],
        form: Form,
        genes: RawGeneMap | None = None,
        ahead: int = 4,
    ) -> RawBatches: ...
    def obs_schema_json(self) -> str | None: ...
    def localize(
        self, columns: list[str], cache_root: str, force: bool = False, threads: int | None = None
    ) -> str: ...

@final
class RawPlan:
    def n_cells(self) -> int: ...
    def n_batches(self) -> int: ...

@final
class RawBatches:
    @property
    def n_cells(self) -> int: ...
    @property
    def n_batches(self) -> int: ...
    def __iter__(self) -> Iterator[_LoaderBatch]: ...
    def __next__(self) -> _LoaderBatch: ...

@final
class RawGeneMap:
    @staticmethod
    def by_name(stored: list[str], wanted: list[str]) -> RawGeneMap: ...
    @staticmethod
    def source_order(gene_order: npt.NDArray[np.int32]) -> RawGeneMap: ...
    @property
    def n_output(self) -> int: ...
    @property
    def n_stored(self) -> int: ...
    @property
    def present(self) -> int: ...
    @property
    def left_out(self) -> int: ...
    def left_out_of(self, nonzeros: npt.NDArray[np.uint64]) -> int: ...

@final
class RawCollection:
    def __new__(
        cls,
        names: list[str],
        roots: list[str],
        genes: str | list[str],
        gene_column: str | None = None,
        threads: int | None = None,
        anonymous: bool = False,
        endpoint: str | None = None,
        digests: list[str | None] | None = None,
        cache_bytes: int = ...,
        cache_dir: str | None = None,
    ) -> Self: ...
    @staticmethod
    def from_state(
        state_json: str,
        genes: str | list[str],
        threads: int | None = None,
        cache_bytes: int = ...,
        cache_dir: str | None = None,
    ) -> RawCollection: ...
    def state_json(self) -> str: ...
    def file_json(self, weights: list[tuple[str, float]] | None = None) -> str: ...
    def is_open(self, member: int) -> bool: ...
    def member(self, member: int) -> RawDataset: ...
    def holders(self) -> npt.NDArray[np.bool_]: ...
    def get_formed(self, cells: npt.NDArray[np.int64], form: Form) -> _Formed: ...
    def plan_epoch(
        self,
        cells: npt.NDArray[np.int64] | None,
        options: LoaderOptions,
        weights: npt.NDArray[np.float64] | None = None,
        num_samples: int | None = None,
        dataset_weights: list[float] | None = None,
    ) -> RawPlan: ...
    def batches(self, plan: RawPlan, form: Form | None = None) -> RawBatches: ...
    def gathers(self, lists: list[npt.NDArray[np.int64]], form: Form, ahead: int = 4) -> RawBatches: ...

def cache_root(explicit: str | None = None) -> str: ...
def collection_file(path: str) -> str: ...
def column_path(root: str, fingerprint: str, column: str) -> str: ...
def redact(text: str) -> str: ...
def register_exceptions(classes: dict[str, type[BaseException]]) -> None: ...
def loader_defaults() -> LoaderOptions: ...
def convert_defaults() -> ConvertDefaults: ...
def run_command_line(argv: list[str]) -> int: ...
def convert_files(
    inputs: list[str], out: str, options: _ConvertOptions, reaching: _Reaching, progress: object | None
) -> str: ...
def convert_anndata(
    source: dict[str, Any], out: str, options: _ConvertOptions, reaching: _Reaching, progress: object | None
) -> str: ...
def append_files(
    dataset: str, inputs: list[str], options: dict[str, Any], reaching: _Reaching, progress: object | None
) -> str: ...

def compact_dataset(dataset: str, level: int, reaching: _Reaching, progress: object | None) -> str: ...

DEFAULT_CACHE_BYTES: int
FAST_LEVEL: int
ARCHIVE_LEVEL: int
INPUT_FORMATS: tuple[str, ...]
