"""Train a logistic-regression classifier on generated data with lazyx.core.

The data are two Gaussian blobs drawn with lazyx's counter-based random
generator; the gradient of the mean binary cross-entropy is written out by
hand (``X^T (sigmoid(X w + b) - y) / n``), and each step is evaluated once,
MLX-style, with ``mx.eval``.

Run: ``python examples/logistic_regression.py``
"""

import time

import lazyx.core as mx


def make_data(n: int, d: int, key):
    k1, k2, k3 = mx.random.split(key, 3)
    direction = mx.random.normal((d,), key=k1)
    labels = mx.random.bernoulli(0.5, (n,), key=k2)
    centers = mx.where(labels[:, None], direction, -direction)
    x = centers + 1.5 * mx.random.normal((n, d), key=k3)
    return x, labels.astype(mx.float32)


def loss_and_grads(w, b, x, y):
    logits = x @ w + b
    p = mx.sigmoid(logits)
    # Binary cross-entropy in the stable form: softplus(z) - y z.
    loss = mx.mean(mx.logaddexp(0.0, logits) - y * logits)
    err = (p - y) / x.shape[0]
    return loss, x.T @ err, mx.sum(err)


def accuracy(w, b, x, y):
    return mx.mean(((x @ w + b) > 0) == (y > 0.5))


def main(steps: int = 200, lr: float = 0.5):
    mx.random.seed(0)
    x, y = make_data(4096, 32, mx.random.key(42))
    w, b = mx.zeros((32,)), mx.array(0.0)
    start = time.perf_counter()
    for step in range(steps):
        loss, gw, gb = loss_and_grads(w, b, x, y)
        w, b = w - lr * gw, b - lr * gb
        mx.eval(w, b, loss)
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  accuracy {accuracy(w, b, x, y).item():.3f}")
    elapsed = time.perf_counter() - start
    print(f"{steps} steps in {elapsed:.2f} s ({steps / elapsed:.0f} steps/s)")
    return loss.item(), accuracy(w, b, x, y).item()


if __name__ == "__main__":
    main()
