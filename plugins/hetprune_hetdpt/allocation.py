"""HetDPT's stage 1 as one object (issue 71): points -> fit -> candidates -> checks -> pick.

An `Allocation` is made for one job. What it knows before stage 1 (the feasible splits, whether the checks
cover them, the point plan, the predictor that will fit, the candidates where they are known) is what
``--plan``, the pre-flight and the run share: the plan's counts and the refusals come from the methods the run
calls, not from code of their own. Each step of the run takes and returns plain data (splits, values by
split, point records), so the MAP study (benchmarks/map_points.py) drives the same steps with several
predictors on one set of points.

Which splits the checks take, and how they are measured, is the job's checks policy (``hetdpt.checks``, a
component of the ``checks`` kind: checks.py holds the built-in ones); the refinement's next splits are a
function below: one rule for a run and for a study.
"""

from __future__ import annotations

import dataclasses

from hetprune import HetpruneError
from hetprune.plugin_api import PruneJob, storage
from hetprune.plugin_api import plan as planning
from hetprune.plugin_api import distributed as dist

from .halving import Halving, PipelineChecks
from .options import HetDPTOptions
from .point_schemes import PointScheme, grid_plan

Split = tuple[int, int]
FALLBACK = ("poly", {"degree": 1})   # the predictor that needs the fewest points: a plane through 3


class Allocation:
    """Stage 1 of one job: `plan_steps` and `check` before it, `run` for it, and the steps `run` takes
    (`point_plan`, `predictor`, `points`, `fit`, `values`, `candidates`, `check_candidates`) for a study."""

    def __init__(self, strategy, job: PruneJob):
        self.strategy, self.job = strategy, job
        self.opts = job.options(HetDPTOptions)
        self.pairs: list[Split] = job.feasible_pairs()   # rank 0's: each rank measures its share of one plan
        self.sign = 1 if job.task.higher_is_better else -1   # the best split: the highest metric, or the lowest loss
        self.fallback: dict | None = None   # where `predictor` fitted a plane in the configured one's place
        self.policy = strategy.checks_policy(job)   # hetdpt.checks: which splits are checked, and how

    # -- what is known before stage 1 ---------------------------------------------------------------------
    @property
    def scheme(self):
        return self.strategy.scheme(self.job)

    @property
    def covered(self) -> bool:
        """Whether the pipeline checks' candidates are known before any point (the policy's ``known``: every
        feasible split, for checks of all of them): then no point is measured and no predictor fitted, since
        none could change the pick."""
        return self.known_candidates() is not None

    @property
    def most(self) -> int:
        """The most splits the checks take (0: none; fewer than 2 check nothing)."""
        most = self.policy.most(self.pairs) if len(self.pairs) > 1 else 0
        return most if most > 1 else 0

    def point_plan(self) -> list[Split]:
        """The points stage 1 measures: none where there is nothing to choose or the checks cover every
        split, else the scheme's plan (rank 0's)."""
        if len(self.pairs) <= 1 or self.covered:
            return []
        return dist.on_main(lambda: self.scheme.plan(self.pairs))

    def known_candidates(self) -> list[Split] | None:
        """The splits the pipeline checks take where the policy knows them before any point (checks of every
        split: fewer attention removals first), else None."""
        if len(self.pairs) <= 1 or self.policy.measure != "pipeline" or not self.most:
            return None
        return self.policy.known(self.pairs)

    def checks(self) -> PipelineChecks | None:
        """The pipeline checks of this job (None where there are none)."""
        if self.most and self.policy.measure == "pipeline":
            return PipelineChecks(self.job, self.policy)
        return None

    def predictor(self, plan: list[Split], what: str = "this budget and model", say: bool = True):
        """The configured predictor (``hetdpt.predictor`` with its options) where ``plan`` has the points it
        needs; else, past the paper, a plane (poly of degree 1, `FALLBACK`), said in one line (``say``): a
        small target's few points still pick a split. Refused before any point is measured only where not
        even a plane can be fitted, with the changes that would help."""
        job = self.job
        predictor = self.strategy.predictor(job)
        need = getattr(predictor, "min_points", None)
        self.fallback = None
        if need is None or len(plan) >= need:
            return predictor
        fallback = job.registry.build("predictor", FALLBACK[0], **FALLBACK[1])
        grows = self.plan_could_give(need)
        more = f"; {grows} would give {predictor.name} its {need}" if grows else ""
        if len(plan) >= fallback.min_points:
            if say:
                job.log(f"[hetdpt] predictor {predictor.name} needs at least {need} distinct points and {what} "
                        f"give {len(plan)}{more}: fitting a plane (poly of degree 1) through them instead")
            self.fallback = {"configured": predictor.name, "plan_points": len(plan)}
            return fallback
        plane = self.plan_could_give(fallback.min_points)   # what would give the plane its points
        helps = [plane] if plane else []
        helps.append("check every split instead of predicting (hetdpt.checks all)")
        raise HetpruneError(
            f"predictor {predictor.name!r} needs at least {need} distinct points, and a plane (the fewest any "
            f"predictor needs) {fallback.min_points}, but {what} give a plan of {len(plan)}: {plan}. "
            + "; or ".join(h[0].upper() + h[1:] for h in helps))

    def plan_could_give(self, need: int) -> str | None:
        """The change to the points' settings that would give the plan ``need`` points, where one would: the
        grid schemes' ``axis_points`` / ``mixed_points`` / ``dense_point`` at their most (None: no setting
        can, as on a budget line of two splits, so no error or line advises raising them)."""
        opts, pairs, scheme = self.opts, self.pairs, self.scheme
        if type(scheme).plan is not PointScheme.plan:   # a path makes its own points: only the dense one
            return ("setting hetdpt.dense_point true"
                    if not opts.dense_point and need <= len(scheme.plan(pairs)) + 1 else None)
        grid = {"axis_points": max(max(p) for p in pairs), "mixed_points": len(pairs)}
        changes: list[tuple[str, dict]] = [("raising hetdpt.axis_points / hetdpt.mixed_points", grid)]
        if not opts.dense_point:
            changes = [("setting hetdpt.dense_point true", {"dense_point": True}), *changes,
                       ("raising hetdpt.axis_points / hetdpt.mixed_points and setting hetdpt.dense_point true",
                        {**grid, "dense_point": True})]
        for change, values in changes:
            if len(grid_plan(dataclasses.replace(opts, **values), pairs)) >= need:
                return change
        return None

    def check(self) -> None:
        """What the settings cannot do, refused before stage 1 trains anything: refinement its point scheme
        cannot reach, a plan too small for any predictor, a point scorer without a one-shot score, and a
        checks' budget that cannot pay for the selections of its candidates (theirs where they are known,
        else the cheapest any K could cost)."""
        opts, scheme = self.opts, self.scheme
        if opts.refine and not scheme.refinable:
            raise HetpruneError(f"hetdpt.refine measures splits on the budget line, which {scheme.name} points "
                                "cannot reach (a path only makes its own splits); use refine 0, or "
                                "point_selection oneshot or gradual")
        if len(self.pairs) <= 1:   # nothing to choose: no point is measured
            return
        if not self.covered:   # checks of every split need no point, nor a predictor
            self.predictor(self.point_plan(), say=False)
        if scheme.orders_by_point_scorer:
            scheme.scorer()   # a point scorer without a one-shot score is refused as it is built
        checks = self.checks()
        if checks is not None:   # a selection share of nothing known is refused as it is made
            checks.check_budget(None, self.pairs, self.most, self.known_candidates())

    def plan_steps(self) -> list[planning.PlanStep]:
        """Stage 1 counted (``--plan``): the scheme's points and, past the paper, the checks (the checks alone
        where they cover every feasible split), by the code the run counts them with."""
        pairs = self.pairs
        if len(pairs) <= 1:
            return []
        plan = self.point_plan()
        steps = [] if self.covered else self.scheme.plan_steps(plan, pairs)   # covered: the checks alone
        checks = self.checks()
        if checks is not None:
            steps += checks.plan_steps(self.most, None, self.strategy.plan_sites(self.job), self.known_candidates())
        # which splits the checks measure (the policy's note); a near-tie's checks are counted as if they run:
        # the most they cost
        which = (f", every one of the {len(pairs)} feasible splits: no MAP point measured" if self.covered else
                 getattr(self.policy, "plan_note", ""))
        if self.most and which:
            steps = [dataclasses.replace(s, what=s.what + which) if "checks" in s.stage else s for s in steps]
        return steps

    # -- the steps of stage 1 -----------------------------------------------------------------------------
    def points(self, plan: list[Split]) -> list[dict]:
        """Every planned point, measured or read from the store (`PointScheme.collect`)."""
        return self.strategy.collect_points(self.job, plan)

    def fit(self, predictor, points: list[dict]) -> dict[Split, float]:
        """``predictor`` fitted on ``points`` (its return value ignored: the object is the fitted one), and
        its prediction at every feasible split."""
        return fit(predictor, points, self.pairs)

    def values(self, predicted: dict, points: list[dict]) -> dict[Split, float]:
        """What the pick and the candidates are chosen by: the predictor's values (the paper's argmax), or,
        refined, the measured value where a split was measured."""
        if not self.opts.refine:
            return dict(predicted)
        measured = {(p["n_attn"], p["n_act"]): storage.metric_of(p) for p in points}
        return {pair: measured.get(pair, predicted[pair]) for pair in self.pairs}

    def best(self, value: dict) -> Split:
        """The best split by ``value``; ties go to fewer attention removals."""
        return max(self.pairs, key=lambda p: (self.sign * value[p], -p[0]))

    def candidates(self, value: dict, loo_mae: float | None) -> tuple[list[Split], dict | None]:
        """The splits the checks take (the policy's ``candidates``, best first) and, for a policy that checks
        only near ties, what the predictor was unsure of (else None)."""
        pairs = self.pairs
        chosen = self.policy.candidates(pairs, value, loo_mae, self.sign) if self.most else []
        unsure = getattr(self.policy, "unsure", None)
        said = unsure(pairs, value, loo_mae, self.sign) if unsure and self.most else None
        return list(chosen), said

    def check_candidates(self, best: list[Split]) -> dict:
        """The candidates measured, by the pipeline (successive halving) or as points of the scheme's kind:
        the pick, its measured value and the record of what ran."""
        job, sign = self.job, self.sign
        checks = self.checks()
        if checks is not None:   # the final run's selection and fine-tune, within the settings' budget
            halved = checks.run(best)
            pick = halved.winner
            assert pick is not None   # halving names a winner of any candidates, and best has one at least
            job.log(f"[hetdpt] pipeline checks: {pick[0]}+{pick[1]} kept after {len(halved.rounds)} round(s), "
                    f"{halved.unit.said(halved.spent)} of {halved.unit.said(halved.budget)} spent")
            return {"pick": pick, "verified": halved_value(halved, pick), "halved": halved, "checked": []}
        found = self.scheme.verify(best)
        pick = max(best, key=lambda p: (sign * storage.metric_of(found[p]), -p[0]))
        job.log("[hetdpt] verified: " + ", ".join(f"{a}+{m} {job.task.format(storage.metric_of(found[(a, m)]))}"
                                                   for a, m in best))
        return {"pick": pick, "verified": storage.metric_of(found[pick]), "halved": None,
                "checked": [found[p] for p in best]}

    # -- the stage ----------------------------------------------------------------------------------------
    def run(self) -> tuple[Split, dict]:
        """Stage 1: the pick and the report's ``allocation`` record."""
        job, opts, pairs = self.job, self.opts, self.pairs
        if len(pairs) == 1:   # nothing to choose: no point could change the answer
            job.log(f"[hetdpt] the budget allows one split, {pairs[0][0]}+{pairs[0][1]}: taken without MAP points")
            return pairs[0], {"predictor": None, "points": [], "fit": {}, "surface": [], "refinement": [],
                              "single_split": True, "pick": {"n_attn": pairs[0][0], "n_act": pairs[0][1]}}
        self.check()   # again: a strategy that runs this one inside (hetdpt-plus) checks it here
        if self.covered:
            return self.run_covered()
        plan = self.point_plan()
        predictor = self.predictor(plan)
        points = self.points(plan)
        predicted = self.fit(predictor, points)
        rounds = []
        for r in range(opts.refine):
            new = dist.on_main(lambda: refinement_pairs(pairs, predicted,
                                                        {(p["n_attn"], p["n_act"]) for p in points}, self.sign))
            if not new:
                break
            job.log(f"[hetdpt] refinement {r + 1}/{opts.refine}: measuring {', '.join(f'{a}+{m}' for a, m in new)}")
            plan = plan + new
            points = self.points(plan)
            predicted = self.fit(predictor, points)
            rounds.append({"measured": [list(p) for p in new]})
        measured = {(p["n_attn"], p["n_act"]): storage.metric_of(p) for p in points}
        value = self.values(predicted, points)
        pick = self.best(value)
        fit_report = predictor.fit_report() if hasattr(predictor, "fit_report") else {}
        best, unsure = self.candidates(value, fit_report.get("loo_mae"))
        verify = self.most
        chooses = getattr(self.policy, "chooses", "")   # a policy's own words for its candidates (optional)
        if verify and chooses:
            job.log(f"[hetdpt] checking {chooses}: {', '.join(f'{a}+{m}' for a, m in best)}")
        if verify and unsure is not None:   # a clear pick is trusted, a near-tie checked
            error = "unknown" if unsure["loo_mae"] is None else job.task.number(unsure["loo_mae"])
            job.log(f"[hetdpt] the predictor's leave-one-out error is {error}: " + (
                f"{', '.join(f'{a}+{m}' for a, m in best)} within it of the best, checked" if len(best) > 1 else
                f"{pick[0]}+{pick[1]} stands out, taken without checks"))
        checked = verify and len(best) > 1 and (unsure is None or unsure["checked"])
        found = self.check_candidates(best) if checked else {"checked": [], "halved": None}
        pick = found.get("pick", pick)
        surface = [{"n_attn": a, "n_act": m, "predicted": predicted[(a, m)],
                    **({"std": predictor.uncertainty(a, m)} if hasattr(predictor, "uncertainty") else {}),
                    **({"measured": measured[(a, m)]} if (a, m) in measured else {})} for a, m in pairs]
        job.log(f"[hetdpt] predictor {predictor.name}: " + ", ".join(
            f"({d['n_attn']},{d['n_act']})={job.task.number(d['predicted'])}" for d in surface))
        halved = found["halved"]
        return pick, {"predictor": predictor.name, "points": points, "fit": fit_report, "surface": surface,
                      "refinement": rounds, "verified": found["checked"], "point_selection": self.scheme.name,
                      **({"predictor_fallback": self.fallback} if self.fallback else {}),
                      "points_cost": points_cost(points + found["checked"]),
                      **({"pipeline_checks": halved.to_dict()} if halved is not None else {}),
                      **({"unsure": unsure} if unsure is not None else {}),
                      "pick": {"n_attn": pick[0], "n_act": pick[1], "predicted": predicted[pick],
                               **({"measured": measured[pick]} if opts.refine and pick in measured else {}),
                               **({"verified": found["verified"]} if checked else {})}}

    def run_covered(self) -> tuple[Split, dict]:
        """Stage 1 where the pipeline checks cover every feasible split: each is checked and the best is the
        pick; no MAP point is measured and no predictor fitted, since none could change it."""
        self.job.log(f"[hetdpt] the checks ({self.policy.name}) cover all {len(self.pairs)} feasible splits: each "
                     "is checked, no MAP point measured (none could change the pick)")
        known = self.known_candidates()
        assert known is not None   # covered: the policy knows them
        found = self.check_candidates(known)
        pick = found["pick"]
        return pick, {"predictor": None, "points": [], "fit": {}, "surface": [], "refinement": [], "verified": [],
                      "checked_every_split": True, "point_selection": self.scheme.name,
                      "points_cost": points_cost([]), "pipeline_checks": found["halved"].to_dict(),
                      "pick": {"n_attn": pick[0], "n_act": pick[1], "verified": found["verified"]}}


# -- the rules ------------------------------------------------------------------------------------------------
def fit(predictor, points: list[dict], pairs: list[Split]) -> dict[Split, float]:
    """``predictor`` fitted on ``points`` and its prediction at every split of ``pairs``; ``fit()``'s return
    value is ignored (the contract's rule): the object is the fitted one."""
    predictor.fit([(p["n_attn"], p["n_act"], storage.metric_of(p)) for p in points])
    return {pair: predictor.predict(*pair) for pair in pairs}


def refinement_pairs(pairs: list[Split], predicted: dict, measured: set, sign: int = 1) -> list[Split]:
    """The best predicted feasible split not yet measured, and its unmeasured neighbours on the budget line
    (``sign`` -1: the metric is better lower)."""
    line = sorted(pairs)
    best = max((p for p in line if p not in measured), key=lambda p: (sign * predicted[p], -p[0]), default=None)
    if best is None:
        return []
    i = line.index(best)
    return [p for p in line[max(0, i - 1):i + 2] if p not in measured]


def halved_value(halved: Halving, pick: Split) -> float | None:
    """The pick's value in the last round that measured it."""
    return next((m["metric"] for r in reversed(halved.rounds) for m in r["measured"]
                 if (m["n_attn"], m["n_act"]) == pick), None)


def points_cost(points: list[dict]) -> dict:
    """What the points cost: images through their fine-tunes (None where a point could not count them) and
    seconds."""
    images = [p.get("images") for p in points]
    return {"points": len(points), "images": None if None in images else sum(images),
            "seconds": round(sum(p.get("seconds", 0) for p in points), 1)}
