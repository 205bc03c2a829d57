"""The ``hetdpt`` strategy: MAP budget allocation, then the shared depth pipeline
(learned within-kind selection, KD fine-tune, merge)."""

from __future__ import annotations

import dataclasses

from hetprune import HetpruneError, Site
from hetprune.plugin_api import DepthStrategy, PruneJob, RunSettings, metric_of
from hetprune.plugin_api import distributed as dist

from .halving import PipelineChecks
from .options import HetDPTOptions
from .point_schemes import OneShotPoints, PointScheme, grid_plan, resolve_finetune
from .point_selection import SCHEMES, scheme_for


FALLBACK = ("poly", {"degree": 1})   # the predictor that needs the fewest points: a plane through 3


class HetDPT(DepthStrategy):
    """HetDPT: split the budget with a fitted accuracy predictor (MAP), learned gates within each kind."""

    name = "hetdpt"
    description = "HetDPT: split the budget with a fitted accuracy predictor (MAP), learned gates within each kind"
    # 2 (issue 71): where the checks cover every feasible split they run without points, fewer attention removals
    # first (before: best predicted first), which can change a tie and the removals the checks share
    behaviour = 2
    sections = {"hetdpt": HetDPTOptions}   # typed: options.py says what each setting does
    defaults = {"hetdpt": HetDPTOptions.defaults()}

    # -- stage 1: points (one scheme object per job: point_schemes.py, progressive.py) -------------
    point_schemes = SCHEMES   # name -> PointScheme class; a strategy built on this one may add its own

    def scheme(self, job: PruneJob):
        """The job's point scheme (``hetdpt.point_selection``), built once per job with its settings resolved."""
        return scheme_for(job, self, self.point_schemes)

    def point_plan(self, job: PruneJob, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The points the job's scheme measures for a budget whose feasible splits are ``pairs``."""
        return self.scheme(job).plan(pairs)

    def grid_plan(self, job: PruneJob, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Axis and budget-line points (``axis_points``, ``mixed_points``, ``dense_point``), whatever the
        scheme: the candidates HetDPT+'s share search measures its own way."""
        return grid_plan(job.options(HetDPTOptions), pairs)

    def collect_points(self, job: PruneJob, plan: list[tuple[int, int]]) -> list[dict]:
        """Measure every planned point not already in the points file (see `PointScheme.collect`)."""
        return self.scheme(job).collect(plan)

    def points_key(self, job: PruneJob) -> str:
        """The key of the job's points (of its dense point, for progressive points, whose paths have theirs)."""
        return self.scheme(job).key

    def removal_orders(self, job: PruneJob, limits: dict[str, int]) -> dict[str, list[Site]]:
        """Per kind, the point scorer's removal order on the dense model (one-shot points; HetDPT+'s share
        search)."""
        return OneShotPoints(job, self).orders(limits)

    POINT_SELECTIONS = tuple(SCHEMES)

    @staticmethod
    def point_finetune(settings: dict, train_size: int | None = None) -> str:
        """The settings section whose schedule fine-tunes a one-shot point, ``auto`` resolved."""
        return resolve_finetune(HetDPTOptions.of(settings).point_finetune, RunSettings.of(settings), train_size,
                                "oneshot")

    # -- what ``hetprune ablate`` asks of a strategy with cheap points --------------
    @staticmethod
    def predictor_name(settings: dict) -> str:
        """The predictor the settings name (``hetdpt.predictor``)."""
        return HetDPTOptions.of(settings).predictor

    @staticmethod
    def point_selection(settings: dict) -> str:
        """The point scheme the settings name (``hetdpt.point_selection``)."""
        return HetDPTOptions.of(settings).point_selection

    @staticmethod
    def point_scorer(job: PruneJob) -> str:
        """The scorer that orders the points' removals (``hetdpt.point_scorer``): part of their keys."""
        return job.options(HetDPTOptions).point_scorer

    @staticmethod
    def predictor(job: PruneJob, name: str | None = None):
        """Predictor ``name`` (default: the configured one) with its options from ``hetdpt.predictor_options``."""
        opts = job.options(HetDPTOptions)
        name = name or opts.predictor
        return job.registry.build("predictor", name, **opts.predictor_options_for(name))

    @staticmethod
    def checks_cover(opts: HetDPTOptions, pairs: list[tuple[int, int]]) -> bool:
        """Whether the pipeline checks measure every feasible split (``hetdpt.verify`` at least their number,
        checked always): then no MAP point could change the pick, and none is measured, nor a predictor fitted.
        (Checks of the points' kind, ``verify_by: points``, are points of the scheme: a progressive path's
        checks extend its measured steps, so they keep their points.)"""
        return (opts.verify_by == "pipeline" and opts.verify >= len(pairs) and opts.verify_when == "always"
                and bool(opts.verify))

    def plan_allocation(self, job: PruneJob) -> list:
        """Stage 1 counted (``--plan``): the scheme's points and, past the paper, the checks (the checks alone
        where they cover every feasible split)."""
        pairs = job.feasible_pairs()
        if len(pairs) <= 1:
            return []
        scheme = self.scheme(job)
        opts = job.options(HetDPTOptions)
        covered = self.checks_cover(opts, pairs)
        steps = [] if covered else scheme.plan_steps(scheme.plan(pairs), pairs)   # covered: the checks alone
        if opts.verify and opts.verify_by == "pipeline":
            steps += PipelineChecks(job).plan_steps(min(opts.verify, len(pairs)), None, self.plan_sites(job))
        # which splits the checks measure (spread and unsure are never together); a near-tie's checks are
        # counted as if they run: the most they cost
        which = (f", every one of the {len(pairs)} feasible splits: no MAP point measured" if covered else
                 ", one in each part of the line" if opts.verify_among == "spread" else
                 ", only on a near-tie" if opts.verify_when == "unsure" else "")
        if opts.verify and which:
            steps = [dataclasses.replace(s, what=s.what + which) if "checks" in s.stage else s for s in steps]
        return steps

    def check_settings(self, job: PruneJob) -> None:
        """What the job's hetdpt settings cannot do, refused before stage 1 trains anything: refinement its
        point scheme cannot reach, fewer planned points than its predictor needs, and a ``verify_budget`` that
        cannot pay for the selections of its pipeline checks' candidates."""
        opts = job.options(HetDPTOptions)
        scheme = self.scheme(job)
        if opts.refine and not scheme.refinable:
            raise HetpruneError(f"hetdpt.refine measures splits on the budget line, which {scheme.name} points "
                                "cannot reach (a path only makes its own splits); use refine 0, or "
                                "point_selection oneshot or gradual")
        pairs = job.feasible_pairs()
        if len(pairs) <= 1:   # nothing to choose: no point is measured
            return
        if not self.checks_cover(opts, pairs):   # checks of every split need no point, nor a predictor
            self.predictor_for(job, dist.on_main(lambda: self.point_plan(job, pairs)), say=False)
        if scheme.orders_by_point_scorer:
            scheme.scorer()   # a point scorer without a one-shot score is refused as it is built
        if opts.verify and opts.verify_by == "pipeline":
            checks = PipelineChecks(job)   # a verify_selection share of nothing known is refused as it is made
            # the settings' budget, if any, against the candidates where they are known: every split's
            checks.check_budget(None, pairs, min(opts.verify, len(pairs)),
                                sorted(pairs) if self.checks_cover(opts, pairs) else None)

    # -- stage 1: allocation ---------------------------------------------------
    def predictor_for(self, job: PruneJob, plan: list[tuple[int, int]], what: str = "this budget and model",
                      say: bool = True):
        """The configured predictor (``hetdpt.predictor`` with its options) where ``plan`` has the points it
        needs; else, past the paper, a plane (poly of degree 1, `FALLBACK`), said in one line (``say``): a
        small target's few points still pick a split. Refused before any point is measured only where not
        even a plane can be fitted, with the changes that would help."""
        predictor = self.predictor(job)
        need = getattr(predictor, "min_points", None)
        if need is None or len(plan) >= need:
            return predictor
        fallback = job.registry.build("predictor", *FALLBACK[:1], **FALLBACK[1])
        grows = self.plan_could_give(job, need)
        more = (f"; {grows} would give {predictor.name} its {need}" if grows else "")
        if len(plan) >= fallback.min_points:
            if say:
                job.log(f"[hetdpt] predictor {predictor.name} needs at least {need} distinct points and {what} "
                        f"give {len(plan)}{more}: fitting a plane (poly of degree 1) through them instead")
            return fallback
        plane = self.plan_could_give(job, fallback.min_points)   # what would give the plane its points
        helps = [plane] if plane else []
        pairs = job.feasible_pairs()
        helps.append(f"check every split instead of predicting (hetdpt.verify {len(pairs)}, verify_by pipeline)")
        raise HetpruneError(
            f"predictor {predictor.name!r} needs at least {need} distinct points, and a plane (the fewest any "
            f"predictor needs) {fallback.min_points}, but {what} give a plan of {len(plan)}: {plan}. "
            + "; or ".join(h[0].upper() + h[1:] for h in helps))

    def plan_could_give(self, job: PruneJob, need: int) -> str | None:
        """The change to the points' settings that would give the plan ``need`` points, where one would: the
        grid schemes' ``axis_points`` / ``mixed_points`` / ``dense_point`` at their most (None: no setting
        can, as on a budget line of two splits, so no error or line advises raising them)."""
        opts, pairs = job.options(HetDPTOptions), job.feasible_pairs()
        scheme = self.scheme(job)
        if type(scheme).plan is not PointScheme.plan:   # a path makes its own points: only the dense one
            return "setting hetdpt.dense_point true" if not opts.dense_point and need <= len(scheme.plan(pairs)) + 1 \
                else None
        grid = {"axis_points": max(max(p) for p in pairs), "mixed_points": len(pairs)}
        changes = [("raising hetdpt.axis_points / hetdpt.mixed_points", grid)]
        if not opts.dense_point:
            changes = [("setting hetdpt.dense_point true", {"dense_point": True}), *changes,
                       ("raising hetdpt.axis_points / hetdpt.mixed_points and setting hetdpt.dense_point true",
                        {**grid, "dense_point": True})]
        for change, values in changes:
            if len(grid_plan(dataclasses.replace(opts, **values), pairs)) >= need:
                return change
        return None

    def allocate(self, job: PruneJob):
        pairs = job.feasible_pairs()   # rank 0's, like every plan below: each rank measures its share of one plan
        if len(pairs) == 1:   # nothing to choose: no point could change the answer
            job.log(f"[hetdpt] the budget allows one split, {pairs[0][0]}+{pairs[0][1]}: taken without MAP points")
            return pairs[0], {"predictor": None, "points": [], "fit": {}, "surface": [], "refinement": [],
                              "single_split": True, "pick": {"n_attn": pairs[0][0], "n_act": pairs[0][1]}}
        self.check_settings(job)   # again: a strategy that runs this one inside (hetdpt-plus) checks it here
        opts = job.options(HetDPTOptions)
        if self.checks_cover(opts, pairs):
            return self.check_every_split(job, opts, pairs)
        refine, verify = opts.refine, opts.verify
        scheme = self.scheme(job)
        plan = dist.on_main(lambda: self.point_plan(job, pairs))
        predictor = self.predictor_for(job, plan)
        configured = opts.predictor if predictor.name != opts.predictor or getattr(
            self.predictor(job), "min_points", 0) > len(plan) else None   # a plane fitted in its place
        points = self.collect_points(job, plan)
        predicted = self.fit(predictor, points, pairs)
        sign = 1 if job.task.higher_is_better else -1   # the best split: the highest metric, or the lowest loss
        rounds = []
        for r in range(refine):
            new = dist.on_main(lambda: self.refinement_pairs(pairs, predicted,
                                                             {(p["n_attn"], p["n_act"]) for p in points}, sign))
            if not new:
                break
            job.log(f"[hetdpt] refinement {r + 1}/{refine}: measuring {', '.join(f'{a}+{m}' for a, m in new)}")
            plan = plan + new
            points = self.collect_points(job, plan)
            predicted = self.fit(predictor, points, pairs)
            rounds.append({"measured": [list(p) for p in new]})
        measured = {(p["n_attn"], p["n_act"]): metric_of(p) for p in points}
        # the paper (refine 0): the predictor's argmax; refined: measured where measured, predicted elsewhere.
        # Ties go to fewer attention removals.
        value = {pair: measured.get(pair, predicted[pair]) if refine else predicted[pair] for pair in pairs}
        pick = max(pairs, key=lambda p: (sign * value[p], -p[0]))
        checked, halved, verified, unsure = [], None, None, None
        fit = predictor.fit_report() if hasattr(predictor, "fit_report") else {}
        best, unsure = self.to_check(opts, pairs, value, fit.get("loo_mae"), sign)
        if verify and opts.verify_among == "spread":
            job.log(f"[hetdpt] checking the best predicted split of each part of the line: "
                    f"{', '.join(f'{a}+{m}' for a, m in best)}")
        if verify and unsure is not None:   # a clear pick is trusted, a near-tie checked
            error = "unknown" if unsure["loo_mae"] is None else job.task.number(unsure["loo_mae"])
            job.log(f"[hetdpt] the predictor's leave-one-out error is {error}: " + (
                f"{', '.join(f'{a}+{m}' for a, m in best)} within it of the best, checked" if len(best) > 1 else
                f"{pick[0]}+{pick[1]} stands out, taken without checks"))
        if verify and (unsure is None or unsure["checked"]):   # past the paper: the best predicted measured
            if opts.verify_by == "pipeline":   # the final run's selection and fine-tune, successive halving
                halved = PipelineChecks(job).run(best)   # within the settings' budget
                pick = halved.winner
                verified = next((m["metric"] for r in reversed(halved.rounds) for m in r["measured"]
                                 if (m["n_attn"], m["n_act"]) == pick), None)
                job.log(f"[hetdpt] pipeline checks: {pick[0]}+{pick[1]} kept after {len(halved.rounds)} round(s), "
                        f"{halved.unit.said(halved.spent)} of {halved.unit.said(halved.budget)} spent")
            else:
                found = scheme.verify(best)
                pick = max(best, key=lambda p: (sign * metric_of(found[p]), -p[0]))
                checked = [found[p] for p in best]
                verified = metric_of(found[pick])
                job.log("[hetdpt] verified: " + ", ".join(f"{a}+{m} {job.task.format(metric_of(found[(a, m)]))}"
                                                           for a, m in best))
        surface = [{"n_attn": a, "n_act": m, "predicted": predicted[(a, m)],
                    **({"std": predictor.uncertainty(a, m)} if hasattr(predictor, "uncertainty") else {}),
                    **({"measured": measured[(a, m)]} if (a, m) in measured else {})} for a, m in pairs]
        job.log(f"[hetdpt] predictor {predictor.name}: " + ", ".join(
            f"({d['n_attn']},{d['n_act']})={job.task.number(d['predicted'])}" for d in surface))
        return pick, {"predictor": predictor.name, "points": points, "fit": fit, "surface": surface,
                      "refinement": rounds, "verified": checked, "point_selection": scheme.name,
                      **({"predictor_fallback": {"configured": configured, "plan_points": len(plan)}}
                         if configured else {}),
                      "points_cost": points_cost(points + checked),
                      **({"pipeline_checks": halved.to_dict()} if halved is not None else {}),
                      **({"unsure": unsure} if unsure is not None else {}),
                      "pick": {"n_attn": pick[0], "n_act": pick[1], "predicted": predicted[pick],
                               **({"measured": measured[pick]} if refine and pick in measured else {}),
                               **({"verified": verified} if verify and (unsure is None or unsure["checked"]) else {})}}

    def check_every_split(self, job: PruneJob, opts: HetDPTOptions, pairs: list[tuple[int, int]]):
        """Allocation where the pipeline checks cover every feasible split: each is checked (the final run's
        selection and fine-tune, by successive halving) and the best is the pick; no MAP point is measured and
        no predictor fitted, since none could change it."""
        job.log(f"[hetdpt] the {opts.verify} checks cover all {len(pairs)} feasible splits: each is checked, no MAP "
                "point measured (none could change the pick)")
        halved = PipelineChecks(job).run(sorted(pairs))   # fewer attention removals first
        pick = halved.winner
        verified = next((m["metric"] for r in reversed(halved.rounds) for m in r["measured"]
                         if (m["n_attn"], m["n_act"]) == pick), None)
        job.log(f"[hetdpt] pipeline checks: {pick[0]}+{pick[1]} kept after {len(halved.rounds)} round(s), "
                f"{halved.unit.said(halved.spent)} of {halved.unit.said(halved.budget)} spent")
        return pick, {"predictor": None, "points": [], "fit": {}, "surface": [], "refinement": [], "verified": [],
                      "checked_every_split": True, "point_selection": self.scheme(job).name,
                      "points_cost": points_cost([]), "pipeline_checks": halved.to_dict(),
                      "pick": {"n_attn": pick[0], "n_act": pick[1], "verified": verified}}

    @staticmethod
    def fit(predictor, points: list[dict], pairs: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
        predictor.fit([(p["n_attn"], p["n_act"], metric_of(p)) for p in points])
        return {pair: predictor.predict(*pair) for pair in pairs}

    @classmethod
    def to_check(cls, opts: HetDPTOptions, pairs: list[tuple[int, int]], value: dict, loo_mae: float | None,
                 sign: int = 1, k: int | None = None) -> tuple[list[tuple[int, int]], dict | None]:
        """The splits ``hetdpt.verify`` checks, best predicted first: the K best by ``value``, or with
        ``verify_among: spread`` the best of each K-th of the line; with ``verify_when: unsure`` only the near
        ties, and what the predictor was unsure of (else None). The one rule, for a run and for the MAP study
        (``k``: a count other than ``opts.verify``, as the study's bound asks of any K, one among them)."""
        k = opts.verify if k is None else k
        if opts.verify_among == "spread":
            best = cls.spread(pairs, value, k, sign)
        else:
            best = sorted(pairs, key=lambda p: (-sign * value[p], p[0]))[:k]
        if k and opts.verify_when == "unsure":
            return cls.near_ties(best, value, loo_mae, sign)
        return best, None

    @staticmethod
    def spread(pairs: list[tuple[int, int]], value: dict, k: int, sign: int = 1) -> list[tuple[int, int]]:
        """``hetdpt.verify_among: spread``: the feasible splits ordered by attention removals, cut into ``k``
        runs of near-equal length (the first runs the shorter), and the best by ``value`` of each run; the
        result best first. The predicted best is always among them, since it is the best of its run."""
        line = sorted(pairs)
        k = min(k, len(line))
        runs = [line[i * len(line) // k:(i + 1) * len(line) // k] for i in range(k)]
        picks = [max(run, key=lambda p: (sign * value[p], -p[0])) for run in runs]
        return sorted(picks, key=lambda p: (-sign * value[p], p[0]))

    @staticmethod
    def near_ties(best: list[tuple[int, int]], value: dict, loo_mae: float | None,
                  sign: int = 1) -> tuple[list[tuple[int, int]], dict]:
        """``hetdpt.verify_when: unsure``: of ``best`` (the K best by ``value``, best first), the splits whose
        value is within the predictor's leave-one-out error (``loo_mae``) of the first: the ones it cannot
        tell apart. A predictor that cannot say its error (too few points) is unsure of all K."""
        if loo_mae is None:
            near = list(best)
        else:
            near = [p for p in best if sign * (value[best[0]] - value[p]) <= loo_mae]
        return near, {"loo_mae": loo_mae, "near": [list(p) for p in near], "checked": len(near) > 1}

    @staticmethod
    def refinement_pairs(pairs: list[tuple[int, int]], predicted: dict, measured: set,
                         sign: int = 1) -> list[tuple[int, int]]:
        """The best predicted feasible split not yet measured, and its unmeasured neighbours on the budget line
        (``sign`` -1: the metric is better lower)."""
        line = sorted(pairs)
        best = max((p for p in line if p not in measured), key=lambda p: (sign * predicted[p], -p[0]), default=None)
        if best is None:
            return []
        i = line.index(best)
        return [p for p in line[max(0, i - 1):i + 2] if p not in measured]


def points_cost(points: list[dict]) -> dict:
    """What the points cost: images through their fine-tunes (None where a point could not count them) and
    seconds."""
    images = [p.get("images") for p in points]
    return {"points": len(points), "images": None if None in images else sum(images),
            "seconds": round(sum(p.get("seconds", 0) for p in points), 1)}
