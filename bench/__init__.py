"""Benchmark and GPU-test support for the patched SGLang tree.

`python -m bench` sweeps concurrency for several server configurations (no speculation, always
EAGLE-3, the dynamic switch on v1 and v2) and recommends the switch's thresholds.
Modules: fixtures (test models), server (launch/stop), client (HTTP load), logparse (server log and
/metrics), analysis (crossover, recommendation), report (JSON/CSV/Markdown/PNG), cli.
"""
