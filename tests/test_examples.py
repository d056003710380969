import math
import os
import runpy

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def test_logistic_regression_learns():
    main = runpy.run_path(os.path.join(EXAMPLES, "logistic_regression.py"))["main"]
    loss, test_acc = main(steps=60)
    # The untrained loss is log(2); the blobs overlap, so the best accuracy is ~0.73.
    assert loss < 0.9 * math.log(2)
    assert 0.65 < test_acc <= 1.0
