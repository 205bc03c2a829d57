"""How MAP's cheap points are made: one class per scheme (``hetdpt.point_selection``); the base class, and
the schemes that make each point from the dense model (``oneshot``, ``gradual``).

A scheme decides which points a budget gets (`PointScheme.plan`), how
each one is measured, and what keys it (`PointScheme.key`: everything
that shapes a point, so a changed setting never reuses a stale one). It is
built once per job with its settings resolved (`scheme_for`), and it
reads the job's device, precision, removers and scoring context from the job,
never again from settings.

* ``oneshot`` (not the paper's): per point, all its sites (the point scorer's
  removal order on the dense model) off at once, one fine-tune, evaluate.
* ``progressive`` (the paper's): paths from the dense model (attention only,
  activation only, and the kinds interleaved); each step removes the site the
  point scorer ranks lowest on the current fine-tuned model and fine-tunes
  from the previous point's weights (`paths`).
* ``gradual``: the run's own selector makes each point from the dense model,
  as the final run will for that split; no fine-tune after it.

The progressive scheme is in `progressive`; `schemes` names them
all. A new scheme is one subclass listed in a strategy's ``point_schemes``.
"""

from __future__ import annotations

import copy
import time

from hetprune import HetpruneError, Site, sites
from hetprune.plugin_api import PruneJob, RunSettings, TrainConfig, pipeline, storage, training
from hetprune.plugin_api import plan as planning
from hetprune.plugin_api import distributed as dist

from .options import FINETUNES, HetDPTOptions  # noqa: F401 - FINETUNES: its old home


AFFORDABLE = 4   # oneshot's auto: the final schedule for points when it sees at most this many short ones' images


def images_of(schedule: TrainConfig, train_size: int | None) -> int | None:
    """Images one fine-tune of ``schedule`` sees (epochs x its subset, or the training set), None if unknown."""
    return per_epoch(schedule.subset, train_size, schedule.epochs)


def per_epoch(subset: int | None, train_size: int | None, epochs: int = 1) -> int | None:
    """Images ``epochs`` passes over ``subset`` images of a training set of ``train_size`` see (None: unknown)."""
    n = subset
    if train_size is not None:
        n = min(n, train_size) if n else train_size
    return None if n is None else int(epochs * n)


def resolve_finetune(section: str, run: RunSettings, train_size: int | None = None, scheme: str = "oneshot") -> str:
    """The settings section whose schedule fine-tunes a point (``section``: ``hetdpt.point_finetune``, checked
    one of FINETUNES), ``auto`` resolved: for ``oneshot``, ``finetune`` where it sees at most AFFORDABLE short
    fine-tunes' images (the embedded benchmarks), else ``short_finetune``; for ``progressive``, always
    ``short_finetune`` (a path has about three times as many points as a one-shot plan)."""
    if section != "auto":
        return section
    if scheme == "progressive":
        return "short_finetune"

    def images(name: str) -> float:
        found = images_of(getattr(run, name), train_size)
        return float("inf") if found is None else found
    return "finetune" if images("finetune") <= AFFORDABLE * images("short_finetune") else "short_finetune"


class PointScheme:
    """The common part: the store, the plan's bookkeeping, the measurement loop, the keys' shared fields."""

    name = ""
    description = ""
    refinable = True   # whether any split on the budget line can be measured (hetdpt.refine's rounds)
    schedule_section = "short_finetune"   # the schedule a point trains with (the log line on the ranks)
    trained_by = "fine-tuned"             # what the ranks do together for a point (the same line)
    orders_by_point_scorer = True         # its removals are ordered by hetdpt.point_scorer (`scorer`)

    def __init__(self, job: PruneJob, strategy):
        self.job, self.strategy = job, strategy
        run = job.config
        # what shapes every scheme's point, besides its own settings
        self.common = {"attn_remover": run.attn_remover, "act_remover": run.act_remover, "seed": job.seed,
                       **({"amp": job.amp} if job.amp != "none" else {})}   # fp32 points keep their old key

    @property
    def point_scorer_key(self) -> dict:
        """What keys the points' removal orders: the point scorer and, where the settings give any, its options
        (none: the key points had before options reached the point scorer)."""
        name = self.options.point_scorer
        return {"point_scorer": name, **self.job.config.options_entry("scorer", name, "point_scorer_options")}

    @property
    def options(self) -> HetDPTOptions:
        """The job's ``hetdpt`` section, typed (read when asked: a plan follows the settings as they are)."""
        return self.job.options(HetDPTOptions)

    # -- what a subclass defines -------------------------------------------------------------------
    @property
    def key(self) -> str:
        raise NotImplementedError

    def plan(self, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The points to measure for a budget whose feasible splits are ``pairs``."""
        return grid_plan(self.options, pairs)

    def measure(self, todo: list[tuple[int, int]], store: storage.PointStore, have: dict) -> None:
        """Measure the points ``todo`` (this rank's share), appending each to ``store`` and ``have``."""
        raise NotImplementedError

    def verify(self, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], dict]:
        """Past the paper (``hetdpt.checks: points``): each split of ``pairs`` measured. Here: as this scheme measures
        any split, a point of it (reused where measured); progressive points override it."""
        return {(p["n_attn"], p["n_act"]): p for p in self.collect(list(pairs))}

    def plan_steps(self, plan: list[tuple[int, int]], pairs: list[tuple[int, int]]) -> list:
        """What measuring ``plan`` costs (``--plan``): here one fine-tune and one evaluation per point, and the
        checks of the points' kind (``hetdpt.checks: points``); schemes that measure otherwise override it."""
        steps = [planning.finetune_step(self.job, self.finetune_section(), "stage 1: MAP points",
                                        f"{len(plan)} points, one fine-tune each", len(plan), len(plan))]
        return steps + self.plan_checks(pairs)

    def finetune_section(self) -> str:
        """The schedule a point is fine-tuned on."""
        return resolve_finetune(self.options.point_finetune, self.job.config, self.job.task.train_size, self.name)

    def plan_checks(self, pairs: list[tuple[int, int]]) -> list:
        """The checks of the points' kind (``hetdpt.checks: points``), one point each; pipeline checks are
        the strategy's to count."""
        policy = self.strategy.checks_policy(self.job)
        k = policy.most(pairs) if policy.measure == "points" else 0
        if k < 2:
            return []
        section = resolve_finetune("auto", self.job.config, self.job.task.train_size, "oneshot")
        return [planning.finetune_step(self.job, section, "stage 1: checks",
                                       f"{k} predicted splits as points, past the paper", k, k)]

    # -- shared ------------------------------------------------------------------------------------
    def store(self, key: str | None = None, name: str = "map-points.jsonl") -> storage.PointStore:
        return storage.PointStore(self.job.shared_dir / name, key or self.key, run=self.job.reuse_tag)

    def collect(self, plan: list[tuple[int, int]]) -> list[dict]:
        """Measure every planned point not already stored; every rank returns the plan's points.

        Points are reused whenever their key matches, with or without ``--resume``: a point is a function of
        its key (base model, data, seed and every setting that shapes it), so reusing one is the same as
        measuring it again. Under torchrun rank 0 reads the store and decides what to measure; then every
        point is measured on every rank together, one after another (each fine-tune exact DDP over all
        ranks, its evaluation split across them), so a point is the same on any number of ranks.
        """
        job = self.job
        store = self.store()
        have = dist.on_main(store.load)
        todo = [p for p in plan if p not in have]
        store.say_reused(job.log, "[hetdpt]", [have[p] for p in plan if p not in todo and p in have], len(plan))
        if todo:
            self.say_ranks()
        self.measure(todo, store, have)
        return [have[p] for p in plan]

    def say_ranks(self) -> None:
        """Under torchrun, say once how the ranks are used: ``stage 1: each point fine-tuned on all 8 ranks
        (exact DDP, global batch 1024 = 8 x 128)``."""
        world = dist.world()
        if world > 1 and not getattr(self, "_said_ranks", False):
            self._said_ranks = True
            cfg = self.job.train_config(self.schedule_section).global_batch(world)
            self.job.log(f"[hetdpt] stage 1: each point {self.trained_by} on all {world} ranks (exact DDP, "
                         f"{training.batch_split(cfg, world)})")

    def evaluate(self, model) -> float:
        """The metric a point records: the task's metric of ``model`` on the selection split (the val set
        only for a task without one: `PruneJob.choice_metric`), evaluated on every rank together (each takes
        a share and the counts are summed). Every point and check is evaluated here alone."""
        return self.job.choice_metric(model)

    def record(self, store: storage.PointStore, have: dict, model, a: int, m: int, chosen: list, started: float,
               made: dict, label: str) -> dict:
        """Evaluate point ``(a, m)``'s model (`evaluate`: every rank together), store the point (rank 0
        writes) and report it; every rank keeps rank 0's record. A point's ``metric`` is the task's metric,
        whichever it is."""
        job = self.job
        acc = self.evaluate(model)
        point = store.record(job, have, {"n_attn": a, "n_act": m, "metric": acc, "split": self.job.choice_split,
                                         "sites": [str(s) for s in chosen],
                                         "seconds": round(time.time() - started, 2), "scheme": self.name, **made})
        job.log(f"[hetdpt] MAP point {label}: {a} attn + {m} act -> {job.task.format(acc)} "
                f"({point['seconds']:.1f}s)")
        return point

    def finetune(self, model, schedule: str) -> None:
        """One point fine-tune with the job's device and precision: under torchrun exact DDP over every rank
        (the global batch split across them, ``accum_steps`` micro-batches each)."""
        job = self.job
        cfg = job.train_config(schedule)
        job.task.fit(model, job.teacher_for(cfg)[0], cfg, "point", progress=False, desc="MAP point")

    def scoring(self, *folder: str):
        """A scoring context of its own under the job's work folder, quiet: a point's scoring and selection
        steps are not the run's selection stage (no progress bar, no epoch events)."""
        ctx = pipeline.scoring_context(self.job, self.job.workdir.joinpath(*folder))
        ctx.progress, ctx.on_epoch_end = False, None
        return ctx

    def scorer(self):
        """The point scorer (``hetdpt.point_scorer``) with its options (``scorer_options.NAME``), built once,
        with a one-shot ``score``."""
        if getattr(self, "_scorer", None) is None:
            name = self.options.point_scorer
            scorer = self.job.registry.build("scorer", name, **self.job.config.options_for("scorer", name))
            if hasattr(scorer, "select") and not hasattr(scorer, "score"):
                raise HetpruneError(f"hetdpt.point_scorer {name!r} has no one-shot score(); pick e.g. taylor")
            self._scorer = scorer
        return self._scorer


def grid_plan(options: HetDPTOptions, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Points on both axes (``axis_points`` per kind) and along the budget line (``mixed_points``), and the
    dense model (``dense_point``): the plan of one-shot and gradual points."""
    import numpy as np

    def axis_values(maximum: int, count: int) -> list[int]:
        if maximum <= 0 or count <= 0:
            return []
        return sorted({int(round(v)) for v in np.linspace(maximum / count, maximum, count)} - {0})

    def spread(line: list[tuple[int, int]], count: int) -> list[tuple[int, int]]:
        inner = line[1:-1] if len(line) > 2 else []
        if count <= 0 or not inner:
            return []
        idx = np.linspace(0, len(inner) - 1, min(count, len(inner)))
        return sorted({inner[int(round(i))] for i in idx})

    max_a = max(a for a, _ in pairs)
    max_m = max(m for _, m in pairs)
    plan = {(0, 0)} if options.dense_point else set()
    plan |= {(a, 0) for a in axis_values(max_a, options.axis_points)}
    plan |= {(0, m) for m in axis_values(max_m, options.axis_points)}
    plan |= set(spread(sorted(pairs), options.mixed_points))
    return sorted(plan, key=lambda p: (p[0] + p[1], p))


class OneShotPoints(PointScheme):
    """Each point from the dense model: its sites (the point scorer's order) off at once, one fine-tune."""

    name = "oneshot"
    description = "each point from the dense model, all its sites off at once, one fine-tune (not the paper's)"

    def __init__(self, job: PruneJob, strategy):
        super().__init__(job, strategy)
        self.section = self.schedule_section = resolve_finetune(self.options.point_finetune, job.config,
                                                                job.task.train_size, "oneshot")
        schedule = getattr(job.config, self.section)
        self.made = {"point_finetune": self.section, "schedule": schedule.as_settings(),
                     "images": images_of(schedule, job.task.train_size)}

    @property
    def key(self) -> str:
        run = self.job.config
        return storage.PointStore.key_for(self.job, {
            "short": getattr(run, self.section),
            **({"point_finetune": self.section} if self.section != "short_finetune" else {}),  # short ones keep
            **self.point_scorer_key, "attn_remover": run.attn_remover,   # their old key
            "act_remover": run.act_remover, "scoring": run.scoring, "seed": self.job.seed,
            **({"amp": self.common["amp"]} if "amp" in self.common else {}),
        })

    def orders(self, limits: dict[str, int]) -> dict[str, list[Site]]:
        """Per kind, the order in which the point scorer removes sites from the dense model, one at a time,
        re-scoring after each."""
        job = self.job
        scorer = self.scorer()
        ctx = pipeline.scoring_context(job, job.workdir / "points-scoring")
        orders = {}
        for kind in ("attn", "act"):
            model = job.place(copy.deepcopy(job.dense))
            order: list[Site] = []
            for _ in range(limits[kind]):
                victim = pipeline.rank_lowest(scorer.score(model, sites(model, kind), ctx), 1)[0]
                pipeline.remove_sites(job, model, [victim])
                order.append(victim)
            orders[kind] = order
        return orders

    def measure(self, todo, store, have) -> None:
        job = self.job
        orders: dict[str, list[Site]] = {}
        if todo:   # scored on rank 0 (scores may differ between ranks), used by every rank
            limits = {"attn": max(p[0] for p in todo), "act": max(p[1] for p in todo)}
            orders = dist.on_main(lambda: self.orders(limits))
        for i, (a, m) in enumerate(todo, 1):
            t0 = time.time()
            model = job.place(copy.deepcopy(job.dense))
            chosen = orders["attn"][:a] + orders["act"][:m]
            pipeline.remove_sites(job, model, chosen)
            self.finetune(model, self.section)
            self.record(store, have, model, a, m, chosen, t0, self.made, f"{i}/{len(todo)}")


class GradualPoints(PointScheme):
    """Each point is what the run's own selector (``scorer``, e.g. gate-taylor's removal-by-removal gate
    training) makes of that split from the dense model, as the final run will; no fine-tune after it."""

    name = "gradual"
    description = "each point is the run's own selection of that split from the dense model, no fine-tune after"

    def __init__(self, job: PruneJob, strategy):
        super().__init__(job, strategy)
        run = job.config
        self.selector = run.scorer
        self.selector_options = run.options_for("scorer", self.selector)

    @property
    def key(self) -> str:
        run = self.job.config
        # the selector, its options, and what it trains with (gate-taylor: short_finetune's lr, batch, KD, on
        # scoring.subset images), never the point_finetune section, which no gradual point uses
        return storage.PointStore.key_for(self.job, {
            **self.common, "point_selection": "gradual", "scorer": self.selector,
            "scorer_options": self.selector_options, "selector_schedule": run.short_finetune,
            "scoring": run.scoring, "v": 2})   # 2: gate-taylor's phase on the whole schedule

    def plan_steps(self, plan, pairs):
        """Each point is the selector's own phase for its split, then an evaluation (``--plan``)."""
        selector = self.job.registry.build("scorer", self.selector, **self.selector_options)
        images = sum(selector.plan(self.job, {"attn": a, "act": m}).train_images if hasattr(selector, "plan") else 0
                     for a, m in plan)
        return [planning.PlanStep("stage 1: MAP points", f"{len(plan)} points, each the selector's own phase",
                                  len(plan), images,
                                  len(plan) * (planning.val_size(self.job.task, self.job.choice_split) or 0)),
                *self.plan_checks(pairs)]

    def images(self, removals: int) -> int | None:
        """Images the selector trains on for ``removals`` removals, where it says (gate-taylor's epochs)."""
        per = getattr(self.built, "epochs_per_removal", None)
        if per is None or not removals:
            return 0 if not removals else None
        n = per_epoch(self.job.config.scoring.subset, self.job.task.train_size)
        return None if n is None else n * (per * removals + getattr(self.built, "warmup_epochs", 0))

    trained_by = "selected (its gate phase)"
    orders_by_point_scorer = False   # the run's own scorer selects each point

    def measure(self, todo, store, have) -> None:
        job = self.job
        self.built = job.registry.build("scorer", self.selector, **self.selector_options)
        for i, (a, m) in enumerate(todo, 1):
            t0 = time.time()
            model = job.place(copy.deepcopy(job.dense))
            ctx = self.scoring("points-gradual", f"{a}+{m}")
            # under torchrun a selector that trains (gate-taylor) does so on every rank together
            chosen = pipeline.select_sites(job, model, {"attn": a, "act": m}, ctx=ctx) if a + m else []
            pipeline.remove_sites(job, model, chosen)
            made = {"selection": "gradual", "scorer": self.selector, "images": self.images(a + m)}
            self.record(store, have, model, a, m, chosen, t0, made, f"{i}/{len(todo)}")
