"""A stand-in for SGLang: only what bench needs (tests/bench/test_bench_e2e.py)."""
