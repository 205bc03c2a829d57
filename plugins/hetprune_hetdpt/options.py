"""The ``hetdpt`` settings section, typed: what MAP's points, predictor, refinement and checks do."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from hetprune import HetpruneError
from hetprune.plugin_api import Section, number, setting, whole

FINETUNES = ("auto", "finetune", "short_finetune")
ORDERS = ("act", "attn")
VERIFY_BY = ("points", "pipeline")
VERIFY_WHEN = ("always", "unsure")
VERIFY_AMONG = ("best", "spread")


@dataclass(frozen=True)
class HetDPTOptions(Section):
    """HetDPT's stage 1: how MAP's cheap points are made and what the predictor picks from them.

    The defaults are what ``benchmarks/map_points.py`` chose by issue 58's rule (the lowest worst-target excess
    regret over the seed-noise floor among the schemes that spend at most 10 % of a DeiT-B run) over 14 targets
    of the three embedded benchmarks, 6 seeds (benchmarks/results/map-points-spread6.md): one-shot points fitted
    with ``poly`` (its degree by leave-2-out CV), then 6 splits checked by the final run's own pipeline
    (``verify_by`` pipeline), the best predicted of each sixth of the budget line (``verify_among`` spread),
    each candidate selected on 7 % of the scoring subset but on at least 300 images a gate epoch and fine-tuned
    on at most one point's schedule (``verify_images`` auto): 9.4 % of a DeiT-B run as ``--plan`` counts it. Progressive points with
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
    verify: int = setting(6, "past the paper: K splits measured (verify_among says which), the best of them picked "
                             "(0 = the predictor's argmax)")
    verify_when: str = setting("always", "with verify > 0, when the splits are checked: always (the K best "
                                         "predicted), or unsure (only the splits predicted within the "
                                         "predictor's leave-one-out error of the best, at most K, and none "
                                         "when the best stands out by more: a near-tie is checked, a clear "
                                         "pick is trusted)")
    verify_among: str = setting("spread", "with verify > 0, which splits are checked: best (the K best predicted) or "
                                        "spread (the feasible splits, ordered by attention removals, cut into K "
                                        "runs of near-equal length, and the best predicted of each run checked: "
                                        "a predictor wrong about the whole line cannot keep its best part from "
                                        "the checks)")
    verify_by: str = setting("pipeline", "with verify > 0, how the K splits are measured: points (a point of the scheme's kind: "
                                       "progressive checks from the nearest path point) or pipeline (the final "
                                       "run's own selection and fine-tune, by successive halving within "
                                       "verify_budget)")
    verify_budget: float | None = setting(None, "verify_by pipeline: what the checks may cost in all, in final "
                                               "fine-tunes' training images, the K selections counted (null: "
                                               "the K selections plus 2 final fine-tunes, or verify_images)")
    verify_images: int | str | None = setting("auto", "verify_by pipeline: the checks sized in training images "
                                                    "instead (what they may see in all, the K selections "
                                                    "counted): each check fine-tunes on the points' schedule "
                                                    "(point_finetune) cut to its share, so their cost does not "
                                                    "grow with the final schedule; auto: the selections and one "
                                                    "whole point's fine-tune per check, at any scale; null, or "
                                                    "a verify_budget set: sized by verify_budget")
    verify_selection: float = setting(0.07, "verify_by pipeline: what the candidates' selections train on: a share "
                                           "of scoring.subset within (0, 1] (1: the final run's own selection, "
                                           "the winner's reused; less: cheaper checks whose sites may differ, "
                                           "the winner's selected again on the whole subset), or a whole "
                                           "number of images per gate epoch above 1")
    verify_selection_at_least: int | None = setting(
        300, "verify_by pipeline: the fewest images per gate epoch a candidate's selection trains on when "
              "verify_selection is a share (a selection's noise is in the images it sees, not in its share of the "
              "subset: 15 % is 45 images on the embedded benchmarks, 192,000 at DeiT-B's); where this reaches the "
              "whole scoring subset the selection is the run's own, the winner's reused (null: no floor)")

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
        self.need("verify", whole(self.verify, 0) and self.verify != 1,
                  "0 (no checks) or a count of splits >= 2 (one check measures the predicted split alone and keeps "
                  "it whatever it measures: it would spend images and change nothing)")
        self.need("verify_by", self.verify_by in VERIFY_BY, f"one of {', '.join(VERIFY_BY)}")
        self.need("verify_when", self.verify_when in VERIFY_WHEN, f"one of {', '.join(VERIFY_WHEN)}")
        self.need("verify_among", self.verify_among in VERIFY_AMONG, f"one of {', '.join(VERIFY_AMONG)}")
        self.need("verify_budget", self.verify_budget is None or (number(self.verify_budget) and self.verify_budget > 0),
                  "a number of final fine-tunes > 0, or null")
        self.need("verify_images", self.verify_images in (None, "auto") or whole(self.verify_images, 1),
                  "a whole number of training images >= 1, auto (the selections and one point's fine-tune per "
                  "check), or null")
        self.need("verify_selection", (number(self.verify_selection, 0, 1) and self.verify_selection > 0)
                  or (number(self.verify_selection) and self.verify_selection > 1
                      and float(self.verify_selection).is_integer()),
                  "a share of scoring.subset within (0, 1] (1: the final run's own selection), or a whole number "
                  "of images per gate epoch above 1")
        self.need("verify_selection_at_least", self.verify_selection_at_least is None
                  or whole(self.verify_selection_at_least, 1), "a whole number of images per gate epoch >= 1, or null")
        floor = self._field_defaults()["verify_selection_at_least"]
        if self.verify_selection_at_least not in (None, floor) and number(self.verify_selection) \
                and self.verify_selection >= 1:
            what = ("1 (the run's own selection, the whole subset)" if self.verify_selection == 1 else
                    f"{int(self.verify_selection):,} images per gate epoch, a number the floor leaves as it is")
            raise HetpruneError(f"hetdpt.verify_selection_at_least ({self.verify_selection_at_least}) is a floor under "
                                f"a share of the scoring subset (hetdpt.verify_selection below 1), and "
                                f"hetdpt.verify_selection is {what}: set one of them")
        if self.verify_budget is not None and self.verify_images not in (None, "auto"):
            raise HetpruneError(f"hetdpt.verify_budget ({self.verify_budget:g} final fine-tunes) and "
                                f"hetdpt.verify_images ({self.verify_images}) both size the pipeline "
                                "checks: set one of them")
        self._refuse_inert_checks()
        if self.verify_among == "spread" and self.verify_when == "unsure":
            raise HetpruneError("hetdpt.verify_among spread (the default) checks one split in every part of the "
                                "budget line, and hetdpt.verify_when unsure only the splits near the predicted "
                                "best: with verify_when unsure, set hetdpt.verify_among best")

    @classmethod
    def _field_defaults(cls) -> dict:
        """Each field's default, read off the fields (``Section.defaults`` builds an instance, which would run
        these checks again): a setting left there is no conflict where one the user set would be."""
        return {f.name: f.default for f in fields(cls)}

    def _refuse_inert_checks(self) -> None:
        """The checks' settings do nothing where there are no checks (``verify`` 0), and ``verify_budget`` and
        ``verify_selection`` (and its floor) nothing for checks of the points' kind: refused, not silently
        ignored."""
        default = self._field_defaults()
        changed = [n for n in ("verify_when", "verify_among", "verify_by", "verify_budget", "verify_images",
                               "verify_selection", "verify_selection_at_least") if getattr(self, n) != default[n]]
        if changed and not self.verify:
            raise HetpruneError(f"hetdpt.{changed[0]} shapes the checks of hetdpt.verify, which is 0 (no checks): "
                                f"set hetdpt.verify to the number of splits to check, or leave hetdpt.{changed[0]} "
                                "at its default")
        pipeline = [n for n in changed if n not in ("verify_by", "verify_when", "verify_among")]
        if pipeline and self.verify_by != "pipeline":
            raise HetpruneError(f"hetdpt.{pipeline[0]} applies to the checks of verify_by pipeline, and this run's "
                                f"are verify_by {self.verify_by}: set hetdpt.verify_by pipeline, or leave "
                                f"hetdpt.{pipeline[0]} at its default")

    @property
    def images_budget(self) -> int | str | None:
        """What sizes the pipeline checks in images: ``verify_images`` (auto by default), or None where a
        ``verify_budget`` sizes them in final fine-tunes instead."""
        return None if self.verify_budget is not None else self.verify_images

    def predictor_options_for(self, name: str) -> dict:
        return dict(self.predictor_options.get(name) or {})
