"""The ``hetdpt`` settings section, typed: what MAP's points, predictor, refinement and checks do."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from hetprune import HetpruneError
from hetprune.plugin_api import Section, setting, whole

from . import verify_names

FINETUNES = ("auto", "finetune", "short_finetune")
ORDERS = ("act", "attn")


@dataclass(frozen=True)
class HetDPTOptions(Section):
    """HetDPT's stage 1: how MAP's cheap points are made and what the predictor picks from them.

    The defaults are what ``benchmarks/map_points.py`` chose by issue 58's rule (the lowest worst-target excess
    regret over the seed-noise floor among the schemes that spend at most 10 % of a DeiT-B run) over 14 targets
    of the three embedded benchmarks, 6 seeds (benchmarks/results/map-points-spread6.md): one-shot points fitted
    with ``poly`` (its degree by leave-2-out CV), then the ``spread`` checks (checks.py): 6 splits, the best
    predicted of each sixth of the budget line, checked by the final run's own pipeline, each candidate
    selected on 7 % of the scoring subset but on at least 300 images a gate epoch and fine-tuned on at most one
    point's schedule (budget auto): 9.4 % of a DeiT-B run as ``--plan`` counts it. Progressive points with
    poly and no checks are the paper's (``--config deit-b-paper``).
    """

    section: ClassVar[str] = "hetdpt"

    predictor: str = setting("poly", "the accuracy predictor MAP fits on the points (poly is the paper's)")
    predictor_options: dict = setting(help="per predictor name, its options", factory=lambda: {"poly": {"degree": "auto"}})
    point_selection: str = setting(
        "oneshot", "how points are made: progressive (the paper's: paths from the dense model, one more site "
                       "off per step, fine-tuned from the previous point's weights), oneshot (each point's sites off "
                       "the dense model at once, one fine-tune), gradual (the run's own selector makes each split)")
    point_finetune: str = setting(
        "auto", "the schedule that fine-tunes a point: finetune, short_finetune, or auto (oneshot: finetune where "
                "it costs at most 4 short ones in images, else short_finetune; progressive: short_finetune)")
    interleave_first: str = setting("act", "the kind the interleaved progressive path removes first (act: 1+1, 1+2, ...)")
    path_stride: int = setting(1, "sites a progressive step removes before its fine-tune (1: the paper's)")
    point_scorer: str = setting("taylor", "the scorer that orders a point's removals")
    axis_points: int = setting(4, "oneshot/gradual: points on each axis (one kind removed)")
    mixed_points: int = setting(3, "oneshot/gradual: points on the budget line (both kinds)")
    dense_point: bool = setting(True, "measure the dense model as a point")
    refine: int = setting(0, "rounds after the fit, each measuring the best predicted split not yet measured (and "
                             "its unmeasured neighbours); 0 = the paper's one-shot fit")
    checks: str = setting("spread", "past the paper: which splits are checked after the fit, and how (a checks "
                                    "policy: spread, best, near-ties, all, points, none, or a plugin's); the "
                                    "pick is the best checked (none: the predictor's argmax, the paper's)")
    checks_options: dict = setting(help="the options of the checks policy hetdpt.checks names (spread: count 6, "
                                        "budget auto, unit images, selection 0.07, selection_at_least 300; "
                                        "see docs/guides/hetdpt.md): only that policy's",
                                   factory=dict)
    def __post_init__(self):
        self.need("predictor", isinstance(self.predictor, str) and self.predictor != "", "a predictor's name")
        self.need("predictor_options", isinstance(self.predictor_options, dict)
                  and all(isinstance(v, dict) for v in self.predictor_options.values()),
                  "a mapping of predictor name to its options")
        self.need("point_selection", isinstance(self.point_selection, str), "a point scheme's name")
        self.need("point_finetune", self.point_finetune in FINETUNES,
                  f"one of {', '.join(FINETUNES)} (the settings section whose schedule fine-tunes a MAP point)")
        self.need("interleave_first", self.interleave_first in ORDERS,
                  f"one of {', '.join(ORDERS)} (the kind the interleaved path of progressive points removes first)")
        self.need("path_stride", whole(self.path_stride, 1),
                  "a whole number >= 1 (the sites a progressive step removes before its fine-tune)")
        self.need("point_scorer", isinstance(self.point_scorer, str) and self.point_scorer != "", "a scorer's name")
        self.need("axis_points", whole(self.axis_points, 0), "a whole number >= 0")
        self.need("mixed_points", whole(self.mixed_points, 0), "a whole number >= 0")
        self.need("dense_point", isinstance(self.dense_point, bool), "true or false")
        self.need("refine", whole(self.refine, 0), "a count of rounds >= 0")
        self.need("checks", isinstance(self.checks, str) and self.checks != "", "a checks policy's name")
        self.need("checks_options", isinstance(self.checks_options, dict)
                  and all(isinstance(v, dict) for v in self.checks_options.values()),
                  "a mapping of checks policy name to its options")
        builtin = verify_names.BY_NAME.get(self.checks)
        if builtin is not None:   # a built-in policy's options checked as they are read (a plugin's: as it is built)
            known = {f.name for f in fields(builtin)}
            unknown = sorted(set(self.checks_policy_options) - known)
            if unknown:
                raise HetpruneError(f"hetdpt.checks_options.{self.checks} has no option(s) {', '.join(unknown)}; "
                                    f"its options: {', '.join(sorted(known)) or 'none'}")
            builtin(**self.checks_policy_options)
        other = sorted(set(self.checks_options) - {self.checks})
        if other:   # options of a policy the run does not use would be ignored without a word
            raise HetpruneError(f"hetdpt.checks_options gives options of {', '.join(other)}, and hetdpt.checks is "
                                f"{self.checks}: give only {self.checks}'s, or set hetdpt.checks {other[0]}")

    @property
    def checks_policy_options(self) -> dict:
        """The options of the policy ``checks`` names."""
        return dict(self.checks_options.get(self.checks) or {})

    @classmethod
    def upgrade(cls, given: dict, held: dict, where: str) -> dict:
        """``given`` (a layer of settings, or a stored section) with the old ``verify_*`` names read as the
        ``checks`` policy they spell (one release), said in a deprecation line with the new spelling;
        ``held``: the section so far, which the old names change."""
        return verify_names.upgrade(given, held, where)

    @classmethod
    def key_form(cls, d: dict) -> dict:
        """The section as keys hash it: a checks policy the old ``verify_*`` names could spell is keyed by
        them, so a compare row made before ``checks`` existed keeps its key."""
        return verify_names.key_form(d)

    def predictor_options_for(self, name: str) -> dict:
        return dict(self.predictor_options.get(name) or {})
