"""The plugin contract's rules for components that change or read a model: scorers, removers, mergers and
width pruners (each call is checked: the sites it may touch, that the model still runs, that a merge keeps
the function). They sit above the model-reading modules they need; each kind's record
(`hetprune.harness.kinds`) loads its table below when its first component is built. The proxy and the rules
that need no model stay in `hetprune.core.contract`.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import math
from typing import TYPE_CHECKING

from ..core import tensors
from ..core.contract import Violation, is_number, jsonable, type_name
from .macs import count_macs
from ..core.errors import HetpruneError
from .spec import input_shape_of
from .sites import Site, sites

if TYPE_CHECKING:
    import torch
    from torch import nn

DEFAULT_MERGE_TOLERANCE = 1e-4   # a merger's ``tolerance`` unless it declares one: relative output error


_examples: contextvars.ContextVar = contextvars.ContextVar("hetprune_example", default=None)


@contextlib.contextmanager
def examples_from(example):
    """Within this context, a model whose input shape hetprune cannot tell (the user's own module) is
    checked on ``example`` (a job's task example)."""
    token = _examples.set(example)
    try:
        yield
    finally:
        _examples.reset(token)


def example_input(model: nn.Module, n: int = 2, seed: int = 0) -> torch.Tensor:
    """A few seeded random images of the model's input shape, dtype and device; for a model whose input
    shape is unknown, the running job's example (HetpruneError without one)."""
    import torch

    param = next(model.parameters())
    try:
        shape = input_shape_of(model)
    except HetpruneError:
        given = _examples.get()
        if given is None:
            raise
        return given[:n].to(param.device, param.dtype if given.is_floating_point() else None)
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=gen).to(param.device, param.dtype)


def outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's outputs in eval mode, without gradients (its train/eval mode is restored), with fp32
    matmuls in full fp32: what the checks compare is the function, not TF32's rounding."""
    import torch

    from ..core.devices import full_fp32

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), full_fp32():
            return model(x)
    finally:
        model.train(was_training)


def relative_error(reference, candidate) -> float:
    """max |reference - candidate| / max |reference|, the largest over the outputs (a model may return
    several: tuples, lists, dicts of tensors): the scale-free error a tolerance bounds."""
    try:
        return tensors.relative_error(reference, candidate)
    except ValueError as exc:
        raise Violation(str(exc)) from None


def runs(model: nn.Module, x: torch.Tensor, after: str, shape: dict | None = None):
    """The outputs of ``model`` on ``x`` (a tensor, or tuples, lists and dicts of them), or a
    `Violation` saying it no longer runs; ``shape``: the outputs' `hetprune.core.tensors.shapes`
    before the call, which must not change."""
    try:
        y = outputs(model, x)
    except Exception as exc:  # whatever the broken model raises is the finding
        raise Violation(f"the model no longer runs after {after}: {type(exc).__name__}: {exc}") from exc
    now = tensors.shapes(y)
    if not now:
        raise Violation(f"the model returns a {type_name(y)} after {after}, which holds no tensor")
    if shape is not None and now != shape:
        raise Violation(f"the model's output shape changed from {tensors.describe(shape)} to "
                        f"{tensors.describe(now)} after {after}")
    if not tensors.all_finite(y):
        raise Violation(f"the model's outputs are not finite after {after}")
    return y


def sites_of(model: nn.Module) -> set:
    """The sites present before a call (a model hetprune cannot read is the caller's error, not the plugin's)."""
    return set(sites(model))


def present_sites(model: nn.Module, after: str) -> set:
    """The sites still present after a call; a model hetprune can no longer read is a violation."""
    try:
        return set(sites(model))
    except HetpruneError as exc:
        raise Violation(f"the model is no longer a ViT hetprune can read after {after}: {exc}") from exc


def _sites_text(items) -> str:
    return ", ".join(sorted(str(s) for s in items)) or "none"


def scorer_score(component, call, model, sites, ctx, *args, **kwargs):
    from torch import nn

    candidates = list(sites)
    before = sites_of(model) if isinstance(model, nn.Module) else None
    scores = call(model, candidates, ctx, *args, **kwargs)
    if not isinstance(scores, dict):
        raise Violation(f"score() returned a {type_name(scores)}; it must return a dict {{Site: float}}")
    missing, extra = set(candidates) - set(scores), set(scores) - set(candidates)
    if missing or extra:
        raise Violation(f"score() must give exactly one score per candidate site; missing: {_sites_text(missing)}; "
                        f"not candidates: {_sites_text(extra)}")
    for site, value in scores.items():
        if not is_number(value):
            raise Violation(f"score() gave {site} a {type_name(value)} ({value!r}); scores must be finite numbers")
        if not math.isfinite(value):
            raise Violation(f"score() gave {site} the score {value}; scores must be finite numbers")
    if before is not None and present_sites(model, "score()") != before:
        raise Violation("score() changed which sites the model has; a scorer must leave the model as it was")
    return {site: float(value) for site, value in scores.items()}


def scorer_select(component, call, model, counts, ctx, *args, **kwargs):
    before = sites_of(model)
    chosen = call(model, counts, ctx, *args, **kwargs)
    if not isinstance(chosen, (list, tuple)) or not all(isinstance(s, Site) for s in chosen):
        raise Violation(f"select() returned {chosen!r}; it must return a list of hetprune.Site")
    got = {k: sum(1 for s in chosen if s.kind == k) for k in counts}
    if got != dict(counts) or len(set(chosen)) != len(chosen) or any(s.kind not in counts for s in chosen):
        raise Violation(f"select() chose {_sites_text(chosen)} ({got}); it must choose exactly {dict(counts)} "
                        "distinct sites")
    gone = set(chosen) - before
    if gone:
        raise Violation(f"select() chose {_sites_text(gone)}, which the model does not have")
    after = present_sites(model, "select()")
    if after != before:
        raise Violation(f"select() removed {_sites_text(before - after)} from the model; it must leave every site "
                        "present (the pipeline removes them)")
    return list(chosen)


def remover_remove(component, call, model, site, *args, **kwargs):
    before = sites_of(model)
    x = example_input(model, n=1)
    shape = tensors.shapes(outputs(model, x))
    record = call(model, site, *args, **kwargs)
    if record is not None and not isinstance(record, dict):
        raise Violation(f"remove() returned a {type_name(record)}; it must return a dict for the recipe (or None)")
    jsonable(record, "remove()'s record")
    after = present_sites(model, f"remove({site})")
    expected = before - {site}
    if after != expected:
        gone, back = before - after, after - before
        detail = f"it removed {_sites_text(gone)}" + (f" and added {_sites_text(back)}" if back else "")
        raise Violation(f"remove({site}) must remove exactly {site}; {detail}")
    runs(model, x, f"remove({site})", shape)
    return record or {}


def merger_merge(component, call, model, *args, **kwargs):
    tol = tolerance_of(component)
    before = sites_of(model)
    reference = copy.deepcopy(model)
    x = example_input(model)
    changed = call(model, *args, **kwargs)
    if changed is None:
        changed = []
    if not isinstance(changed, (list, tuple, set)) or not all(isinstance(b, int) for b in changed):
        raise Violation(f"merge() returned {changed!r}; it must return the list of block indices it changed")
    if present_sites(model, "merge()") != before:
        raise Violation("merge() changed which sites the model has; a merger folds, it does not remove")
    y = runs(model, x, "merge()")
    err = relative_error(outputs(reference, x), y)
    if not err <= tol:
        raise Violation(f"merge() changed the model's outputs by {err:.3g} (relative, {x.dtype}), more than its "
                        f"tolerance {tol:.3g}; a merger must keep the function")
    return sorted(set(changed))


def width_pruner_prune(component, call, model, target_macs, example_inputs, ctx=None, *args, **kwargs):
    x = example_inputs[:1]
    shape = tensors.shapes(outputs(model, x))
    result = call(model, target_macs, example_inputs, ctx, *args, **kwargs)
    runs(model, x, "prune()", shape)
    macs_fn = getattr(ctx, "macs_fn", None) or (lambda m: count_macs(m, x))
    macs = macs_fn(model)
    if macs > target_macs:
        raise Violation(f"prune() left {macs} MACs, above the target {int(target_macs)}")
    return result


def tolerance_of(merger) -> float:
    """A merger's declared ``tolerance`` (relative output error), or the default."""
    tol = getattr(merger, "tolerance", DEFAULT_MERGE_TOLERANCE)
    if not is_number(tol) or not 0 < tol < 1:
        raise Violation(f"tolerance must be a number in (0, 1) (relative output error), got {tol!r}")
    return float(tol)


# method -> rule, for each kind whose rules run a model (`hetprune.core.contract` describes rules)
SCORER_RULES = {"score": scorer_score, "select": scorer_select}
REMOVER_RULES = {"remove": remover_remove}
MERGER_RULES = {"merge": merger_merge}
WIDTH_PRUNER_RULES = {"prune": width_pruner_prune}
