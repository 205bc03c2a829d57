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

from . import devices
from .budget import Budget
from .errors import HetpruneError

AUTO = "auto"


def resolve_name(name: str, device) -> str:
    """``auto`` -> ``latency`` on CUDA, ``macs`` elsewhere; any other name as given."""
    if name != AUTO:
        return name
    return "latency" if devices.resolve(device).type == "cuda" else "macs"


def bind(budget: Budget | None, settings: dict, registry) -> Budget | None:
    """The budget with the run's cost model named in it (speedup and latency targets), checked."""
    chosen = settings.get("cost_model", AUTO)
    if not isinstance(chosen, str) or not chosen:
        raise HetpruneError(f"cost_model must be a name (auto, macs, latency or a plugin's), got {chosen!r}")
    if chosen != AUTO:
        check(registry, chosen, settings)
    if budget is None or budget.sites is not None:
        return budget
    if budget.target_macs is not None:
        if chosen not in (AUTO, "macs"):
            raise HetpruneError(f"--target-macs counts MACs; --cost-model {chosen} applies to --target-speedup "
                                "and --target-latency")
        return budget
    name = resolve_name(chosen, settings.get("device", "cpu"))
    if budget.target_latency is not None and chosen == AUTO:
        name = "latency"
    bound = dataclasses.replace(budget, cost_model=name)
    check(registry, name, settings)
    return bound


def check(registry, name: str, settings: dict) -> None:
    """An unknown cost model, or options it does not take, fail now (listing what is known), not after the
    base model is trained."""
    registry.build("cost_model", name, **(settings.get("cost_model_options") or {}).get(name, {}))


def run_model_name(budget: Budget, settings: dict) -> str:
    """The cost model a run reports in: its budget's, else the settings' (auto resolved by device)."""
    return budget.model_name or resolve_name(settings.get("cost_model", AUTO), settings.get("device", "cpu"))
