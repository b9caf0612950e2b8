"""Benchmark scripts (not tests): each prints its figures and the exact configuration; see BENCHMARKS.md."""
