"""Benchmarks: each prints a markdown table with a baseline measured in the same run."""
