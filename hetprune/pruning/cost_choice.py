"""Which cost model a run counts its budget in, and the cost block of a run report.

``--cost-model auto`` (the default) is ``latency`` on CUDA, where MACs
mislead most (launch-bound sizes, odd widths), and ``macs`` elsewhere. A
site budget (``--budget K``) needs no cost model; ``--target-macs`` always
counts MACs; ``--target-latency`` needs a time model. The models themselves
are components (hook ``register_cost_models``; built-ins ``macs`` and
``latency`` in the plugin ``hetprune_costs``).
"""

from __future__ import annotations

import dataclasses

from ..core import devices
from .budget import Budget
from ..core.settings import Settings
from ..core.errors import HetpruneError, option

AUTO = "auto"


def resolve_name(name: str, device) -> str:
    """``auto`` -> ``latency`` on CUDA, ``macs`` elsewhere; any other name as given."""
    if name != AUTO:
        return name
    return "latency" if devices.resolve(device).type == "cuda" else "macs"


def bind(budget: Budget | None, settings: Settings, registry) -> Budget | None:
    """The budget with the run's cost model named in it (speedup and latency targets), checked."""
    run = settings.run
    chosen = run.cost_model
    if not isinstance(chosen, str) or not chosen:
        raise HetpruneError(f"cost_model must be a name (auto, macs, latency or a plugin's), got {chosen!r}")
    if chosen != AUTO:
        build(registry, chosen, settings)   # an unknown name or option fails now
    if budget is None or budget.sites is not None:
        return budget
    if budget.target_macs is not None:
        if chosen not in (AUTO, "macs"):
            raise HetpruneError(f"{option('target-macs')} counts MACs; "
                                f"{option('cost-model', chosen, setting='cost_model')} applies to "
                                f"{option('target-speedup')} and {option('target-latency')}")
        return budget
    name = resolve_name(chosen, run.device)
    if budget.target_latency is not None and chosen == AUTO:
        name = "latency"
    if name != chosen:
        build(registry, name, settings)
    return dataclasses.replace(budget, cost_model=name)


def build(registry, name: str, settings: Settings):
    """The cost model ``name`` with its options from ``cost_model_options``; an unknown name, or options it does
    not take, is one error listing what is known (commands call this before any base model is trained)."""
    return registry.build("cost_model", name, **settings.run.options_for("cost_model", name))


def refuse_parallel(jobs: int, budgets: list[Budget], settings: Settings) -> set[str]:
    """The time cost models the budgets count in; an error when ``jobs`` > 1 would run rows at once, each
    timing the others' noise."""
    timed = {run_model_name(b, settings) for b in budgets} - {"macs"}
    if timed and jobs > 1:
        raise HetpruneError(f"{option('jobs', str(jobs))} with a time cost model ({', '.join(sorted(timed))}): rows "
                            f"running at once would time each other's noise; use {option('jobs', '1')}")
    return timed


def run_model_name(budget: Budget, settings: Settings) -> str:
    """The cost model a run reports in: its budget's, else the settings' (auto resolved by device)."""
    run = settings.run
    return budget.model_name or resolve_name(run.cost_model, run.device)
