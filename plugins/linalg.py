"""``lazyx.core.linalg``: factorizations, inverses, solves, determinants and norms.

The pack reads as ``mlx.core.linalg`` (0.32): the same names, signatures, defaults and
result dtypes. Each op checks its input (at least two dimensions, square where the
math needs it, a dtype the factorization accepts: float32/float64, plus complex64 for
``svd``, ``eig`` and ``eigh`` as in MLX), then builds one node of a factorization
primitive that works on the last two axes and loops over the leading ones:

====================  ======================================  =====================
primitive             ops                                     outputs
====================  ======================================  =====================
``Inverse``           ``inv``, ``tri_inv``, ``cholesky_inv``  inverse
``Cholesky``          ``cholesky``                            triangular factor
``QR``                ``qr``                                  ``Q``, ``R`` (reduced)
``SVD``               ``svd``, ``norm`` (2, -2, "nuc")        ``U``, ``S``, ``Vt`` / ``S``
``Eig``               ``eig``, ``eigvals``                    complex64 values, vectors
``Eigh``              ``eigh``, ``eigvalsh``                  real values, vectors
``LUF``               ``lu``, ``lu_factor``                   packed LU, pivots, rows
``Solve``             ``solve``                               ``X`` with ``A X = B``
``SolveTriangular``   ``solve_triangular``                    ``X``
``Det``/``SlogDet``   ``det``, ``slogdet``                    determinant / sign, log
``Pinv``              ``pinv``                                pseudo-inverse
====================  ======================================  =====================

``norm``, ``cross``, ``lu`` and ``cholesky_inv`` are compositions of these and of the
element-wise ops, as in MLX. The kernels are LAPACK: NumPy's batched ``numpy.linalg``
and SciPy's LAPACK wrappers on the CPU (``lazyx.backends.cpu.kernels.linalg``), cuSOLVER
and cuBLAS through CuPy on the GPU (``lazyx.backends.cuda.linalg``). Unlike MLX, whose
GPU streams refuse these ops, lazyx runs them on either device.

Transform rules sit beside each primitive and are written with ``lazyx.core`` ops, so
they compose (second derivatives, ``vmap`` of ``grad``). A factorization that reads one
triangle of its input (``cholesky``, ``eigh``, ``tri_inv``, ``solve_triangular``) is
differentiated as the function of that triangle it is; ``vmap`` moves the batch axis to
the front, where the kernels loop anyway. MLX 0.32 registers ``vmap`` for most of these
and ``vjp``/``jvp`` only for ``det``/``slogdet``; lazyx gives every primitive all three
(the registry-wide rule test checks them), with two limits: the rules of ``qr`` need
``M >= N``, and those of ``svd`` with ``compute_uv=True`` and of ``lu`` need square
matrices (elsewhere the full factors are not unique), a :class:`TransformError` says so.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

import lazyx.core as mx
from lazyx import dtypes as dt
from lazyx.arguments import as_array, broadcast_shapes, cast, normalize_axis
from lazyx.array import array, lazy, lazy_multi
from lazyx.device import to_stream
from lazyx.errors import ArgumentError, AxisError, DtypeError, ShapeError, TransformError
from lazyx.examples import example, uniform
from lazyx.hookspecs import hookimpl, pack_hooks
from lazyx.primitive import Primitive
from lazyx.rules import batch_first, sum_to_shape

_PROMOTE = dt._PROMOTE
_REAL = (dt.float32, dt.float64)
_REAL_OR_COMPLEX = (dt.float32, dt.float64, dt.complex64)


# -- argument checks -------------------------------------------------------------------
def _matrix(a, op: str, allowed=_REAL, square: bool = True) -> array:
    """``a`` as an array of at least two dimensions (square ones with ``square``) of a
    dtype in ``allowed``, or a lazyx error naming ``op``."""
    a = a if type(a) is array else as_array(a)
    if a._dtype not in allowed:
        names = " or ".join(d.name for d in allowed)
        raise DtypeError(f"[{op}] Arrays must have type {names}, got {a._dtype.name} "
                         f"(shape {a._shape}).")
    _check_shape(a, op, square)
    return a


def _check_shape(a: array, op: str, square: bool = True) -> None:
    s = a._shape
    if len(s) < 2:
        raise ShapeError(f"[{op}] Arrays must have >= 2 dimensions, got shape {s}.")
    if square and s[-1] != s[-2]:
        raise ShapeError(f"[{op}] Only defined for square matrices: the last two "
                         f"dimensions of shape {s} differ.")


# -- shared rule helpers (last two axes are the matrix) --------------------------------
def _T(x, s):
    return mx.swapaxes(x, -1, -2, stream=s)


def _H(x, s):
    """Conjugate transpose."""
    x = _T(x, s)
    return mx.conjugate(x, stream=s) if x._dtype.kind == "c" else x


def _mm(a, b, s):
    return mx.matmul(a, b, stream=s)


def _diag(x, s):
    return mx.diagonal(x, 0, -2, -1, stream=s)


def _diag_embed(v, s):
    """``(..., n)`` -> ``(..., n, n)`` with ``v`` on the diagonal."""
    n = v._shape[-1]
    return mx.multiply(mx.expand_dims(v, -1, stream=s), mx.eye(n, dtype=v._dtype, stream=s),
                       stream=s)


def _eye_like(x, s):
    return mx.eye(x._shape[-2], x._shape[-1], dtype=x._dtype, stream=s)


def _from_triangle(d, upper: bool, s):
    """The tangent of a function that reads one triangle of its input: the symmetric
    (Hermitian) matrix that triangle stands for."""
    if upper:
        return mx.add(mx.triu(d, stream=s), _H(mx.triu(d, 1, stream=s), s), stream=s)
    return mx.add(mx.tril(d, stream=s), _H(mx.tril(d, -1, stream=s), s), stream=s)


def _to_triangle(g, upper: bool, s):
    """The adjoint of :func:`_from_triangle`: a cotangent of the symmetric matrix as one
    of the triangle the function read."""
    if upper:
        return mx.add(mx.triu(g, stream=s), mx.triu(_H(g, s), 1, stream=s), stream=s)
    return mx.add(mx.tril(g, stream=s), mx.tril(_H(g, s), -1, stream=s), stream=s)


def _gaps(w, s):
    """``F[..., i, j] = 1 / (w[j] - w[i])`` off the diagonal and 0 on it (eigen- and
    singular-value rules); the diagonal is kept finite by adding the identity first."""
    n = w._shape[-1]
    eye = mx.eye(n, dtype=w._dtype, stream=s)
    diff = mx.subtract(mx.expand_dims(w, -2, stream=s), mx.expand_dims(w, -1, stream=s),
                       stream=s)
    return mx.subtract(mx.reciprocal(mx.add(diff, eye, stream=s), stream=s), eye, stream=s)


def _real_like(x, like, s):
    """``x`` (a cotangent) as the real part where the primal ``like`` is real."""
    if x._dtype.kind == "c" and like._dtype.kind != "c":
        return mx.real(x, stream=s)
    return x


# -- primitives ------------------------------------------------------------------------
class _Factorization(Primitive):
    """A primitive on the last two axes of its inputs, batched over the leading ones.

    ``vmap`` moves the batch axis of every batched input to the front (padding to the
    largest per-example rank, so that broadcast batch dimensions still line up) and
    builds the same node there: the kernels loop over leading axes anyway.
    """

    __slots__ = ()

    def output_dtypes(self, inputs):
        return [inputs[0].dtype] * len(self.output_shapes(inputs))

    def again(self, inputs) -> list:
        """The outputs of this primitive (a new node, same parameters) on ``inputs``."""
        prim = type(self)(self.stream, *self.params())
        shapes = prim.output_shapes(inputs)
        dtypes = prim.output_dtypes(inputs)
        if len(shapes) == 1:
            return [lazy(shapes[0], dtypes[0], prim, tuple(inputs))]
        return lazy_multi(shapes, dtypes, prim, tuple(inputs))

    def vmap(self, inputs, axes):
        s = self.stream
        rank = max(len(x._shape) - (a is not None) for x, a in zip(inputs, axes))
        xs = [x if a is None else batch_first(x, a, rank, s) for x, a in zip(inputs, axes)]
        outs = self.again(xs)
        return outs, [0] * len(outs)


def _one(prim, a: array) -> array:
    return prim.again([a])[0]


class Inverse(_Factorization):
    """The inverse of each matrix; ``structure`` "lower"/"upper" reads only that
    triangle (``tri_inv``) and gives a triangular inverse."""

    __slots__ = ("structure",)
    arity = 1
    structure: Literal["general", "lower", "upper"]

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    def _mask(self, x):
        if self.structure == "general":
            return x
        f = mx.triu if self.structure == "upper" else mx.tril
        return f(x, stream=self.stream)

    def vjp(self, primals, cotangents, argnums, outputs):
        s = self.stream
        xh = _H(outputs[0], s)
        return [self._mask(mx.negative(_mm(_mm(xh, cotangents[0], s), xh, s), stream=s))]

    def jvp(self, primals, tangents, argnums):
        s = self.stream
        x = _inverse(primals[0], self.structure, s)
        return [mx.negative(_mm(_mm(x, self._mask(tangents[0]), s), x, s), stream=s)]


def _inverse(a, structure, s):
    return _one(Inverse(to_stream(s), structure), a)


class Cholesky(_Factorization):
    """The Cholesky factor of each (symmetric positive definite) matrix, read from its
    lower triangle (``upper=False``: ``A = L L^T``) or its upper one (``A = U^T U``)."""

    __slots__ = ("upper",)
    arity = 1
    upper: bool

    def output_shapes(self, inputs):
        return [inputs[0].shape]

    @staticmethod
    def _phi(x, s):
        """The lower triangle of ``x`` with its diagonal halved."""
        return mx.subtract(mx.tril(x, stream=s),
                           mx.multiply(_diag_embed(_diag(x, s), s), 0.5, stream=s), stream=s)

    def jvp(self, primals, tangents, argnums):
        s = self.stream
        a, d = primals[0], tangents[0]
        if self.upper:  # cholesky(A, upper) == cholesky(A^T)^T: the lower rule on A^T
            a, d = _T(a, s), _T(d, s)
        low = _one(Cholesky(self.stream, False), a)
        li = _inverse(low, "lower", s)
        x = _mm(_mm(li, _from_triangle(d, False, s), s), _H(li, s), s)
        out = _mm(low, self._phi(x, s), s)
        return [_T(out, s) if self.upper else out]

    def vjp(self, primals, cotangents, argnums, outputs):
        s = self.stream
        low, g = outputs[0], cotangents[0]
        if self.upper:
            low, g = _T(low, s), _T(g, s)
        li = _inverse(low, "lower", s)
        sym = _mm(_mm(_H(li, s), self._phi(_mm(_H(low, s), g, s), s), s), li, s)
        out = _to_triangle(sym, False, s)
        return [_T(out, s) if self.upper else out]


class QR(_Factorization):
    """The reduced QR factorization: ``Q`` is ``(M, K)``, ``R`` is ``(K, N)``,
    ``K = min(M, N)``."""

    __slots__ = ()
    arity = 1

    def output_shapes(self, inputs):
        *b, m, n = inputs[0].shape
        k = min(m, n)
        return [tuple(b) + (m, k), tuple(b) + (k, n)]

    def _square_r(self, a):
        m, n = a._shape[-2:]
        if m < n:
            raise TransformError(f"[QR] The derivative of qr is implemented for M >= N, got "
                                 f"shape {a._shape}.")

    def jvp(self, primals, tangents, argnums):
        s = self.stream
        a, d = primals[0], tangents[0]
        self._square_r(a)
        q, r = self.again([a])
        x = _mm(d, _inverse(r, "upper", s), s)
        y = _mm(_H(q, s), x, s)
        low = mx.tril(y, -1, stream=s)
        omega = mx.subtract(low, _H(low, s), stream=s)
        dq = mx.add(_mm(q, mx.subtract(omega, y, stream=s), s), x, stream=s)
        dr = _mm(mx.subtract(y, omega, stream=s), r, s)
        return [dq, dr]

    def vjp(self, primals, cotangents, argnums, outputs):
        s = self.stream
        a = primals[0]
        self._square_r(a)
        q, r = outputs
        gq, gr = cotangents
        ybar = mx.subtract(_mm(gr, _H(r, s), s), _mm(_H(q, s), gq, s), stream=s)
        # omega = tril(y, -1) - tril(y, -1)^T contributes -ybar, folded in here:
        ybar = mx.add(ybar, mx.tril(mx.subtract(_H(ybar, s), ybar, stream=s), -1, stream=s),
                      stream=s)
        xbar = mx.add(gq, _mm(q, ybar, s), stream=s)
        return [_mm(xbar, _H(_inverse(r, "upper", s), s), s)]


class SVD(_Factorization):
    """The singular value decomposition with full ``U`` ``(M, M)`` and ``Vt`` ``(N, N)``
    (``compute_uv``) or the singular values alone, in descending order."""

    __slots__ = ("compute_uv",)
    arity = 1
    compute_uv: bool

    def output_shapes(self, inputs):
        *b, m, n = inputs[0].shape
        b = tuple(b)
        sv = b + (min(m, n),)
        return [b + (m, m), sv, b + (n, n)] if self.compute_uv else [sv]

    def output_dtypes(self, inputs):
        d = inputs[0].dtype
        real = dt.float32 if d is dt.complex64 else d
        return [d, real, d] if self.compute_uv else [real]

    def _factors(self, a):
        """Reduced ``U``, ``S``, ``V`` of ``a`` (from the outputs of a full SVD node)."""
        s = self.stream
        u, sv, vt = _one_svd(a, True, s)
        m, n = a._shape[-2:]
        k = min(m, n)
        if m > k:
            u = u[..., :, :k]
        if n > k:
            vt = vt[..., :k, :]
        return u, sv, _H(vt, s)

    def _square(self, a):
        m, n = a._shape[-2:]
        if self.compute_uv and m != n:
            raise TransformError(
                f"[SVD] The derivative of svd with compute_uv=True is implemented for "
                f"square matrices (the extra columns of the full U or Vt are not unique), "
                f"got shape {a._shape}; use compute_uv=False for the singular values.")

    def jvp(self, primals, tangents, argnums):
        s = self.stream
        a, d = primals[0], tangents[0]
        self._square(a)
        u, sv, v = self._factors(a)
        ds_mat = _mm(_mm(_H(u, s), d, s), v, s)
        dsv = _diag(ds_mat, s)
        if dsv._dtype.kind == "c":
            dsv = mx.real(dsv, stream=s)
        if not self.compute_uv:
            return [dsv]
        # JAX's rule (square case): F holds 1 / (s_j^2 - s_i^2).
        srow = mx.expand_dims(sv, -2, stream=s)
        f = _gaps(mx.square(sv, stream=s), s)
        if ds_mat._dtype.kind == "c":
            f = cast(f, ds_mat._dtype, s)
            srow = cast(srow, ds_mat._dtype, s)
        dss = mx.multiply(ds_mat, srow, stream=s)               # dS @ diag(s)
        sds = mx.multiply(_T(srow, s), ds_mat, stream=s)        # diag(s) @ dS
        sinv = mx.reciprocal(srow, stream=s)
        du_diag = mx.multiply(mx.multiply(mx.subtract(ds_mat, _H(ds_mat, s), stream=s), 0.5,
                                          stream=s),
                              mx.multiply(sinv, _eye_like(ds_mat, s), stream=s), stream=s)
        du = _mm(u, mx.add(mx.multiply(f, mx.add(dss, _H(dss, s), stream=s), stream=s),
                           du_diag, stream=s), s)
        dv = _mm(v, mx.multiply(f, mx.add(sds, _H(sds, s), stream=s), stream=s), s)
        return [du, dsv, _H(dv, s)]

    def vjp(self, primals, cotangents, argnums, outputs):
        s = self.stream
        a = primals[0]
        self._square(a)
        if not self.compute_uv:
            u, sv, v = self._factors(a)
            g = cotangents[0]
            if a._dtype.kind == "c":
                g = cast(g, a._dtype, s)
            return [_mm(mx.multiply(u, mx.expand_dims(g, -2, stream=s), stream=s), _H(v, s), s)]
        u, sv, vt = outputs
        gu, gs, gvt = cotangents
        v, gv = _H(vt, s), _H(gvt, s)
        # PyTorch's rule (square case): U [(skew(U^H gU)/E) S + S (skew(V^H gV)/E)
        # + diag(gS)] V^H with E[j, k] = s_k^2 - s_j^2.
        uhgu = _mm(_H(u, s), gu, s)
        vhgv = _mm(_H(v, s), gv, s)
        f = _gaps(mx.square(sv, stream=s), s)
        srow = mx.expand_dims(sv, -2, stream=s)
        if u._dtype.kind == "c":
            f, srow, gs = cast(f, u._dtype, s), cast(srow, u._dtype, s), cast(gs, u._dtype, s)
        inner = mx.add(
            mx.multiply(mx.multiply(mx.subtract(uhgu, _H(uhgu, s), stream=s), f, stream=s),
                        srow, stream=s),
            mx.multiply(_T(srow, s),
                        mx.multiply(mx.subtract(vhgv, _H(vhgv, s), stream=s), f, stream=s),
                        stream=s), stream=s)
        inner = mx.add(inner, _diag_embed(gs, s), stream=s)
        if u._dtype.kind == "c":
            # The phase of each singular pair: the imaginary diagonal of U^H gU.
            im = mx.divide(mx.imag(_diag(uhgu, s), stream=s),
                           mx.multiply(sv, 2.0, stream=s), stream=s)
            inner = mx.add(inner, mx.multiply(_diag_embed(cast(im, u._dtype, s), s), 1j,
                                              stream=s), stream=s)
        return [_mm(_mm(u, inner, s), vt, s)]


def _one_svd(a, compute_uv, s):
    return SVD(to_stream(s), compute_uv).again([a])


class Eigh(_Factorization):
    """Eigenvalues (ascending, real) and, with ``compute_eigenvectors``, eigenvectors of
    each Hermitian matrix given by its ``uplo`` triangle."""

    __slots__ = ("uplo", "compute_eigenvectors")
    arity = 1
    uplo: Literal["L", "U"]
    compute_eigenvectors: bool

    def output_shapes(self, inputs):
        sh = inputs[0].shape
        return [sh[:-1], sh] if self.compute_eigenvectors else [sh[:-1]]

    def output_dtypes(self, inputs):
        d = inputs[0].dtype
        real = dt.float32 if d is dt.complex64 else d
        return [real, d] if self.compute_eigenvectors else [real]

    def _both(self, a):
        return Eigh(self.stream, self.uplo, True).again([a])

    def jvp(self, primals, tangents, argnums):
        s = self.stream
        a = primals[0]
        w, v = self._both(a) if not self.compute_eigenvectors else self.again([a])
        m = _mm(_mm(_H(v, s), _from_triangle(tangents[0], self.uplo == "U", s), s), v, s)
        dw = _diag(m, s)
        if dw._dtype.kind == "c":
            dw = mx.real(dw, stream=s)
        if not self.compute_eigenvectors:
            return [dw]
        f = cast(_gaps(w, s), v._dtype, s)
        return [dw, _mm(v, mx.multiply(f, m, stream=s), s)]

    def vjp(self, primals, cotangents, argnums, outputs):
        s = self.stream
        a = primals[0]
        if self.compute_eigenvectors:
            w, v = outputs
            gw, gv = cotangents
            inner = mx.multiply(cast(_gaps(w, s), v._dtype, s), _mm(_H(v, s), gv, s), stream=s)
        else:
            w, v = self._both(a)
            gw, inner = cotangents[0], None
        d = _diag_embed(cast(gw, v._dtype, s), s)
        inner = d if inner is None else mx.add(inner, d, stream=s)
        sym = _mm(_mm(v, inner, s), _H(v, s), s)
        return [_to_triangle(sym, self.uplo == "U", s)]


class Eig(_Factorization):
    """Eigenvalues and, with ``compute_eigenvectors``, unit-norm right eigenvectors of
    each square matrix; always complex64, as in MLX."""

    __slots__ = ("compute_eigenvectors",)
    arity = 1
    compute_eigenvectors: bool

    def output_shapes(self, inputs):
        sh = inputs[0].shape
        return [sh[:-1], sh] if self.compute_eigenvectors else [sh[:-1]]

    def output_dtypes(self, inputs):
        return [dt.complex64] * (2 if self.compute_eigenvectors else 1)

    def _both(self, a):
        return Eig(self.stream, True).again([a])

    def jvp(self, primals, tangents, argnums):
        # JAX's rule: M = V^-1 dA V, dw = diag(M), dV = V (F o M), then the part of dV
        # that would change each column's norm removed.
        s = self.stream
        w, v = self._both(primals[0])
        m = _mm(_mm(_inverse(v, "general", s), cast(tangents[0], dt.complex64, s), s), v, s)
        dw = _diag(m, s)
        if not self.compute_eigenvectors:
            return [dw]
        dv = _mm(v, mx.multiply(_gaps(w, s), m, stream=s), s)
        return [dw, self._unit_norm(v, dv)]

    def _unit_norm(self, v, dv):
        s = self.stream
        along = mx.real(mx.sum(mx.multiply(mx.conjugate(v, stream=s), dv, stream=s), axis=-2,
                               keepdims=True, stream=s), stream=s)
        return mx.subtract(dv, mx.multiply(v, cast(along, v._dtype, s), stream=s), stream=s)

    def vjp(self, primals, cotangents, argnums, outputs):
        s = self.stream
        a = primals[0]
        if self.compute_eigenvectors:
            (w, v), (gw, gv) = outputs, cotangents
            gv = self._unit_norm(v, gv)  # the projection is its own adjoint
            inner = mx.multiply(mx.conjugate(_gaps(w, s), stream=s), _mm(_H(v, s), gv, s),
                                stream=s)
            inner = mx.add(inner, _diag_embed(gw, s), stream=s)
        else:
            w, v = self._both(a)
            inner = _diag_embed(cotangents[0], s)
        vi = _inverse(v, "general", s)
        return [_real_like(_mm(_mm(_H(vi, s), inner, s), _H(v, s), s), a, s)]


class LUF(_Factorization):
    """LU factorization with partial pivoting: the packed ``LU`` (unit lower ``L`` below
    the diagonal, ``U`` on and above it), LAPACK's ``pivots`` (0-based row swaps, K of
    them) and ``rows``, the permutation with ``A = (L @ U)[rows]``; both uint32."""

    __slots__ = ()
    arity = 1

    def output_shapes(self, inputs):
        sh = inputs[0].shape
        return [sh, sh[:-2] + (min(sh[-2:]),), sh[:-1]]

    def output_dtypes(self, inputs):
        return [inputs[0].dtype, dt.uint32, dt.uint32]

    def _square(self, a):
        if a._shape[-1] != a._shape[-2]:
            raise TransformError(f"[LUF] The derivative of lu and lu_factor is implemented "
                                 f"for square matrices, got shape {a._shape}.")

    def _parts(self, lu):
        s = self.stream
        low = mx.add(mx.tril(lu, -1, stream=s), _eye_like(lu, s), stream=s)
        up = mx.triu(lu, stream=s)
        return low, up, _inverse(low, "lower", s), _inverse(up, "upper", s)

    def jvp(self, primals, tangents, argnums):
        s = self.stream
        a = primals[0]
        self._square(a)
        lu, _, rows = self.again([a])
        low, up, li, ui = self._parts(lu)
        # (L U)[j] = A[inverse(rows)[j]]
        # Indices carry no gradient, and a transform reaching one raises (as in MLX).
        inv_rows = mx.stop_gradient(mx.expand_dims(mx.argsort(rows, axis=-1, stream=s), -1,
                                                   stream=s), stream=s)
        db = mx.take_along_axis(tangents[0], inv_rows, axis=-2, stream=s)
        x = _mm(_mm(li, db, s), ui, s)
        d = mx.add(_mm(low, mx.tril(x, -1, stream=s), s), _mm(mx.triu(x, stream=s), up, s),
                   stream=s)
        return [d, None, None]

    def vjp(self, primals, cotangents, argnums, outputs):
        s = self.stream
        self._square(primals[0])
        lu, _, rows = outputs
        g = cotangents[0]
        low, up, li, ui = self._parts(lu)
        xbar = mx.add(mx.tril(_mm(_H(low, s), g, s), -1, stream=s),
                      mx.triu(_mm(g, _H(up, s), s), stream=s), stream=s)
        bbar = _mm(_mm(_H(li, s), xbar, s), _H(ui, s), s)
        rows = mx.stop_gradient(mx.expand_dims(rows, -1, stream=s), stream=s)  # indices
        return [mx.take_along_axis(bbar, rows, axis=-2, stream=s)]


def _solve_shape(sa, sb, op, shown=None):
    """The shape of ``x`` in ``a @ x = b``; ``shown`` is ``b``'s shape as the user gave
    it (a vector ``b`` is a column here)."""
    shown = sb if shown is None else shown
    if sa[-1] != sb[-2]:
        raise ShapeError(f"[{op}] The last dimension of a (shape {sa}) must match the "
                         f"{'length' if len(shown) == 1 else 'second to last dimension'} "
                         f"of b (shape {shown}).")
    try:
        batch = broadcast_shapes(sa[:-2], sb[:-2])
    except ShapeError:
        raise ShapeError(f"[{op}] The batch dimensions of a (shape {sa}) and b (shape "
                         f"{shown}) cannot be broadcast.") from None
    return batch + sb[-2:]


class Solve(_Factorization):
    """``X`` with ``A X = B`` for square ``A`` ``(..., N, N)`` and ``B`` ``(..., N, K)``
    (the op reshapes a vector ``b``); batch dimensions broadcast."""

    __slots__ = ()
    arity = 2

    def output_shapes(self, inputs):
        return [_solve_shape(inputs[0].shape, inputs[1].shape, "linalg.solve")]

    def _solve(self, a, b, transpose=False):
        s = self.stream
        return type(self)(s, *self.params()).again([_T(a, s) if transpose else a, b])[0]

    def _mask(self, a):
        return a

    def jvp(self, primals, tangents, argnums):
        s = self.stream
        a, b = primals
        x = self._solve(a, b)
        rhs = None
        for t, i in zip(tangents, argnums):
            term = (mx.negative(_mm(self._mask(t), x, s), stream=s) if i == 0
                    else t)
            rhs = term if rhs is None else mx.add(rhs, term, stream=s)
        shape = x._shape
        if rhs._shape != shape:
            rhs = mx.broadcast_to(rhs, shape, stream=s)
        return [self._solve(a, rhs)]

    def vjp(self, primals, cotangents, argnums, outputs):
        s = self.stream
        a, b = primals
        gb = self._solve(a, cotangents[0], transpose=True)
        out = []
        for i in argnums:
            if i == 1:
                out.append(sum_to_shape(gb, b._shape, s))
            else:
                ga = mx.negative(_mm(gb, _T(outputs[0], s), s), stream=s)
                out.append(sum_to_shape(self._mask(ga), a._shape, s))
        return out


class SolveTriangular(Solve):
    """``X`` with ``A X = B`` for ``A`` triangular: only its ``upper`` or lower triangle
    is read."""

    __slots__ = ("upper",)
    arity = 2
    upper: bool

    def output_shapes(self, inputs):
        return [_solve_shape(inputs[0].shape, inputs[1].shape, "linalg.solve_triangular")]

    def _solve(self, a, b, transpose=False):
        s = self.stream
        upper = self.upper != transpose
        return SolveTriangular(s, upper).again([_T(a, s) if transpose else a, b])[0]

    def _mask(self, a):
        return (mx.triu if self.upper else mx.tril)(a, stream=self.stream)


class Det(_Factorization):
    """The determinant of each square matrix."""

    __slots__ = ()
    arity = 1

    def output_shapes(self, inputs):
        return [inputs[0].shape[:-2]]

    def jvp(self, primals, tangents, argnums):
        s = self.stream
        a = primals[0]
        tr = _trace_of_solve(a, tangents[0], s)
        return [mx.multiply(self.again([a])[0], tr, stream=s)]

    def vjp(self, primals, cotangents, argnums, outputs):
        s = self.stream
        g = mx.multiply(cotangents[0], outputs[0], stream=s)
        return [_scaled_inverse_t(primals[0], g, s)]


def _trace_of_solve(a, d, s):
    """``trace(A^-1 dA)`` for each matrix."""
    return mx.sum(mx.multiply(_T(_inverse(a, "general", s), s), d, stream=s), axis=(-2, -1),
                  stream=s)


def _scaled_inverse_t(a, g, s):
    """``g * A^-T`` for each matrix (``g`` one number per matrix)."""
    g = mx.expand_dims(g, (-2, -1), stream=s)
    return mx.multiply(g, _T(_inverse(a, "general", s), s), stream=s)


class SlogDet(_Factorization):
    """The sign and the log of the absolute value of each determinant."""

    __slots__ = ()
    arity = 1

    def output_shapes(self, inputs):
        b = inputs[0].shape[:-2]
        return [b, b]

    def jvp(self, primals, tangents, argnums):
        return [None, _trace_of_solve(primals[0], tangents[0], self.stream)]

    def vjp(self, primals, cotangents, argnums, outputs):
        return [_scaled_inverse_t(primals[0], cotangents[1], self.stream)]


class Pinv(_Factorization):
    """The Moore-Penrose pseudo-inverse of each matrix (through its SVD)."""

    __slots__ = ()
    arity = 1

    def output_shapes(self, inputs):
        sh = inputs[0].shape
        return [sh[:-2] + (sh[-1], sh[-2])]

    @staticmethod
    def _complements(a, p, s):
        """``I - A P`` and ``I - P A``: the projectors onto the complements of the ranges
        of ``A`` and of ``A^T``."""
        q = mx.subtract(mx.eye(a._shape[-2], dtype=a._dtype, stream=s), _mm(a, p, s), stream=s)
        r = mx.subtract(mx.eye(a._shape[-1], dtype=a._dtype, stream=s), _mm(p, a, s), stream=s)
        return q, r

    # Golub and Pereyra: dP = -P dA P + P P^T dA^T (I - A P) + (I - P A) dA^T P^T P.
    def jvp(self, primals, tangents, argnums):
        s = self.stream
        a, d = primals[0], tangents[0]
        p = self.again([a])[0]
        q, r = self._complements(a, p, s)
        pt, dt_ = _T(p, s), _T(d, s)
        out = mx.negative(_mm(_mm(p, d, s), p, s), stream=s)
        out = mx.add(out, _mm(_mm(_mm(p, pt, s), dt_, s), q, s), stream=s)
        return [mx.add(out, _mm(_mm(_mm(r, dt_, s), pt, s), p, s), stream=s)]

    def vjp(self, primals, cotangents, argnums, outputs):
        s = self.stream
        a, p, g = primals[0], outputs[0], cotangents[0]
        q, r = self._complements(a, p, s)
        pt, gt = _T(p, s), _T(g, s)
        out = mx.negative(_mm(_mm(pt, g, s), pt, s), stream=s)
        out = mx.add(out, _mm(_mm(_mm(q, gt, s), p, s), pt, s), stream=s)
        return [mx.add(out, _mm(_mm(_mm(pt, p, s), gt, s), r, s), stream=s)]


# -- op functions ------------------------------------------------------------------------
def inv(a, *, stream=None) -> array:
    """Compute the inverse of a square matrix.

    Batched over the leading dimensions of ``a``. A singular matrix raises
    :class:`~lazyx.errors.LinAlgError` when evaluated.

    Args:
        a (array): input array of float32 or float64, at least 2-D.

    Returns:
        array: ``ainv`` such that ``a @ ainv = ainv @ a = eye(n)``.
    """
    a = _matrix(a, "linalg.inv")
    return _inverse(a, "general", stream)


def tri_inv(a, upper: bool = False, *, stream=None) -> array:
    """Compute the inverse of a triangular square matrix.

    Only the lower (``upper=False``) or upper triangle of ``a`` is read.

    Args:
        a (array): input array of float32 or float64, at least 2-D.
        upper (bool): whether ``a`` is upper triangular. Default: ``False``.

    Returns:
        array: the triangular inverse.
    """
    a = _matrix(a, "linalg.tri_inv")
    return _inverse(a, "upper" if upper else "lower", stream)


def cholesky(a, upper: bool = False, *, stream=None) -> array:
    """Compute the Cholesky factor of a symmetric positive definite matrix.

    The lower factor ``L`` (``a = L @ L.T``) reads the lower triangle of ``a``; the
    upper factor ``U`` (``a = U.T @ U``) reads the upper one. A matrix that is not
    positive definite raises :class:`~lazyx.errors.LinAlgError` when evaluated.

    Args:
        a (array): input array of float32 or float64, at least 2-D.
        upper (bool): return the upper factor. Default: ``False``.

    Returns:
        array: the triangular factor.
    """
    a = _matrix(a, "linalg.cholesky")
    return _one(Cholesky(to_stream(stream), bool(upper)), a)


def cholesky_inv(a, upper: bool = False, *, stream=None) -> array:
    """Compute the inverse of a symmetric positive definite matrix from its Cholesky
    factor.

    Args:
        a (array): the Cholesky factor (float32 or float64): lower (``a @ a.T`` is the
            matrix) or, with ``upper``, upper (``a.T @ a`` is the matrix).
        upper (bool): whether ``a`` is the upper factor. Default: ``False``.

    Returns:
        array: the inverse of the matrix ``a`` factors.
    """
    a = _matrix(a, "linalg.cholesky_inv")
    s = stream
    li = _inverse(a, "upper" if upper else "lower", s)
    return _mm(li, _T(li, s), s) if upper else _mm(_T(li, s), li, s)


def qr(a, *, stream=None):
    """The QR factorization of the input matrix.

    Args:
        a (array): input array of float32 or float64, at least 2-D, shape ``(..., M, N)``.

    Returns:
        tuple(array, array): ``Q`` ``(..., M, K)`` with orthonormal columns and upper
        triangular ``R`` ``(..., K, N)``, ``K = min(M, N)``, such that ``Q @ R = a``.

    Example:
        >>> q, r = qr(array([[2.0, 3.0], [1.0, 2.0]]))
    """
    a = _matrix(a, "linalg.qr", square=False)
    return tuple(QR(to_stream(stream)).again([a]))


def svd(a, compute_uv: bool = True, *, stream=None):
    """The singular value decomposition of the input matrix.

    Args:
        a (array): input array of float32, float64 or complex64, at least 2-D,
            shape ``(..., M, N)``.
        compute_uv (bool): return ``U``, ``S`` and ``Vt``; else ``S`` alone.
            Default: ``True``.

    Returns:
        tuple(array, array, array) or array: ``U`` ``(..., M, M)``, the singular values
        ``S`` ``(..., min(M, N))`` in descending order (real), and ``Vt`` ``(..., N, N)``,
        with ``a = U[..., :K] @ diag(S) @ Vt[..., :K, :]``.
    """
    a = _matrix(a, "linalg.svd", _REAL_OR_COMPLEX, square=False)
    outs = _one_svd(a, bool(compute_uv), stream)
    return tuple(outs) if compute_uv else outs[0]


def _eig_args(a, op):
    return _matrix(a, op, _REAL_OR_COMPLEX)


def _uplo(UPLO, op) -> str:
    if UPLO not in ("L", "U"):
        raise ArgumentError(f"[{op}] UPLO must be 'L' or 'U', got {UPLO!r}.")
    return UPLO


def eig(a, *, stream=None):
    """Compute the eigenvalues and right eigenvectors of a square matrix.

    Unlike :func:`numpy.linalg.eig` the results are complex64 even when the eigenvalues
    are real.

    Args:
        a (array): input array of float32, float64 or complex64, at least 2-D.

    Returns:
        tuple(array, array): the eigenvalues ``w`` and the unit-norm eigenvectors ``v``,
        column ``v[..., :, i]`` belonging to ``w[..., i]``.
    """
    a = _eig_args(a, "linalg.eig")
    return tuple(Eig(to_stream(stream), True).again([a]))


def eigvals(a, *, stream=None) -> array:
    """Compute the eigenvalues of a square matrix (complex64, in no particular order).

    Args:
        a (array): input array of float32, float64 or complex64, at least 2-D.

    Returns:
        array: the eigenvalues.
    """
    a = _eig_args(a, "linalg.eigvals")
    return Eig(to_stream(stream), False).again([a])[0]


def eigh(a, UPLO: str = "L", *, stream=None):
    """Compute the eigenvalues and eigenvectors of a real symmetric or complex Hermitian
    matrix.

    Args:
        a (array): input array of float32, float64 or complex64, at least 2-D.
        UPLO (str): read the lower (``"L"``) or upper (``"U"``) triangle. Default: ``"L"``.

    Returns:
        tuple(array, array): the eigenvalues in ascending order (real) and the
        orthonormal eigenvectors (columns).
    """
    a = _eig_args(a, "linalg.eigh")
    return tuple(Eigh(to_stream(stream), _uplo(UPLO, "linalg.eigh"), True).again([a]))


def eigvalsh(a, UPLO: str = "L", *, stream=None) -> array:
    """Compute the eigenvalues (ascending, real) of a real symmetric or complex Hermitian
    matrix.

    Args:
        a (array): input array of float32, float64 or complex64, at least 2-D.
        UPLO (str): read the lower (``"L"``) or upper (``"U"``) triangle. Default: ``"L"``.

    Returns:
        array: the eigenvalues.
    """
    a = _eig_args(a, "linalg.eigvalsh")
    return Eigh(to_stream(stream), _uplo(UPLO, "linalg.eigvalsh"), False).again([a])[0]


def lu_factor(a, *, stream=None):
    """Compute the compact LU factorization (partial pivoting) of a matrix.

    Args:
        a (array): input array of float32 or float64, at least 2-D.

    Returns:
        tuple(array, array): the packed ``LU`` (unit lower ``L`` below the diagonal,
        ``U`` on and above it) and the pivots (uint32, LAPACK's row swaps, 0-based).
    """
    a = _matrix(a, "linalg.lu_factor", square=False)
    lu, piv, _ = LUF(to_stream(stream)).again([a])
    return lu, piv


def lu(a, *, stream=None):
    """Compute the LU factorization of a matrix.

    Args:
        a (array): input array of float32 or float64, at least 2-D, ``(..., M, N)``.

    Returns:
        tuple(array, array, array): the row indices ``p`` (uint32, ``(..., M)``), unit
        lower triangular ``L`` ``(..., M, K)`` and upper triangular ``U`` ``(..., K, N)``
        such that ``a = L[p] @ U`` (2-D) or ``take_along_axis(L, p[..., None], -2) @ U``.
    """
    a = _matrix(a, "linalg.lu", square=False)
    s = stream
    packed, _, rows = LUF(to_stream(s)).again([a])
    m, n = a._shape[-2:]
    k = min(m, n)
    low = packed[..., :, :k] if n > k else packed
    up = packed[..., :k, :] if m > k else packed
    low = mx.add(mx.tril(low, -1, stream=s), mx.eye(m, k, dtype=a._dtype, stream=s), stream=s)
    return rows, low, mx.triu(up, stream=s)


def _solve_operands(a, b, op):
    a = a if type(a) is array else as_array(a)
    b = b if type(b) is array else as_array(b)
    d = _PROMOTE[(a._dtype, b._dtype)]
    if d not in _REAL:
        raise DtypeError(f"[{op}] Input arrays must promote to float32 or float64, got "
                         f"{a._dtype.name} and {b._dtype.name} (shapes {a._shape} and "
                         f"{b._shape}).")
    _check_shape(a, op)
    if len(b._shape) < 1:
        raise ShapeError(f"[{op}] b must have at least one dimension, got shape {b._shape}.")
    return cast(a, d), cast(b, d)


def _solve_with(prim, a, b, op, stream):
    vector, shown = len(b._shape) == 1, b._shape
    if vector:  # as NumPy 2 and MLX: only a 1-D b is a vector
        b = mx.expand_dims(b, -1, stream=stream)
    _solve_shape(a._shape, b._shape, op, shown)
    x = prim.again([a, b])[0]
    return mx.squeeze(x, -1, stream=stream) if vector else x


def solve(a, b, *, stream=None) -> array:
    """Compute the solution of the linear system ``a @ x = b``.

    ``b`` is a vector when it is 1-D, else a stack of matrices whose batch dimensions
    broadcast against those of ``a``. A singular ``a`` raises
    :class:`~lazyx.errors.LinAlgError` when evaluated.

    Args:
        a (array): square matrices ``(..., N, N)``.
        b (array): right-hand side ``(N,)`` or ``(..., N, K)``.

    Returns:
        array: ``x``, of the promoted dtype (float32 or float64).
    """
    a, b = _solve_operands(a, b, "linalg.solve")
    return _solve_with(Solve(to_stream(stream)), a, b, "linalg.solve", stream)


def solve_triangular(a, b, *, upper: bool = False, stream=None) -> array:
    """Compute the solution of ``a @ x = b`` for triangular ``a``.

    Args:
        a (array): triangular matrices ``(..., N, N)``; only the lower (or, with
            ``upper``, the upper) triangle is read.
        b (array): right-hand side ``(N,)`` or ``(..., N, K)``.
        upper (bool): whether ``a`` is upper triangular. Default: ``False``.

    Returns:
        array: ``x``, of the promoted dtype (float32 or float64).
    """
    op = "linalg.solve_triangular"
    a, b = _solve_operands(a, b, op)
    return _solve_with(SolveTriangular(to_stream(stream), bool(upper)), a, b, op, stream)


def _det_arg(a, op):
    a = a if type(a) is array else as_array(a)
    if a._dtype.kind == "c":
        raise DtypeError(f"[{op}] Complex inputs are not supported (got {a._dtype.name}, "
                         f"shape {a._shape}).")
    _check_shape(a, op)
    return a if a._dtype.kind == "f" else cast(a, dt.float32)


def det(a, *, stream=None) -> array:
    """Compute the determinant of a square matrix (of each, batched).

    Integer and boolean inputs give float32; floating ones keep their dtype.

    Args:
        a (array): input array, at least 2-D.

    Returns:
        array: the determinants, of shape ``a.shape[:-2]``.
    """
    return Det(to_stream(stream)).again([_det_arg(a, "linalg.det")])[0]


def slogdet(a, *, stream=None):
    """Compute the sign and the natural log of the absolute value of the determinant.

    A singular matrix gives sign 0 and ``-inf``; ``det = sign * exp(logabsdet)``.

    Args:
        a (array): input array, at least 2-D.

    Returns:
        tuple(array, array): ``sign`` and ``logabsdet``, each of shape ``a.shape[:-2]``.
    """
    return tuple(SlogDet(to_stream(stream)).again([_det_arg(a, "linalg.slogdet")]))


def pinv(a, *, stream=None) -> array:
    """Compute the Moore-Penrose pseudo-inverse of a matrix (through its SVD).

    Args:
        a (array): input array of float32 or float64, at least 2-D, ``(..., M, N)``.

    Returns:
        array: ``aplus`` ``(..., N, M)`` with ``a @ aplus @ a = a``.
    """
    a = _matrix(a, "linalg.pinv", square=False)
    return Pinv(to_stream(stream)).again([a])[0]


# -- norm ------------------------------------------------------------------------------
_MATRIX_ORDS = ("fro", "nuc", 1, -1, 2, -2, math.inf, -math.inf)


def _norm_axes(axis, ndim, op="linalg.norm") -> tuple:
    if isinstance(axis, (list, tuple)):
        axes = tuple(normalize_axis(x, ndim, f"[{op}] axis") for x in axis)
        if len(axes) > 2:
            raise ArgumentError(f"[{op}] Received too many axes for norm: {tuple(axis)} "
                                f"(one for a vector norm, two for a matrix norm).")
        if len(axes) == 2 and axes[0] == axes[1]:
            raise AxisError(f"[{op}] Repeated axis in {tuple(axis)}.")
        return axes
    return (normalize_axis(axis, ndim, f"[{op}] axis"),)


def _vector_norm(x, ord, axis, keepdims, s):
    kw = dict(axis=axis, keepdims=keepdims, stream=s)
    if ord is None or ord == 2:
        if x._dtype.kind == "c":
            sq = mx.square(mx.abs(x, stream=s), stream=s)
        else:
            sq = mx.square(x, stream=s)
        return mx.sqrt(mx.sum(sq, **kw), stream=s)
    ax = mx.abs(x, stream=s)
    if ord == math.inf:
        return mx.max(ax, **kw)
    if ord == -math.inf:
        return mx.min(ax, **kw)
    if ord == 0:
        return cast(mx.sum(mx.not_equal(x, 0, stream=s), **kw), ax._dtype, s)
    if ord == 1:
        return mx.sum(ax, **kw)
    return mx.power(mx.sum(mx.power(ax, ord, stream=s), **kw), 1.0 / ord, stream=s)


def _matrix_norm(x, ord, axes, keepdims, s):
    r, c = axes
    if ord == "fro":
        return _vector_norm(x, None, axes, keepdims, s)
    if ord in ("nuc", 2, -2):
        rest = [i for i in range(len(x._shape)) if i not in axes]
        m = mx.transpose(x, rest + [r, c], stream=s)  # the matrices on the last two axes
        sv = _one_svd(_matrix(m, "linalg.norm", _REAL_OR_COMPLEX, square=False), False, s)[0]
        red = {"nuc": mx.sum, 2: mx.max, -2: mx.min}[ord]
        out = red(sv, axis=-1, stream=s)
        if keepdims:
            out = mx.expand_dims(out, tuple(sorted(axes)), stream=s)
        return out
    ax = mx.abs(x, stream=s)
    # 1 / -1: largest / smallest column sum; inf / -inf: the same over rows.
    first, then = (r, c) if abs(ord) == 1 else (c, r)
    red = mx.max if ord > 0 else mx.min
    out = red(mx.sum(ax, axis=first, keepdims=True, stream=s), axis=then, keepdims=True,
              stream=s)
    return out if keepdims else mx.squeeze(out, axis=tuple(axes), stream=s)


def norm(a, /, ord=None, axis=None, keepdims: bool = False, *, stream=None) -> array:
    """Matrix or vector norm.

    ====================  ============================  ===========================
    ``ord``               norm for matrices             norm for vectors
    ====================  ============================  ===========================
    None                  Frobenius norm                2-norm
    'fro'                 Frobenius norm                --
    'nuc'                 nuclear norm (sum of S)       --
    inf                   max(sum(abs(x), axis=1))      max(abs(x))
    -inf                  min(sum(abs(x), axis=1))      min(abs(x))
    0                     --                            sum(x != 0)
    1                     max(sum(abs(x), axis=0))      sum(abs(x))
    -1                    min(sum(abs(x), axis=0))      as below
    2                     largest singular value        as below
    -2                    smallest singular value       as below
    other                 --                            sum(abs(x)**ord)**(1./ord)
    ====================  ============================  ===========================

    Args:
        a (array): input array. With ``axis=None`` it must be 1-D or 2-D unless ``ord``
            is None too (then the 2-norm of the flattened array is returned).
        ord (int, float or str, optional): order of the norm. Default: ``None``.
        axis (int or list(int), optional): one axis (vector norms) or two (matrix
            norms). Default: ``None``.
        keepdims (bool): keep the reduced axes as size one. Default: ``False``.

    Returns:
        array: the norm; integer inputs give float32, complex ones their real dtype.
    """
    op = "linalg.norm"
    a = a if type(a) is array else as_array(a)
    s = stream
    if a._dtype.kind in "biu":
        a = cast(a, dt.float32, s)
    nd = len(a._shape)
    if axis is None:
        if ord is None:
            out = _vector_norm(mx.reshape(a, (-1,), stream=s), None, 0, False, s)
            return mx.reshape(out, (1,) * nd, stream=s) if keepdims else out
        if nd not in (1, 2):
            raise ArgumentError(f"[{op}] With ord={ord!r} and axis=None the input must be "
                                f"1-D or 2-D, got shape {a._shape}.")
        axes = tuple(range(nd))
    else:
        axes = _norm_axes(axis, nd, op)
    if len(axes) == 1:
        if isinstance(ord, str):
            raise ArgumentError(f"[{op}] Norm {ord!r} only supported for matrices, but "
                                f"received 1 axis.")
        if ord is not None and not isinstance(ord, (int, float)):
            raise ArgumentError(f"[{op}] ord must be None, a number or a string, got "
                                f"{ord!r}.")
        return _vector_norm(a, ord, axes[0], keepdims, s)
    if ord is None:
        ord = "fro"
    if ord not in _MATRIX_ORDS:
        raise ArgumentError(f"[{op}] Invalid ord {ord!r} for a matrix norm: use one of "
                            f"'fro', 'nuc', 1, -1, 2, -2, inf or -inf.")
    return _matrix_norm(a, ord, axes, keepdims, s)


def cross(a, b, axis: int = -1, *, stream=None) -> array:
    """Compute the cross product of two arrays along an axis.

    The axis must have size 2 or 3 in each input; size 2 means a zero third component.

    Args:
        a (array): input array.
        b (array): input array.
        axis (int): the axis of the vectors. Default: ``-1``.

    Returns:
        array: the cross product (size 3 along ``axis``), of the promoted dtype.
    """
    op = "linalg.cross"
    a = a if type(a) is array else as_array(a)
    b = b if type(b) is array else as_array(b)
    s = stream
    parts = []
    for x in (a, b):
        ax = normalize_axis(axis, len(x._shape), f"[{op}] axis")
        n = x._shape[ax]
        if n not in (2, 3):
            raise ShapeError(f"[{op}] The specified axis must have size 2 or 3, got size {n} "
                             f"on axis {axis} of shape {x._shape}.")
        parts.append([mx.take(x, i, axis=ax, stream=s) for i in range(n)] + [None] * (3 - n))
    (a0, a1, a2), (b0, b1, b2) = parts

    def term(x, y, z, w):  # x * y - z * w, where None is zero
        p = None if x is None or y is None else mx.multiply(x, y, stream=s)
        q = None if z is None or w is None else mx.multiply(z, w, stream=s)
        if q is None:
            return p
        return mx.negative(q, stream=s) if p is None else mx.subtract(p, q, stream=s)

    comps = [term(a1, b2, a2, b1), term(a2, b0, a0, b2), term(a0, b1, a1, b0)]
    full = mx.multiply(a0, b0, stream=s)  # the shape and dtype of every component
    comps = [mx.zeros_like(full, stream=s) if c is None
             else mx.broadcast_to(c, full._shape, stream=s) for c in comps]
    return mx.stack(comps, axis=normalize_axis(axis, len(full._shape) + 1, f"[{op}] axis"),
                    stream=s)


PRIMITIVES = [Inverse, Cholesky, QR, SVD, Eigh, Eig, LUF, Solve, SolveTriangular, Det,
              SlogDet, Pinv]

OPS = {f"linalg.{f.__name__}": f for f in (
    norm, qr, svd, inv, pinv, tri_inv, cholesky, cholesky_inv, det, slogdet, eig, eigvals,
    eigh, eigvalsh, lu, lu_factor, solve, solve_triangular, cross)}
# MLX's top-level matrix_norm is linalg.norm itself.
OPS["matrix_norm"] = norm


lazyx_primitives, lazyx_ops = pack_hooks(PRIMITIVES, OPS)


def _spd(n, batch=()):
    """A well-conditioned symmetric positive definite matrix (stays one when scaled)."""
    x = uniform(batch + (n, n))
    return x @ x.swapaxes(-1, -2) + n * np.eye(n)


_EIG_EXAMPLE = np.array([[4.0, 1.0, 0.5], [0.3, 2.0, 0.2], [0.1, 0.4, 7.0]])


@hookimpl
def lazyx_examples():
    # Diagonally dominant: invertible, distinct real eigenvalues, well conditioned.
    def square(n):
        return uniform((n, n)) + np.diag(np.arange(1.0, n + 1.0) * 2.0)
    spd = _spd(3)
    tri = np.tril(square(3))
    return [
        (Inverse, example(inv, square(3))),
        (Inverse, example(lambda x: tri_inv(x, upper=True), square(3))),
        (Inverse, example(tri_inv, tri)),
        (Cholesky, example(cholesky, spd)),
        (Cholesky, example(lambda x: cholesky(x, upper=True), spd)),
        (QR, example(lambda x: list(qr(x)), uniform((4, 3)))),
        (QR, example(lambda x: list(qr(x)), square(3))),
        (SVD, example(lambda x: svd(x, compute_uv=False), uniform((3, 4)))),
        (SVD, example(lambda x: list(svd(x)), square(3))),
        (Eigh, example(lambda x: list(eigh(x)), spd)),
        (Eigh, example(lambda x: eigvalsh(x, UPLO="U"), square(3))),
        # A fixed matrix with well-separated real eigenvalues (about 1.9, 4.1, 7.0): a random
        # one can have close or complex-conjugate pairs, where finite differences of the
        # eigenvectors are ill-conditioned.
        (Eig, example(lambda x: list(eig(x)), _EIG_EXAMPLE.copy())),
        (Eig, example(eigvals, _EIG_EXAMPLE.copy())),
        (LUF, example(lambda x: lu_factor(x)[0], square(3))),
        (LUF, example(lambda x: list(lu(x)[1:]), square(3))),
        (Solve, example(solve, square(3), uniform((3,)))),
        (Solve, example(solve, square(3), uniform((2, 3, 2)))),
        (SolveTriangular, example(solve_triangular, tri, uniform((3, 2)))),
        (SolveTriangular, example(lambda a, b: solve_triangular(a, b, upper=True),
                                  square(3), uniform((3,)))),
        (Det, example(det, square(3))),
        (SlogDet, example(lambda x: list(slogdet(x)), square(3))),
        (Pinv, example(pinv, uniform((3, 2)))),
    ]
