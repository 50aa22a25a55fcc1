"""A conversion job run from Python (convert, append, write_anndata,
compact): what the Rust job reports while it runs, shown as a progress bar
when one can be seen, and the summary it returns when done. What each job
does, and the checks of its arguments, are in the modules that start it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from ._args import flag


class Progress:
    """What the Rust job reports while it runs (phases, the file being read,
    cells done, notes), shown as a tqdm bar (a widget in Jupyter, text in a
    terminal) when ``show``; the notes are kept for the summary either way."""

    def __init__(self, show: bool) -> None:
        self.show = show
        self.notes: list[str] = []
        self._bar: Any = None

    def phase(self, name: str, total_cells: int) -> None:
        if not self.show:
            return
        self.close()
        self._bar = _bar_class()(
            total=total_cells or None, desc=name, unit=" cells", unit_scale=bool(total_cells), dynamic_ncols=True,
            file=sys.stderr,
        )

    def file(self, name: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(name, refresh=False)

    def advance(self, cells: int) -> None:
        if self._bar is not None:
            self._bar.update(cells)

    def note(self, message: str) -> None:
        self.notes.append(message)
        if self.show:
            _bar_class().write(f"deltacells: note: {message}", file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _in_jupyter() -> bool:
    """Whether this runs in a Jupyter kernel."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # pragma: no cover - a broken IPython is not ours to fix
        return False
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def _bar_class() -> Any:
    """tqdm's widget in Jupyter when ipywidgets is there to draw it, else its
    text bar (which Jupyter shows too, without the warning tqdm.auto gives)."""
    if _in_jupyter():
        try:
            import ipywidgets  # noqa: F401
            from tqdm.notebook import tqdm as notebook_bar

            return notebook_bar
        except ImportError:
            pass
    from tqdm import tqdm as text_bar

    return text_bar


def _interactive() -> bool:
    """Whether a progress bar can be seen: a Jupyter kernel, or stderr a terminal."""
    if _in_jupyter():
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stderr
        return False


def run(progress: Any, job: Callable[[Progress], str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Runs ``job``, which reports to the :class:`Progress` it is given and
    returns its summary as JSON; ``progress`` is the argument of that name
    (None: a bar when one can be seen). The summary, and the notes the job
    reported."""
    reporter = Progress(_interactive() if progress is None else flag("progress", progress))
    try:
        summary = json.loads(job(reporter))
    finally:
        reporter.close()
    return summary, tuple(reporter.notes)
