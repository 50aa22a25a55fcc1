"""Convert and read deltacells datasets: compact tiled single-cell count matrices.

>>> import deltacells
>>> ds = deltacells.open_dataset("out/pbmc_1k", obs_columns=["obs_names"])
>>> batch = ds.get_batch([5, 0, 999])
>>> batch.to_scipy().shape
(3, 14053)

The reading is done by the Rust library (decoding on its own threads, with
the GIL released); this package gives it NumPy, SciPy and pandas types.
"""

from types import MappingProxyType

from ._anndata import write_anndata
from ._collection import Collection, CollectionObs, Member
from ._compact import CompactSummary, compact
from ._convert import AppendSummary, ConvertSummary, append, convert
from ._dataset import Dataset
from ._loader import CellBatch, Loader
from ._obs import Obs
from ._open import open_collection, open_dataset
from ._options import DEFAULTS as _LOADER_DEFAULTS
from ._types import Batch
from ._vocabulary import Vocabulary, VocabularyReport, VocabularyWarning
from .exceptions import (
    ArgumentTypeError,
    CellIndexError,
    CorruptDatasetError,
    DatasetChangedError,
    DatasetExistsError,
    DatasetNotFoundError,
    DeltacellsError,
    InputNotFoundError,
    InvalidArgumentError,
    InvalidInputError,
    UnknownNameError,
)

#: The loader's defaults, the Rust loader's own (``batch_size``, ``shuffle``,
#: ``seed``, ``window_tiles``, ``mix_chunks``, ``prefetch``...): what
#: :meth:`Dataset.batches`, :meth:`Collection.batches` and
#: :class:`deltacells.torch.CellDataset` use for a keyword not given. Read-only.
LOADER_DEFAULTS = MappingProxyType(dict(_LOADER_DEFAULTS))

__all__ = [
    "LOADER_DEFAULTS",
    "convert",
    "append",
    "compact",
    "write_anndata",
    "ConvertSummary",
    "AppendSummary",
    "CompactSummary",
    "open_dataset",
    "open_collection",
    "Dataset",
    "Collection",
    "CollectionObs",
    "Member",
    "Batch",
    "Loader",
    "CellBatch",
    "Obs",
    "Vocabulary",
    "VocabularyReport",
    "VocabularyWarning",
    "DeltacellsError",
    "DatasetNotFoundError",
    "CorruptDatasetError",
    "CellIndexError",
    "InvalidArgumentError",
    "ArgumentTypeError",
    "UnknownNameError",
    "DatasetChangedError",
    "InputNotFoundError",
    "InvalidInputError",
    "DatasetExistsError",
]
