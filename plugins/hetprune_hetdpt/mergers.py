"""Mergers: fold linear MLPs into one layer, optionally with norm2's affine."""

from hetprune.plugin_api import surgery


class LinearMerge:
    """Merge fc2·fc1 of every linear MLP where it lowers MACs (LayerScale folded in)."""

    name = "linear-merge"
    fold_norm = False

    def merge(self, model):
        return sorted(surgery.merge_all(model, fold_norm=self.fold_norm))


class LayerNormFold(LinearMerge):
    """Like linear-merge, and also fold the preceding LayerNorm's affine into the merged layer."""

    name = "ln-fold"
    fold_norm = True
