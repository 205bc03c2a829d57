"""The training layer: data, the trainer and its recipe features, tasks, resume keys, and the embedded
benchmarks with their base models."""

from . import digit_grid  # noqa: E402,F401  (it registers --data digit-grid with the embedded data sets)
