"""The training layer: data, the trainer and its recipe features, tasks, resume keys, and the embedded
benchmarks with their base models."""
