"""Side-by-side benchmarks of lazyx with MLX, NumPy, PyTorch and JAX on one machine.

Run ``python benchmarks/run.py``: it measures every figure in one process,
prints a table with ratios, and writes ``benchmarks/RESULTS.md``.
"""
