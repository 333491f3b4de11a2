"""The toolkit's one logging set-up: progress and warnings on stderr, so that stdout stays
parseable (status tables, reports, the tree's path).

Messages read as they always have: the message alone, warnings prefixed ``warning:``. The handler
writes to ``sys.stderr`` as it is when a record is emitted, so a caller that redirects stderr (a
test's capture, a wrapper script) receives them.
"""

from __future__ import annotations

import logging
import sys

ROOT_LOGGER = "tools"


class CurrentStderr(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # logging's own contract: a failing handler does not stop the program
            self.handleError(record)


class PlainFormatter(logging.Formatter):
    PREFIXES = {logging.WARNING: "warning: ", logging.DEBUG: "debug: "}

    def format(self, record: logging.LogRecord) -> str:
        return self.PREFIXES.get(record.levelno, "") + record.getMessage()


def configure(verbose: bool = False, root_logger: str = ROOT_LOGGER) -> None:
    """Install the handler once on `root_logger` (the toolkit's, or another package's that logs
    the same way); -v/--verbose shows debug records too."""
    root = logging.getLogger(root_logger)
    if not any(isinstance(h, CurrentStderr) for h in root.handlers):
        handler = CurrentStderr()
        handler.setFormatter(PlainFormatter())
        root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.propagate = False
