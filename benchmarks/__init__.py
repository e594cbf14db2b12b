"""Benchmarks (``./dev bench NAME``): ratios measured side by side in one run, with their conditions."""
