"""The ``deltacells`` console script: the command line of the Rust library
(the same as the ``deltacells`` binary cargo builds), run in this process."""

from __future__ import annotations

import signal
import sys


def main() -> None:
    """Runs ``deltacells ARGS...`` and exits with its status (0 success, 1
    verify found problems, 2 any error)."""
    from ._deltacells import run_command_line

    # Ctrl-C ends the command at once, as it ends the binary (Python's own
    # handler would wait for the Rust code to return first).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(run_command_line(["deltacells", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
