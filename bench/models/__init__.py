"""Test models that need no download: synthetic pairs (exact and random drafts), the Kimi-K2.5-shaped
pair, and a target with an EAGLE-3 draft trained on the machine (`fixtures` is the entry point)."""
