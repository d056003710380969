"""The conv pack against MLX 0.32.2 on the same inputs: every function, strides,
padding (symmetric, asymmetric, negative), dilations, groups, flip, transposed
convolutions with output padding, ``convolve``'s modes, result dtypes, gradients, and
the exception types of bad input."""

import numpy as np
import pytest
from mlx_compat import requires_mlx, same

pytestmark = requires_mlx


def _data(shape, seed):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


CASES = [
    ("conv1d", (2, 9, 4), (6, 3, 2), dict(stride=2, padding=1, dilation=2, groups=2)),
    ("conv2d", (2, 7, 6, 3), (4, 3, 2, 3), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2))),
    ("conv2d", (1, 6, 6, 4), (4, 3, 3, 1), dict(padding=1, groups=4)),
    ("conv3d", (1, 5, 4, 6, 2), (3, 2, 3, 2, 2), dict(stride=(1, 2, 1), padding=1, dilation=(2, 1, 1))),
    ("conv_general", (1, 6, 7, 4), (2, 2, 3, 2),
     dict(stride=[1, 2], padding=([2, 0], [1, 3]), kernel_dilation=[2, 1], input_dilation=[1, 3],
          groups=2, flip=True)),
    ("conv_general", (2, 8, 3), (2, 3, 3), dict(padding=([-1], [2]), flip=True)),
    ("conv_transpose1d", (2, 5, 4), (3, 3, 4), dict(stride=2, padding=1, output_padding=1)),
    ("conv_transpose2d", (1, 4, 3, 4), (4, 3, 2, 2),
     dict(stride=(2, 3), padding=(1, 0), dilation=(1, 2), output_padding=(1, 2), groups=2)),
    ("conv_transpose3d", (1, 3, 2, 3, 2), (2, 2, 2, 2, 2), dict(stride=2, padding=(0, 1, 0))),
]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_values_and_dtypes_match_mlx(case, dtype):
    name, xs, ws, kw = CASES[case]
    x, w = _data(xs, case), _data(ws, case + 20)
    same(lambda m: getattr(m, name)(m.array(x).astype(getattr(m, dtype)),
                                    m.array(w).astype(getattr(m, dtype)), **kw),
         rtol={"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}[dtype], atol=1e-5 if dtype == "float32" else 2e-2)


@pytest.mark.parametrize("mode", ["full", "same", "valid"])
@pytest.mark.parametrize("n,k", [(9, 4), (3, 7), (6, 3), (5, 5)])
def test_convolve_matches_mlx(n, k, mode):
    a, v = _data((n,), n), _data((k,), k + 1)
    same(lambda m: m.convolve(m.array(a), m.array(v), mode=mode), atol=1e-6)


# Gradients: MLX's input gradient is wrong-shaped for asymmetric padding with input
# dilation (lazyx's follows the definition; tests/plugins/test_conv.py checks it by
# finite differences), so the cases here are those MLX gets right.
GRADS = [
    ("conv1d", (2, 9, 4), (6, 3, 2), dict(stride=2, padding=1, dilation=2, groups=2)),
    ("conv2d", (2, 7, 6, 3), (4, 3, 2, 3), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2))),
    ("conv_general", (1, 6, 7, 2), (3, 2, 3, 2), dict(padding=1, kernel_dilation=2, flip=True)),
    ("conv_transpose2d", (1, 4, 3, 2), (3, 3, 2, 2), dict(stride=2, padding=1, output_padding=1)),
]


@pytest.mark.parametrize("case", range(len(GRADS)))
def test_gradients_match_mlx(case):
    name, xs, ws, kw = GRADS[case]
    x, w = _data(xs, case), _data(ws, case + 30)

    def grads(m):
        def loss(a, b):
            y = getattr(m, name)(a, b, **kw)
            return m.sum(y * m.cos(y))
        return m.grad(loss, argnums=(0, 1))(m.array(x), m.array(w))
    same(grads, rtol=1e-4, atol=1e-5)


BAD = [
    lambda m: m.conv2d(m.zeros((1, 8, 8, 4)), m.zeros((6, 3, 3, 3))),
    lambda m: m.conv2d(m.zeros((1, 8, 8, 4)), m.zeros((6, 3, 3, 4)), groups=3),
    lambda m: m.conv2d(m.zeros((1, 8, 8, 4)), m.zeros((5, 3, 3, 2)), groups=2),
    lambda m: m.conv2d(m.zeros((1, 8, 8, 4)), m.zeros((6, 9, 9, 4))),
    lambda m: m.conv2d(m.zeros((8, 8, 4)), m.zeros((6, 3, 3, 4))),
    lambda m: m.conv_general(m.zeros((1, 3)), m.zeros((4, 3))),
    lambda m: m.conv_general(m.zeros((1, 2, 2, 2, 2, 3)), m.zeros((4, 1, 1, 1, 1, 3))),
    lambda m: m.conv2d(m.zeros((1, 8, 8, 4)), m.zeros((6, 3, 3, 4)), stride=0),
    lambda m: m.conv2d(m.zeros((1, 8, 8, 4)), m.zeros((6, 3, 3, 4)), dilation=0),
    lambda m: m.conv2d(m.zeros((1, 8, 8, 4)), m.zeros((6, 3, 3, 4)), stride=(1, 2, 3)),
    lambda m: m.conv1d(m.zeros((1, 8, 4)), m.zeros((6, 3, 4)), stride=1.5),
    lambda m: m.conv_general(m.zeros((1, 8, 8, 4)), m.zeros((6, 3, 3, 4)), padding=[1, 2, 3]),
    lambda m: m.conv2d(m.zeros((1, 8, 8, 4), dtype=m.int32), m.zeros((6, 3, 3, 4))),
    lambda m: m.conv3d(m.zeros((1, 4, 4, 4, 4)), m.zeros((4, 2, 2, 2, 2)), groups=2),
    lambda m: m.conv_transpose1d(m.zeros((2, 5, 3)), m.zeros((4, 2, 3)), padding=3),
    lambda m: m.convolve(m.zeros((2, 3)), m.zeros(3)),
    lambda m: m.convolve(m.zeros(3), m.zeros(2), mode="bad"),
    lambda m: m.convolve(m.array([1, 2, 3]), m.array([1, 1])),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_raises_mlx_exception_type(case):
    assert same(BAD[case]) is None


def test_shapes_and_dtypes_of_edge_cases_match_mlx():
    same(lambda m: m.conv2d(m.zeros((0, 5, 5, 3)), m.zeros((4, 2, 2, 3))))
    same(lambda m: m.conv2d(m.zeros((1, 5, 5, 3), dtype=m.float16), m.zeros((4, 2, 2, 3))))
    # conv1d reads its scalars for every spatial axis of the input it gets, as MLX
    same(lambda m: m.conv1d(m.ones((1, 6, 6, 2)), m.ones((3, 2, 2, 2)), stride=2))
