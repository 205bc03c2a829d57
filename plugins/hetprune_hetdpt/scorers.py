"""Importance scorers. Higher score = more important = keep. Scores are only
ever compared between sites of the same kind."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

from hetprune import HetpruneError
from hetprune.plugin_api import Section, adapters, devices, number, setting, storage, training, whole
from hetprune.plugin_api import plan as planning
from hetprune.plugin_api import distributed as dist

from . import gates


class TaylorScorer:
    """One-shot first-order Taylor estimate of the loss increase when a site is removed."""

    name = "taylor"

    def score(self, model, sites, ctx):
        bank, handles = gates.install(model, sites)
        was_training = model.training
        model.eval()
        try:
            total = torch.zeros_like(bank.scores)
            n = 0
            for batch in ctx.batches():
                bank.scores.grad = None
                ctx.loss(model, batch).backward()
                total += bank.scores.grad.detach()
                n += 1
            model.zero_grad(set_to_none=True)
        finally:
            gates.uninstall(model, handles)
            model.train(was_training)
        if n == 0:
            raise HetpruneError("taylor scorer got no batches: the scoring subset is empty")
        # removing a site moves m from 1 to 0: delta L ~ -dL/dm
        return {s: float(-total[i] / n) for i, s in enumerate(sites)}


class LossDropScorer:
    """Zeroth order: the loss increase when a site is actually removed (simulated by its gate at 0) on the
    scoring batches, not its first-order estimate. ``select`` removes greedily, one site at a time
    alternating kinds as gate-taylor does, re-measuring the rest after each removal; no weights change."""

    name = "loss-drop"
    description = "the loss increase of each real removal (not its Taylor estimate), greedy, re-measured"

    @torch.no_grad()
    def _losses(self, model, bank, batches, sites, ctx) -> dict:
        def loss() -> float:
            return sum(float(ctx.loss(model, batch)) for batch in batches) / len(batches)

        base = loss()
        out = {}
        for site in sites:
            i = bank.index[site]
            bank.mask[i] = 0.0
            out[site] = loss() - base
            bank.mask[i] = 1.0
        return out

    def _run(self, model, candidates, ctx, steps):
        batches = list(ctx.batches())
        if not batches:
            raise HetpruneError("loss-drop scorer got no batches: the scoring subset is empty")
        bank, handles = gates.install(model, candidates)
        was_training = model.training
        model.eval()
        try:
            return steps(bank, batches)
        finally:
            gates.uninstall(model, handles)
            model.train(was_training)

    def score(self, model, sites, ctx):
        return self._run(model, list(sites), ctx, lambda bank, batches: self._losses(model, bank, batches, sites, ctx))

    def select(self, model, counts, ctx):
        order = GateTaylorScorer.schedule(counts)
        candidates = [s for kind in ("attn", "act") if counts.get(kind) for s in _present(model, kind)]

        def steps(bank, batches):
            removed = []
            for kind in order:
                drops = self._losses(model, bank, batches, bank.active(kind), ctx)
                victim = min(drops, key=lambda s: (drops[s], s.block))
                bank.switch_off(victim)
                removed.append(victim)
                if ctx.progress:
                    ctx.log(f"  loss-drop: removed {victim} (loss +{drops[victim]:.4f})")
            return removed

        return self._run(model, candidates, ctx, steps) if order else []


class BlockInfluenceScorer:
    """1 - cosine similarity of a site's input and output (how much it changes the stream)."""

    name = "block-influence"

    @torch.no_grad()
    def score(self, model, sites, ctx):
        adapter = adapters.adapter_for(model)
        sums = {s: 0.0 for s in sites}
        counts = {s: 0 for s in sites}
        handles = []

        def record(site, x, y):
            cos = F.cosine_similarity(x.flatten(0, -2), y.flatten(0, -2), dim=-1)
            sums[site] += float((1 - cos).mean())
            counts[site] += 1

        for site in sites:
            if site.kind == "attn":
                # the attention site maps the residual stream x (the block's input) to x + branch
                # (the input of the norm before the MLP)
                before, after = adapter.stream_points(model, site.block)
                seen = {}

                def pre(module, inputs, _seen=seen):
                    _seen["x"] = inputs[0]

                def post(module, inputs, _site=site, _seen=seen):
                    record(_site, _seen.pop("x"), inputs[0])

                handles.append(before.register_forward_pre_hook(pre))
                handles.append(after.register_forward_pre_hook(post))
            else:
                module, removed = adapter.gate_point(model, site.block, site.kind)

                def act_hook(module, inputs, output, _site=site, _removed=removed):
                    record(_site, _removed(inputs, output), output)

                handles.append(module.register_forward_hook(act_hook))
        was_training = model.training
        model.eval()
        try:
            for batch in ctx.batches():
                ctx.loss(model, batch)   # the task's own forward: a batch may be a dict, a namedtuple, ...
        finally:
            for h in handles:
                h.remove()
            model.train(was_training)
        return {s: sums[s] / max(1, counts[s]) for s in sites}


class MagnitudeScorer:
    """RMS of the weights a site's branch owns (attention: its projections; activation: the MLP's)."""

    name = "magnitude"

    @torch.no_grad()
    def score(self, model, sites, ctx):
        adapter = adapters.adapter_for(model)
        out = {}
        for s in sites:
            weights = adapter.branch_weights(model, s.block, s.kind)
            sq = sum(float((w.double() ** 2).sum()) for w in weights)
            n = sum(w.numel() for w in weights)
            out[s] = (sq / n) ** 0.5
        return out


@dataclass(frozen=True)
class RandomOptions(Section):
    """``scorer_options.random``."""

    section: ClassVar[str] = "scorer_options.random"
    seed: int | None = setting(None, "the draws' seed (null: the run's)")

    def __post_init__(self):
        self.need("seed", self.seed is None or whole(self.seed), "a whole number or null (the run's)")


class RandomScorer:
    """Seeded random scores: the control every scorer should beat."""

    name = "random"
    Options = RandomOptions

    def __init__(self, **options):
        self.seed = RandomOptions.from_dict(options).seed

    def score(self, model, sites, ctx):
        seed = ctx.seed if self.seed is None else self.seed
        gen = torch.Generator().manual_seed(10_007 * seed + sum(ord(c) for c in sites[0].kind) if sites else seed)
        values = torch.rand(len(sites), generator=gen)
        return {s: float(v) for s, v in zip(sites, values)}


@dataclass(frozen=True)
class GateTaylorOptions(Section):
    """``scorer_options.gate-taylor``: the paper's gate phase."""

    section: ClassVar[str] = "scorer_options.gate-taylor"
    epochs_per_removal: int = setting(1, "weight-and-gate training epochs between two removals")
    warmup_epochs: int = setting(1, "epochs before the first removal")
    score_lr: float = setting(1.0, "the gate scores' learning rate (SGD)")
    score_decay: float = setting(1.0, "how much of the score evidence survives a removal (1: it accumulates over "
                                      "the whole run, as in the paper; 0: reset after each removal)")

    def __post_init__(self):
        if not whole(self.epochs_per_removal, 1) or not whole(self.warmup_epochs, 0):
            raise HetpruneError("gate-taylor needs epochs_per_removal >= 1 and warmup_epochs >= 0")
        self.need("score_lr", number(self.score_lr) and self.score_lr > 0, "a number > 0")
        if not number(self.score_decay, 0, 1):
            raise HetpruneError(f"gate-taylor score_decay must be within [0, 1] (1: scores accumulate over the "
                                f"whole run, as in the paper; 0: reset after each removal), got {self.score_decay!r}")


class GateTaylorScorer:
    """The paper's learned gates: STE-trained scores, incremental removal alternating kinds."""

    name = "gate-taylor"
    Options = GateTaylorOptions
    trains_on_scoring_subset = True   # the gate phase trains on scoring.subset: a toy one stops real-data runs

    def __init__(self, **options):
        o = GateTaylorOptions.from_dict(options)
        self.epochs_per_removal, self.warmup_epochs = o.epochs_per_removal, o.warmup_epochs
        self.score_lr, self.score_decay = float(o.score_lr), float(o.score_decay)

    def score(self, model, sites, ctx):
        """One-shot fallback: the gate gradient on the scoring batches (same as ``taylor``)."""
        return TaylorScorer().score(model, sites, ctx)

    def plan(self, job, counts: dict[str, int], shared: int = 0):
        """The gate phase counted (``--plan``): warm-up plus ``epochs_per_removal`` per removal, each epoch over
        the scoring subset, with short_finetune's batch and optimiser (at most ``counts`` removals). ``shared``:
        its first removals continue from another selection's kept state (`shared_removals`), not trained."""
        removals = len(self.schedule(counts)) - shared
        epochs = (self.warmup_epochs if not shared else 0) + self.epochs_per_removal * removals
        cfg = job.config.schedule("short_finetune", subset=job.config.scoring_batches.subset)
        per = planning.epoch_images(cfg, job.task.train_size) or 0
        return planning.PlanStep("select: gate phase",
                                 f"{epochs} epochs x {per:,} images, up to {removals} removals", 1, epochs * per, 0)

    @staticmethod
    def schedule(counts: dict[str, int]) -> list[str]:
        """The kinds due at each removal: alternating, attention first, until both are met."""
        left = dict(counts)
        order = []
        for kind in itertools.cycle(("attn", "act")):
            if not any(left.values()):
                break
            if left.get(kind, 0) > 0:
                order.append(kind)
                left[kind] -= 1
        return order

    @classmethod
    def shared_removals(cls, a: dict[str, int], b: dict[str, int]) -> int:
        """How many first removals the gate phases of two selections from the same start share: their
        schedules' common beginning, where both remove from the same kinds (the gates cover the same sites);
        one selection continues from the other's state kept there (``ScoringContext.keep_states_at``)."""
        if {k for k, n in a.items() if n} != {k for k, n in b.items() if n}:
            return 0
        n = 0
        for x, y in zip(cls.schedule(a), cls.schedule(b)):
            if x != y:
                break
            n += 1
        return n

    def every_rank(self, ctx) -> bool:
        """Under torchrun the gate phase trains on every rank together (exact DDP) on hetprune's own trainer;
        a task with its own training loop (``Task(finetune=...)``) runs it on rank 0 alone."""
        return not ctx.task.own_finetune

    def select(self, model, counts, ctx):
        from timm.optim import create_optimizer_v2

        order = self.schedule(counts)
        if not order:
            return []
        candidates = [s for kind in ("attn", "act") if counts.get(kind) for s in _present(model, kind)]
        distributed = bool(getattr(ctx, "distributed", False)) and dist.active()
        rank, world = (dist.rank(), dist.world()) if distributed else (0, 1)
        cfg = ctx.train_config("short_finetune", subset=ctx.config.scoring_batches.subset).global_batch(world)
        device = devices.resolve(ctx.device)
        amp = devices.resolve_amp(cfg.amp, device)
        ctx.place(model)
        attn_mode = _attn_mode(ctx)
        # the checkpoint is reused only for the same start, candidates, schedule, data and settings
        key = {"starting weights": storage.weights_key(model),
               "teacher": ctx.teacher_key or storage.weights_key(ctx.teacher), "base": ctx.base_key or None,
               "candidates": [str(s) for s in candidates], "schedule": order,
               "data": ctx.task.key, "learning rate": LR_SCHEDULE,
               "training settings": cfg.to_dict(), "attention removal": attn_mode,
               "gate options": {"epochs_per_removal": self.epochs_per_removal, "warmup_epochs": self.warmup_epochs,
                                "score_lr": self.score_lr,
                                **({"score_decay": self.score_decay} if self.score_decay != 1 else {})}}
        # the weights' optimizer is made before the gates exist: the same parameter groups as the fine-tune
        # (no weight decay on norms, biases and LayerScale)
        opt_w = create_optimizer_v2(model, opt="adamw", lr=training.scaled_lr(cfg), weight_decay=cfg.weight_decay)
        bank, handles = gates.install(model, candidates, attn_mode=attn_mode)
        opt_s = torch.optim.SGD([bank.scores], lr=self.score_lr)
        scaler = training.grad_scaler(device, amp)
        ckpt_path = Path(ctx.workdir) / "gate-checkpoint.pt"
        step, removed = 0, []
        state = self._resume(ckpt_path, key, ctx, device, distributed) if ctx.resume else None
        shared_from = None
        if state is None and ctx.shared_states is not None:
            state, shared_from = self._shared(ctx, key, order, device, distributed)
        if state is not None:
            model.load_state_dict(state["model"])
            opt_w.load_state_dict(state["opt_w"])
            opt_s.load_state_dict(state["opt_s"])
            if state.get("scaler"):
                scaler.load_state_dict(state["scaler"])
            step = state["step"]
            removed = [s for s in candidates if bank.mask[bank.index[s]] == 0]
            if shared_from is not None:
                ctx.log(f"  gate-taylor: removals 1-{step} of {len(order)} are another selection's from the same "
                        f"start ({shared_from.name}); continuing from its kept state")
            else:
                ctx.log(f"resume: the gate phase continues after removal {step} of {len(order)}, from {ckpt_path} "
                        f"saved {storage.made_when([state], 'saved_at')}")
        teacher = ctx.place(ctx.teacher).eval()
        net = model
        if distributed:   # the global batch split across the ranks; DDP sums the gate scores' gradients too
            from torch.nn.parallel import DistributedDataParallel

            dist.broadcast_module(model)
            net = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
            if ctx.progress and step < len(order):
                ctx.log(f"  gate-taylor: the gate phase on all {world} ranks (exact DDP, "
                        f"{training.batch_split(cfg, world)})")
        steps = 0 if ctx.task.own_finetune else ctx.task.source().steps_per_epoch(cfg)
        lr = None
        with training.training_modes(model, cfg):   # drop path, a distilled model's heads: as a fine-tune trains
            try:
                for i in range(step, len(order)):
                    epochs = self.epochs_per_removal + (self.warmup_epochs if i == 0 else 0)
                    if ctx.task.own_finetune:
                        loss = self._own_loop(model, teacher, cfg, epochs, bank, ctx, seed=ctx.seed * 7919 + i * 31)
                    else:
                        lr = self.interval_schedule(opt_w, cfg, epochs, i == 0, steps)
                    for e in range(0 if ctx.task.own_finetune else epochs):
                        loss = self._epoch(net, teacher, cfg, [opt_w, opt_s], scaler, ctx, device, amp,
                                           seed=ctx.seed * 7919 + i * 31 + e, rank=rank, world=world,
                                           distributed=distributed, lr=lr, first_step=e * steps)
                    kind = order[i]
                    active = bank.active(kind)
                    victim = min(active, key=lambda s: (bank.score_of(s), s.block))
                    bank.switch_off(victim)
                    removed.append(victim)
                    with torch.no_grad():   # evidence gathered before this removal counts less (1: all of it)
                        bank.scores.mul_(self.score_decay)
                    if ctx.on_epoch_end:
                        ctx.on_epoch_end(i + 1, {"loss": loss, "removed": str(victim)})
                    if ctx.progress:
                        ctx.log(f"  gate-taylor: step {i + 1}/{len(order)} removed {victim} "
                                f"(score {bank.score_of(victim):+.4f}), loss {loss:.4f}")
                    if not distributed or dist.is_main():   # under DDP every rank holds the same state: rank 0 writes
                        saved = {"model": model.state_dict(), "opt_w": opt_w.state_dict(), "opt_s": opt_s.state_dict(),
                                 "scaler": scaler.state_dict(), "step": i + 1, "key": key, "saved_at": storage.now()}
                        _save(saved, ckpt_path)
                        storage.note_saved(f"a gate checkpoint in {ckpt_path.parent}")
                    if ctx.shared_states is not None and i + 1 in ctx.keep_states_at:   # for selections sharing it
                        prefix = {**key, "schedule": order[:i + 1]}
                        path = _shared_path(ctx.shared_states, prefix)
                        if not distributed or dist.is_main():
                            _save({**saved, "key": prefix}, path)
                        _KEPT.add(str(path))   # on every rank: they look for it together
            finally:
                self.last_scores = {str(s): bank.score_of(s) for s in candidates}
                gates.uninstall(model, handles)
        model.eval()
        return removed

    @staticmethod
    def interval_schedule(optimizer, cfg, epochs: int, first: bool, steps: int):
        """The weights' learning rate over the epochs up to one removal: short_finetune's warm-up (at the
        phase's start) and cosine decay to its ``min_lr``, restarted after every removal (the release's cyclic
        cosine), so a selection that shares another's first removals shares their schedule too."""
        interval = dataclasses.replace(cfg, epochs=epochs, warmup_epochs=cfg.warmup_epochs if first else 0)
        return training.make_scheduler(optimizer, interval, training.scaled_lr(cfg), steps)

    @staticmethod
    def _resume(path: Path, key: dict, ctx, device, distributed: bool) -> dict | None:
        """The gate checkpoint to continue from, or None. Under DDP rank 0 decides and every rank loads the
        same one (its step and save time checked), or every rank stops with one error
        (`hetprune.core.distributed.follow_saved`) rather than some resuming while others start afresh."""
        def read(file: Path) -> dict:
            try:
                return torch.load(str(file), map_location=device, weights_only=True)
            except Exception as exc:
                raise HetpruneError(f"gate checkpoint {file} is corrupt ({exc}); delete it to start over") from exc

        found = dist.follow_saved(
            [path], read, lambda state: (state["step"], state.get("saved_at")), "resume: the gate phase",
            reuse=lambda file, state: storage.reusable(state.get("key"), key, f"the gate checkpoint {file}", ctx.log),
            describe=lambda t: f"removal {t[0]}, saved {t[1]}", distributed=distributed)
        return None if found is None else found[1]

    @classmethod
    def _shared(cls, ctx, key: dict, order: list[str], device, distributed: bool):
        """The kept state of another selection from the same start that shares the most of this one's first
        removals (same weights, teacher, sites, data and settings: the key, its schedule cut to the shared
        beginning), and its path; (None, None) when there is none. Only states this process kept are taken,
        or any with ``ctx.resume`` (a run continued: its work folder is its own)."""
        for n in range(len(order), 0, -1):
            prefix = {**key, "schedule": order[:n]}
            path = _shared_path(ctx.shared_states, prefix)
            if not (ctx.resume or str(path) in _KEPT):
                continue
            state = cls._resume(path, prefix, ctx, device, distributed)
            if state is not None:
                return state, path
        return None, None

    @staticmethod
    def _epoch(net, teacher, cfg, optimizers, scaler, ctx, device, amp, seed: int, rank: int = 0, world: int = 1,
               distributed: bool = False, lr=None, first_step: int = 0) -> float:
        """One epoch of the gate phase: the fine-tune's own batches and step (autocast, fp32 loss, GradScaler)
        on both optimizers; the straight-through gates need nothing more. Under DDP (``net`` wraps the
        model) each rank takes its share of every global batch, its loss weighted by that share as the
        trainer weighs it, so the weights and the gate scores move as in one process. ``lr``: the weights'
        scheduler (`interval_schedule`), at step ``first_step`` of it when the epoch begins."""
        net.train()
        torch.manual_seed(seed)
        source = ctx.task.source()   # the task's training batches and loss, as every fine-tune sees them
        totals = torch.zeros(2, dtype=torch.float64)
        for n, (batch, share, items) in enumerate(source.epoch(cfg, seed, rank, world, device, distributed)):
            if lr is not None:
                lr.step_update(first_step + n)
            loss = source.loss(net, batch, teacher, cfg, device, amp)
            try:
                stepped = training.optimisation_step(training.share_weighted(loss, share, items, world), optimizers,
                                                     scaler, device, distributed, clip=cfg)
            except training.NonFiniteLoss as exc:
                raise HetpruneError(f"gate-taylor: loss became {exc.value}; lower short_finetune.lr") from None
            if stepped and share:
                totals += torch.tensor([loss.item() * share, share], dtype=torch.float64)
        if distributed:
            totals = dist.sum_tensor(totals.to(device)).cpu()
        return float(totals[0] / max(1.0, float(totals[1])))

    def _own_loop(self, model, teacher, cfg, epochs: int, bank, ctx, seed: int) -> float:
        """The gate phase's weight training in the task's own loop (``Task(finetune=...)``).

        The user's optimizer sees the gate scores too (they are parameters of
        the model) and would move them by its own rule; the scores must follow
        the summed Taylor gradient. So the gradients reaching the scores are
        summed here, the scores put back after the loop, and moved by that sum
        (the SGD step hetprune's own loop takes, at ``score_lr``).
        """
        saved = bank.scores.detach().clone()
        summed = torch.zeros_like(saved)

        def add(grad):
            summed.add_(grad.detach())

        hook = bank.scores.register_hook(add)
        try:
            history = ctx.task.fit(model, teacher, dataclasses.replace(cfg, epochs=epochs, seed=seed), "gate")
        finally:
            hook.remove()
        with torch.no_grad():
            bank.scores.copy_(saved - self.score_lr * summed)
        last = history[-1] if history else {}
        return float(last.get("loss", float("nan"))) if isinstance(last, dict) else float("nan")


_KEPT: set[str] = set()   # the shared gate states this process kept: taken without --resume too
LR_SCHEDULE = "warm-up, cosine per removal"   # in the gate states' key: those of a constant rate are not reused


def _shared_path(folder: Path, prefix_key: dict) -> Path:
    """Where a gate state kept for other selections lives: named by its key (start, settings, removals so far)."""
    key = storage.fingerprint(prefix_key)
    return storage.found(Path(folder) / f"gate-{key[:24]}.pt", Path(folder) / f"gate-{key.before[:24]}.pt")


def _save(state: dict, path: Path) -> Path:
    """``state`` to ``path`` whole or not at all (written beside it, then renamed)."""
    return storage.save_torch_atomic(path, state)


def _attn_mode(ctx) -> str:
    """The attention removal mode of the configured remover, so the gates simulate that removal (the job's
    registry; a context made by hand, without one, gets the installed plugins')."""
    from hetprune import get_registry

    remover = (ctx.registry or get_registry()).build("remover", ctx.config.attn_remover)
    return getattr(remover, "mode", "identity")


def _present(model, kind):
    from hetprune import sites

    return sites(model, kind)
