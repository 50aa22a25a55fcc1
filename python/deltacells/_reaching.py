"""How a conversion job reaches its inputs and its dataset: the options
convert, append, write_anndata and compact share (the object store's
address and credentials, how inputs are told apart and read, downloads,
threads), checked and each named in the error that refuses it, as the
binding takes them (:class:`deltacells._types._Reaching`)."""

from __future__ import annotations

from typing import Any

from . import _deltacells
from ._args import choice, flag, folder, location, optional_name, thread_count
from ._errors import InvalidArgumentError
from ._types import _Reaching

#: The library's names of its input formats (InputFormat), in the order of its help.
INPUT_FORMATS: tuple[str, ...] = _deltacells.INPUT_FORMATS


def reaching(
    *, anonymous: Any, endpoint: Any, input_format: Any, feature_type: Any, genome: Any, download_inputs: Any,
    download_dir: Any, threads: Any,
) -> _Reaching:
    """The options of how a job reaches its inputs and dataset, checked."""
    downloading = flag("download_inputs", download_inputs)
    if download_dir is not None and not downloading:
        raise InvalidArgumentError("download_dir is where download_inputs=True puts the inputs; pass both")
    return _Reaching(
        anonymous=flag("anonymous", anonymous),
        endpoint=None if endpoint is None else location("endpoint", endpoint),
        input_format=choice("input_format", input_format, INPUT_FORMATS, optional=True),
        feature_type=optional_name("feature_type", feature_type),
        genome=optional_name("genome", genome),
        download_inputs=downloading,
        download_dir=folder("download_dir", download_dir),
        threads=thread_count("threads", threads),
    )
