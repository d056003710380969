"""training: the three model workloads of issue 15, side by side with PyTorch's eager CPU
step, MLX's CPU build and JAX's jit, in one run, one table each.

1. **MLP step** (784-512-512-10, batch 256, Adam): forward, cross-entropy, backward and
   the Adam update, waited for. lazyx and MLX run the same program (``nn.value_and_grad``
   + ``optimizer.update``, then ``eval(model, optimizer.state)``), compiled with the
   model's and the optimizer's state as ``inputs=``/``outputs=``; PyTorch runs
   ``loss.backward()`` + ``torch.optim.Adam.step()``; JAX one ``jax.jit`` of
   ``value_and_grad`` and an Adam written in ``jax.numpy`` (optax is not a dependency),
   its buffers donated.
2. **Transformer block** (sequence 128, width 256, 4 heads, batch 8, float32): pre-norm,
   ``x + attn(ln1(x))`` (causal), then ``x + linear2(gelu(linear1(ln2(x))))`` (MLP 4x,
   exact GELU). lazyx and MLX build it from the same code on their ``nn``
   (``MultiHeadAttention``, ``LayerNorm``, ``Linear``), PyTorch from ``nn.LayerNorm``,
   ``nn.Linear`` and ``F.scaled_dot_product_attention(is_causal=True)`` (the forward
   under ``torch.no_grad()``), JAX from ``jax.numpy`` and ``jax.nn.dot_product_attention``
   under ``jax.jit``, all with the same weights (their outputs and losses are checked to
   agree). Forward, and forward + backward: ``value_and_grad`` of ``mean(y ** 2)`` with
   respect to every parameter.
3. **Conv-net step** on 28x28 inputs (batch 128): Conv2d(1, 32, 3) - relu - Conv2d(32,
   64, 3) - relu - MaxPool2d(2) - Linear(9216, 128) - relu - Linear(128, 10),
   cross-entropy, Adam; channels-last in lazyx, MLX and JAX, NCHW in PyTorch.

Every column is checked to learn (its loss falls over a few steps) or to agree with the
others before it is timed. Timings are the fastest of interleaved repeats
(``timing.compare(..., statistic=min)``: the machine may be shared), printed with the
ratio to PyTorch eager and the targets: issue 15's (the block's forward within 1.3x of
PyTorch eager) and issue 16's (MLP compiled >= 1.2x PyTorch eager's steps/s and >= JAX
jit's, MLP eager >= 0.9x; the block's forward + backward eager within 1.1x of PyTorch
eager, compiled faster).
Run: ``python -m benchmarks.training [--quick] [--only mlp,block,conv]``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.peers import load  # noqa: E402
from benchmarks.timing import compare, machine_load  # noqa: E402

SIZES = (784, 512, 512, 10)
BATCH = 256
SEQ, WIDTH, HEADS, BLOCK_BATCH = 128, 256, 4, 8
CONV_BATCH, CLASSES = 128, 10
REFERENCE = "PyTorch eager"

# ----------------------------------------------------------------------------- shared


def _adam_jax(jax, loss_fn, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """A jitted Adam step (bias-corrected, as PyTorch's) on a parameter tree:
    ``step(params, m, v, t, x, y) -> (loss, params, m, v)``, its buffers donated."""
    jnp = jax.numpy
    tmap = jax.tree_util.tree_map

    def step(params, m, v, t, x, y):
        loss, g = jax.value_and_grad(loss_fn)(params, x, y)
        m = tmap(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = tmap(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        params = tmap(lambda p, m, v: p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps),
                      params, m, v)
        return loss, params, m, v
    return jax.jit(step, donate_argnums=(0, 1, 2))


def _jax_trainer(jax, params, loss_fn, x, y):
    """``run()``: one jitted Adam step of ``loss_fn`` on ``(x, y)``, waited for."""
    jnp = jax.numpy
    step = _adam_jax(jax, loss_fn)
    params = {k: jnp.asarray(v) for k, v in params.items()}
    st = {"p": params, "m": jax.tree_util.tree_map(jnp.zeros_like, params),
          "v": jax.tree_util.tree_map(jnp.zeros_like, params), "t": 0}
    x, y = jnp.asarray(x), jnp.asarray(y)

    def run():
        st["t"] += 1
        loss, st["p"], st["m"], st["v"] = step(st["p"], st["m"], st["v"],
                                               jnp.float32(st["t"]), x, y)
        return loss.block_until_ready()
    return run


def _mlx_like_trainer(core, nn, optim, model, x, y, compiled: bool):
    """``run()``: one step of the MLX training program (``nn.value_and_grad`` +
    ``optimizer.update``, compiled with the state as ``inputs``/``outputs``), waited for;
    the same code drives lazyx's and MLX's ``core``/``nn``/``optim``."""
    optimizer = optim.Adam(learning_rate=1e-3)
    optimizer.init(model.trainable_parameters())
    core.eval(model.parameters(), optimizer.state)

    def loss_fn(model, x, y):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        optimizer.update(model, grads)
        return loss

    if compiled:
        step = partial(core.compile, inputs=state, outputs=state)(step)
    x, y = core.array(x), core.array(y)

    def run():
        loss = step(x, y)
        core.eval(loss, state)
        return loss
    return run


def _torch_trainer(torch, model, x, y, device: str = "cpu", compiled: bool = False):
    """``run()``: one PyTorch step (``loss.backward()`` + ``Adam.step()``) of ``model`` on
    ``device``, its forward under ``torch.compile`` when ``compiled``."""
    model = model.to(device)
    forward = torch.compile(model) if compiled else model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.from_numpy(x).to(device), torch.from_numpy(y.astype(np.int64)).to(device)

    def run():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(forward(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return run


def _scalar(v) -> float:
    return float(np.asarray(v.item() if hasattr(v, "item") else v))


def check_learns(fns) -> None:
    """Every column trains: its loss falls over a few steps on the fixed batch (a benchmark
    of a step that does not learn is void)."""
    for name, fn in fns.items():
        first = _scalar(fn())
        for _ in range(4):
            last = _scalar(fn())
        assert last < first, f"{name}: the loss did not fall ({first} -> {last})"


def measure(fns: dict, budget_s: float) -> dict:
    """{name: seconds}: the fastest of interleaved repeats."""
    return compare(fns, budget_s=budget_s, rounds=4, warmup=3, statistic=min)


def table(title: str, times: dict, rate: str, targets=()) -> None:
    """One table: each column's ms and rate (``rate`` per second), its time over PyTorch
    eager's, then the ``targets`` lines ``(text, column, bound[, other column])`` met or
    missed (a bound on time / PyTorch eager's, or / the other column's)."""
    ref = times.get(REFERENCE)
    print(f"\n{title}")
    print(f"  {'column':22} {'ms':>9} {rate + '/s':>10}  {'time / ' + REFERENCE:>22}")
    for name, sec in times.items():
        ratio = f"{sec / ref:22.2f}x" if ref else ""
        print(f"  {name:22} {sec * 1e3:9.2f} {1 / sec:10.1f}  {ratio}")
    for text, col, bound, *against in targets:
        base = times.get(against[0]) if against else ref
        if base and col in times:
            r = times[col] / base
            print(f"  target: {text}: {r:.3f}x <= {bound:.3g} -> {'met' if r <= bound else 'MISSED'}")

# ----------------------------------------------------------------------------- MLP step


def _mlp_data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], BATCH).astype(np.int32)
    return x, y


def _mlx_like_mlp(core, nn, optim, compiled: bool):
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Linear(i, o) for i, o in zip(SIZES[:-1], SIZES[1:])]

        def __call__(self, x):
            for layer in self.layers[:-1]:
                x = nn.relu(layer(x))
            return self.layers[-1](x)

    core.random.seed(0)
    return _mlx_like_trainer(core, nn, optim, MLP(), *_mlp_data(), compiled)


def _torch_mlp(torch):
    torch.manual_seed(0)
    layers = []
    for i, o in zip(SIZES[:-1], SIZES[1:]):
        layers += [torch.nn.Linear(i, o), torch.nn.ReLU()]
    return _torch_trainer(torch, torch.nn.Sequential(*layers[:-1]), *_mlp_data())


def _uniform_linear(rng, i, o):
    bound = 1 / math.sqrt(i)
    return (rng.uniform(-bound, bound, (o, i)).astype(np.float32),
            rng.uniform(-bound, bound, (o,)).astype(np.float32))


def _jax_mlp(jax):
    jnp = jax.numpy
    rng = np.random.default_rng(0)
    params = {}
    for n, (i, o) in enumerate(itertools.pairwise(SIZES)):
        params[f"w{n}"], params[f"b{n}"] = _uniform_linear(rng, i, o)
    depth = len(SIZES) - 1

    def loss_fn(p, x, y):
        for n in range(depth):
            x = x @ p[f"w{n}"].T + p[f"b{n}"]
            if n < depth - 1:
                x = jax.nn.relu(x)
        logp = jax.nn.log_softmax(x)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))
    return _jax_trainer(jax, params, loss_fn, *_mlp_data())


def mlp_callables(peers) -> dict:
    import lazyx.nn
    import lazyx.optimizers
    lx = peers["lazyx"].module
    out = {"lazyx eager": _mlx_like_mlp(lx, lazyx.nn, lazyx.optimizers, False),
           "lazyx compiled": _mlx_like_mlp(lx, lazyx.nn, lazyx.optimizers, True)}
    if "PyTorch" in peers:
        out[REFERENCE] = _torch_mlp(peers["PyTorch"].module)
    if "MLX" in peers:
        import mlx.nn
        import mlx.optimizers
        mx = peers["MLX"].module
        out["MLX eager"] = _mlx_like_mlp(mx, mlx.nn, mlx.optimizers, False)
        out["MLX compiled"] = _mlx_like_mlp(mx, mlx.nn, mlx.optimizers, True)
    if "JAX" in peers:
        out["JAX jit"] = _jax_mlp(peers["JAX"].module)
    return out


def bench_mlp(peers, budget_s: float) -> None:
    fns = mlp_callables(peers)
    check_learns(fns)
    table(f"MLP {'-'.join(map(str, SIZES))} training step, batch {BATCH}, Adam",
          measure(fns, budget_s), "steps",
          [("issue 16: MLP compiled >= 1.2x PyTorch eager's steps/s (time / PyTorch eager)",
            "lazyx compiled", 1 / 1.2),
           ("issue 16: MLP compiled >= JAX jit's steps/s (time / JAX jit)", "lazyx compiled", 1.0,
            "JAX jit"),
           ("issue 16: MLP eager >= 0.9x PyTorch eager's steps/s", "lazyx eager", 1 / 0.9)])

# ----------------------------------------------------------------------------- block


def _block_weights() -> dict:
    """The block's parameters under MLX's names, NumPy float32 (``Linear.weight`` is
    ``(out, in)`` in every framework here)."""
    rng = np.random.default_rng(1)
    w = {}
    for ln in ("ln1", "ln2"):
        w[f"{ln}.weight"] = (1 + 0.1 * rng.standard_normal(WIDTH)).astype(np.float32)
        w[f"{ln}.bias"] = (0.1 * rng.standard_normal(WIDTH)).astype(np.float32)
    for proj in ("query_proj", "key_proj", "value_proj", "out_proj"):
        w[f"attention.{proj}.weight"] = _uniform_linear(rng, WIDTH, WIDTH)[0]
    w["linear1.weight"], w["linear1.bias"] = _uniform_linear(rng, WIDTH, 4 * WIDTH)
    w["linear2.weight"], w["linear2.bias"] = _uniform_linear(rng, 4 * WIDTH, WIDTH)
    return w


def _block_input():
    return np.random.default_rng(2).standard_normal((BLOCK_BATCH, SEQ, WIDTH)).astype(np.float32)


def _mlx_like_block(core, nn, compiled: bool):
    """``(forward, forward_backward)`` of the block on ``core``/``nn`` (lazyx's or MLX's),
    each returning what it computed, evaluated."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(WIDTH)
            self.attention = nn.MultiHeadAttention(WIDTH, HEADS)
            self.ln2 = nn.LayerNorm(WIDTH)
            self.linear1 = nn.Linear(WIDTH, 4 * WIDTH)
            self.linear2 = nn.Linear(4 * WIDTH, WIDTH)

        def __call__(self, x):
            y = self.ln1(x)
            x = x + self.attention(y, y, y, mask="causal")
            return x + self.linear2(nn.gelu(self.linear1(self.ln2(x))))

    model = Block()
    model.load_weights([(k, core.array(v)) for k, v in _block_weights().items()])
    core.eval(model.parameters())
    x = core.array(_block_input())

    def loss_fn(model, x):
        y = model(x)
        return (y * y).mean()

    forward = model
    loss_and_grad = partial(nn.value_and_grad(model, loss_fn), model)
    if compiled:
        forward = partial(core.compile, inputs=model.state)(model)
        # value_and_grad puts its traced parameters into the model: they come back out
        # (as MLX's, lazyx's compile leaves the traced arrays otherwise).
        loss_and_grad = partial(core.compile, inputs=model.state,
                                outputs=model.state)(loss_and_grad)

    def fwd():
        y = forward(x)
        core.eval(y)
        return y

    def fwd_bwd():
        out = loss_and_grad(x)
        core.eval(out)
        return out
    return fwd, fwd_bwd


def _torch_block(torch):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
            self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH, bias=False)
                                              for _ in range(4))
            self.linear1, self.linear2 = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

        def heads(self, t):
            return t.view(t.shape[0], t.shape[1], HEADS, -1).transpose(1, 2)

        def forward(self, x):
            y = self.ln1(x)
            a = F.scaled_dot_product_attention(self.heads(self.q(y)), self.heads(self.k(y)),
                                               self.heads(self.v(y)), is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(x.shape))
            return x + self.linear2(F.gelu(self.linear1(self.ln2(x))))

    model = Block()
    mlx_name = {"q": "attention.query_proj", "k": "attention.key_proj",
                "v": "attention.value_proj", "o": "attention.out_proj"}
    w = _block_weights()
    state = {}
    for key in model.state_dict():
        module, param = key.split(".")
        state[key] = torch.from_numpy(w[f"{mlx_name.get(module, module)}.{param}"])
    model.load_state_dict(state)
    x = torch.from_numpy(_block_input())

    def fwd():
        with torch.no_grad():
            return model(x)

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        loss = (model(x) ** 2).mean()
        loss.backward()
        return loss, {k: p.grad for k, p in model.named_parameters()}
    return fwd, fwd_bwd


def _jax_block(jax):
    jnp = jax.numpy

    def layer_norm(x, w, b, eps=1e-5):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + eps) * w + b

    def block(p, x):
        def heads(t):  # (B, L, heads, d): dot_product_attention's layout
            return t.reshape(*t.shape[:-1], HEADS, -1)
        y = layer_norm(x, p["ln1.weight"], p["ln1.bias"])
        q, k, v = (heads(y @ p[f"attention.{n}_proj.weight"].T) for n in ("query", "key", "value"))
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(x.shape)
        x = x + a @ p["attention.out_proj.weight"].T
        h = layer_norm(x, p["ln2.weight"], p["ln2.bias"])
        h = jax.nn.gelu(h @ p["linear1.weight"].T + p["linear1.bias"], approximate=False)
        return x + h @ p["linear2.weight"].T + p["linear2.bias"]

    params = {k: jnp.asarray(v) for k, v in _block_weights().items()}
    x = jnp.asarray(_block_input())
    forward = jax.jit(block)
    loss_and_grad = jax.jit(jax.value_and_grad(lambda p, x: (block(p, x) ** 2).mean()))

    def fwd():
        return forward(params, x).block_until_ready()

    def fwd_bwd():
        return jax.block_until_ready(loss_and_grad(params, x))
    return fwd, fwd_bwd


def block_callables(peers) -> tuple[dict, dict]:
    """``({column: forward}, {column: forward_backward})``."""
    import lazyx.nn
    lx = peers["lazyx"].module
    cols = {"lazyx eager": _mlx_like_block(lx, lazyx.nn, False),
            "lazyx compiled": _mlx_like_block(lx, lazyx.nn, True)}
    if "PyTorch" in peers:
        cols[REFERENCE] = _torch_block(peers["PyTorch"].module)
    if "MLX" in peers:
        import mlx.nn
        mx = peers["MLX"].module
        cols["MLX eager"] = _mlx_like_block(mx, mlx.nn, False)
        cols["MLX compiled"] = _mlx_like_block(mx, mlx.nn, True)
    if "JAX" in peers:
        cols["JAX jit"] = _jax_block(peers["JAX"].module)
    return {k: v[0] for k, v in cols.items()}, {k: v[1] for k, v in cols.items()}


def check_block(fwd: dict, fwd_bwd: dict) -> None:
    """Every column computes the same block: outputs and losses agree with lazyx eager's
    (float32 sums of 1024-wide products: a loose tolerance)."""
    ref_y = np.asarray(fwd["lazyx eager"]())
    ref_loss = _scalar(fwd_bwd["lazyx eager"]()[0])
    for name, forward in fwd.items():
        y = np.asarray(forward())
        err = np.abs(y - ref_y).max() / np.abs(ref_y).max()
        assert err < 1e-3, f"{name}: the block's output differs from lazyx's ({err:.1e})"
        loss = _scalar(fwd_bwd[name]()[0])
        assert abs(loss - ref_loss) <= 1e-3 * abs(ref_loss), \
            f"{name}: the loss differs from lazyx's ({loss} vs {ref_loss})"


def bench_block(peers, budget_s: float) -> None:
    fwd, fwd_bwd = block_callables(peers)
    check_block(fwd, fwd_bwd)
    shape = f"sequence {SEQ}, width {WIDTH}, {HEADS} heads, batch {BLOCK_BATCH}"
    table(f"Transformer block forward ({shape})", measure(fwd, budget_s), "calls",
          [("block forward eager within 1.3x of PyTorch eager", "lazyx eager", 1.3),
           ("block forward compiled within 1.3x", "lazyx compiled", 1.3)])
    table(f"Transformer block forward + backward ({shape})", measure(fwd_bwd, budget_s),
          "calls",
          [("issue 16: block fwd+bwd eager within 1.1x of PyTorch eager", "lazyx eager", 1.1),
           ("issue 16: block fwd+bwd compiled faster than PyTorch eager", "lazyx compiled", 1.0)])

# ----------------------------------------------------------------------------- conv-net


def _conv_data(channels_last: bool):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((CONV_BATCH, 28, 28, 1)).astype(np.float32)
    y = rng.integers(0, CLASSES, CONV_BATCH).astype(np.int32)
    return (x if channels_last else x.transpose(0, 3, 1, 2).copy()), y


def _mlx_like_convnet(core, nn, optim, compiled: bool):
    class ConvNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3)
            self.conv2 = nn.Conv2d(32, 64, 3)
            self.pool = nn.MaxPool2d(2)
            self.fc1 = nn.Linear(12 * 12 * 64, 128)
            self.fc2 = nn.Linear(128, CLASSES)

        def __call__(self, x):
            x = self.pool(nn.relu(self.conv2(nn.relu(self.conv1(x)))))
            return self.fc2(nn.relu(self.fc1(x.reshape(x.shape[0], -1))))

    core.random.seed(0)
    return _mlx_like_trainer(core, nn, optim, ConvNet(), *_conv_data(True), compiled)


def _torch_convnet(torch):
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(12 * 12 * 64, 128),
                          nn.ReLU(), nn.Linear(128, CLASSES))
    return _torch_trainer(torch, model, *_conv_data(False))


def _jax_convnet(jax):
    jnp, lax = jax.numpy, jax.lax
    rng = np.random.default_rng(0)

    def conv_w(cin, cout):  # HWIO
        bound = 1 / math.sqrt(cin * 9)
        return (rng.uniform(-bound, bound, (3, 3, cin, cout)).astype(np.float32),
                rng.uniform(-bound, bound, (cout,)).astype(np.float32))
    p = {}
    p["c1"], p["c1b"] = conv_w(1, 32)
    p["c2"], p["c2b"] = conv_w(32, 64)
    p["f1"], p["f1b"] = _uniform_linear(rng, 12 * 12 * 64, 128)
    p["f2"], p["f2b"] = _uniform_linear(rng, 128, CLASSES)
    dn = ("NHWC", "HWIO", "NHWC")

    def loss_fn(p, x, y):
        x = jax.nn.relu(lax.conv_general_dilated(x, p["c1"], (1, 1), "VALID",
                                                 dimension_numbers=dn) + p["c1b"])
        x = jax.nn.relu(lax.conv_general_dilated(x, p["c2"], (1, 1), "VALID",
                                                 dimension_numbers=dn) + p["c2b"])
        x = lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        x = jax.nn.relu(x.reshape(x.shape[0], -1) @ p["f1"].T + p["f1b"])
        logp = jax.nn.log_softmax(x @ p["f2"].T + p["f2b"])
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))
    return _jax_trainer(jax, p, loss_fn, *_conv_data(True))


def conv_callables(peers, with_mlx: bool) -> dict:
    import lazyx.nn
    import lazyx.optimizers
    lx = peers["lazyx"].module
    out = {"lazyx eager": _mlx_like_convnet(lx, lazyx.nn, lazyx.optimizers, False),
           "lazyx compiled": _mlx_like_convnet(lx, lazyx.nn, lazyx.optimizers, True)}
    if "PyTorch" in peers:
        out[REFERENCE] = _torch_convnet(peers["PyTorch"].module)
    if "MLX" in peers and with_mlx:
        import mlx.nn
        import mlx.optimizers
        mx = peers["MLX"].module
        out["MLX compiled"] = _mlx_like_convnet(mx, mlx.nn, mlx.optimizers, True)
    if "JAX" in peers:
        out["JAX jit"] = _jax_convnet(peers["JAX"].module)
    return out


def bench_conv(peers, budget_s: float) -> None:
    fns = conv_callables(peers, with_mlx=True)
    check_learns(fns)
    # MLX's CPU convolution takes seconds a step: timed alone, a few steps, not
    # interleaved (it would take the whole budget of every round).
    slow = {}
    if "MLX compiled" in fns:
        mlx_step = fns.pop("MLX compiled")
        slow["MLX compiled"] = min(_wall(mlx_step) for _ in range(2))
    times = measure(fns, budget_s)
    times.update(slow)
    table(f"Conv-net training step, 28x28, batch {CONV_BATCH}, Adam "
          "(conv 1->32->64 3x3, max-pool 2, 9216-128-10)", times, "steps",
          [("conv-net step eager (no target; report past 1.5x)", "lazyx eager", 1.5)])


def _wall(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0

# ----------------------------------------------------------------------------- main


BENCHES = {"mlp": bench_mlp, "block": bench_block, "conv": bench_conv}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="less time per figure")
    ap.add_argument("--only", default=",".join(BENCHES),
                    help=f"comma-separated subset of {', '.join(BENCHES)}")
    args = ap.parse_args(argv)
    peers = load()
    print(f"machine load before: {machine_load():.0%}; "
          + "; ".join(f"{p.name} {p.version}" + (f" ({', '.join(p.notes)})" if p.notes else "")
                      for p in peers.values() if p.name in ("lazyx", "PyTorch", "MLX", "JAX")))
    print("fastest of interleaved repeats (timing.compare(..., statistic=min)); "
          "the machine may be shared, so figures are noisy")
    for name in args.only.split(","):
        BENCHES[name](peers, budget_s=1.5 if args.quick else 6.0)


if __name__ == "__main__":
    main()
