"""The plugin contract's rule for strategies: what ``run`` returns is a complete PruneResult whose model
runs, whose report is JSON, which left the dense model alone, and which reloads from its recipe. It needs the
pipeline and the recipe, so it sits above them; the strategy kind's record (`hetprune.harness.kinds`) loads
it when the first strategy is built.
"""

from __future__ import annotations

import contextvars
import copy
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..core import distributed as dist
from ..core.contract import Violation, type_name
from ..core.errors import HetpruneError
from ..model.checks import outputs, relative_error, runs
from ..model.spec import model_hash
from .report import REPORT_KEYS, PruneResult
from ..model.recipe import Recipe, load, save

if TYPE_CHECKING:
    import torch
    from torch import nn

RELOAD_TOLERANCE = 1e-5          # a reloaded result against the model the strategy returned (relative)


_nested = contextvars.ContextVar("hetprune_strategy_nested", default=False)


def strategy_run(component, call, job, *args, **kwargs):
    dense_hash = model_hash(job.dense)
    outermost = not _nested.get()
    token = _nested.set(True)
    try:
        result = call(job, *args, **kwargs)
    finally:
        _nested.reset(token)
    check_result(result, job.example)
    if model_hash(job.dense) != dense_hash:
        raise Violation("run() changed job.dense; a strategy must prune a copy of the dense model")
    # what is saved must reload: the outermost run's result (a strategy run inside another, e.g. hetdpt in
    # hetdpt-plus, may prune an intermediate model its recipe alone does not describe); under torchrun rank 0
    if outermost and dist.is_main():
        base = copy.deepcopy(job.dense) if result.recipe.base.is_user_built else None
        check_reloads(result.model, result.recipe, job.example, base=base, adapter=getattr(job, "adapter", None))
    return result


def check_result(result, example: torch.Tensor) -> None:
    """A strategy's result: a PruneResult with a model, a recipe and a complete, JSON-able report."""
    from torch import nn

    if not isinstance(result, PruneResult):
        raise Violation(f"run() returned a {type_name(result)}; it must return a hetprune.PruneResult "
                        "(model, recipe, report)")
    if not isinstance(result.model, nn.Module):
        raise Violation(f"run()'s result.model is a {type_name(result.model)}, not a torch module")
    if not isinstance(result.recipe, Recipe):
        raise Violation(f"run()'s result.recipe is a {type_name(result.recipe)}, not a hetprune.Recipe")
    if not isinstance(result.report, dict):
        raise Violation(f"run()'s result.report is a {type_name(result.report)}, not a dict")
    missing = [k for k in REPORT_KEYS if k not in result.report]
    if missing:
        raise Violation(f"run()'s report lacks {', '.join(missing)} (hetprune.pruning.steps.finish fills them)")
    try:
        json.dumps(result.report)
    except (TypeError, ValueError) as exc:
        raise Violation(f"run()'s report cannot be written as JSON: {exc}") from exc
    ref = next(result.model.parameters())   # the example as the model runs: its device and float dtype
    runs(result.model, example.to(device=ref.device, dtype=ref.dtype if ref.is_floating_point() else None), "run()")


def check_reloads(model: nn.Module, recipe, example: torch.Tensor, tol: float = RELOAD_TOLERANCE,
                  base: nn.Module | None = None, adapter=None) -> None:
    """Save ``model`` with ``recipe`` and load it back as a user would: same outputs, or a violation.
    ``base``: a fresh unpruned model to load onto (a user-built base, which hetprune cannot build)."""
    with tempfile.TemporaryDirectory(prefix="hetprune-reload-") as tmp:
        try:
            save(Path(tmp) / "result", model, recipe)
            loaded = load(Path(tmp) / "result", model=base, adapter=adapter)
        except HetpruneError as exc:
            raise Violation(f"the result does not reload from its recipe and weights: {exc}") from exc
    ref = next(model.parameters())
    x = example.to(ref.device)
    loaded.to(device=ref.device, dtype=ref.dtype)  # compared where and as the result itself runs
    err = relative_error(outputs(model, x), outputs(loaded, x))
    if not err <= tol:
        raise Violation(f"the result reloaded from its recipe gives other outputs (relative error {err:.3g} > "
                        f"{tol:g}); "
                        "the recipe does not describe the model")


STRATEGY_RULES = {"run": strategy_run}   # method -> rule (`hetprune.core.contract` describes rules)
