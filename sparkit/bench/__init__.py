"""Decode benchmark (bench), comparisons (compare), depth sweeps (tune) and the
correctness gate (verify). Metric definitions live in metrics.py."""
