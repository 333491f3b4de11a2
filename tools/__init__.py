"""Patch-series toolkit for the SGLang patch queue.

Run as ``python -m tools <command>``; see ``python -m tools --help`` and README.md.
"""
