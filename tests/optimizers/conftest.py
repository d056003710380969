import os
import sys

# The MLX differential harness is importable as `mlx_compat` from these tests.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "mlx"))
