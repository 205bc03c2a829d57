"""How MAP's cheap points are made: one class per scheme (``hetdpt.point_selection``).

A scheme decides which points a budget gets (:meth:`PointScheme.plan`), how
each one is measured, and what keys it (:attr:`PointScheme.key`: everything
that shapes a point, so a changed setting never reuses a stale one). It is
built once per job with its settings resolved (:func:`scheme_for`), and it
reads the job's device, precision, removers and scoring context from the job,
never again from settings.

* ``oneshot`` (not the paper's): per point, all its sites (the point scorer's
  removal order on the dense model) off at once, one fine-tune, evaluate.
* ``progressive`` (the paper's): paths from the dense model (attention only,
  activation only, and the kinds interleaved); each step removes the site the
  point scorer ranks lowest on the current fine-tuned model and fine-tunes
  from the previous point's weights (:mod:`.paths`).
* ``gradual``: the run's own selector makes each point from the dense model,
  as the final run will for that split; no fine-tune after it.

A new scheme is one subclass registered in :data:`SCHEMES` (a strategy built
on ``hetdpt`` may pass its own table to :func:`scheme_for`).
"""

from __future__ import annotations

import copy
import time

from hetprune import HetpruneError, Site, sites
from hetprune import distributed as dist
from hetprune.cache import fingerprint
from hetprune.pipeline import PruneJob, rank_lowest, remove_sites, scoring_context, select_sites
from hetprune.points import PointStore

from .paths import Path as PointPath, paths_for

FINETUNES = ("auto", "finetune", "short_finetune")
AFFORDABLE = 4   # oneshot's auto: the final schedule for points when it sees at most this many short ones' images


def images_of(schedule: dict, train_size: int | None) -> int | None:
    """Images one fine-tune of ``schedule`` sees (epochs x its subset, or the training set), None if unknown."""
    n = schedule.get("subset")
    if train_size is not None:
        n = min(n, train_size) if n else train_size
    return None if n is None else int(schedule["epochs"] * n)


def resolve_finetune(settings: dict, train_size: int | None = None, scheme: str = "oneshot") -> str:
    """The settings section whose schedule fine-tunes a point (``hetdpt.point_finetune``), ``auto`` resolved:
    for ``oneshot``, ``finetune`` where it sees at most AFFORDABLE short fine-tunes' images (the embedded
    benchmarks), else ``short_finetune``; for ``progressive``, always ``short_finetune`` (a path has about
    three times as many points as a one-shot plan)."""
    section = settings["hetdpt"].get("point_finetune", "short_finetune")
    if section not in FINETUNES:
        raise HetpruneError(f"hetdpt.point_finetune must be one of {', '.join(FINETUNES)} (the settings section "
                            f"whose schedule fine-tunes a MAP point), got {section!r}")
    if section != "auto":
        return section
    if scheme == "progressive":
        return "short_finetune"

    def images(name: str) -> float:
        found = images_of(settings[name], train_size)
        return float("inf") if found is None else found
    return "finetune" if images("finetune") <= AFFORDABLE * images("short_finetune") else "short_finetune"


class PointScheme:
    """The common part: the store, the plan's bookkeeping, the measurement loop, the keys' shared fields."""

    name = ""
    description = ""
    refinable = True   # whether any split on the budget line can be measured (hetdpt.refine's rounds)

    def __init__(self, job: PruneJob, strategy):
        self.job, self.strategy = job, strategy
        s = job.settings
        self.options = s["hetdpt"]
        # what shapes every scheme's point, besides its own settings
        self.common = {"base": job.base_hash, "data": job.task.fingerprint, "attn_remover": s["attn_remover"],
                       "act_remover": s["act_remover"], "seed": job.seed,
                       **({"amp": job.amp} if job.amp != "none" else {})}   # fp32 points keep their old key

    # -- what a subclass defines -------------------------------------------------------------------
    @property
    def key(self) -> str:
        raise NotImplementedError

    def plan(self, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The points to measure for a budget whose feasible splits are ``pairs``."""
        return grid_plan(self.options, pairs)

    def measure(self, todo: list[tuple[int, int]], store: PointStore, have: dict) -> None:
        """Measure the points ``todo`` (this rank's share), appending each to ``store`` and ``have``."""
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------------------
    def store(self, key: str | None = None) -> PointStore:
        return PointStore(self.job.shared_dir / "map-points.jsonl", key or self.key)

    def collect(self, plan: list[tuple[int, int]]) -> list[dict]:
        """Measure every planned point not already stored; every rank returns the plan's points.

        Points are reused whenever their key matches, with or without ``--resume``: a point is a function of
        its key (base model, data, seed and every setting that shapes it), so reusing one is the same as
        measuring it again. Under torchrun each rank measures its share (point i on rank i mod world, each
        with its own single-process fine-tune), appends it under a lock, and all ranks read the whole file.
        """
        job = self.job
        store = self.store()
        have = store.load()
        todo = dist.on_main(lambda: [p for p in plan if p not in have])
        if have and todo != plan:
            job.log(f"[hetdpt] reusing {len(plan) - len(todo)} measured MAP points from {store.path}")
        self.measure(todo, store, have)
        if dist.active():
            dist.barrier()
            have = store.load()
        return [have[p] for p in plan]

    def record(self, store: PointStore, have: dict, model, a: int, m: int, chosen: list, started: float,
               made: dict, label: str) -> dict:
        """Evaluate this rank's own model of point ``(a, m)`` (the whole val set, not shared across ranks),
        store the point and report it. A point's ``accuracy`` is the task's metric, whichever it is."""
        job = self.job
        acc = job.task.evaluate(model, job.device, amp=job.amp, workers=job.workers, distributed=False)
        point = {"n_attn": a, "n_act": m, "accuracy": acc, "sites": [str(s) for s in chosen],
                 "seconds": round(time.time() - started, 2), "scheme": self.name, **made}
        store.append(point)
        have[(a, m)] = point
        job.event("on_point_collected", point=point)
        job.log(f"[hetdpt] MAP point {label}: {a} attn + {m} act -> {job.task.format(acc)} "
                f"({point['seconds']:.1f}s)")
        return point

    def finetune(self, model, schedule: str) -> None:
        """One point fine-tune on this rank alone, with the job's device and precision."""
        job = self.job
        job.task.fit(model, job.dense, job.train_config(schedule), "point", progress=False, desc="MAP point",
                     distributed=False)

    def scorer(self):
        """The point scorer (``hetdpt.point_scorer``), built once, with a one-shot ``score``."""
        if getattr(self, "_scorer", None) is None:
            name = self.options["point_scorer"]
            scorer = self.job.registry.build("scorer", name)
            if hasattr(scorer, "select") and not hasattr(scorer, "score"):
                raise HetpruneError(f"hetdpt.point_scorer {name!r} has no one-shot score(); pick e.g. taylor")
            self._scorer = scorer
        return self._scorer


def grid_plan(options: dict, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
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
    plan = {(0, 0)} if options["dense_point"] else set()
    plan |= {(a, 0) for a in axis_values(max_a, options["axis_points"])}
    plan |= {(0, m) for m in axis_values(max_m, options["axis_points"])}
    plan |= set(spread(sorted(pairs), options["mixed_points"]))
    return sorted(plan, key=lambda p: (p[0] + p[1], p))


class OneShotPoints(PointScheme):
    """Each point from the dense model: its sites (the point scorer's order) off at once, one fine-tune."""

    name = "oneshot"
    description = "each point from the dense model, all its sites off at once, one fine-tune (not the paper's)"

    def __init__(self, job: PruneJob, strategy):
        super().__init__(job, strategy)
        self.section = resolve_finetune(job.settings, job.task.train_size, "oneshot")
        s = job.settings
        self.made = {"point_finetune": self.section, "schedule": s[self.section],
                     "images": images_of(s[self.section], job.task.train_size)}

    @property
    def key(self) -> str:
        s = self.job.settings
        return fingerprint({
            "base": self.common["base"], "data": self.common["data"], "short": s[self.section],
            **({"point_finetune": self.section} if self.section != "short_finetune" else {}),  # short ones keep
            "point_scorer": self.options["point_scorer"], "attn_remover": s["attn_remover"],   # their old key
            "act_remover": s["act_remover"], "scoring": s["scoring"], "seed": self.job.seed,
            **({"amp": self.common["amp"]} if "amp" in self.common else {}),
        })

    def orders(self, limits: dict[str, int]) -> dict[str, list[Site]]:
        """Per kind, the order in which the point scorer removes sites from the dense model, one at a time,
        re-scoring after each."""
        job = self.job
        scorer = self.scorer()
        ctx = scoring_context(job, job.workdir / "points-scoring")
        orders = {}
        for kind in ("attn", "act"):
            model = job.place(copy.deepcopy(job.dense))
            order: list[Site] = []
            for _ in range(limits[kind]):
                victim = rank_lowest(scorer.score(model, sites(model, kind), ctx), 1)[0]
                remove_sites(job, model, [victim])
                order.append(victim)
            orders[kind] = order
        return orders

    def measure(self, todo, store, have) -> None:
        job = self.job
        mine = todo[dist.rank()::dist.world()]
        orders = None
        if todo:   # scored on rank 0 (scores may differ between ranks), used by every rank
            limits = {"attn": max(p[0] for p in todo), "act": max(p[1] for p in todo)}
            orders = dist.on_main(lambda: self.orders(limits))
        for i, (a, m) in enumerate(mine, 1):
            t0 = time.time()
            model = job.place(copy.deepcopy(job.dense))
            chosen = orders["attn"][:a] + orders["act"][:m]
            remove_sites(job, model, chosen)
            self.finetune(model, self.section)
            self.record(store, have, model, a, m, chosen, t0, self.made, f"{i}/{len(mine)}")


class GradualPoints(PointScheme):
    """Each point is what the run's own selector (``scorer``, e.g. gate-taylor's removal-by-removal gate
    training) makes of that split from the dense model, as the final run will; no fine-tune after it."""

    name = "gradual"
    description = "each point is the run's own selection of that split from the dense model, no fine-tune after"

    def __init__(self, job: PruneJob, strategy):
        super().__init__(job, strategy)
        s = job.settings
        self.selector = s["scorer"]
        self.selector_options = s.get("scorer_options", {}).get(self.selector, {})

    @property
    def key(self) -> str:
        s = self.job.settings
        # the selector, its options, and what it trains with (gate-taylor: short_finetune's lr, batch, KD, on
        # scoring.subset images), never the point_finetune section, which no gradual point uses
        return fingerprint({**self.common, "point_selection": "gradual", "scorer": self.selector,
                            "scorer_options": self.selector_options, "selector_schedule": s["short_finetune"],
                            "scoring": s["scoring"]})

    def images(self, removals: int) -> int | None:
        """Images the selector trains on for ``removals`` removals, where it says (gate-taylor's epochs)."""
        per = getattr(self.built, "epochs_per_removal", None)
        if per is None or not removals:
            return 0 if not removals else None
        n = images_of({"epochs": 1, "subset": self.job.settings["scoring"]["subset"]}, self.job.task.train_size)
        return None if n is None else n * (per * removals + getattr(self.built, "warmup_epochs", 0))

    def measure(self, todo, store, have) -> None:
        job = self.job
        mine = todo[dist.rank()::dist.world()]
        self.built = job.registry.build("scorer", self.selector, **self.selector_options)
        for i, (a, m) in enumerate(mine, 1):
            t0 = time.time()
            model = job.place(copy.deepcopy(job.dense))
            ctx = scoring_context(job, job.workdir / "points-gradual" / f"{a}+{m}")
            ctx.progress, ctx.on_epoch_end = False, None   # a point's steps are not the run's selection stage
            chosen = select_sites(job, model, {"attn": a, "act": m}, ctx=ctx, shared=False) if a + m else []
            remove_sites(job, model, chosen)
            made = {"selection": "gradual", "scorer": self.selector, "images": self.images(a + m)}
            self.record(store, have, model, a, m, chosen, t0, made, f"{i}/{len(mine)}")


class ProgressivePoints(PointScheme):
    """The paper's points: paths from the dense model, one more site off per step, each step fine-tuned from
    the previous point's weights (see :mod:`.paths`)."""

    name = "progressive"
    description = "the paper's: paths from the dense model, one more site per point, weights inherited"
    ORDERS = ("act", "attn")
    refinable = False   # a path makes its own splits only

    def __init__(self, job: PruneJob, strategy):
        super().__init__(job, strategy)
        self.section = resolve_finetune(job.settings, job.task.train_size, "progressive")
        first = self.options.get("interleave_first", "act")
        if first not in self.ORDERS:
            raise HetpruneError(f"hetdpt.interleave_first must be one of {', '.join(self.ORDERS)} (the kind the "
                                f"interleaved path of progressive points removes first), got {first!r}")
        self.first = first
        s = job.settings
        self.step_images = images_of(s[self.section], job.task.train_size)
        self._paths: list[PointPath] = []

    def path_key(self, path: PointPath) -> str:
        """What shapes the points of one path: the scheme, the path (the interleaved path's order), the
        schedule, the point scorer and its data, and the common fields; not its length (a longer path
        extends a shorter one with the same key)."""
        s = self.job.settings
        return fingerprint({**self.common, "point_selection": "progressive", "path": path.name,
                            "point_finetune": self.section, "schedule": s[self.section],
                            "point_scorer": self.options["point_scorer"], "scoring": s["scoring"]})

    @property
    def key(self) -> str:
        """The dense point's key: the dense model evaluated, no fine-tune."""
        return fingerprint({**self.common, "point_selection": "progressive", "path": "dense"})

    def plan(self, pairs):
        self._paths = paths_for(pairs, self.first)
        plan = {(0, 0)} if self.options["dense_point"] else set()
        for path in self._paths:
            plan |= set(path.recorded)
        return sorted(plan, key=lambda p: (p[0] + p[1], p))

    def collect(self, plan):
        if not self._paths:   # a plan made elsewhere: the paths that reach its points
            self._paths = paths_for_plan(plan, self.first)
        job = self.job
        stores = {path.name: self.store(self.path_key(path)) for path in self._paths}
        dense_store = self.store()
        have = {}
        for path in self._paths:
            have.update(stores[path.name].load())
        have.update(dense_store.load())
        wanted = set(plan)
        todo_paths = dist.on_main(lambda: [p for p in self._paths if any(q in wanted and q not in have
                                                                          for q in p.recorded)])
        dense_todo = (0, 0) in wanted and (0, 0) not in have
        reused = len([p for p in plan if p in have])
        if reused and len(todo_paths) + dense_todo:
            job.log(f"[hetdpt] reusing {reused} measured MAP points from {dense_store.path}")
        world = dist.world()
        if world > len(todo_paths) >= 1 and dist.is_main() and world > 1:
            job.log(f"[hetdpt] progressive points: {len(todo_paths)} path(s) on {world} ranks; ranks "
                    f"{len(todo_paths)}-{world - 1} wait (a path is a chain of fine-tunes, each from the last)")
        if dense_todo and dist.is_main():
            t0 = time.time()
            self.record(dense_store, have, job.place(copy.deepcopy(job.dense)), 0, 0, [], t0,
                        {"path": "dense", "images": 0}, "dense")
        for i, path in enumerate(todo_paths):
            if i % world == dist.rank():
                self.walk(path, stores[path.name], have, max(q[0] + q[1] for q in path.steps if q in wanted)
                          if any(q in wanted for q in path.steps) else len(path.steps))
        if dist.active():
            dist.barrier()
            have = {}
            for path in self._paths:
                have.update(stores[path.name].load())
            have.update(dense_store.load())
        missing = [p for p in plan if p not in have]
        if missing:
            raise HetpruneError(f"progressive points: no path reaches {missing}")
        return [have[p] for p in plan]

    # -- one path ----------------------------------------------------------------------------------
    def checkpoint(self, path: PointPath, step: int):
        return self.job.shared_dir / "map-paths" / f"{self.path_key(path)}-step{step}.pt"

    def start(self, path: PointPath, stored: dict):
        """The model to continue ``path`` from and the steps it has done: the last finished step whose
        weights are kept and whose point (if it records one) is stored; else the dense model, step 0."""
        import torch

        job = self.job
        for step in range(len(path.steps), 0, -1):
            file = self.checkpoint(path, step)
            pair = path.steps[step - 1]
            if not file.is_file() or (pair in path.recorded and pair not in stored):
                continue
            try:
                state = torch.load(str(file), map_location="cpu", weights_only=True)
            except Exception as exc:
                raise HetpruneError(f"progressive points: checkpoint {file} cannot be read ({exc}); delete it to "
                                    "walk that path again") from exc
            model = job.place(copy.deepcopy(job.dense))
            remove_sites(job, model, [Site.parse(s) for s in state["sites"]])
            model.load_state_dict(state["model"])
            job.place(model)
            job.log(f"[hetdpt] progressive points: path {path.name} continues after step {step} ({file.name})")
            return model, [Site.parse(s) for s in state["sites"]], step
        return job.place(copy.deepcopy(job.dense)), [], 0

    def walk(self, path: PointPath, store: PointStore, have: dict, reach: int) -> None:
        """Walk ``path`` until its steps reach ``reach`` sites removed, resuming from its last kept step."""
        import torch

        job = self.job
        stored = store.load()
        model, removed, done = self.start(path, stored)
        scorer = self.scorer()
        ctx = scoring_context(job, job.workdir / "points-scoring" / path.name)
        ctx.progress, ctx.on_epoch_end = False, None
        for step in range(done, len(path.steps)):
            a, m = path.steps[step]
            if a + m > reach:
                break
            t0 = time.time()
            kind = path.kinds[step]
            victim = rank_lowest(scorer.score(model, sites(model, kind), ctx), 1)[0]
            remove_sites(job, model, [victim])
            removed = removed + [victim]
            self.finetune(model, self.section)
            file = self.checkpoint(path, step + 1)
            file.parent.mkdir(parents=True, exist_ok=True)
            tmp = file.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "sites": [str(s) for s in removed], "step": step + 1}, str(tmp))
            tmp.replace(file)
            if (a, m) in path.recorded:   # its images: its own fine-tune and those of unrecorded steps before
                fine_tunes = path.since_recorded(step + 1)
                images = None if self.step_images is None else self.step_images * fine_tunes
                self.record(store, have, model, a, m, removed, t0,
                            {"path": path.name, "step": step + 1, "fine_tunes": fine_tunes,
                             "point_finetune": self.section, "schedule": job.settings[self.section],
                             "images": images}, f"{path.name} {step + 1}/{len(path.steps)}")
            if step:   # the previous step's weights are no longer needed once this one is kept
                self.checkpoint(path, step).unlink(missing_ok=True)


def paths_for_plan(plan: list[tuple[int, int]], first: str) -> list[PointPath]:
    """The paths whose points cover ``plan`` (a plan made by another scheme's plan, e.g. a refinement's)."""
    max_a = max((a for a, _ in plan), default=0)
    max_m = max((m for _, m in plan), default=0)
    return paths_for([(max_a, max_m)], first)


SCHEMES = {cls.name: cls for cls in (OneShotPoints, ProgressivePoints, GradualPoints)}


def scheme_for(job: PruneJob, strategy, schemes: dict | None = None) -> PointScheme:
    """The job's point scheme (``hetdpt.point_selection``), built once per job with its settings resolved."""
    table = schemes or SCHEMES
    name = job.settings["hetdpt"].get("point_selection", "oneshot")
    if name not in table:
        raise HetpruneError(f"hetdpt.point_selection must be one of {', '.join(table)}, got {name!r}")
    return job.once(("point scheme", name), lambda: table[name](job, strategy))
