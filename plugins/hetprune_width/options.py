"""The settings sections of the width strategies, typed: ``width`` (which width pruner, with what options)
and ``hetdpt_plus`` (how HetDPT+ combines depth and width)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hetprune import HetpruneError
from hetprune.plugin_api import Section, number, setting, whole

ORDERS = ("auto", "depth-width", "width-depth", "interleaved")
INTERMEDIATE = ("short_finetune", "finetune", "none")


@dataclass(frozen=True)
class WidthOptions(Section):
    """Which width pruner runs and its options."""

    section: ClassVar[str] = "width"

    pruner: str = setting("isomorphic", "the width pruner (a registered width_pruner)")
    # the width pruner's keyword options; a --set of one option replaces this mapping (the pruner's own defaults
    # fill the rest), e.g. --set width.pruner_options='{importance: taylor}'
    pruner_options: dict = setting(help="the width pruner's options (its own defaults fill the rest)",
                                   factory=lambda: _isomorphic_defaults())

    def __post_init__(self):
        self.need("pruner", isinstance(self.pruner, str) and self.pruner != "", "a width pruner's name")
        self.need("pruner_options", isinstance(self.pruner_options, dict), "a mapping of option to value")

    @property
    def tolerance(self) -> float:
        """How close under its MAC target a width pruner stops (its ``tolerance`` option, default 2 %)."""
        return float(self.pruner_options.get("tolerance", 0.02))


def _isomorphic_defaults() -> dict:
    from .pruner import IsomorphicOptions

    return IsomorphicOptions().to_dict()


@dataclass(frozen=True)
class HetDPTPlusOptions(Section):
    """How HetDPT+ splits one MAC target between depth and width pruning."""

    section: ClassVar[str] = "hetdpt_plus"

    order: str = setting("auto", "width-depth (best measured, README) with MAC budgets, else depth-width (the "
                                 "paper's); or name one: depth-width, width-depth, interleaved")
    rounds: int = setting(2, "interleaved: depth+width rounds, each taking an equal share of both cuts")
    depth_strategy: str = setting("hetdpt", "any registered depth strategy (its settings section must be present)")
    depth_share: float | str = setting(0.45, "share of the MAC reduction (dense -> target) taken by depth pruning, "
                                             "or search: chosen from cheap points with a fitted predictor")
    refine: int = setting(0, "share search: rounds measuring the best predicted split not yet measured")
    depth_sites: int | None = setting(None, "or a site count for the depth part (overrides depth_share)")
    intermediate_finetune: str = setting("short_finetune", "settings section of the fine-tune between the two "
                                                           "steps, or none")

    def __post_init__(self):
        self.need("order", self.order in ORDERS, f"one of {', '.join(ORDERS)}")
        self.need("rounds", whole(self.rounds, 1), "a whole number >= 1")
        self.need("depth_strategy", isinstance(self.depth_strategy, str) and self.depth_strategy != "",
                  "a depth strategy's name")
        self.need("refine", whole(self.refine, 0), "a count of rounds >= 0")
        self.need("depth_sites", self.depth_sites is None or whole(self.depth_sites, 1),
                  "a site count >= 1 (or null)")
        if self.depth_sites is None:
            self.need("depth_share", self.depth_share == "search" or number(self.depth_share) and
                      0 < self.depth_share < 1, "within (0, 1) or 'search'")
            if self.depth_share == "search" and self.order not in ("depth-width", "auto"):
                raise HetpruneError("hetdpt_plus.depth_share search runs with order depth-width (or auto)")
        if self.order == "interleaved" and self.depth_sites is not None and self.depth_sites < self.rounds:
            raise HetpruneError(f"hetdpt_plus.depth_sites {self.depth_sites} cannot be spread over "
                                f"hetdpt_plus.rounds {self.rounds}: give at least one site per round")
        self.need("intermediate_finetune", self.intermediate_finetune in INTERMEDIATE,
                  f"one of {', '.join(INTERMEDIATE)}")

    @property
    def searched(self) -> bool:
        """Whether the depth share is searched (no fixed share and no site count)."""
        return self.depth_sites is None and self.depth_share == "search"
