"""Puts this folder on sys.path for the tests of every subfolder (bench_helpers, data/), as pytest
does for a folder's conftest.py."""
