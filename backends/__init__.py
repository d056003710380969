"""lazyx's backends: ``cpu`` (NumPy and native kernels), ``metal``, ``cuda``."""
