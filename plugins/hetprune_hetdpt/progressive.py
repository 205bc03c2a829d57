"""Progressive MAP points, the paper's: paths from the dense model, one more site off per step, each step
fine-tuned from the previous step's weights (`paths` says which steps), and, past the paper, a check of
the checked splits (``hetdpt.checks: points``): each reached from the nearest step its removals contain and
fine-tuned once more (on the final schedule where that is affordable)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import time

from hetprune import HetpruneError, Site, sites
from hetprune.plugin_api import PruneJob, pipeline, storage
from hetprune.plugin_api import plan as planning
from hetprune.plugin_api import distributed as dist

from .paths import OTHER, Path as PointPath, paths_for
from .point_schemes import PointScheme, images_of, resolve_finetune


class ProgressivePoints(PointScheme):
    """The paper's points: paths from the dense model, one more site off per step, each step fine-tuned from
    the previous point's weights (see `paths`)."""

    name = "progressive"
    description = "the paper's: paths from the dense model, one more site per point, weights inherited"
    ORDERS = ("act", "attn")
    refinable = False   # a path makes its own splits only

    def __init__(self, job: PruneJob, strategy):
        super().__init__(job, strategy)
        self.section = self.schedule_section = resolve_finetune(self.options.point_finetune, job.config,
                                                                job.task.train_size, "progressive")
        self.first, self.stride = self.options.interleave_first, self.options.path_stride   # checked by the options
        run = job.config
        self.step_images = images_of(getattr(run, self.section), job.task.train_size)
        # a check's fine-tune (hetdpt.checks points): the final schedule where it costs at most 4 short ones (the
        # embedded benchmarks), else short_finetune (a real run's final fine-tune is far too long to repeat)
        self.check_section = resolve_finetune("auto", job.config, job.task.train_size, "oneshot")
        self.final_images = images_of(getattr(run, self.check_section), job.task.train_size)
        self.keep_steps = strategy.checks_policy(job).measure == "points"   # checks branch off any step
        self._paths: list[PointPath] = []

    def path_key(self, path: PointPath) -> storage.Key:
        """What shapes the points of one path: the scheme, the path (the interleaved path's order), the
        schedule, the point scorer and its data, and the common fields; not its length (a longer path
        extends a shorter one with the same key)."""
        run = self.job.config
        return storage.PointStore.key_for(self.job, {
            **self.common, "point_selection": "progressive", "path": path.name,
            "point_finetune": self.section, "schedule": getattr(run, self.section),
            **self.point_scorer_key, "scoring": run.scoring,
            **({"stride": self.stride} if self.stride != 1 else {})})   # stride 1 keeps its key

    @property
    def key(self) -> str:
        """The dense point's key: the dense model evaluated, no fine-tune."""
        return storage.PointStore.key_for(self.job, {**self.common, "point_selection": "progressive", "path": "dense"})

    def plan(self, pairs):
        self._paths = paths_for(pairs, self.first, self.stride)
        plan = {(0, 0)} if self.options.dense_point else set()
        for path in self._paths:
            plan |= set(path.recorded)
        return sorted(plan, key=lambda p: (p[0] + p[1], p))

    def plan_steps(self, plan, pairs):
        """The paths counted (``--plan``): one short fine-tune per step (a step is ``path_stride`` removals),
        one evaluation per recorded point, the dense point's evaluation, and the checks."""
        self.plan(pairs)
        wanted = set(plan)
        steps = 0
        for path in self._paths:
            reach = max((sum(q) for q in path.recorded if q in wanted), default=0)
            steps += sum(1 for a, m in path.steps if a + m <= reach)
        points = len(plan)
        return [planning.finetune_step(self.job, self.section, "stage 1: MAP points",
                                       f"{len(self._paths)} paths, {steps} steps, {points} points", steps, points),
                *self.plan_checks(pairs)]

    def plan_checks(self, pairs: list[tuple[int, int]]) -> list:
        """The checks of the points' kind (``hetdpt.checks: points``) counted at the most they cost: which
        splits they take is known only after the fit, so the costliest ``count`` feasible splits, each its extra
        path steps from the nearest step it contains (one short fine-tune each) and one check fine-tune."""
        policy = self.strategy.checks_policy(self.job)
        k = policy.most(pairs) if policy.measure == "points" else 0
        if k < 2:
            return []
        self.plan(pairs)
        extra = sorted((self.check_steps(p) for p in pairs), reverse=True)[:k]
        steps = planning.finetune_step(self.job, self.section, "", "", sum(extra), 0)
        checks = planning.finetune_step(self.job, self.check_section, "", "", k, k)
        return [dataclasses.replace(
            checks, stage="stage 1: checks",
            what=f"at most {k} predicted splits as points, past the paper, each from the nearest path step "
                 f"({sum(extra)} extra steps at most)",
            fine_tunes=checks.fine_tunes + steps.fine_tunes, train_images=checks.train_images + steps.train_images)]

    def check_steps(self, pair: tuple[int, int]) -> int:
        """The path steps a check of ``pair`` adds to the nearest path step it contains (`verify`)."""
        path, step = self.base_for(pair)
        base = path.steps[step - 1] if step else (0, 0)
        return -(-(pair[0] - base[0] + pair[1] - base[1]) // self.stride)

    def collect(self, plan):
        # rank 0's paths on every rank (under torchrun only rank 0 may have made the plan); a plan made
        # elsewhere gets the paths that reach its points
        self._paths = dist.on_main(lambda: self._paths or paths_for_plan(plan, self.first, self.stride))
        job = self.job
        stores = {path.name: self.store(self.path_key(path)) for path in self._paths}
        dense_store = self.store()
        have = dist.on_main(lambda: self.load_all([*stores.values(), dense_store]))   # rank 0 decides what is reused
        wanted = set(plan)
        todo_paths = [p for p in self._paths if any(q in wanted and q not in have for q in p.recorded)]
        dense_todo = (0, 0) in wanted and (0, 0) not in have
        dense_store.say_reused(job.log, "[hetdpt]", [have[p] for p in plan if p in have], len(plan))
        if todo_paths:
            self.say_ranks()
        if dense_todo:
            t0 = time.time()
            self.record(dense_store, have, job.place(copy.deepcopy(job.dense)), 0, 0, [], t0,
                        {"path": "dense", "images": 0}, "dense")
        for path in todo_paths:   # one path after another, each step on every rank together
            reach = max(sum(q) for q in path.recorded if q in wanted)   # the last wanted point of the path
            self.walk(path, stores[path.name], have, reach)
        missing = [p for p in plan if p not in have]
        if missing:
            raise HetpruneError(f"progressive points: no path reaches {missing}")
        return [have[p] for p in plan]

    @staticmethod
    def load_all(stores: list[storage.PointStore]) -> dict:
        """Every stored point of these stores (the paths' and the dense point's), by split."""
        have: dict = {}
        for store in stores:
            have.update(store.load())
        return have

    # -- one path ----------------------------------------------------------------------------------
    def checkpoint(self, path: PointPath, step: int):
        """Where the weights after ``step`` steps of ``path`` are kept: named by the path's key, the step and
        the kinds its steps removed up to there (the interleaved path's order depends on the budget, so two
        budgets' paths may reach a step by different removals)."""
        order, key = storage.fingerprint(path.kinds[:step]), self.path_key(path)
        folder = self.job.shared_dir / "map-paths"
        return storage.found(folder / f"{key}-step{step}-{order[:8]}.pt",
                             folder / f"{key.before}-step{step}-{order.before[:8]}.pt")   # (as key version 1 named it)

    def load(self, file) -> tuple:
        """A kept step: its model (the dense model with the step's sites removed, then its weights) and sites."""
        import torch

        job = self.job
        try:
            state = torch.load(str(file), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise HetpruneError(f"progressive points: checkpoint {file} cannot be read ({exc}); delete it to walk "
                                "that path again") from exc
        removed = [Site.parse(s) for s in state["sites"]]
        model = job.place(copy.deepcopy(job.dense))
        pipeline.remove_sites(job, model, removed)
        model.load_state_dict(state["model"])
        return job.place(model), removed

    def start(self, path: PointPath, stored: dict):
        """The model to continue ``path`` from and the steps it has done: the last finished step whose
        weights are kept and whose point (if it records one) is stored; else the dense model, step 0."""
        usable = [step for step in range(len(path.steps), 0, -1)
                  if path.steps[step - 1] not in path.recorded or path.steps[step - 1] in stored]
        found = self.kept(path, usable, check=True)
        if found is None:
            return self.job.place(copy.deepcopy(self.job.dense)), [], 0
        model, removed, step = found
        self.job.log(f"[hetdpt] progressive points: path {path.name} continues after step {step} "
                     f"({self.checkpoint(path, step).name})")
        return model, removed, step

    def kept(self, path: PointPath, steps: list[int], check: bool = False):
        """The first of ``steps`` (latest first) whose weights are kept, as ``(model, removed sites, step)``,
        or None. Rank 0 decides which (what it sees in the shared folder) and every rank loads that one, or
        every rank stops with one error (`hetprune.core.distributed.follow_saved`). ``check``: a file whose sites
        are not its step's split is passed over (said aloud)."""
        job = self.job
        files = [self.checkpoint(path, step) for step in steps]

        def reuse(file, state) -> bool:
            step, removed = steps[files.index(file)], state[1]
            got = (sum(x.kind == "attn" for x in removed), sum(x.kind == "act" for x in removed))
            if check and got != path.steps[step - 1]:   # never continue from weights that are not this step's
                pair = path.steps[step - 1]
                job.log(f"[hetdpt] progressive points: {file.name} holds {got[0]} attn + {got[1]} act removed, "
                        f"not step {step}'s {pair[0]} + {pair[1]}; not reused")
                return False
            return True

        # other ranks load rank 0's file by its name: a rank's own key may differ (a Task hashing its own batches)
        found = dist.follow_saved(files, self.load, lambda state: [str(x) for x in state[1]],
                                  f"progressive points (path {path.name})", reuse=reuse, by_name=True,
                                  describe=lambda names: f"sites {', '.join(names)}", continues=f" path {path.name}")
        if found is None:
            return None
        index, (model, removed) = found
        return model, removed, steps[index]

    def step(self, model, kinds: list[str], ctx) -> list[Site]:
        """One step: for each of ``kinds`` in turn, the point scorer's lowest site of that kind on ``model``
        off (scored again after each, on rank 0: every rank removes its choice); then one point fine-tune."""
        removed = []
        for kind in kinds:
            victim = dist.on_main(functools.partial(self.lowest, model, kind, ctx))
            pipeline.remove_sites(self.job, model, [victim])
            removed.append(victim)
        self.finetune(model, self.section)
        return removed

    def lowest(self, model, kind: str, ctx) -> Site:
        """The site of ``kind`` the point scorer ranks lowest on ``model``."""
        return pipeline.rank_lowest(self.scorer().score(model, sites(model, kind), ctx), 1)[0]

    def walk(self, path: PointPath, store: storage.PointStore, have: dict, reach: int) -> None:
        """Walk ``path`` until its steps reach ``reach`` sites removed, resuming from its last kept step."""
        job = self.job
        stored = dist.on_main(store.load)
        model, removed, done = self.start(path, stored)
        ctx = self.scoring("points-scoring", path.name)
        for step in range(done, len(path.steps)):
            a, m = path.steps[step]
            if a + m > reach:
                break
            t0 = time.time()
            removed = removed + self.step(model, path.kinds[step], ctx)
            self.keep(model, removed, self.checkpoint(path, step + 1))
            if (a, m) in path.recorded:   # its images: its own fine-tune and those of unrecorded steps before
                fine_tunes = path.since_recorded(step + 1)
                images = None if self.step_images is None else self.step_images * fine_tunes
                self.record(store, have, model, a, m, removed, t0,
                            {"path": path.name, "step": step + 1, "fine_tunes": fine_tunes,
                             "point_finetune": self.section,
                             "schedule": getattr(job.config, self.section).as_settings(), "images": images},
                            f"{path.name} {step + 1}/{len(path.steps)}")
            if step and not self.keep_steps and dist.is_main():   # the previous step's weights are not needed
                self.checkpoint(path, step).unlink(missing_ok=True)

    # -- past the paper: verify the best predicted splits ----------------------------------------------------
    @property
    def verify_key(self) -> str:
        run = self.job.config
        return storage.PointStore.key_for(self.job, {
            **self.common, "point_selection": "progressive", "verify": self.first,
            "point_finetune": self.section, "schedule": getattr(run, self.section),
            "final": getattr(run, self.check_section),
            **({"check": self.check_section} if self.check_section != "finetune" else {}),
            **self.point_scorer_key, "scoring": run.scoring, "stride": self.stride})

    def base_for(self, pair: tuple[int, int]) -> tuple[PointPath, int]:
        """The path step nearest ``pair`` whose removals it contains (most sites off; the paths' order breaks
        ties), as (path, step); step 0 is the dense model."""
        found = [(p[0] + p[1], -i, path, step + 1) for i, path in enumerate(self._paths)
                 for step, p in enumerate(path.steps) if p[0] <= pair[0] and p[1] <= pair[1]]
        if not found:
            return self._paths[0], 0
        _, _, path, step = max(found, key=lambda f: (f[0], f[1]))
        return path, step

    def model_at(self, path: PointPath, step: int):
        """The model of ``path`` after ``step`` steps: its kept weights, else the steps again from the nearest
        kept one before it (the same seed and data: the same model)."""
        job = self.job
        found = self.kept(path, list(range(step, 0, -1)))
        done, model, removed = (0, job.place(copy.deepcopy(job.dense)), []) if found is None else \
            (found[2], found[0], found[1])
        ctx = self.scoring("points-scoring", path.name)
        for i in range(done, step):
            removed = removed + self.step(model, path.kinds[i], ctx)
            self.keep(model, removed, self.checkpoint(path, i + 1))
        return model, removed

    def keep(self, model, removed: list, file) -> None:
        """Keep a step's weights and sites (written whole, then moved into place; by rank 0: under torchrun
        every rank holds the same model)."""

        if not dist.is_main():
            return
        storage.save_torch_atomic(file, {"model": model.state_dict(), "sites": [str(s) for s in removed],
                                         "step": len(removed)})

    def verify(self, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], dict]:
        """Each split of ``pairs`` measured past the paper: from the nearest path step its removals contain
        (inherited weights), the missing sites removed as on a path (``path_stride`` per step, interleaved,
        the ``interleave_first`` kind first), then one check fine-tune (the final schedule where affordable),
        evaluated. Stored in ``map-checks.jsonl`` and reused like points; under torchrun each check on every
        rank together, as points are."""
        store = self.store(self.verify_key, "map-checks.jsonl")
        have = dist.on_main(store.load)
        todo = [p for p in pairs if p not in have]
        store.say_reused(self.job.log, "[hetdpt]", [have[p] for p in pairs if p not in todo and p in have],
                         len(pairs), "checks")
        for i, (a, m) in enumerate(todo):
            t0 = time.time()
            path, step = self.base_for((a, m))
            model, removed = self.model_at(path, step)
            base = path.steps[step - 1] if step else (0, 0)
            left = {"attn": a - base[0], "act": m - base[1]}
            ctx = self.scoring("points-scoring", f"verify-{a}+{m}")
            order, kind = [], self.first
            while any(left.values()):   # the missing sites alternating, ``interleave_first`` first
                kind = kind if left[kind] else OTHER[kind]
                order.append(kind)
                left[kind] -= 1
                kind = OTHER[kind]
            steps = [order[j:j + self.stride] for j in range(0, len(order), self.stride)]
            for kinds in steps:
                removed = removed + self.step(model, kinds, ctx)
            self.finetune(model, self.check_section)
            images = (None if self.step_images is None or self.final_images is None
                      else len(steps) * self.step_images + self.final_images)
            self.record(store, have, model, a, m, removed, t0,
                        {"verified_from": [base[0], base[1]], "path": path.name, "extra_steps": len(steps),
                         "check_finetune": self.check_section, "images": images}, f"check {i + 1}/{len(todo)}")
        return {p: have[p] for p in pairs}


def paths_for_plan(plan: list[tuple[int, int]], first: str, stride: int = 1) -> list[PointPath]:
    """The paths whose points cover ``plan`` (a plan made by another scheme's plan, e.g. a refinement's)."""
    max_a = max((a for a, _ in plan), default=0)
    max_m = max((m for _, m in plan), default=0)
    return paths_for([(max_a, max_m)], first, stride)
