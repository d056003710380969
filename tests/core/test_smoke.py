import numpy as np
import pytest

import lazyx.core as mx
from helpers import ALL_DTYPES, FLOAT_DTYPES, check_op, random_array


@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if d is not mx.bool_], ids=lambda d: d.name)
def test_add_matches_numpy(dtype):
    a = random_array((3, 4), dtype)
    b = random_array((4,), dtype)
    check_op(mx.add, np.add, a, b, dtype=dtype)
