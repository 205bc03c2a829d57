"""What a comparison is made of, below its rows and its report: the spec (strategies, budgets, seeds, one
settings object, the timer), one row's plan and key, and the checks of the lists a caller passes."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core import config
from ...core.settings import Settings
from ...pruning.budget import Budget
from ...core.keys import fingerprint
from ...core.errors import HetpruneError


@dataclass
class CompareSpec:
    strategies: list[str]
    budgets: list[Budget]
    seeds: list[int]
    settings: Settings                  # one settings object for every strategy (all sections merged)
    batch_sizes: list[int] = field(default_factory=lambda: [1, 256])
    device: str = "cpu"
    speed_repeats: int = 7
    speed_spread: float = 0.02          # time until every speedup is known within ±2 % ...
    speed_budget_s: float = 15.0        # ... or this many more seconds per batch size have passed

    def __post_init__(self):
        self.settings = Settings.of(self.settings)   # a caller's mapping is checked and carried typed


def row_id(strategy: str, budget: Budget, seed: int) -> str:
    b = "-".join(f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in budget.to_dict().items())
    return f"{strategy}__{b}__seed{seed}"


def model_folder(plan: "RowPlan") -> str:
    """A row's model folder under ``models/``: its id and its key, so a run with other settings (another
    scorer, schedule, base or data) saves its models beside those of an earlier run, never over them."""
    return f"{plan.id}__{plan.key[:12]}"


def row_key(spec: CompareSpec, strategy: str, budget: Budget, seed: int, base_hash: str, data_fp: str) -> str:
    """What a finished row depends on: reuse it only when all of this matches."""
    return fingerprint({"strategy": strategy, "budget": budget.to_dict(), "seed": seed,
                        "settings": config.keyed(spec.settings), "base": base_hash, "data": data_fp})


@dataclass
class RowPlan:
    """One row to run: a strategy (registered name, or a fixed split), budget, seed and full settings."""

    id: str
    strategy: str
    budget: Budget
    seed: int
    settings: Settings
    key: str
    split: tuple[int, int] | None = None   # run hetprune.pruning.pipeline.FixedSplit instead of a named strategy
    label: str | None = None               # what the row is called in tables (default: the strategy)

    def __post_init__(self):
        self.settings = Settings.of(self.settings)

    def to_payload(self) -> dict:
        return {"id": self.id, "strategy": self.strategy, "budget": self.budget.to_dict(), "seed": self.seed,
                "settings": self.settings.as_settings(), "key": self.key, "split": self.split, "label": self.label}

    @classmethod
    def from_payload(cls, d: dict) -> "RowPlan":
        return cls(**{**d, "budget": Budget(**d["budget"]), "settings": Settings.of(d["settings"]),
                      "split": tuple(d["split"]) if d["split"] else None})


def budget_text(budget: dict) -> str:
    if "sites" in budget:
        return str(budget["sites"])
    if "target_macs" in budget:
        return f"MACs≤{budget['target_macs']:g}"
    by = f" ({budget['cost_model']})" if budget.get("cost_model") not in (None, "macs") else ""
    if "target_latency" in budget:
        return f"latency≤{budget['target_latency'] * 1e3:g}ms"
    return f"speedup≥{budget['target_speedup']:g}{by}"


def distinct(values: list, what: str) -> list:
    """``values`` as given, refused when one repeats: a repeated seed or budget would be counted as two
    (a mean over "2 seeds" with std 0)."""
    seen, repeated = [], []
    for v in values:
        (repeated if v in seen else seen).append(v)
    if repeated:
        shown = ", ".join(budget_text(v.to_dict()) if isinstance(v, Budget) else str(v) for v in repeated)
        raise HetpruneError(f"{what} lists {shown} more than once; give each once")
    return list(values)


def whole_number(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HetpruneError(f"{what} must be a whole number, got {value!r}")
    return value
