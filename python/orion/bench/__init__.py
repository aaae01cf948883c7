"""``python -m orion.bench``: Orion's own benchmarks."""
