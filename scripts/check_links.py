"""Checks the relative links of every Markdown file in the repository.

Every `[text](path#anchor)` and `![alt](path)` (and reference definitions,
`[name]: path`) outside code is checked: the path, taken relative to the
file that links (or to the repository's root when it starts with `/`), must
exist, and an anchor into a Markdown file must be one of its headings, as
GitHub names them (lowercased, punctuation dropped, spaces made hyphens, a
repeated heading given -1, -2, ...). Links with a scheme (https:, mailto:)
are not checked. Build output, virtual environments and fuzz corpora are
skipped.

Prints each bad link as `file:line: link (why)` and exits 1; prints one line
and exits 0 when every link is good. Run from anywhere:

    python3 scripts/check_links.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent

# Folders skipped wherever they are, and paths skipped from the root.
SKIP_NAMES = {
    ".git",
    "target",
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
}
SKIP_PATHS = {"fuzz/corpus", "fuzz/artifacts", "data", "out"}

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^\s{0,3}(#{1,6})(?:\s+(.*?))?(?:\s+#+)?\s*$")
SETEXT = re.compile(r"^\s{0,3}(=+|-+)\s*$")
HTML_ID = re.compile(r"""<a\s[^>]*(?:name|id)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
CODE_SPAN = re.compile(r"(`+)[^\n]*?\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def markdown_files(root: Path) -> list[Path]:
    """Every .md file under `root`, skipping SKIP_NAMES and SKIP_PATHS."""
    found: list[Path] = []

    def walk(folder: Path) -> None:
        for entry in sorted(folder.iterdir()):
            rel = entry.relative_to(root).as_posix()
            if entry.is_dir():
                if entry.name not in SKIP_NAMES and rel not in SKIP_PATHS and not entry.is_symlink():
                    walk(entry)
            elif entry.suffix.lower() == ".md":
                found.append(entry)

    walk(root)
    return found


def without_code(text: str) -> str:
    """The text with fenced code blocks emptied and code spans blanked, so
    that line numbers and offsets stay those of the file."""
    out: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)[0] * len(match.group(1))
            out.append("")
        elif fence is not None:
            if match and match.group(1).startswith(fence) and line.strip().strip(fence[0]) == "":
                fence = None
            out.append("")
        else:
            out.append(CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file: its headings' (ATX and setext) and
    explicit HTML ids."""
    lines = path.read_text(encoding="utf-8").split("\n")
    fence: str | None = None
    names: list[str] = []
    previous: str | None = None  # the last line, if it could be a setext heading's text
    for line in lines:
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)[0] * len(match.group(1))
            previous = None
            continue
        if fence is not None:
            if match and match.group(1).startswith(fence) and line.strip().strip(fence[0]) == "":
                fence = None
            continue
        atx = ATX.match(line)
        if atx:
            names.append(slug(atx.group(2) or ""))
            previous = None
            continue
        if previous is not None and SETEXT.match(line):
            names.append(slug(previous))
            previous = None
            continue
        stripped = line.strip()
        is_text = (
            bool(stripped)
            and not stripped.startswith(("|", ">", "-", "*", "+"))
            and not re.match(r"\d+[.)]\s", stripped)
        )
        previous = line if is_text else None
    seen: dict[str, int] = {}
    result: set[str] = set()
    for name in names:
        count = seen.get(name, 0)
        result.add(name if count == 0 else f"{name}-{count}")
        seen[name] = count + 1
    text = "\n".join(lines)
    result.update(HTML_ID.findall(text))
    return result


def links(text: str) -> list[tuple[int, str]]:
    """The (line, target) of every link and reference definition outside code."""
    plain = without_code(text)
    found: list[tuple[int, str]] = []
    for pattern in (INLINE_LINK, REF_DEF):
        for match in pattern.finditer(plain):
            line = plain.count("\n", 0, match.start(1)) + 1
            found.append((line, match.group(1)))
    return sorted(found)


def problem(source: Path, target: str, cache: dict[Path, set[str]]) -> str | None:
    """Why `target`, linked from `source`, is bad; None when it is good."""
    if not target or SCHEME.match(target) or target.startswith("//"):
        return None
    path_part, _, anchor = target.partition("#")
    path_part = unquote(path_part.split("?", 1)[0])
    if path_part.startswith("/"):
        dest = ROOT / path_part.lstrip("/")
    elif path_part:
        dest = source.parent / path_part
    else:
        dest = source
    if not dest.exists():
        return "no such file"
    if not anchor:
        return None
    if dest.is_dir():
        dest = dest / "README.md"
        if not dest.exists():
            return "anchor into a folder without README.md"
    if dest.suffix.lower() != ".md":
        return None
    if dest not in cache:
        cache[dest] = anchors(dest)
    if unquote(anchor) not in cache[dest]:
        return f"no heading #{anchor} in {dest.resolve().relative_to(ROOT).as_posix()}"
    return None


def main() -> int:
    """Checks every Markdown file; returns the exit status."""
    cache: dict[Path, set[str]] = {}
    bad: list[str] = []
    files = markdown_files(ROOT)
    checked = 0
    for path in files:
        text = path.read_text(encoding="utf-8")
        for line, target in links(text):
            checked += 1
            why = problem(path, target, cache)
            if why:
                bad.append(f"{path.relative_to(ROOT).as_posix()}:{line}: {target} ({why})")
    for entry in bad:
        print(entry)
    if bad:
        print(f"check_links: {len(bad)} bad of {checked} links in {len(files)} files", file=sys.stderr)
        return 1
    print(f"check_links: {checked} links in {len(files)} files, all good")
    return 0


if __name__ == "__main__":
    sys.exit(main())
