"""How a conversion job reaches its inputs and its dataset: the keywords
convert, append, write_anndata and compact share (``_types.JobArgs`` and
``_types.InputArgs``: the store's address and credentials, how inputs are
told apart and read, downloads, threads), checked and each named in the
error that refuses it, as the binding takes them (``_types._Reaching``)."""

from __future__ import annotations

from . import _deltacells
from ._args import choice, flag, folder, optional_name, thread_count
from ._options import store_options
from ._types import InputArgs, JobArgs, _Reaching
from .exceptions import InvalidArgumentError

#: The library's names of its input formats (InputFormat), in the order of its help.
INPUT_FORMATS: tuple[str, ...] = _deltacells.INPUT_FORMATS


def reaching(job: JobArgs, inputs: InputArgs | None = None) -> _Reaching:
    """A job's keywords checked, as the binding takes them: how its store is
    reached and its threads (``job``), and how its inputs are read
    (``inputs``; None for a job that reads none: each its default)."""
    given = inputs if inputs is not None else InputArgs()
    downloading = flag("download_inputs", given.get("download_inputs", False))
    download_dir = given.get("download_dir")
    if download_dir is not None and not downloading:
        raise InvalidArgumentError("download_dir is where download_inputs=True puts the inputs; pass both")
    return _Reaching(
        **store_options(job),
        input_format=choice("input_format", given.get("input_format"), INPUT_FORMATS, optional=True),
        feature_type=optional_name("feature_type", given.get("feature_type")),
        genome=optional_name("genome", given.get("genome")),
        download_inputs=downloading,
        download_dir=folder("download_dir", download_dir),
        threads=thread_count("threads", job.get("threads")),
    )
