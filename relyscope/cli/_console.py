"""The CLI's rich consoles: a reader of stdout that went away exits 141, never a verdict's code."""

from __future__ import annotations

import os
import sys
from typing import Final

from rich.console import Console

__all__ = ["CliConsole", "EXIT_BROKEN_PIPE"]

#: exit status when the reader of stdout went away (``relyscope gate … | head``): 128 + SIGPIPE, as
#: a shell reports a coreutils tool the pipe killed — click's and rich's own answer, 1, is gate's "block"
EXIT_BROKEN_PIPE: Final = 141


class CliConsole(Console):
    """A :class:`rich.console.Console` whose write to a closed pipe exits 141: rich's own
    :meth:`~rich.console.Console.on_broken_pipe` (the documented override point) exits 1, so
    ``relyscope gate … | head -1`` on a PASS exited as a block."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)  # as rich: the final flush must not fail again
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(EXIT_BROKEN_PIPE)
