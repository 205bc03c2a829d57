"""Reproduce benchmarks/results/digit-pairs-linear.md: how far a linear model gets on the embedded data sets.

A logistic regression on raw pixels (scikit-learn, L2, C=1) trained on each
embedded data set's training images (unshifted) and scored on its val images:
digits is nearly linearly separable; the sum of a digit pair is not, nor is
the digit grid's label (the sum of its digits mod 10, read from 16 cells). A
few other labellings of the same pairs are listed for comparison.

    python benchmarks/digit_pairs_linear.py

Writes benchmarks/results/digit-pairs-linear.{md,json}.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from studylib.files import write
from studylib.machine import load, machine, machine_line
from studylib.tables import table

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    from sklearn.linear_model import LogisticRegression

    from hetprune.training.embedded_data import _digits_split, digit_pairs, digits
    from hetprune.training.digit_grid import digit_grid

    started, load_start = time.time(), load()
    rows = []

    def fit(name, xtr, ytr, xva, yva):
        start = time.time()
        model = LogisticRegression(max_iter=2000, C=1.0).fit(xtr, ytr)
        acc = 100 * float((model.predict(xva) == yva).mean())
        majority = 100 * float(np.bincount(yva).max() / len(yva))
        rows.append((name, len(set(ytr.tolist())), acc, majority, time.time() - start))
        print(f"{name}: {acc:.1f}% (majority class {majority:.1f}%)", flush=True)

    d = digits()
    fit("digits (10 classes)", d.train.images.flatten(1).numpy(), d.train.labels.numpy(),
        d.val.tensors[0].flatten(1).numpy(), d.val.tensors[1].numpy())
    p = digit_pairs()
    fit("digit-pairs: sum (the benchmark's label)", p.train.images.flatten(1).numpy(), p.train.labels.numpy(),
        p.val.tensors[0].flatten(1).numpy(), p.val.tensors[1].numpy())
    g = digit_grid()
    fit("digit-grid: sum mod 10 (the benchmark's label)", g.train.images.flatten(1).numpy(),
        g.train.labels.numpy(), g.val.tensors[0].flatten(1).numpy(), g.val.tensors[1].numpy())
    # other labels of random pairs of the same split, for comparison (no blank halves)
    images, labels, train_idx, val_idx = _digits_split(450, 0)
    rng = np.random.default_rng(0)

    def pairs(pool, n):
        a, b = rng.choice(pool, n), rng.choice(pool, n)
        return np.concatenate([images[a], images[b]], axis=2).reshape(n, -1), labels[a], labels[b]

    xtr, atr, btr = pairs(train_idx, 4000)
    xva, ava, bva = pairs(val_idx, 1000)
    for name, f in [("pairs: left digit", lambda a, b: a), ("pairs: parity of the sum", lambda a, b: (a + b) % 2),
                    ("pairs: order (<, =, >)", lambda a, b: np.sign(a - b) + 1)]:
        fit(name, xtr, f(atr, btr), xva, f(ava, bva))
    res = {"command": "python benchmarks/digit_pairs_linear.py", "machine": machine(), "load_start": load_start,
           "load_end": load(), "seconds": round(time.time() - started, 1),
           "rows": [{"data": n, "classes": c, "top1": round(a, 2), "majority": round(m, 2), "seconds": round(t, 1)}
                    for n, c, a, m, t in rows]}
    write(ROOT / "benchmarks" / "results", "digit-pairs-linear", res, markdown(res))
    return 0


def markdown(res: dict) -> str:
    lines = ["# A linear model on the embedded data sets", "",
             f"Produced by `{res['command']}`: a logistic regression (scikit-learn, L2, C=1) on raw pixels, "
             "trained on the training images and scored on the val images.", "",
             machine_line(res) + ".", ""]
    lines += table(["data / label", "classes", "val top-1 %", "majority class %"],
                   [[r["data"], r["classes"], f"{r['top1']:.1f}", f"{r['majority']:.1f}"] for r in res["rows"]])
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
