"""Benchmarks: each prints a table of numbers measured side by side in one run."""
