import os
import sys

# The harness is importable as `mlx_compat` from these tests.
sys.path.insert(0, os.path.dirname(__file__))
