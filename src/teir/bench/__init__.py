"""Benchmarks that report ratios to the machine probe measured in the same run."""
