"""The ``isomorphic`` width pruner: Torch-Pruning's isomorphic global pruning
(Fang et al., ECCV 2024) driven to a MAC target.

One pruning pass removes, with one ratio ``r``:

* channels of every isomorphic scope (MLP hidden of all GELU MLPs ranked
  together, linear MLPs together, the residual/embedding width alone) at ratio
  ``r`` — Torch-Pruning's ``isomorphic=True, global_pruning=True``;
* whole heads, ranked globally across blocks, at ``head_share * r``;
* head dimensions, ranked across all attention modules, at
  ``head_dim_share * r`` (the Isomorphic-Pruning DeiT-2.6G setting is
  ratio 0.6, heads 0.6, head dims 0.3: shares 1.0 and 0.5, our defaults).

The classifier head's outputs are never pruned; channel counts are rounded to
``round_to``. The ratio is searched (safeguarded secant on MACs(r), trials on
copies) until ``count_macs <= target`` and within ``tolerance`` below it.
Where one rounding step jumps over the window (``round_to`` channels of the
embedding change every layer; a head or ``round_to`` head dims change a whole
attention), a second "trim" search on the model just above the target prunes
MLP hidden channels only, the finest step there is. (Torch-Pruning applies
``round_to`` to an attention's total width, so head dims drop in steps of
``round_to`` per head: DeiT-B's 64 become 56, 48, 40...)

``steps > 1`` prunes progressively: ``steps`` searches to geometrically
spaced targets, importance re-estimated (Taylor: fresh gradients) in between.

Works on depth-pruned models: a `HetBlock` has no
attention to prune; a `MergedMlp` is one
``D x D`` linear whose both sides are the residual width, so it is pruned
with the embedding; an MLP whose activation was removed but which is not
merged keeps a prunable hidden width.

Gated MLPs (timm ``GluMlp``/``SwiGLUPacked``, ``SwiGLU``) keep the same
channels in both halves. Torch-Pruning cannot prune a packed gated fc1 (one
linear chunked in two), so the adapter's ``WidthInfo.prepare`` shows it the
two halves as separate linears for the pass and ``restore`` packs them again.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import dataclass, fields
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from hetprune import HetpruneError
from hetprune.plugin_api import Section, number, setting, whole, widths
from hetprune.plugin_api import macs as mac

IMPORTANCES = ("magnitude", "taylor", "random")


def _importance(name: str):
    import torch_pruning as tp

    if name == "magnitude":
        return tp.importance.GroupMagnitudeImportance(p=2)
    if name == "taylor":
        return tp.importance.GroupTaylorImportance()
    if name == "random":
        return tp.importance.RandomImportance()
    raise HetpruneError(f"width importance must be one of {IMPORTANCES}, got {name!r}")


def adopt(model: nn.Module, other: nn.Module) -> None:
    """Make ``model`` (the caller's object) hold ``other``'s modules, parameters and attributes."""
    model.__dict__.clear()
    model.__dict__.update(other.__dict__)


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _copy(model: nn.Module, grads: dict[str, torch.Tensor] | None) -> nn.Module:
    """A deep copy, gradients included (``copy.deepcopy`` drops them; Taylor importance needs them)."""
    twin = copy.deepcopy(model)
    if grads:
        for n, p in twin.named_parameters():
            if n in grads:
                p.grad = grads[n].clone()
    return twin


@dataclass(frozen=True)
class IsomorphicOptions(Section):
    """The isomorphic width pruner's options (``width.pruner_options``)."""

    section: ClassVar[str] = "width.pruner_options"

    importance: str = setting("magnitude", f"channel importance: {', '.join(IMPORTANCES)}")
    round_to: int = setting(8, "keep head dims, MLP hidden and embedding widths multiples of this")
    prune_heads: bool = setting(True, "remove whole heads too")
    head_share: float = setting(1.0, "how much of the pruning ratio heads take")
    head_dim_share: float = setting(0.5, "how much of the pruning ratio head dims take")
    prune_embed: bool = setting(True, "prune the embedding width too")
    max_ratio: float = setting(0.9, "the largest channel ratio one pass removes")
    tolerance: float = setting(0.02, "how close under the MAC target the search stops")
    steps: int = setting(1, "passes to the target")
    max_trials: int = setting(12, "ratio trials of the search")
    taylor_batches: int | None = setting(None, "batches Taylor importance reads (null: the scoring batches)")

    def __post_init__(self):
        if self.importance not in IMPORTANCES:
            raise HetpruneError(f"width importance must be one of {IMPORTANCES}, got {self.importance!r}")
        if not whole(self.round_to, 1):
            raise HetpruneError(f"round_to must be an integer >= 1, got {self.round_to!r}")
        if not number(self.max_ratio) or not 0 < self.max_ratio < 1:
            raise HetpruneError(f"max_ratio must be within (0, 1), got {self.max_ratio}")
        if not 0 <= self.head_share <= 1 / self.max_ratio or not 0 <= self.head_dim_share <= 1 / self.max_ratio:
            raise HetpruneError(f"head_share and head_dim_share must be within [0, 1/max_ratio], "
                                f"got {self.head_share}, {self.head_dim_share}")
        if not number(self.tolerance) or not 0 < self.tolerance < 1:
            raise HetpruneError(f"tolerance must be within (0, 1), got {self.tolerance}")
        if not whole(self.steps, 1) or not whole(self.max_trials, 2):
            raise HetpruneError(f"need steps >= 1 and max_trials >= 2, got {self.steps}, {self.max_trials}")
        self.need("taylor_batches", self.taylor_batches is None or whole(self.taylor_batches, 1),
                  "a whole number >= 1 or null")


class IsomorphicWidthPruner:
    """Torch-Pruning isomorphic global width pruning (heads, head dims, MLP hidden, embedding) to a MAC target."""

    name = "isomorphic"
    Options = IsomorphicOptions
    description = ("Torch-Pruning isomorphic global width pruning (heads, head dims, MLP hidden, embedding) "
                   "to a MAC target")

    def __init__(self, **options) -> None:
        o = IsomorphicOptions.from_dict(options, where="the isomorphic width pruner's options (width.pruner_options)")
        self.importance, self.round_to, self.prune_heads = o.importance, o.round_to, o.prune_heads
        self.head_share, self.head_dim_share, self.prune_embed = o.head_share, o.head_dim_share, o.prune_embed
        self.max_ratio, self.tolerance, self.steps = o.max_ratio, o.tolerance, o.steps
        self.max_trials, self.taylor_batches = o.max_trials, o.taylor_batches
        self.last_report: dict = {}

    def options(self) -> dict:
        return IsomorphicOptions.from_dict({f.name: getattr(self, f.name) for f in fields(IsomorphicOptions)}).to_dict()

    # -- one pass ----------------------------------------------------------------
    def prune_once(self, model: nn.Module, ratio: float, example: torch.Tensor, trim: bool = False) -> None:
        """One Torch-Pruning pass at channel ratio ``ratio``, in place; attention attributes fixed after.

        ``trim``: prune MLP hidden channels only (embedding and attention frozen), the finest step there is.
        """
        import torch_pruning as tp

        info = widths.width_info(model)
        attns = info.attentions  # (module, qkv, heads)
        num_heads = {qkv: heads for _, qkv, heads in attns}
        before = {a: (qkv.out_features, heads) for a, qkv, heads in attns}
        ignored = list(info.ignored_layers)
        ratio_dict: dict = {}
        head_dims = self.head_dim_share > 0 and bool(attns) and not trim
        heads = self.prune_heads and self.head_share > 0 and bool(attns) and not trim
        if head_dims:
            ratio_dict[tuple(qkv for _, qkv, _ in attns)] = min(self.max_ratio, ratio * self.head_dim_share)
        if (trim or not self.prune_embed) and info.embed_input is not None:
            ratio_dict[info.embed_input] = 0.0
        unwrapped = list(info.unwrapped)
        was_training = model.training
        model.eval()
        info.prepare(model)  # e.g. packed gated MLPs split in two: Torch-Pruning cannot rank a chunked fc1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pruner = tp.pruner.BasePruner(
                    model, example, importance=_importance(self.importance), global_pruning=True, isomorphic=True,
                    pruning_ratio=ratio, pruning_ratio_dict=ratio_dict, max_pruning_ratio=self.max_ratio,
                    ignored_layers=ignored, num_heads=num_heads,
                    prune_num_heads=heads,
                    prune_head_dims=head_dims, head_pruning_ratio=min(self.max_ratio, ratio * self.head_share),
                    round_to=self.round_to, unwrapped_parameters=unwrapped,
                )
                for group in pruner.step(interactive=True):
                    group.prune()
        finally:
            info.restore(model)
        model.train(was_training)
        for a, qkv, _ in attns:
            # Torch-Pruning updates its head count before it checks a group; a group it then skips keeps its heads
            heads = pruner.num_heads[qkv] if qkv.out_features != before[a][0] else before[a][1]
            info.fix_attention(a, heads)
        info.sync(model)

    # -- search ------------------------------------------------------------------
    def _search(self, model, target, example, macs_fn, grads, trim, log, trials):
        """Find the ratio whose pass lands in [target * (1 - tol), target]. Returns (best, above)."""
        start = macs_fn(model)
        best = None   # (macs, ratio, model): the largest result <= target
        above = (start, 0.0, model)  # (macs, ratio, model): the smallest result > target (at first: unpruned)
        lo, f_lo = 0.0, start - target        # f > 0: still above the target
        hi, f_hi = None, None
        r = min(self.max_ratio, max(1e-3, 1 - math.sqrt(target / start)))  # MACs ~ (1 - r)^2
        side = 0
        for _ in range(self.max_trials):
            twin = _copy(model, grads)
            t0 = time.time()
            self.prune_once(twin, r, example, trim=trim)
            macs = macs_fn(twin)
            trials.append({"ratio": round(r, 5), "macs": macs, "trim": trim,
                           "seconds": round(time.time() - t0, 2)})
            log(f"[width] ratio {r:.4f}{' (trim: MLP hidden only)' if trim else ''}: {mac.human(macs)} MACs "
                f"(target {mac.human(target)})")
            f = macs - target
            if f <= 0:
                if best is None or macs > best[0]:
                    best = (macs, r, twin)
                if macs >= target * (1 - self.tolerance):
                    break
                hi, f_hi = r, f
                if side == -1:
                    f_lo /= 2  # Illinois: keep the secant from stalling on one side
                side = -1
            else:
                if macs < above[0]:
                    above = (macs, r, twin)
                prev = (lo, f_lo)
                lo, f_lo = r, f
                if side == 1 and f_hi is not None:
                    f_hi /= 2
                side = 1
            if hi is None:
                if r >= self.max_ratio:
                    break
                # not bracketed yet: extrapolate the secant through the last two points (a little past it)
                slope = (prev[1] - f) / (r - prev[0]) if r > prev[0] else 0.0
                step = 1.05 * f / slope if slope > 0 else max(0.05, r)
                r = min(self.max_ratio, r + max(step, 1e-3))
                continue
            if hi - lo < 2e-3:  # a jump (one rounding step) between lo and hi: no ratio lands in the window
                break
            r_new = lo + (hi - lo) * f_lo / (f_lo - f_hi) if f_lo != f_hi else (lo + hi) / 2
            if not lo + 1e-5 < r_new < hi - 1e-5:
                r_new = (lo + hi) / 2
            r = r_new
        return best, above

    def prune(self, model: nn.Module, target_macs: float, example_inputs: torch.Tensor, ctx=None) -> dict:
        """Shrink ``model`` in place until its MACs are at most ``target_macs`` (and within ``tolerance`` of it).

        ``ctx`` (optional) may give ``batches()`` (training batches: needed for
        Taylor importance), ``macs_fn(model)`` (the cost to meet, default
        [`hetprune.model.macs.count_macs`][hetprune.model.macs.count_macs] on ``example_inputs``) and ``log``.
        Returns a report (also kept as ``last_report``).
        """
        log = getattr(ctx, "log", None) or (lambda msg: None)
        example = example_inputs[:1]
        macs_fn = getattr(ctx, "macs_fn", None) or (lambda m: mac.count_macs(m, example))
        started = time.time()
        start = macs_fn(model)
        trials: list[dict] = []
        report = {"pruner": self.name, "options": self.options(), "target_macs": int(target_macs),
                  "macs_before": start, "trials": trials}
        if start <= target_macs:
            report.update(macs=start, within_tolerance=start >= target_macs * (1 - self.tolerance),
                          note="already at or below the target: nothing pruned", seconds=0.0)
            self.last_report = report
            return report
        stage_targets = [start * (target_macs / start) ** (k / self.steps) for k in range(1, self.steps + 1)]
        stage_targets[-1] = float(target_macs)
        stages = []
        for target in stage_targets:
            grads = self._taylor_grads(model, ctx) if self.importance == "taylor" else None
            best, above = self._search(model, target, example, macs_fn, grads, False, log, trials)
            tol_ok = best is not None and best[0] >= target * (1 - self.tolerance)
            if not tol_ok:
                # a rounding step (embedding, heads, head dims) jumped over the window: finish from the model just
                # above the target by pruning MLP hidden channels only
                base = above[2]
                g2 = self._taylor_grads(base, ctx) if self.importance == "taylor" else None
                best2, _ = self._search(base, target, example, macs_fn, g2, True, log, trials)
                if best2 is not None and (best is None or best2[0] > best[0]):
                    best = (best2[0], above[1], best2[2], best2[1])
            if best is None:
                raise HetpruneError(
                    f"width pruning cannot reach {mac.human(target)} MACs: at ratio {self.max_ratio} the model still "
                    f"has {mac.human(min(t['macs'] for t in trials))}; raise max_ratio or relax the target")
            adopt(model, best[2])
            model.zero_grad(set_to_none=True)
            stages.append({"target": int(target), "macs": best[0], "ratio": best[1],
                           "trim_ratio": best[3] if len(best) > 3 else None})
        macs = macs_fn(model)
        within = macs >= target_macs * (1 - self.tolerance)
        if not within:
            log(f"[width] note: {mac.human(macs)} MACs is more than {self.tolerance:.0%} below the target "
                f"{mac.human(target_macs)} (the rounding step round_to={self.round_to} is too coarse for this model)")
        report.update(macs=macs, within_tolerance=within, ratio=stages[-1]["ratio"],
                      trim_ratio=stages[-1]["trim_ratio"], stages=stages, seconds=round(time.time() - started, 1))
        self.last_report = report
        return report

    def _taylor_grads(self, model: nn.Module, ctx) -> dict[str, torch.Tensor]:
        batches = getattr(ctx, "batches", None)
        if batches is None:
            raise HetpruneError("taylor width importance needs training data: pass a context with batches() "
                                "(the strategies do), or use importance=magnitude")
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        model.zero_grad(set_to_none=True)
        n = 0
        for i, (x, y) in enumerate(batches()):
            if self.taylor_batches is not None and i >= self.taylor_batches:
                break
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            n += 1
        model.train(was_training)
        if n == 0:
            raise HetpruneError("taylor width importance got no training batches")
        grads = _grads(model)
        model.zero_grad(set_to_none=True)
        return grads
