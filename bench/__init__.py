"""Benchmark and GPU-test support for the patched SGLang tree.

`python -m bench` sweeps concurrency for several server configurations (no speculation, always
EAGLE-3, the dynamic switch on v1 and v2) and recommends the switch's thresholds. Packages by
concern: models (test models), run (settings, servers, load), results (records, analysis,
reports); configs (the configurations compared) and errors below them, cli at the top.
"""
