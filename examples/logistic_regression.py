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
    direction = 0.15 * mx.random.normal((d,), key=k1)
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
    x_all, y_all = make_data(5120, 32, mx.random.key(42))
    x, y = x_all[:4096], y_all[:4096]
    x_test, y_test = x_all[4096:], y_all[4096:]
    w, b = mx.zeros((32,)), mx.array(0.0)
    start = time.perf_counter()
    for step in range(steps):
        loss, gw, gb = loss_and_grads(w, b, x, y)
        w, b = w - lr * gw, b - lr * gb
        mx.eval(w, b, loss)
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  train accuracy "
                  f"{accuracy(w, b, x, y).item():.3f}")
    elapsed = time.perf_counter() - start
    test_acc = accuracy(w, b, x_test, y_test).item()
    print(f"{steps} steps in {elapsed:.2f} s ({steps / elapsed:.0f} steps/s); "
          f"held-out accuracy {test_acc:.3f}")
    return loss.item(), test_acc


if __name__ == "__main__":
    main()
