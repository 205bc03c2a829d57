"""A merger plugin for benchmarks/quantize.py: ``linear-merge`` that also keeps each model's unmerged twin.

The study compares INT8 on the very same pruned models with merging off and on. The pipeline merges after
the fine-tune, so the unmerged model is the one the merger is handed: this merger saves its weights (as
``<model hash of the merged result>.safetensors`` in the folder ``$HETPRUNE_UNMERGED_DIR``), then merges
exactly as ``linear-merge`` does, so the runs, their budgets and their models are those of the default.

    hetprune compare --plugin quantize_unmerged --set 'mergers=[keep-unmerged]' ...   (benchmarks/ on the path)
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import hetprune
from hetprune.model import surgery

ENV = "HETPRUNE_UNMERGED_DIR"
NAME = "keep-unmerged"


class KeepUnmerged:
    """``linear-merge`` (fc2·fc1 of every linear MLP where it lowers MACs), keeping the unmerged weights."""

    name = NAME
    fold_norm = False

    def merge(self, model):
        from hetprune.core.io import save_weights
        from hetprune.model.spec import model_hash

        before = copy.deepcopy(model)
        merged = sorted(surgery.merge_all(model, fold_norm=self.fold_norm))
        folder = os.environ.get(ENV)
        if folder and merged:
            save_weights(Path(folder) / f"{model_hash(model)}.safetensors", before)
        return merged


@hetprune.hookimpl
def register_mergers(register):
    register(KeepUnmerged)
