"""Checks that the modules of the Python package (python/deltacells) import
only modules below them in the layer table, LAYERS: lowest first, a module
may import one listed before it (in a lower layer, or earlier in its own),
never one listed after it, nor itself. Every import counts, at the top of a
module, inside a function or under ``TYPE_CHECKING``; where a lower module
needs something of a higher one, a Protocol of what it calls takes its place
(``_types.ObsColumns``, ``_obs.ObsSource``, ``_vocabulary.GeneSource``,
``_loader.CellSource``). The Rust extension counts as its stub,
``_deltacells.pyi``.

A module of the package missing from the table fails too, so that a new one
is placed. Prints each import that breaks the order (file, line, the two
modules) and exits 1; prints nothing and exits 0 when there are none. Run
from the repository's root (.ci/run does):

    python3 scripts/python_layers.py
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path("python/deltacells")
LAYERS = {
    "types and protocols: Batch, Cells, ObsColumns, the option sets the binding takes": ["_types"],
    "the Rust extension, the exceptions, argument checks": ["_deltacells", "exceptions", "_args"],
    "options and forms: defaults and checks": ["_options"],
    "obs (and Obs.where), gene vocabularies": ["_obs", "_vocabulary"],
    "sampling: splits by group, balancing weights": ["_sampling"],
    "reading: the loader (of any CellSource), then a dataset, a collection, opening": [
        "_loader", "_dataset", "_collection", "_open",
    ],
    "conversion: how a job reaches its store and inputs, runs and reports; convert and append, from AnnData, compact": [
        "_reaching", "_jobs", "_convert", "_anndata", "_compact",
    ],
    "adapters": ["torch", "lightning", "scvi"],
    "the package": ["__init__", "_cli"],
}
RANK = {module: rank for rank, module in enumerate(m for layer in LAYERS.values() for m in layer)}


def imported(node: ast.Import | ast.ImportFrom, modules: set[str]) -> list[str]:
    """The package's modules an import statement names, relative or through
    ``deltacells``; ``from . import name`` of a name that is not a module is
    an import of ``__init__``."""
    if isinstance(node, ast.Import):
        paths = [a.name.split(".") for a in node.names]
        return [(path[1:] or ["__init__"])[0] for path in paths if path[0] == "deltacells"]
    path = node.module.split(".") if node.module else []
    if node.level == 0:
        if path[:1] != ["deltacells"]:
            return []  # another package
        path = path[1:]
    elif node.level > 1:
        return ["." * node.level + ".".join(path)]  # outside the package: never in the table
    if path:
        return [path[0]]
    return [a.name if a.name in modules else "__init__" for a in node.names]


def main() -> int:
    files = sorted([*PACKAGE.glob("*.py"), *PACKAGE.glob("*.pyi")])
    modules = {f.stem for f in files}
    problems = []
    for module in sorted(modules - RANK.keys()):
        problems.append(f"{PACKAGE}/{module}: not in the layer table of scripts/python_layers.py; place it")
    for path in files:
        if path.stem not in RANK:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in imported(node, modules):
                if target not in RANK:
                    problems.append(f"{path}:{node.lineno}: {path.stem} imports {target}, which is not in the table")
                elif RANK[target] >= RANK[path.stem]:
                    problems.append(f"{path}:{node.lineno}: {path.stem} imports {target}, which is not below it")
    print("\n".join(problems), end="\n" if problems else "")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
