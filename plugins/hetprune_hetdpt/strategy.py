"""The ``hetdpt`` strategy: MAP budget allocation, then the shared depth pipeline
(learned within-kind selection, KD fine-tune, merge)."""

from __future__ import annotations

from hetprune import HetpruneError, Site
from hetprune.pipeline import DepthStrategy, PruneJob
from hetprune.points import metric_of
from hetprune import distributed as dist

from .point_schemes import OneShotPoints, grid_plan, resolve_finetune
from .schemes import SCHEMES, scheme_for


class HetDPT(DepthStrategy):
    """HetDPT: split the budget with a fitted accuracy predictor (MAP), learned gates within each kind."""

    name = "hetdpt"
    description = "HetDPT: split the budget with a fitted accuracy predictor (MAP), learned gates within each kind"
    defaults = {
        "hetdpt": {
            # gp with progressive points and verify 3: the lowest worst-target mean regret within 1.5x the cost
            # of the one-shot points, over 8 targets of both embedded benchmarks, 3 seeds
            # (benchmarks/results/map-points.md); poly is the paper's fit, its degree chosen by leave-2-out CV
            "predictor": "gp",
            "predictor_options": {"poly": {"degree": "auto"}},   # per predictor name
            # how MAP points are made (point_schemes.py, one class each). progressive (the paper's): paths
            # from the dense model, attention only, activation only and interleaved, each step one more site
            # off (the point scorer's lowest on the current model) and fine-tuned from the previous point's
            # weights. oneshot (not the paper's): each point's sites off the dense model at once (the point
            # scorer's order), one fine-tune. gradual: the run's own selector (``scorer``, e.g. gate-taylor's
            # removal-by-removal gate training) makes the split from the dense model as the final run will,
            # and the point is its metric (no further fine-tune)
            "point_selection": "progressive",
            # the schedule that fine-tunes a point: finetune (the final fine-tune's), short_finetune (the
            # paper's short one) or auto: for oneshot, finetune where it costs at most 4 short ones in images
            # (the embedded benchmarks: there short_finetune's 2 epochs on 150 images ranked digit-pairs'
            # budget-8 splits at Spearman 0.20 and one seed in three picked a split 3.7 points worse), else
            # short_finetune (a real run's final fine-tune is far too long for a dozen points); for progressive,
            # short_finetune (its paths hold about three times as many points)
            "point_finetune": "auto",
            "interleave_first": "act",   # the kind the progressive interleaved path removes first (act: 1+1, 1+2, ...)
            "path_stride": 1,            # sites a progressive step removes before its fine-tune (1: the paper's)
            "point_scorer": "taylor",
            "axis_points": 4,
            "mixed_points": 3,
            "dense_point": True,
            # refinement rounds after the fit: each measures the best predicted feasible split not yet measured
            # (and its unmeasured neighbours on the budget line) with the same cheap fine-tune, then refits;
            # the pick prefers measured values. 0 = the paper's one-shot fit.
            "refine": 0,
            # past the paper: the K best predicted splits measured, the best of them picked (0 = the
            # predictor's argmax). Progressive: each reached from the nearest path point its removals contain
            # (inherited weights), then one fine-tune on the final schedule where that is affordable (auto's
            # rule), else short_finetune. Oneshot and gradual: a point of that split
            "verify": 3,
        }
    }

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
        return grid_plan(job.settings["hetdpt"], pairs)

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
        return resolve_finetune(settings, train_size, "oneshot")

    # -- stage 1: allocation ---------------------------------------------------
    def predictor_for(self, job: PruneJob, plan: list[tuple[int, int]], what: str = "this budget and model"):
        """The configured predictor (``hetdpt.predictor`` with its options), refused before any point is
        measured when ``plan`` has fewer points than it needs."""
        opts = job.settings["hetdpt"]
        predictor = job.registry.build("predictor", opts["predictor"],
                                       **opts.get("predictor_options", {}).get(opts["predictor"], {}))
        need = getattr(predictor, "min_points", None)
        if need is not None and len(plan) < need:  # say so before an hour of fine-tuning, not after
            fewer = (f"lower the degree (hetdpt.predictor_options.{opts['predictor']}.degree)"
                     if hasattr(predictor, "degree") else "choose a predictor that needs fewer (hetdpt.predictor)")
            raise HetpruneError(
                f"predictor {predictor.name!r} needs at least {need} distinct points, but {what} give a plan of "
                f"{len(plan)}: {plan}. Raise hetdpt.axis_points / hetdpt.mixed_points"
                f"{'' if opts.get('dense_point') else ', set hetdpt.dense_point=true'}, or {fewer}")
        return predictor

    @staticmethod
    def refine_rounds(settings: dict, key: str = "hetdpt.refine", what: str = "a count of rounds") -> int:
        """A refinement round count (or another count) from settings (``section.name``), checked."""
        section, name = key.split(".")
        refine = settings[section].get(name, 0)
        if isinstance(refine, bool) or not isinstance(refine, int) or refine < 0:
            raise HetpruneError(f"{key} must be {what} >= 0, got {refine!r}")
        return refine

    def allocate(self, job: PruneJob):
        pairs = job.feasible_pairs()   # rank 0's, like every plan below: each rank measures its share of one plan
        if len(pairs) == 1:   # nothing to choose: no point could change the answer
            job.log(f"[hetdpt] the budget allows one split, {pairs[0][0]}+{pairs[0][1]}: taken without MAP points")
            return pairs[0], {"predictor": None, "points": [], "fit": {}, "surface": [], "refinement": [],
                              "single_split": True, "pick": {"n_attn": pairs[0][0], "n_act": pairs[0][1]}}
        refine = self.refine_rounds(job.settings)
        verify = self.refine_rounds(job.settings, "hetdpt.verify", "a count of splits")
        scheme = self.scheme(job)
        if refine and not scheme.refinable:
            raise HetpruneError(f"hetdpt.refine measures splits on the budget line, which {scheme.name} points "
                                "cannot reach (a path only makes its own splits); use refine 0, or "
                                "point_selection oneshot or gradual")
        plan = dist.on_main(lambda: self.point_plan(job, pairs))
        predictor = self.predictor_for(job, plan)
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
        checked = []
        if verify:   # past the paper: the best predicted splits measured (progressive: checked), the best kept
            best = sorted(pairs, key=lambda p: (-sign * value[p], p[0]))[:verify]
            found = scheme.verify(best)
            pick = max(best, key=lambda p: (sign * metric_of(found[p]), -p[0]))
            checked = [found[p] for p in best]
            job.log("[hetdpt] verified: " + ", ".join(f"{a}+{m} {job.task.format(metric_of(found[(a, m)]))}"
                                                       for a, m in best))
        surface = [{"n_attn": a, "n_act": m, "predicted": predicted[(a, m)],
                    **({"std": predictor.uncertainty(a, m)} if hasattr(predictor, "uncertainty") else {}),
                    **({"measured": measured[(a, m)]} if (a, m) in measured else {})} for a, m in pairs]
        fit = predictor.fit_report() if hasattr(predictor, "fit_report") else {}
        job.log(f"[hetdpt] predictor {predictor.name}: " + ", ".join(
            f"({d['n_attn']},{d['n_act']})={job.task.number(d['predicted'])}" for d in surface))
        return pick, {"predictor": predictor.name, "points": points, "fit": fit, "surface": surface,
                      "refinement": rounds, "verified": checked, "point_selection": scheme.name,
                      "points_cost": points_cost(points + checked),
                      "pick": {"n_attn": pick[0], "n_act": pick[1], "predicted": predicted[pick],
                               **({"measured": measured[pick]} if refine and pick in measured else {}),
                               **({"verified": metric_of(found[pick])} if verify else {})}}

    @staticmethod
    def fit(predictor, points: list[dict], pairs: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
        predictor.fit([(p["n_attn"], p["n_act"], metric_of(p)) for p in points])
        return {pair: predictor.predict(*pair) for pair in pairs}

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
