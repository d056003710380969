"""Recurrent layers: ``RNN``, ``GRU`` and ``LSTM`` with MLX's parameter names and gate
layout, so MLX checkpoints load.

Inputs are ``(..., L, input_size)`` (batch first, or unbatched ``(L, input_size)``);
outputs hold the hidden state of every step, ``(..., L, hidden_size)``. The input
projection of all steps is one matmul up front; the loop over ``L`` then adds the
hidden projection step by step (the graph is unrolled, as in MLX). Parameters start
uniform in ``±1/sqrt(hidden_size)``.

Gate layout (rows of ``Wx`` and ``Wh``): GRU ``[r, z, n]``, LSTM ``[i, f, g, o]``.
A step without an incoming hidden state (the first, when ``hidden`` is not given)
skips the hidden matmul: it is the step of a zero state (the GRU's ``r * bhn`` stays).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import lazyx.core as mx
from lazyx.errors import ArgumentError

from ._checks import check_features
from .base import Module

__all__ = ["RNN", "GRU", "LSTM"]


def _uniform(scale: float, shape: tuple):
    return mx.random.uniform(low=-scale, high=scale, shape=shape)


class RNN(Module):
    r"""An Elman recurrent layer.

    .. math:: h_{t + 1} = \sigma (W_{xh} x_t + W_{hh} h_t + b)

    Args:
        input_size (int): features of the input ``D``.
        hidden_size (int): features of the hidden state ``H``.
        bias (bool, optional): learn a bias ``b``. Default: ``True``.
        nonlinearity (callable, optional): ``sigma``. Default: ``mx.tanh``.

    Parameters ``Wxh (H, D)``, ``Whh (H, H)``, ``bias (H,)``. Call as
    ``rnn(x, hidden=None)``.
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: Optional[Callable] = None):
        super().__init__()
        self.nonlinearity = nonlinearity or mx.tanh
        if not callable(self.nonlinearity):
            raise ArgumentError(f"[RNN] nonlinearity must be callable; got {nonlinearity!r}.")
        self.hidden_size = hidden_size
        scale = 1.0 / math.sqrt(hidden_size)
        self.Wxh = _uniform(scale, (hidden_size, input_size))
        self.Whh = _uniform(scale, (hidden_size, hidden_size))
        if bias:
            self.bias = _uniform(scale, (hidden_size,))

    def _extra_repr(self) -> str:
        return (f"input_dims={self.Wxh.shape[1]}, hidden_size={self.hidden_size}, "
                f"nonlinearity={self.nonlinearity}, bias={'bias' in self}")

    def __call__(self, x, hidden=None):
        check_features(self, x, self.Wxh.shape[1], "Wxh", self.Wxh.shape, min_ndim=2)
        x = mx.addmm(self.bias, x, self.Wxh.T) if "bias" in self else x @ self.Wxh.T
        states = []
        for t in range(x.shape[-2]):
            h = x[..., t, :]
            if hidden is not None:
                h = mx.addmm(h, hidden, self.Whh.T)
            hidden = self.nonlinearity(h)
            states.append(hidden)
        return mx.stack(states, axis=-2)


class GRU(Module):
    r"""A gated recurrent unit.

    .. math::
        r_t &= \sigma(W_{xr} x_t + W_{hr} h_t + b_r) \\
        z_t &= \sigma(W_{xz} x_t + W_{hz} h_t + b_z) \\
        n_t &= \tanh(W_{xn} x_t + b_n + r_t \odot (W_{hn} h_t + b_{hn})) \\
        h_{t + 1} &= (1 - z_t) \odot n_t + z_t \odot h_t

    Args:
        input_size (int): features of the input ``D``.
        hidden_size (int): features of the hidden state ``H``.
        bias (bool, optional): learn the biases ``b`` and ``bhn``. Default: ``True``.

    Parameters ``Wx (3H, D)``, ``Wh (3H, H)``, ``b (3H,)``, ``bhn (H,)``, rows in the
    order ``r, z, n``. Call as ``gru(x, hidden=None)``.
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        super().__init__()
        self.hidden_size = hidden_size
        scale = 1.0 / math.sqrt(hidden_size)
        self.Wx = _uniform(scale, (3 * hidden_size, input_size))
        self.Wh = _uniform(scale, (3 * hidden_size, hidden_size))
        if bias:
            self.b = _uniform(scale, (3 * hidden_size,))
            self.bhn = _uniform(scale, (hidden_size,))

    def _extra_repr(self) -> str:
        return (f"input_dims={self.Wx.shape[1]}, hidden_size={self.hidden_size}, "
                f"bias={'b' in self}")

    def __call__(self, x, hidden=None):
        check_features(self, x, self.Wx.shape[1], "Wx", self.Wx.shape, min_ndim=2)
        H = self.hidden_size
        x = mx.addmm(self.b, x, self.Wx.T) if "b" in self else x @ self.Wx.T
        x_rz, x_n = x[..., :-H], x[..., -H:]
        states = []
        for t in range(x.shape[-2]):
            rz = x_rz[..., t, :]
            if hidden is not None:
                h_proj = hidden @ self.Wh.T
                h_rz, h_n = h_proj[..., :-H], h_proj[..., -H:]
                if "bhn" in self:
                    h_n = h_n + self.bhn
                rz = rz + h_rz
            r, z = mx.split(mx.sigmoid(rz), 2, axis=-1)
            n = x_n[..., t, :]
            if hidden is not None:
                n = n + r * h_n
            elif "bhn" in self:  # a zero hidden state still contributes r * bhn
                n = n + r * self.bhn
            n = mx.tanh(n)
            hidden = (1 - z) * n if hidden is None else (1 - z) * n + z * hidden
            states.append(hidden)
        return mx.stack(states, axis=-2)


class LSTM(Module):
    r"""A long short-term memory layer.

    .. math::
        i_t, f_t, o_t &= \sigma(W_{x\cdot} x_t + W_{h\cdot} h_t + b_\cdot) \\
        g_t &= \tanh(W_{xg} x_t + W_{hg} h_t + b_g) \\
        c_{t + 1} &= f_t \odot c_t + i_t \odot g_t \\
        h_{t + 1} &= o_t \odot \tanh(c_{t + 1})

    Args:
        input_size (int): features of the input ``D``.
        hidden_size (int): features of the hidden and cell states ``H``.
        bias (bool, optional): learn a bias. Default: ``True``.

    Parameters ``Wx (4H, D)``, ``Wh (4H, H)``, ``bias (4H,)``, rows in the order
    ``i, f, g, o``. Call as ``lstm(x, hidden=None, cell=None)``; returns the hidden and
    the cell states of every step.
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        super().__init__()
        self.hidden_size = hidden_size
        scale = 1.0 / math.sqrt(hidden_size)
        self.Wx = _uniform(scale, (4 * hidden_size, input_size))
        self.Wh = _uniform(scale, (4 * hidden_size, hidden_size))
        if bias:
            self.bias = _uniform(scale, (4 * hidden_size,))

    def _extra_repr(self) -> str:
        return (f"input_dims={self.Wx.shape[1]}, hidden_size={self.hidden_size}, "
                f"bias={'bias' in self}")

    def __call__(self, x, hidden=None, cell=None):
        check_features(self, x, self.Wx.shape[1], "Wx", self.Wx.shape, min_ndim=2)
        x = mx.addmm(self.bias, x, self.Wx.T) if "bias" in self else x @ self.Wx.T
        hiddens, cells = [], []
        for t in range(x.shape[-2]):
            ifgo = x[..., t, :]
            if hidden is not None:
                ifgo = mx.addmm(ifgo, hidden, self.Wh.T)
            i, f, g, o = mx.split(ifgo, 4, axis=-1)
            i, f, g, o = mx.sigmoid(i), mx.sigmoid(f), mx.tanh(g), mx.sigmoid(o)
            cell = i * g if cell is None else f * cell + i * g
            hidden = o * mx.tanh(cell)
            hiddens.append(hidden)
            cells.append(cell)
        return mx.stack(hiddens, axis=-2), mx.stack(cells, axis=-2)
