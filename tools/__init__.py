"""Patch-series toolkit for the SGLang patch queue.

Run as ``python -m tools <command>``; see ``python -m tools --help`` and README.md.
"""

from tools.logs import configure

# Progress and warnings reach stderr for whoever imports the toolkit (make, the benchmark, tests);
# `python -m tools -v` shows debug records too.
configure()
