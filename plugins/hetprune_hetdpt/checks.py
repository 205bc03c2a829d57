"""HetDPT's checks policies (the ``checks`` kind, past the paper): which splits stage 1 checks after the
predictor's fit, and how. ``hetdpt.checks`` names one, ``hetdpt.checks_options`` gives its options; the pick
is the best checked (none: the predictor's argmax, the paper's).

* ``spread`` (the default, issue 58's study): the feasible splits ordered by attention removals, cut into
  ``count`` runs of near-equal length, and the best predicted of each run: a predictor wrong about the whole
  line cannot keep its best part from the checks.
* ``best``: the ``count`` best predicted.
* ``near-ties``: of the ``count`` best predicted, only those within the predictor's leave-one-out error of
  the best (a clear pick is trusted, a near-tie checked).
* ``all``: every feasible split; no MAP point is measured, since none could change the pick.
* ``points``: ``count`` splits (chosen ``among`` best, spread or near-ties) measured as points of the run's
  scheme, not through the final pipeline.
* ``none``: no checks.

The pipeline policies (all but ``points`` and ``none``) check each candidate by the final run's own selection
and fine-tune, kept by successive halving (halving.py), sized by one typed block: ``budget`` in ``unit``
(images: each check fine-tunes on the points' schedule cut to its share, so the checks' cost does not grow
with the final schedule; finetunes: in final fine-tunes), and what each candidate's selection trains on
(``selection``, with its floor ``selection_at_least``). A combination the old ``verify_*`` flags refused by
hand (spread checks only when unsure; a budget in two units) has no spelling here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from hetprune import HetpruneError
from hetprune.plugin_api import number, whole

Split = tuple[int, int]
UNITS = ("images", "finetunes")
AMONG = ("spread", "best", "near-ties")


def _need(policy, name: str, ok: bool, what: str) -> None:
    if not ok:
        raise HetpruneError(f"hetdpt.checks_options.{policy.name}.{name} must be {what}, got "
                            f"{getattr(policy, name)!r}")


@dataclass(frozen=True)
class Counted:
    """A policy that checks at most ``count`` splits."""

    count: int = 6

    def __post_init__(self):
        _need(self, "count", whole(self.count, 2),
              "a count of splits >= 2 (one check measures the predicted split alone and keeps it whatever it "
              "measures: it would spend images and change nothing; hetdpt.checks none checks nothing)")

    def most(self, pairs: list[Split]) -> int:
        return min(self.count, len(pairs))


@dataclass(frozen=True)
class Sized:
    """How pipeline checks are sized (`hetprune.plugin_api.SizesChecks`): ``budget`` in ``unit`` and what each
    candidate's selection trains on. The defaults are issue 58's study's."""

    budget: int | float | str = "auto"
    unit: str = "images"
    selection: float = 0.07
    selection_at_least: int | None = 300

    measure: ClassVar[str] = "pipeline"

    def __post_init__(self):
        _need(self, "unit", self.unit in UNITS,
              "images (each check fine-tunes on the points' schedule cut to its share) or finetunes (the final "
              "fine-tune's)")
        if self.unit == "images":
            _need(self, "budget", self.budget == "auto" or whole(self.budget, 1),
                  "auto (the selections and one whole point's fine-tune per check) or a whole number of "
                  "training images >= 1 (the selections counted)")
        else:
            _need(self, "budget", self.budget == "auto" or (number(self.budget) and self.budget > 0),
                  "auto (the selections and 2 final fine-tunes) or a number of final fine-tunes > 0 (the "
                  "selections counted)")
        _need(self, "selection", (number(self.selection, 0, 1) and self.selection > 0)
              or (number(self.selection) and self.selection > 1 and float(self.selection).is_integer()),
              "a share of scoring.subset within (0, 1] (1: the final run's own selection), or a whole number of "
              "images per gate epoch above 1")
        _need(self, "selection_at_least", self.selection_at_least is None or whole(self.selection_at_least, 1),
              "a whole number of images per gate epoch >= 1, or null (no floor)")
        floor = next(f.default for f in fields(Sized) if f.name == "selection_at_least")
        if self.selection_at_least not in (None, floor) and number(self.selection) and self.selection >= 1:
            what = ("1 (the run's own selection, the whole subset)" if self.selection == 1 else
                    f"{int(self.selection):,} images per gate epoch, a number the floor leaves as it is")
            raise HetpruneError(f"hetdpt.checks_options.{self.name}.selection_at_least ({self.selection_at_least})"
                                f" is a floor under a share of the scoring subset (selection below 1), and "
                                f"selection is {what}: set one of them")

    @property
    def images(self) -> int | float | str | None:
        return budget_in_images(self.budget, self.unit)

    @property
    def finetunes(self) -> float | None:
        return budget_in_finetunes(self.budget, self.unit)


def budget_in_images(budget, unit: str):
    """A checks budget in images (``auto`` or a number), or None where it is in final fine-tunes."""
    return budget if unit == "images" else None


def budget_in_finetunes(budget, unit: str) -> float | None:
    """A checks budget in final fine-tunes (None: in images, or auto)."""
    return None if unit == "images" or budget == "auto" else float(budget)


@dataclass(frozen=True)
class SpreadChecks(Sized, Counted):
    """The best predicted split of each of ``count`` parts of the budget line, through the final pipeline."""

    name: ClassVar[str] = "spread"
    description: ClassVar[str] = "the best predicted split of each of count parts of the budget line (the default)"
    plan_note: ClassVar[str] = ", one in each part of the line"   # what --plan says of the candidates
    chooses: ClassVar[str] = "the best predicted split of each part of the line"   # what the run's log says

    def __post_init__(self):
        Counted.__post_init__(self)
        Sized.__post_init__(self)

    def known(self, pairs: list[Split]) -> list[Split] | None:
        return sorted(pairs) if len(pairs) > 1 and self.count >= len(pairs) else None

    def candidates(self, pairs, value, loo_mae, sign=1) -> list[Split]:
        return spread(pairs, value, self.count, sign)


@dataclass(frozen=True)
class BestChecks(SpreadChecks):
    """The ``count`` best predicted splits, through the final pipeline."""

    name: ClassVar[str] = "best"
    description: ClassVar[str] = "the count best predicted splits"
    plan_note: ClassVar[str] = ""
    chooses: ClassVar[str] = ""

    def candidates(self, pairs, value, loo_mae, sign=1) -> list[Split]:
        return best(pairs, value, self.count, sign)


@dataclass(frozen=True)
class NearTieChecks(SpreadChecks):
    """Of the ``count`` best predicted, those the predictor cannot tell from the best (within its leave-one-out
    error), through the final pipeline; none where the best stands out."""

    name: ClassVar[str] = "near-ties"
    description: ClassVar[str] = "of the count best predicted, those within the predictor's leave-one-out error"
    plan_note: ClassVar[str] = ", only on a near-tie"
    chooses: ClassVar[str] = ""   # the run says what the predictor was unsure of instead

    def known(self, pairs: list[Split]) -> list[Split] | None:
        return None   # which are near is known only from the fit

    def candidates(self, pairs, value, loo_mae, sign=1) -> list[Split]:
        return near_ties(best(pairs, value, self.count, sign), value, loo_mae, sign)

    def unsure(self, pairs, value, loo_mae, sign=1) -> dict:
        """What the predictor was unsure of (the report's ``allocation.unsure``)."""
        near = self.candidates(pairs, value, loo_mae, sign)
        return {"loo_mae": loo_mae, "near": [list(p) for p in near], "checked": len(near) > 1}


@dataclass(frozen=True)
class AllChecks(Sized):
    """Every feasible split, through the final pipeline: no MAP point is measured (none could change the
    pick)."""

    name: ClassVar[str] = "all"
    description: ClassVar[str] = "every feasible split, and no MAP point"

    def most(self, pairs: list[Split]) -> int:
        return len(pairs)

    def known(self, pairs: list[Split]) -> list[Split] | None:
        return sorted(pairs) if len(pairs) > 1 else None

    def candidates(self, pairs, value, loo_mae, sign=1) -> list[Split]:
        return sorted(pairs)


@dataclass(frozen=True)
class PointChecks(Counted):
    """``count`` splits chosen ``among`` the best predicted, a spread or the near ties, each measured as a point
    of the run's scheme (a progressive path's checks from its nearest step), not through the final pipeline
    (in the study such checks undervalued attention-heavy splits: benchmarks/results/map-points.md)."""

    among: str = "spread"

    name: ClassVar[str] = "points"
    description: ClassVar[str] = "count splits measured as points of the run's scheme, not the final pipeline"
    measure: ClassVar[str] = "points"

    def __post_init__(self):
        super().__post_init__()
        _need(self, "among", self.among in AMONG, f"one of {', '.join(AMONG)}")

    @property
    def plan_note(self) -> str:
        return self.rule().plan_note

    @property
    def chooses(self) -> str:
        return self.rule().chooses

    def known(self, pairs: list[Split]) -> list[Split] | None:
        return None   # points of the scheme: a path's checks extend its measured steps, so it keeps its points

    def rule(self):
        cls = {"spread": SpreadChecks, "best": BestChecks, "near-ties": NearTieChecks}[self.among]
        return cls(count=self.count)

    def candidates(self, pairs, value, loo_mae, sign=1) -> list[Split]:
        return self.rule().candidates(pairs, value, loo_mae, sign)

    def unsure(self, pairs, value, loo_mae, sign=1) -> dict | None:
        rule = self.rule()
        return rule.unsure(pairs, value, loo_mae, sign) if hasattr(rule, "unsure") else None


@dataclass(frozen=True)
class NoChecks:
    """No checks: the predictor's argmax (the paper's)."""

    name: ClassVar[str] = "none"
    description: ClassVar[str] = "no checks: the predictor's argmax (the paper's)"
    measure: ClassVar[str] = "pipeline"

    def most(self, pairs: list[Split]) -> int:
        return 0

    def known(self, pairs: list[Split]) -> list[Split] | None:
        return None

    def candidates(self, pairs, value, loo_mae, sign=1) -> list[Split]:
        return []


POLICIES = (SpreadChecks, BestChecks, NearTieChecks, AllChecks, PointChecks, NoChecks)


# -- the rules ------------------------------------------------------------------------------------------------
def best(pairs: list[Split], value: dict, k: int, sign: int = 1) -> list[Split]:
    """The ``k`` best by ``value``, best first; ties go to fewer attention removals."""
    return sorted(pairs, key=lambda p: (-sign * value[p], p[0]))[:k]


def spread(pairs: list[Split], value: dict, k: int, sign: int = 1) -> list[Split]:
    """The feasible splits ordered by attention removals, cut into ``k`` runs of near-equal length (the first
    runs the shorter), and the best by ``value`` of each run; the result best first. The predicted best is
    always among them, since it is the best of its run."""
    line = sorted(pairs)
    k = min(k, len(line))
    runs = [line[i * len(line) // k:(i + 1) * len(line) // k] for i in range(k)]
    picks = [max(run, key=lambda p: (sign * value[p], -p[0])) for run in runs]
    return sorted(picks, key=lambda p: (-sign * value[p], p[0]))


def near_ties(ranked: list[Split], value: dict, loo_mae: float | None, sign: int = 1) -> list[Split]:
    """Of ``ranked`` (best first), the splits whose value is within the predictor's leave-one-out error
    (``loo_mae``) of the first: the ones it cannot tell apart. A predictor that cannot say its error (too few
    points) is unsure of all of them."""
    if loo_mae is None:
        return list(ranked)
    return [p for p in ranked if sign * (value[ranked[0]] - value[p]) <= loo_mae]
