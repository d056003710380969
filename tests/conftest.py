import os
import sys

# Make the shared checks importable as `helpers` from every test folder.
sys.path.insert(0, os.path.dirname(__file__))

import lazyx.scheduler  # noqa: E402

# Every node evaluated by the suite checks its primitive's shape rule.
lazyx.scheduler.check_shape_rules = True


import pytest  # noqa: E402


@pytest.fixture
def on_cpu():
    """Run the test with the CPU as default device: for tests of CPU memory layout
    (views sharing NumPy buffers), which a GPU default device does not have."""
    from lazyx.testing import running_on
    with running_on("cpu"):
        yield


@pytest.fixture
def cpu_backend():
    """Run the test on the native ``cpu`` backend's CPU stream, whatever the default
    device and backend (tests of its kernels, of fusion into C++, of its buffers)."""
    import lazyx.core as mx
    with mx.use_backend("cpu", "cpu"), mx.stream(mx.cpu):
        yield
