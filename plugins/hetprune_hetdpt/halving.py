"""Checks the final pipeline would make (a pipeline checks policy: checks.py): the candidate splits, each
through the final run's own selection and fine-tune, measured on the selection split, kept by successive
halving within a cost budget.

The checks of the points' own kind (``hetdpt.checks: points``) fine-tune the path's model of a split, not what
the final run makes of it (the run's selector from the dense model, then its KD fine-tune); they undervalued
attention-heavy splits in the study (benchmarks/results/map-points.md). Here each candidate is what the final
run would be, at a fraction of its fine-tune:

* every candidate's sites are chosen once by the run's scorer from the dense model, as the final ``select``
  stage does (which then chooses the winner's again: a learning scorer also adapts the weights it hands on).
  A learning scorer that can say which first removals two selections share (gate-taylor: ``shared_removals``,
  the common beginning of their removal schedules) trains those once: a later candidate continues from an
  earlier one's state kept there, and the final select stage from the winner's, with identical results;
  only the removals trained are counted against the budget. The policy's ``selection`` below 1 selects the
  candidates on that share of the scoring subset instead (cheaper checks whose sites may differ from the final
  run's; the final select stage then selects the winner again on the whole subset);
* round 1 fine-tunes all K candidates on a short fraction of the final schedule, measures each on the
  selection split and keeps the better half (at least one); each later round gives the survivors a longer
  fraction (the round's equal share of the budget over fewer candidates), until one is left.

Sized in final fine-tunes (``unit: finetunes``), the checks grow with the final schedule: at DeiT-B's 400
epochs three of them cost more than the rest of the run. ``unit: images`` (the default) sizes them in training
images instead, like the MAP points: the budget is a number of images, and each check fine-tunes on the
points' schedule (``point_finetune``) cut to its share, so what they cost is bounded by design whatever the
final schedule (`Unit`). ``selection`` may then also be a number of images per gate epoch.

`halving` is the schedule and the bookkeeping alone (tested with stub fine-tunes of known values);
`PipelineChecks` runs it on a job.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hetprune import HetpruneError
from hetprune.plugin_api import PruneJob, pipeline, storage
from hetprune.plugin_api import plan as planning
from hetprune.plugin_api import distributed as dist

from .checks import Sized, budget_in_finetunes, budget_in_images
from .options import HetDPTOptions
from .point_schemes import resolve_finetune

Split = tuple[int, int]
FINETUNES_BEYOND_SELECTION = 2.0   # the default budget: the K selections, then this many final fine-tunes
FRACTION_DIGITS = 6   # a check is (split, fraction), the fraction stored to this many digits


@dataclass(frozen=True)
class Unit:
    """What the checks' budget counts, and the schedule a check fine-tunes on a fraction of: one final
    fine-tune (``unit: finetunes``), or, sized in images (``unit: images``), one fine-tune on the points'
    schedule, whose ``images`` turn a number of images into units."""

    options: str = "hetdpt.checks_options.<policy>"   # where the policy's options are set, as errors name them
    section: str = "finetune"    # the schedule one unit is
    images: int = 0              # the images one unit sees (0: unknown)
    in_images: bool = False      # the budget is a number of images (else of final fine-tunes)

    @property
    def setting(self) -> str:
        """The setting that states the budget."""
        return f"{self.options}.budget"

    def said(self, units: float) -> str:
        """``units`` as the setting states them: final fine-tunes, or images."""
        return f"{units * self.images:,.0f} images" if self.in_images else f"{units:.2f} final fine-tunes"


FINAL = Unit()


@dataclass
class Halving:
    """What successive halving did: each round's candidates, fraction and measured values, and its cost in
    units of the budget (final fine-tunes, or in images one points'-schedule fine-tune of
    ``unit_images`` images; ``spent`` <= ``budget``)."""

    budget: float
    rounds: list[dict] = field(default_factory=list)
    spent: float = 0.0
    winner: Split | None = None
    selection_subset: int | None = None   # the scoring subset the candidates were selected on, where not the run's
    unit: Unit = FINAL

    def to_dict(self) -> dict:
        sized = ({"unit": self.unit.section, "unit_images": self.unit.images,
                  "budget_images": round(self.budget * self.unit.images),
                  "spent_images": round(self.spent * self.unit.images)} if self.unit.in_images else {})
        return {"budget": self.budget, "spent": round(self.spent, 4), "rounds": self.rounds,
                "winner": list(self.winner) if self.winner else None,
                **({"selection_subset": self.selection_subset} if self.selection_subset is not None else {}),
                **sized}


def fractions(k: int, budget: float, selection_cost: float, unit: Unit = FINAL) -> list[float]:
    """The fraction of a unit's fine-tune each round gives each of its candidates: the budget left after the
    ``k`` selections (``selection_cost`` units in all) in equal shares per round, each share split among the
    round's candidates (k, k//2, ...: the better half kept), at most the whole schedule. A round that gives
    the whole schedule is the last (it keeps one): a later round would ask for the same (split, fraction),
    get the stored value back and train nothing, so it is no round."""
    counts = round_sizes(k)
    if not counts:
        return []
    check_pays(budget, k, selection_cost, unit=unit)
    share = (budget - selection_cost) / len(counts)
    out = []
    for n in counts:   # rounded as the checks' store keys them: 0.9999999999999999 is the whole schedule
        out.append(round(min(1.0, share / n), FRACTION_DIGITS))
        if out[-1] == 1.0:   # the last round: the next would re-ask the same checks and train nothing
            break
    return out


def round_sizes(k: int) -> list[int]:
    """The candidates of each round of successive halving of ``k``: k, k//2, ..., down to 2."""
    counts = []
    while k > 1:
        counts.append(k)
        k = max(1, k // 2)
    return counts


def most_spent(k: int, budget: float, selection_cost: float, unit: Unit = FINAL,
               cost: Callable[[float], float] | None = None) -> float:
    """The most `halving` of ``k`` candidates can spend within ``budget`` units: the selections, then each
    round's fine-tunes, which never exceed a whole schedule each (so a generous budget is not all spent);
    ``cost(fraction)``: what one check at ``fraction`` trains on, in units (default: the fraction itself)."""
    if k <= 1 or budget - selection_cost <= 0:
        return min(budget, selection_cost) if k > 1 else 0.0
    cost = cost or (lambda f: f)
    return selection_cost + sum(n * cost(f) for n, f in zip(round_sizes(k), fractions(k, budget, selection_cost, unit)))


def checks_run(k: int, budget: float, selection_cost: float, unit: Unit = FINAL) -> int:
    """The fine-tunes `halving` of ``k`` candidates runs within ``budget``: each round's candidates, over the
    rounds its `fractions` make (each measured once, on the selection split)."""
    if k <= 1 or budget - selection_cost <= 0:
        return 0
    return sum(n for n, _ in zip(round_sizes(k), fractions(k, budget, selection_cost, unit)))


def check_pays(budget: float, k: int, selection_cost: float, at_least: bool = False, unit: Unit = FINAL) -> None:
    """Refuse a budget that leaves nothing for the fine-tunes of ``k`` candidates once their selections
    (``selection_cost`` units; ``at_least``: a floor known before the candidates are) are paid."""
    if k > 1 and budget - selection_cost <= 0:
        least = "at least " if at_least else ""
        if unit.in_images:
            stated = (f"{budget * unit.images:,.0f} does not pay for the {k} candidates' selections ({least}"
                      f"{unit.said(selection_cost)})")
        else:
            stated = (f"{budget:g} (final-fine-tune units) does not pay for the {k} candidates' selections "
                      f"({least}{selection_cost:.3g} units)")
        raise HetpruneError(f"{unit.setting} {stated}: raise it, lower {unit.options}.count"
                            + (f", or select the candidates on fewer images ({unit.options}.selection)"
                               if unit.in_images else ""))


def halving(candidates: list[Split], run: Callable[[Split, float], float], budget: float,
            selection_cost: float = 0.0, sign: int = 1, unit: Unit = FINAL,
            cost: Callable[[float], float] | None = None) -> Halving:
    """Successive halving of ``candidates`` (best predicted first). ``run(split, fraction)`` fine-tunes the
    candidate on ``fraction`` of a unit's schedule (the final one, or the points') and returns its metric
    (``sign`` -1: lower is better); ``selection_cost``: the candidates' selections, in units; ``cost``: what a
    check at a fraction trains on in units (default: the fraction; a schedule of whole batches may train a
    little more), what ``spent`` counts. Ties keep the earlier (better predicted) candidate. Raises when the
    budget cannot pay for the selections."""
    out = Halving(budget=float(budget), spent=float(selection_cost), unit=unit)
    alive = list(candidates)
    if len(alive) <= 1:   # nothing to halve: no selection runs, nothing is spent
        out.spent, out.winner = 0.0, alive[0] if alive else None
        return out
    schedule = fractions(len(alive), budget, selection_cost, unit)
    for i, fraction in enumerate(schedule):
        values = {split: run(split, fraction) for split in alive}
        out.spent += (cost(fraction) if cost else fraction) * len(alive)
        keep = 1 if i == len(schedule) - 1 else max(1, len(alive) // 2)
        ranked = sorted(alive, key=lambda s: (-sign * values[s], alive.index(s)))
        out.rounds.append({"fraction": fraction, "measured": [
            {"n_attn": s[0], "n_act": s[1], "metric": values[s]} for s in alive],
            "kept": [list(s) for s in ranked[:keep]]})
        alive = ranked[:keep]
    out.winner = alive[0]
    return out


def selection_job(job: PruneJob, share: float, at_least: int | None = None, where: str = "hetdpt.checks_options.spread"
                  ) -> PruneJob:
    """The job the candidates' selections run in: the run's own (``share`` 1), or the same with ``share`` of
    its scoring subset (the policy's ``selection`` below 1), or with that many images per gate epoch (a
    whole number above 1): a cheaper gate phase for the checks alone. ``at_least`` images per gate epoch
    (``selection_at_least``) are a floor under a share (a number of images is taken as given); where the
    floor reaches the whole subset, the selection is the run's own. ``where``: the policy's options, as
    errors name them."""
    if share == 1:
        return job
    run = job.config
    # the images one gate epoch reads, as gate-taylor's plan counts them (the subset, at most the training set)
    whole = planning.epoch_images(job.train_config("short_finetune", subset=run.scoring_batches.subset),
                                  job.task.train_size)
    if share > 1:
        n = int(share)
        if whole is not None and n >= whole:
            raise HetpruneError(f"{where}.selection {n:,} images per gate epoch is not fewer than the "
                                f"{whole:,} the run's own selection trains on (scoring.subset): use 1 (the run's "
                                "own selection), or fewer images")
    elif whole is None:
        raise HetpruneError(f"{where}.selection below 1 is a share of scoring.subset, and this run has neither "
                            f"a scoring.subset nor a training set of known size: set scoring.subset, or "
                            f"{where}.selection 1, or a number of images per gate epoch")
    else:
        n = max(1, round(share * whole))
    if at_least is not None and share < 1 and n < at_least:
        if whole is not None and at_least >= whole:
            return job
        n = at_least
    return dataclasses.replace(job, settings=job.settings.replace_in("scoring", subset=n))


def checks_policy(job: PruneJob):
    """The job's checks policy (``hetdpt.checks`` with its options; checks.py holds the built-in ones), built
    once per job: a policy a plugin breaks is refused as it is built, before stage 1."""
    opts = job.options(HetDPTOptions)
    return job.once("checks policy", lambda: job.registry.build("checks", opts.checks, **opts.checks_policy_options))


class PipelineChecks:
    """`halving` on a job: each candidate's sites chosen once by the run's scorer (the final select stage
    chooses the winner's again), then fine-tuned on a fraction of a unit's schedule (the final one, or with
    a budget in images the points') and measured on the selection split. Each measured (split, fraction) is
    stored in ``map-pipeline-checks.jsonl`` and reused like a point."""

    def __init__(self, job: PruneJob, policy=None):
        policy = checks_policy(job) if policy is None else policy   # the job's own (hetdpt.checks) by default
        self.job, self.policy = job, policy
        opts = job.options(HetDPTOptions)
        size: dict[str, Any] = {f.name: getattr(policy, f.name, f.default) for f in dataclasses.fields(Sized)}
        self.where = f"hetdpt.checks_options.{policy.name}"   # its options, as errors name them
        self.select_job = selection_job(job, size["selection"], size["selection_at_least"], self.where)
        self.own_selection = self.select_job is job   # the final run's own selection: the winner's reused
        self.images_budget = budget_in_images(size["budget"], size["unit"])
        self.finetunes = budget_in_finetunes(size["budget"], size["unit"])
        run = job.config
        section = (resolve_finetune(opts.point_finetune, run, job.task.train_size, opts.point_selection)
                   if self.images_budget is not None else "finetune")
        self.cfg = job.train_config(section)
        per_epoch = planning.epoch_images(self.cfg, job.task.train_size)
        images = (per_epoch or 0) * self.cfg.epochs
        self.unit = Unit(self.where, section, images, in_images=self.images_budget is not None)
        # a schedule of 0 epochs (HetDPT+'s depth part without an intermediate fine-tune) checks without one
        if self.unit.in_images and per_epoch is None and self.cfg.epochs:
            raise HetpruneError(f"{self.where}.unit images sizes each check as a share of the points' schedule "
                                f"({section}), whose images are unknown here (no {section}.subset, and a "
                                f"training set of unknown size): set {section}.subset, use {self.where}.unit "
                                "finetunes, or pick without checks with hetdpt.checks none")
        self.key = storage.PointStore.key_for(job, {
            "seed": job.seed, "scorer": run.scorer, "scorer_options": run.options_for("scorer", run.scorer),
            "scoring": self.select_job.config.scoring, "short": run.short_finetune, "finetune": run.finetune,
            "removers": [run.attn_remover, run.act_remover], "split": job.choice_split,
            "amp": job.amp, "v": 2,   # 2: gate-taylor's phase on short_finetune's whole schedule
            # a fraction of the points' schedule is another check than the final one's
            **({"unit": section} if self.unit.in_images else {})})
        self.sites: dict[Split, list] = {}
        self.models: dict[Split, object] = {}
        self.candidates: list[Split] = []   # the splits being checked: which removals their selections share
        self.selection_seconds: dict[Split, float] = {}   # each selection made here, timed (the MAP study reads it)

    def store(self) -> storage.PointStore:
        """Where the checks' points are kept; one key per fraction of the schedule (`PointStore.at`)."""
        return storage.PointStore(self.job.shared_dir / "map-pipeline-checks.jsonl", self.key, run=self.job.reuse_tag)

    def configured_budget(self, k: int = 0, selection_cost: float = 0.0) -> float | None:
        """The budget the policy gives, in units: images over a unit's images (``auto``: the ``k`` candidates'
        selections, ``selection_cost`` units, and one whole point's fine-tune for every check the rounds
        make: what the checks cost at most, at any scale), or final fine-tunes (None: auto, the selections
        plus `FINETUNES_BEYOND_SELECTION`)."""
        if self.images_budget == "auto":   # every round's equal share pays each of its checks a whole one
            return selection_cost + len(round_sizes(k)) * k
        if self.images_budget is not None:   # in images (unit.in_images)
            # (a check that fine-tunes nothing costs nothing: only the selections count)
            return self.images_budget / self.unit.images if self.unit.images else None
        return self.finetunes

    def shared(self, a: Split, b: Split) -> int:
        """The first removals the selections of ``a`` and ``b`` share (0 for a scorer that cannot say; all of
        them where ``a`` is ``b``)."""
        share = getattr(self.scorer(), "shared_removals", None)
        return share({"attn": a[0], "act": a[1]}, {"attn": b[0], "act": b[1]}) if share else 0

    def selection_cost(self, split: Split, shared: int = 0) -> float:
        """A candidate's selection in units: its scorer's counted phase (none for a one-shot scorer), less its
        first ``shared`` removals, continued from an earlier candidate's kept state."""
        if not self.unit.images:
            return 0.0
        scorer = self.scorer()
        if not hasattr(scorer, "plan"):
            return 0.0
        counts = {"attn": split[0], "act": split[1]}
        job = self.select_job
        step = scorer.plan(job, counts, shared=shared) if shared else scorer.plan(job, counts)
        return step.train_images / self.unit.images

    def selections_cost(self, candidates: list[Split]) -> float:
        """The candidates' selections in order, each continuing from the earlier one it shares most with."""
        return sum(self.selection_cost(s, max((self.shared(s, t) for t in candidates[:i]), default=0))
                   for i, s in enumerate(candidates))

    def least_selections_cost(self, pairs: list[Split], k: int) -> float:
        """A floor under what the selections of any ``k`` of ``pairs`` cost (`selections_cost`), known before
        any point says which ``k``: the first candidate selects in full, each later one at least what is left
        after the most it could share with another."""
        full = [self.selection_cost(p) for p in pairs]
        later = sorted(min([self.selection_cost(p, self.shared(p, q)) for q in pairs if q != p], default=cost)
                       for p, cost in zip(pairs, full))
        return min(full, default=0.0) + sum(later[:k - 1])

    def check_budget(self, budget: float | None, pairs: list[Split], k: int,
                     known: list[Split] | None = None) -> None:
        """Refuse, before stage 1, a budget (in units; None: the settings') that cannot pay for the
        selections of any ``k`` of the feasible splits ``pairs``, or, where the candidates are ``known``
        before any point (checks of every split), for theirs."""
        if budget is None and self.images_budget == "auto":   # it pays for the selections by design
            return
        budget = self.configured_budget() if budget is None else budget
        if budget is None:
            return
        if known is not None:
            self.candidates = list(known)
            check_pays(budget, len(known), self.selections_cost(known), unit=self.unit)
        else:
            check_pays(budget, k, self.least_selections_cost(pairs, k), at_least=True, unit=self.unit)

    def affordable(self, candidates: list[Split], budget: float) -> list[Split]:
        """The best predicted of ``candidates`` whose selections ``budget`` pays for, with something left for
        their fine-tunes: all of them where it pays for all. The pre-flight refuses a budget that cannot pay
        for any ``k`` candidates, but which ``k`` the predictor picks is known only after stage 1, and their
        selections may share less: then fewer are checked (said in one line) rather than stage 1 refused."""
        kept = list(candidates)
        while len(kept) > 1 and budget - self.selections_cost(kept) <= 0:
            kept.pop()
        if len(kept) < len(candidates):
            self.job.log(f"[hetdpt] {self.unit.setting} pays for the selections of {len(kept)} of the "
                         f"{len(candidates)} candidates ({', '.join(f'{a}+{m}' for a, m in candidates)}, "
                         f"{self.unit.said(self.selections_cost(candidates))}): checking the "
                         f"{'best predicted alone, which is the pick' if len(kept) == 1 else f'{len(kept)} best predicted'}")
        return kept

    def scorer(self):
        run = self.job.config
        return self.job.once("verify scorer", lambda: self.job.registry.build(
            "scorer", run.scorer, **run.options_for("scorer", run.scorer)))

    def selected(self, split: Split):
        """The candidate's model with its sites off (chosen once, from the dense model, as the final select
        stage would)."""
        if split not in self.models:
            t0 = time.time()
            job = self.select_job
            model = job.place(copy.deepcopy(job.dense))
            ctx = pipeline.scoring_context(job, job.workdir / "pipeline-checks" / f"{split[0]}+{split[1]}")
            ctx.progress, ctx.on_epoch_end = False, None
            # kept for the other candidates (where they share this one's first removals) and, after all of
            # them (what it shares with itself), for the final select stage, which chooses the winner's again
            # (from this state only where the checks select as it does: the run's own selection)
            ctx.keep_states_at = tuple(sorted({n for t in {*self.candidates, split} if (n := self.shared(split, t))
                                               and (t != split or self.own_selection)}))
            chosen = pipeline.select_sites(job, model, {"attn": split[0], "act": split[1]}, ctx=ctx)
            pipeline.remove_sites(self.job, model, chosen)
            self.sites[split], self.models[split] = chosen, model
            self.selection_seconds[split] = time.time() - t0
        return self.models[split]

    def run(self, candidates: list[Split], budget: float | None = None) -> Halving:
        """Successive halving of ``candidates`` within ``budget`` units (None: the settings' budget,
        `configured_budget`, or the candidates' selections plus `FINETUNES_BEYOND_SELECTION`)."""
        job = self.job
        sign = 1 if job.task.higher_is_better else -1
        self.candidates = list(candidates)
        cost = self.selections_cost(self.candidates)
        budget = self.configured_budget(len(self.candidates), cost) if budget is None else budget
        budget = cost + FINETUNES_BEYOND_SELECTION if budget is None else budget
        if len(self.candidates) > 1 and budget - cost <= 0:   # known only now: fewer checked, stage 1 kept
            self.candidates = self.affordable(self.candidates, budget)
            candidates, cost = self.candidates, self.selections_cost(self.candidates)
        most = most_spent(len(self.candidates), budget, cost, self.unit, self.check_units)   # what they can spend
        # said before hours of gate phases and fine-tunes begin: what they may cost, in the budget's unit
        job.log(f"[hetdpt] pipeline checks of {', '.join(f'{a}+{m}' for a, m in self.candidates)}: selections "
                f"{self.unit.said(cost)}, at most {self.unit.said(most)} in all")
        stores: dict[float, tuple[storage.PointStore, dict]] = {}

        def measure(split: Split, fraction: float) -> float:
            if fraction not in stores:   # one store key per fraction: a point is (split, fraction)
                store = self.store().at(fraction=fraction)
                stores[fraction] = (store, dist.on_main(store.load))
            store, have = stores[fraction]
            if split in have:
                return have[split]["metric"]
            t0 = time.time()
            model = copy.deepcopy(self.selected(split))
            cfg = self.schedule(fraction)
            job.task.fit(model, job.teacher_for(cfg)[0], cfg, "check", progress=False, desc="pipeline check")
            value = job.choice_metric(model)
            point = store.record(job, have, {"n_attn": split[0], "n_act": split[1], "fraction": fraction,
                                             "metric": value, "split": job.choice_split, "epochs": cfg.epochs,
                                             "subset": cfg.subset, "sites": [str(s) for s in self.sites[split]],
                                             "seconds": round(time.time() - t0, 2)}, event=False)
            of = "the final fine-tune" if not self.unit.in_images else f"a point's fine-tune ({self.unit.section})"
            job.log(f"[hetdpt] pipeline check {split[0]}+{split[1]} at {fraction:.0%} of {of} -> "
                    f"{job.task.format(value)} ({point['seconds']:.1f}s)")
            return value

        out = halving(candidates, measure, budget, cost, sign, self.unit, self.check_units)
        if self.images_budget == "auto":   # auto's budget is what it spends: one whole fine-tune per check
            out.budget = most
        if not self.own_selection:
            out.selection_subset = self.select_job.config.scoring_batches.subset
        return out

    def check_units(self, fraction: float) -> float:
        """What one check at ``fraction`` trains on, in units: `schedule`'s images (at least one batch an
        epoch) over a unit's, or its epochs over the unit's where the images are unknown."""
        if not self.cfg.epochs:   # a schedule of no epochs (HetDPT+'s depth part): the check trains nothing
            return 0.0
        cfg = self.schedule(fraction)
        size = self.job.task.train_size
        per, whole = planning.epoch_images(cfg, size), planning.epoch_images(self.cfg, size)
        if per and whole:
            return cfg.epochs * per / (self.cfg.epochs * whole)
        return cfg.epochs / self.cfg.epochs

    def schedule(self, fraction: float):
        """A unit's schedule (the final fine-tune, or the points') at ``fraction`` of its images: fewer images
        per epoch where the training set's size is known (its epochs, warm-up and cosine kept), else fewer
        epochs."""
        section = self.unit.section
        per = planning.epoch_images(self.cfg, self.job.task.train_size)
        if per:
            return self.job.train_config(section, subset=max(self.cfg.batch_size, round(fraction * per)))
        return self.job.train_config(section, epochs=max(1, round(fraction * self.cfg.epochs)))

    def plan_steps(self, k: int, budget: float | None, sites: int,
                   known: list[Split] | None = None) -> list[planning.PlanStep]:
        """What the checks cost (``--plan``): the budget's units (None: the settings' budget, or k
        selections of a ``sites``-site split, half of each kind, plus `FINETUNES_BEYOND_SELECTION`), at most
        that where the candidates are not known before stage 1 (the removals they share are counted once in a
        run, whole here); the ``known`` candidates' own selections where they are (checks of every split).
        Where the final select stage continues from the winner's kept selection (a scorer that shares
        removals, the run's own selection), that selection is the gate phase the plan counts for the select
        stage, so it is not counted twice."""
        one = self.selection_cost((sites - sites // 2, sites // 2))
        if known is not None:
            k, self.candidates = len(known), list(known)
        selections = self.selections_cost(known) if known is not None else k * one
        budget = self.configured_budget(k, selections) if budget is None else budget
        if budget is None:
            budget = selections + FINETUNES_BEYOND_SELECTION
        shares = bool(getattr(self.scorer(), "shared_removals", None))
        reused = one if shares and self.own_selection else 0.0
        most = most_spent(k, budget, selections, self.unit, self.check_units)   # a budget the rounds cannot fill
        runs = checks_run(k, budget, selections, self.unit)   # each measured on the selection split
        if self.images_budget == "auto":
            budget = most
        if self.unit.in_images:
            what = f"{k} splits by successive halving, at most {self.unit.said(budget)} ({self.unit.section} cut)"
        else:
            what = f"{k} splits by successive halving, at most {budget:.3g} final fine-tunes"
        if shares:
            what += (" (the removals they share counted once" if known is not None else
                     " (less the removals they share") + ("; the winner's selection is the select stage's gate "
                                                          "phase, counted there)" if reused else ")")
        if most < budget - 1e-9:
            what += f"; each check at most one whole {self.unit.section}: {self.unit.said(most)} at most"
        if not self.own_selection:   # the policy's selection (and its floor): what each candidate's gate phase sees
            n = self.select_job.config.scoring_batches.subset
            what += f"; each candidate selected on {n:,} images a gate epoch"
        evals = planning.finetune_step(self.job, self.unit.section, "", "", runs, runs).eval_images
        return [planning.PlanStep("stage 1: pipeline checks", what, runs,
                                  int(max(0.0, most - reused) * self.unit.images), evals)]
