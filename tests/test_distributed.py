"""torchrun with CPU processes (gloo) follows the single-process run, also when the data does not split evenly,
and every rank plans from rank 0's inputs.

The worker side of the multi-process tests is this file itself, run by torchrun (``python -m
torch.distributed.run ... tests/test_distributed.py SCENARIO OUT``): each rank writes what it ended with to OUT
and the test compares it with a single-process run made here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hetprune
from hetprune.cli import main
from conftest import TINY_SPEC, CountedStats, PluginOf, seeded_tiny as tiny, tiny_example
from hetprune.core import loader

FT = ["--set", "finetune.epochs=2", "--set", "finetune.subset=65", "--set", "finetune.batch_size=16",
      "--set", "short_finetune.epochs=1", "--set", "short_finetune.subset=32", "--set", "short_finetune.batch_size=16",
      "--set", "scoring.subset=32", "--set", "scoring.batches=1"]

# (training images, global batch size) per world size: a short last batch that leaves ranks empty (65 at 16),
# shares of 6/5/5 (64 at 16 on 3 ranks), fewer images than ranks, and a batch smaller than the world
CASES = {2: [(65, 16), (1, 16)], 3: [(65, 16), (64, 16), (2, 16), (8, 2)]}
LR = 5e-3
VAL_ITEMS = 7   # an evaluation set that does not split evenly either


def model_args(trained_tiny):
    _, spec, ckpt = trained_tiny
    return ["--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt)]


def launch(nproc: int, args: list[str], cwd: Path, check: bool = True,
           run_options: tuple = ()) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node nproc [RUN_OPTIONS] ARGS``; a collective mismatch fails within a
    minute; ``check``: the run must succeed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HETPRUNE_DIST_TIMEOUT_MIN": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           *run_options, *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=cwd)
    assert proc.returncode == 0 or not check, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def torchrun(args, tmp_path, nproc: int = 2):
    return launch(nproc, ["-m", "hetprune", *args], tmp_path)


def run_workers(scenario: str, nproc: int, out: Path) -> list[dict]:
    """Run this file's ``scenario`` on ``nproc`` ranks; what each rank wrote, by rank."""
    out.mkdir(parents=True, exist_ok=True)
    launch(nproc, [__file__, scenario, str(out)], out)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(nproc)]


# -- the training and evaluation scenario -----------------------------------------------------------------------



def train_case(data, n: int, batch_size: int) -> tuple[torch.nn.Module, list[dict]]:
    """A tiny model trained with soft KD on ``n`` images, ``batch_size`` at a time (under torchrun: split)."""
    from hetprune.training.train import TrainConfig, train

    model, teacher = tiny(0), tiny(1).eval()
    cfg = TrainConfig(epochs=2, lr=LR, batch_size=batch_size, subset=n, kd="soft", warmup_epochs=0)
    return model, train(model, data, cfg, teacher=teacher, progress=False)


def val_set(data):
    return torch.utils.data.Subset(data.val, list(range(VAL_ITEMS)))


PER_GPU = dict(epochs=1, lr=LR, subset=65, kd="none", warmup_epochs=0, lr_scale="linear", lr_base_batch=8)


def per_gpu_case(data, batch_size: int, per_gpu: bool) -> torch.nn.Module:
    """A tiny model trained at ``batch_size`` per GPU (``per_gpu``) or globally, lr scaled by the batch."""
    from hetprune.training.train import TrainConfig, train

    model = tiny(0)
    train(model, data, TrainConfig(**PER_GPU, batch_size=batch_size, batch_per_gpu=per_gpu), progress=False)
    return model


def training_worker(out: Path) -> dict:
    from hetprune.core import distributed as dist
    from hetprune.training.embedded_data import digits
    from hetprune.training.train import evaluate_dataset

    data, result = digits(), {}
    for n, batch_size in CASES[dist.world()]:
        model, history = train_case(data, n, batch_size)
        result[f"{n}@{batch_size}"] = {"state": model.state_dict(), "loss": [h["loss"] for h in history],
                                       "top1": evaluate_dataset(model, val_set(data), batch_size=2)}
    result["per-gpu"] = per_gpu_case(data, 8, per_gpu=True).state_dict()
    return result


# -- the planning scenario ----------------------------------------------------------------------------------------

class RankSkewed:
    """A 'measured' cost that differs between ranks: MACs x (1 + rank x 0.1 per attention sub-block still
    present), as if each rank timed attention differently."""

    name = "rank-skewed"
    unit = "units"

    def cost(self, model, example):
        from hetprune.core import distributed as dist
        from hetprune.model import surgery
        from hetprune.model.macs import count_macs
        from hetprune.model.sites import sites

        kept = sum(not surgery.site_removed(model, s) for s in sites(model, "attn"))
        return float(count_macs(model, example) * (1 + dist.rank() * 0.1 * kept))


PLAN_SETS = ["finetune.epochs=1", "finetune.subset=33", "finetune.batch_size=16", "short_finetune.epochs=1",
             "short_finetune.subset=16", "short_finetune.batch_size=8", "scoring.subset=16", "scoring.batches=1",
             "scorer=magnitude", "hetdpt.point_scorer=magnitude", "hetdpt.point_finetune=short_finetune",
             "hetdpt.point_selection=oneshot", "hetdpt.checks=none",   # refinement measures any split: one-shot
             "hetdpt.axis_points=2", "hetdpt.mixed_points=1", "hetdpt.refine=1"]
PLAN_BUDGET = dict(target_speedup=1.3, cost_model=RankSkewed.name)


def planning_worker(out: Path) -> dict:
    from hetprune.core import distributed as dist
    from hetprune.pruning.budget import Budget, feasible_pairs
    from hetprune.training.embedded_data import digits
    from hetprune.pruning.pipeline import PruneJob
    from hetprune.core.plugins import get_registry

    hetprune.register_plugin(PluginOf("register_cost_models", RankSkewed), "test-rank-skewed")
    registry = get_registry()
    strategy = registry.build("strategy", "hetdpt")
    settings = hetprune.core.loader.resolve(strategy.defaults, overrides=None, sets=PLAN_SETS)
    job = PruneJob(dense=tiny(0), spec=TINY_SPEC, data=digits(), budget=Budget(**PLAN_BUDGET), settings=settings,
                   registry=registry, workdir=out / "work", progress=False, strategy_name="hetdpt",
                   measure_cost=False)
    # what this rank alone would plan from
    own_pairs = feasible_pairs(job.dense, job.budget, job.example, merge=bool(settings.get("mergers")),
                               cost=job.cost_model.cost)
    result = strategy.run(job)
    recipe = result.recipe.to_dict()
    try:   # a planning error on rank 0 reaches every rank, instead of leaving them waiting
        dist.on_main(lambda: 1 / 0)
        error = ""
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    allocation = result.report["allocation"]
    return {"own_pairs": json.dumps(own_pairs), "pairs": json.dumps(job.feasible_pairs()),
            "plan": json.dumps(strategy.point_plan(job, job.feasible_pairs())),
            "recipe": json.dumps({k: v for k, v in recipe.items() if k != "provenance"}, sort_keys=True),
            "pick": json.dumps(allocation["pick"], sort_keys=True),
            "points": json.dumps(sorted([p["n_attn"], p["n_act"]] for p in allocation["points"])),
            "state": result.model.state_dict(), "error": error}


# -- the user-task scenario: ranks whose loaders yield different numbers of batches ----------------------------

class Batches:
    """Re-iterable batches without a length, so the ranks' check cannot lean on ``len()``."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


def task_worker(out: Path) -> dict:
    from hetprune.core import distributed as dist
    from hetprune.core.errors import HetpruneError
    from hetprune.training.task import Task, UserSource
    from hetprune.training.train import TrainConfig, train

    gen = torch.Generator().manual_seed(dist.rank())

    def batches(n: int) -> Batches:
        return Batches([(torch.randn(4, 1, 16, 16, generator=gen), torch.randint(0, 10, (4,), generator=gen))
                        for _ in range(n)])

    def loss(model, batch):
        return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

    result = {}
    for case, n in (("even", 3), ("uneven", 3 + dist.rank())):
        task = Task(batches(n), batches(1), loss, lambda model, val: 0.0, name=case)
        try:
            history = train(tiny(0), UserSource(task), TrainConfig(epochs=1, lr=LR, batch_size=4, warmup_epochs=0),
                            progress=False)
            result[case] = f"trained {len(history)} epoch(s)"
        except HetpruneError as exc:
            result[case] = f"HetpruneError: {exc}"
    return result


def retrain_worker(out: Path) -> dict:
    """An embedded base model the package does not ship (another schedule): rank 0 trains it, every rank
    reads it (rank 0 used to call itself again, forever, while the others waited)."""
    from hetprune.training.embedded import embedded_model

    os.environ["HETPRUNE_CACHE"] = str(out / "cache")
    model = embedded_model("digits", spec=TINY_SPEC, training={"epochs": 1}, progress=False, log=lambda m: None)
    return {"weights": hetprune.model.spec.model_hash(model)}

# -- stage 1 on every rank: progressive points and the gate phase, each trained by all ranks together ---------

STAGE1_SETS = ["hetdpt.point_selection=progressive", "short_finetune.epochs=1", "short_finetune.subset=16",
               "short_finetune.batch_size=5",   # global batches of 5, 5, 5, 1: shares 3/2 and a stand-in of weight 0
               "scoring.subset=16", "scoring.batches=1",
               "scorer_options={gate-taylor: {epochs_per_removal: 1, warmup_epochs: 0}}"]


def stage1(out: Path, log=lambda msg: None) -> dict:
    """Progressive MAP points for a budget of 2 sites, then gate-taylor's gate phase choosing 1 + 1 sites on
    the dense model (the trained tiny model in ``out/dense.safetensors``); each point fine-tune counted with
    whether it ran under DDP, each gate epoch with its world and mode."""
    import copy

    import hetprune.training.task
    from hetprune.core import distributed as dist
    from hetprune.pruning.budget import Budget
    from hetprune.training.embedded_data import digits
    from hetprune.core.io import load_weights
    from hetprune.pruning.pipeline import PruneJob, select_sites
    from hetprune.core.plugins import get_registry
    from hetprune_hetdpt.scorers import GateTaylorScorer

    fine_tunes, gate_epochs = [], []
    real_train, real_epoch = hetprune.training.task.train, GateTaylorScorer.__dict__["_epoch"]   # the staticmethod itself

    def counted(model, data, cfg, distributed=None, **kwargs):
        fine_tunes.append(dist.active() if distributed is None else bool(distributed) and dist.active())
        return real_train(model, data, cfg, distributed=distributed, **kwargs)

    def gate_epoch(*args, **kwargs):
        gate_epochs.append([kwargs.get("world"), kwargs.get("distributed")])
        return real_epoch.__func__(*args, **kwargs)

    hetprune.training.task.train, GateTaylorScorer._epoch = counted, staticmethod(gate_epoch)
    try:
        registry = get_registry()
        strategy = registry.build("strategy", "hetdpt")
        settings = hetprune.core.loader.resolve(strategy.defaults, overrides=None, sets=STAGE1_SETS)
        dense = tiny(0)
        dense.load_state_dict(load_weights(out / "dense.safetensors"))
        job = PruneJob(dense=dense, spec=TINY_SPEC, data=digits(), budget=Budget(sites=2), settings=settings,
                       registry=registry, workdir=out / "work", progress=False, strategy_name="hetdpt", log=log)
        points = strategy.collect_points(job, strategy.point_plan(job, job.feasible_pairs()))
        model = copy.deepcopy(job.dense)
        chosen = select_sites(job, model, {"attn": 1, "act": 1})
    finally:
        hetprune.training.task.train, GateTaylorScorer._epoch = real_train, real_epoch
    steps = {f.name: torch.load(f, weights_only=True)["model"] for f in sorted((out / "work" / "map-paths").iterdir())}
    return {"points": json.dumps(points, sort_keys=True), "fine_tunes": fine_tunes, "gate_epochs": gate_epochs,
            "chosen": [str(c) for c in chosen], "gated": model.state_dict(), "steps": steps}


def stage1_worker(out: Path) -> dict:
    lines: list[str] = []
    return {**stage1(out, log=lines.append), "log": lines}


# -- resume decisions: rank 0 decides, every rank follows or every rank stops with one error --------------------

RESUME_CFG = dict(epochs=2, lr=LR, batch_size=16, subset=32, kd="none", warmup_epochs=0)
GATE_SETTINGS = {"scoring": {"subset": 16}, "short_finetune": {"batch_size": 8, "kd": "none"}}


def resume_worker(out: Path) -> dict:
    """Checkpoints placed in per-rank folders, so that the ranks see different ones, as nodes whose view of a
    shared folder lags do: rank 1 alone sees a fine-tune checkpoint (it must start afresh with rank 0), rank 0
    alone sees one (one error on every rank), rank 0 alone sees a gate checkpoint (the same)."""
    import dataclasses
    import shutil

    from hetprune.core import distributed as dist
    from hetprune.training.embedded_data import digits
    from hetprune.core.errors import HetpruneError
    from hetprune.harness.testing import scoring_context
    from hetprune.training.train import TrainConfig, train
    from hetprune_hetdpt.scorers import GateTaylorScorer

    data, cfg, key, rank = digits(), TrainConfig(**RESUME_CFG), {"run": "test"}, dist.rank()
    made = out / "made"
    if dist.is_main():   # a checkpoint after epoch 1 of 2, as an interrupted run leaves it; and a gate checkpoint
        train(tiny(0), data, cfg, checkpoint_dir=made, resume_key=key, distributed=False, progress=False)
        ckpt = torch.load(made / "finetune-checkpoint.pt", weights_only=True)
        ckpt["epoch"], ckpt["history"] = 1, ckpt["history"][:1]
        torch.save(ckpt, made / "finetune-checkpoint.pt")
        GateTaylorScorer(warmup_epochs=0).select(tiny(0), {"attn": 1, "act": 0},
                                                 scoring_context(tiny(0), made, GATE_SETTINGS))
    dist.barrier()

    def folder(case: str, seen: bool, name: str = "finetune-checkpoint.pt") -> Path:
        path = out / case / f"rank{rank}"
        path.mkdir(parents=True)
        if seen:
            shutil.copy(made / name, path / name)
        return path

    def outcome(fn) -> str:
        try:
            fn()
            return "done"
        except HetpruneError as exc:
            return f"HetpruneError: {exc}"

    model = tiny(0)
    afresh = outcome(lambda: train(model, data, cfg, checkpoint_dir=folder("afresh", rank == 1), resume=True,
                                   resume_key=key, progress=False))
    unseen = outcome(lambda: train(tiny(0), data, cfg, checkpoint_dir=folder("unseen", rank == 0), resume=True,
                                   resume_key=key, progress=False))
    ctx = dataclasses.replace(scoring_context(tiny(0), folder("gate", rank == 0, "gate-checkpoint.pt"), GATE_SETTINGS),
                              resume=True, distributed=True)
    gate = outcome(lambda: GateTaylorScorer(warmup_epochs=0).select(tiny(0), {"attn": 1, "act": 0}, ctx))
    return {"afresh": afresh, "state": model.state_dict(), "unseen": unseen, "gate": gate}


# -- shared folders: points of several ranks without locks, the ImageFolder fingerprint on rank 0 --------------

def make_images(root: Path) -> list[Path]:
    """A tiny ImageFolder tree: 2 classes, 3 training and 2 validation PNGs each."""
    from PIL import Image

    files = []
    for split, n in (("train", 3), ("val", 2)):
        for label, value in (("dark", 40), ("light", 200)):
            (root / split / label).mkdir(parents=True)
            for i in range(n):
                files.append(root / split / label / f"{i}.png")
                Image.new("L", (16, 16), value + i).save(files[-1])
    return files


def shared_worker(out: Path) -> dict:
    import fcntl

    from hetprune.core import distributed as dist
    from hetprune.training.image_folders import image_folder
    from hetprune.pruning.point_store import PointStore

    def no_locks(*args):
        raise OSError(38, "Function not implemented (a Lustre mount without flock)")

    fcntl.flock = fcntl.lockf = no_locks
    store = PointStore(out / "shared" / "map-points.jsonl", "key")
    store.append({"n_attn": dist.rank(), "n_act": 1, "metric": 50.0 + dist.rank()})
    dist.barrier()
    points = {f"{a}+{m}": p["metric"] for (a, m), p in sorted(store.load().items())}
    root = out / "imgs"
    if dist.is_main():
        make_images(root)
    dist.barrier()
    with CountedStats() as stats:
        data = image_folder(root, tiny(0))
    return {"points": points, "files": sorted(f.name for f in (out / "shared").iterdir()),
            "fingerprint": data.fingerprint, "stats": stats.counts}


# -- the process group ends with the process, error or not -----------------------------------------------------

def exit_worker(out: Path, fail: bool) -> int:
    from hetprune.core import distributed as dist

    rank, real = os.environ["RANK"], torch.distributed.destroy_process_group

    def destroy(*args, **kwargs):
        (out / f"destroyed-{rank}").write_text("yes")
        return real(*args, **kwargs)

    torch.distributed.destroy_process_group = destroy
    dist.init_from_env("cpu", timeout_min=1)
    dist.barrier()
    if fail:
        raise RuntimeError(f"rank {rank} stops with an error")
    return 0


# -- the mixing scenario: mixup / cutmix batches and training on 2 ranks ------------------------------------

MIX_CFG = dict(epochs=1, lr=LR, batch_size=15, subset=45, kd="soft", warmup_epochs=0, mixup=0.8, cutmix=1.0,
               label_smoothing=0.1, accum_steps=2)   # micro-batches too: DDP synchronises the last only


def mixed_rows(data, rank: int, world: int, seed: int) -> dict:
    """Item index -> (mixed image, soft target) of the first two global batches, this rank's share."""
    from hetprune.training.train import ClassificationSource, TrainConfig

    cfg = TrainConfig(**MIX_CFG, seed=seed)
    from hetprune.training.samplers import GlobalBatchSampler

    sampler = GlobalBatchSampler(45, 15, seed, rank=rank, world=world, pad_empty=world > 1, pairs=True)
    out = {}
    for (batch, share, _), items, _ in zip(ClassificationSource(data).epoch(cfg, seed, rank, world,
                                                                            torch.device("cpu"), world > 1),
                                           sampler, range(2)):
        for i, item in enumerate(items[:share]):
            out[item] = (batch[0][i], batch[1][i])
    return out


def mix_train(data, seed: int = 0) -> torch.nn.Module:
    from hetprune.training.train import TrainConfig, train

    model, teacher = tiny(0), tiny(1).eval()
    train(model, data, TrainConfig(**MIX_CFG, seed=seed), teacher=teacher, progress=False)
    return model


def mix_worker(out: Path) -> dict:
    from hetprune.core import distributed as dist
    from hetprune.training.embedded_data import digits

    data = digits()
    return {"rows": {seed: mixed_rows(data, dist.rank(), dist.world(), seed) for seed in (0, 1)},
            "state": mix_train(data).state_dict()}


def worker(scenario: str, out: Path) -> int:
    from hetprune.core import distributed as dist
    from hetprune.core.io import plain_strings

    torch.set_num_threads(1)
    dist.init_from_env("cpu")
    result = {"train": training_worker, "plan": planning_worker, "task": task_worker, "retrain": retrain_worker,
              "stage1": stage1_worker, "mix": mix_worker, "resume": resume_worker,
              "shared": shared_worker}[scenario](out)
    torch.save(plain_strings(result), out / f"rank{dist.rank()}.pt")   # (a key, e.g. a data set's, as its string)
    dist.barrier()
    return 0


# -- the tests ----------------------------------------------------------------------------------------------------

def test_every_rank_takes_every_step_and_the_shares_weigh_each_item_once():
    from hetprune.training.samplers import GlobalBatchSampler

    for n, batch_size in [(65, 16), (64, 16), (2, 16), (8, 2), (1, 16)]:
        for world in (2, 3):
            samplers = [GlobalBatchSampler(n, batch_size, seed=3, rank=r, world=world, pad_empty=True)
                        for r in range(world)]
            single = GlobalBatchSampler(n, batch_size, seed=3)
            steps = {len(list(s)) for s in samplers}
            assert steps == {len(list(single))}, (n, batch_size, world, steps)
            for t, whole in enumerate(single):
                shares = [s.shares()[t] for s in samplers]
                real = [b for s, (share, _) in zip(samplers, shares) for b in list(s)[t][:share]]
                assert sorted(real) == sorted(whole)                  # each item once, in its own global batch
                assert {w for _, w in shares} == {len(whole)}
            # evaluation counts items: without padding a rank yields its real shares only
            plain = [i for r in range(world) for b in GlobalBatchSampler(n, batch_size, 3, rank=r, world=world)
                     for i in b]
            assert sorted(plain) == list(range(n))


@pytest.mark.parametrize("world", [2, 3])
def test_uneven_splits_train_and_evaluate_like_one_process(tmp_path, world):
    from hetprune.training.embedded_data import digits
    from hetprune.training.train import evaluate_dataset

    ranks = run_workers("train", world, tmp_path)
    data = digits()
    for n, batch_size in CASES[world]:
        case = f"{n}@{batch_size}"
        model, history = train_case(data, n, batch_size)
        expected = [h["loss"] for h in history]
        for r, got in enumerate(ranks):
            err = max((model.state_dict()[k] - v).abs().max().item() for k, v in got[case]["state"].items())
            # AdamW turns rounding in near-zero gradients into ~5e-5 here; weighting shares 6/5/5 alike gives 4e-2
            assert err < 3e-4, (case, r, err)
            assert got[case]["loss"] == pytest.approx(expected, rel=1e-5), (case, r)
            ddp_model = tiny(0)
            ddp_model.load_state_dict(got[case]["state"])
            assert got[case]["top1"] == evaluate_dataset(ddp_model, val_set(data), batch_size=2), (case, r)
    # batch_per_gpu: 8 per GPU on `world` ranks is one process's global batch of 8 x world, lr scaled by that
    single = per_gpu_case(data, 8 * world, per_gpu=False).state_dict()
    for r, got in enumerate(ranks):
        err = max((single[k] - v).abs().max().item() for k, v in got["per-gpu"].items())
        assert err < 3e-4, (r, err)


def test_mixup_and_cutmix_batches_and_training_are_the_same_on_2_ranks(tmp_path):
    """Each rank mixes its own share of a global batch (pairs stay on one rank, lambda and box from the global
    step), item for item as one process mixes the whole batch; so DDP training with mixing (and gradient
    accumulation over micro-batches) follows it too."""
    from hetprune.training.embedded_data import digits

    ranks = run_workers("mix", 2, tmp_path)
    data = digits()
    for seed in (0, 1):
        single = mixed_rows(data, 0, 1, seed)
        got = {**ranks[0]["rows"][seed], **ranks[1]["rows"][seed]}
        assert sorted(got) == sorted(single) and not set(ranks[0]["rows"][seed]) & set(ranks[1]["rows"][seed])
        for item, (x, y) in single.items():
            assert torch.equal(got[item][0], x) and torch.equal(got[item][1], y), (seed, item)
    model = mix_train(data)
    for got in ranks:
        err = max((model.state_dict()[k] - v).abs().max().item() for k, v in got["state"].items())
        assert err < 3e-4, err


def test_every_rank_plans_from_rank_0s_costs(tmp_path):
    ranks = run_workers("plan", 2, tmp_path)
    assert ranks[0]["own_pairs"] != ranks[1]["own_pairs"]     # the ranks' own costs disagree ...
    for got in ranks[1:]:                                      # ... and still every rank planned alike
        for key in ("pairs", "plan", "recipe", "pick", "points"):
            assert got[key] == ranks[0][key], key
        assert all(torch.equal(v, ranks[0]["state"][k]) for k, v in got["state"].items())
    assert ranks[0]["pairs"] == ranks[0]["own_pairs"]        # rank 0's costs
    assert ranks[0]["error"].startswith("ZeroDivisionError")
    assert ranks[1]["error"].startswith("HetpruneError") and "ZeroDivisionError" in ranks[1]["error"]
    lines = (tmp_path / "work" / "map-points.jsonl").read_text().splitlines()
    measured = sorted([p["n_attn"], p["n_act"]] for p in map(json.loads, lines))
    assert json.dumps(measured) == ranks[0]["points"]         # the points file holds exactly the plan used
    assert {tuple(p) for p in json.loads(ranks[0]["plan"])} <= {tuple(p) for p in measured}


def test_user_task_ranks_that_run_out_unevenly_stop_with_one_error_instead_of_hanging(tmp_path):
    """Rank 1's loader yields a 4th batch that rank 0's does not. Without the per-step check both ranks
    'trained 1 epoch' here: gloo paired rank 1's extra gradient all-reduce with rank 0's sum of the epoch's
    loss, and both went on with wrong numbers (elsewhere such a mismatch waits until the timeout)."""
    ranks = run_workers("task", 2, tmp_path)
    for got in ranks:
        assert got["even"] == "trained 1 epoch(s)"
        assert got["uneven"].startswith("HetpruneError: under torchrun every rank must yield the same number of "
                                        "training batches, but at batch 4 1 of 2 ranks had one"), got["uneven"]
    assert "rank 0 had run out" in ranks[0]["uneven"] and "rank 1 had one" in ranks[1]["uneven"]


def test_torchrun_prune_with_uneven_data_matches_single_process(trained_tiny, tmp_path):
    """The issue's command: 65 images at batch 16 on 2 ranks."""
    args = ["prune", *model_args(trained_tiny), "--strategy", "act-only", "--scorer", "magnitude", "--budget", "2", *FT]
    assert main(args + ["--out", str(tmp_path / "single")]) == 0
    proc = torchrun(args + ["--out", str(tmp_path / "ddp")], tmp_path)
    assert proc.stdout.count("saved ") == 1          # rank 0 alone writes and reports
    single, ddp = hetprune.load(tmp_path / "single"), hetprune.load(tmp_path / "ddp")
    x = tiny_example(8)
    err = (single(x) - ddp(x)).abs().max().item()
    assert err < 1e-4, err
    r1 = json.loads((tmp_path / "single" / "report.json").read_text())
    r2 = json.loads((tmp_path / "ddp" / "report.json").read_text())
    assert r1["sites"] == r2["sites"]
    assert r1["finetune_history"][-1]["loss"] == pytest.approx(r2["finetune_history"][-1]["loss"], rel=1e-4)
    assert abs(r1["top1"] - r2["top1"]) <= 0.5


def test_torchrun_spreads_map_points_and_keeps_points_file_whole(trained_tiny, tmp_path):
    args = ["prune", *model_args(trained_tiny), "--strategy", "hetdpt", "--scorer", "magnitude", "--budget", "2",
            *FT, "--set", "hetdpt.axis_points=2", "--set", "hetdpt.mixed_points=1", "--set", "hetdpt.checks=none",
            "--out", str(tmp_path / "out")]   # checks none: checks of all 3 splits would need no point
    torchrun(args, tmp_path)
    lines = [json.loads(l) for l in (tmp_path / "out.work" / "map-points.jsonl").read_text().splitlines()]
    pairs = [(p["n_attn"], p["n_act"]) for p in lines]
    assert len(pairs) == len(set(pairs)) >= 5
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert sorted((p["n_attn"], p["n_act"]) for p in report["allocation"]["points"]) == sorted(pairs)


def test_an_embedded_model_that_is_not_shipped_is_trained_once_under_torchrun(tmp_path):
    ranks = run_workers("retrain", 2, tmp_path)
    assert ranks[0]["weights"] == ranks[1]["weights"]
    assert len(list((tmp_path / "cache" / "base").iterdir())) == 1

def test_stage_1_trains_every_point_and_the_gate_phase_on_all_ranks_and_matches_one_process(trained_tiny, tmp_path):
    """Each progressive point's fine-tune and the gate phase run data-parallel on both ranks (once one path per
    rank: this test pinned [3, 4, 4] fine-tunes on 3 ranks), one after another, and give one process's points,
    step weights and sites. Tolerances: exact DDP follows one process up to the order of float reductions (the
    training test above: under 3e-4 after AdamW), so weights agree within 3e-4, and a point's top-1 within one
    of the 450 validation images (a near tie whose argmax those last digits flip)."""
    import shutil

    for run in ("ddp", "single"):
        (tmp_path / run).mkdir()
        shutil.copy(trained_tiny[2], tmp_path / run / "dense.safetensors")
    ranks = run_workers("stage1", 2, tmp_path / "ddp")
    single = stage1(tmp_path / "single")
    assert all(got["points"] == ranks[0]["points"] and got["chosen"] == ranks[0]["chosen"] for got in ranks[1:])
    assert len(single["fine_tunes"]) == 6 and not any(single["fine_tunes"])   # 3 paths x 2 steps, one process
    for got in ranks:   # both ranks in every point fine-tune, under DDP; every gate epoch on 2 ranks
        assert got["fine_tunes"] == [True] * 6
        assert got["gate_epochs"] == [[2, True], [2, True]]
    assert "[hetdpt] stage 1: each point fine-tuned on all 2 ranks (exact DDP, global batch 5 = 2 x 2-3)" in \
        ranks[0]["log"]
    points = {(p["n_attn"], p["n_act"]): p for p in json.loads(ranks[0]["points"])}
    expected = {(p["n_attn"], p["n_act"]): p for p in json.loads(single["points"])}
    assert sorted(points) == sorted(expected)
    for pair, p in expected.items():
        assert points[pair]["sites"] == p["sites"], pair
        assert abs(points[pair]["metric"] - p["metric"]) <= 100 / 450 + 1e-9, pair
    assert ranks[0]["steps"].keys() == single["steps"].keys()   # the same keys: a point is one on any world size
    for name, state in single["steps"].items():
        err = max((state[k] - v).abs().max().item() for k, v in ranks[0]["steps"][name].items())
        assert err < 3e-4, (name, err)
    assert ranks[0]["chosen"] == single["chosen"]                 # the gate phase selects as one process does
    err = max((single["gated"][k] - v).abs().max().item() for k, v in ranks[1]["gated"].items())
    assert err < 3e-4, err
    lines = (tmp_path / "ddp" / "work" / "map-points.jsonl").read_text().splitlines()
    assert len(lines) == len(points) and not list((tmp_path / "ddp" / "work").glob("map-points.rank*"))


def test_rank_0_decides_whether_to_resume_and_a_rank_that_cannot_follow_stops_every_rank(tmp_path):
    """A rank that alone sees a checkpoint starts afresh with rank 0 (it used to resume alone, and the ranks'
    steps no longer matched); a rank that cannot see the checkpoint rank 0 resumes from stops every rank at
    once with one error naming it (it used to start afresh, and wait in a collective until the timeout)."""
    from hetprune.training.embedded_data import digits
    from hetprune.training.train import TrainConfig, train

    ranks = run_workers("resume", 2, tmp_path)
    fresh = tiny(0)
    train(fresh, digits(), TrainConfig(**RESUME_CFG), progress=False)
    for got in ranks:
        assert got["afresh"] == "done"
        err = max((fresh.state_dict()[k] - v).abs().max().item() for k, v in got["state"].items())
        assert err < 3e-4, err
        assert got["unseen"].startswith("HetpruneError: resume: fine-tune: rank 1 cannot follow rank 0's decision: "
                                        f"it finds no {tmp_path / 'unseen' / 'rank1' / 'finetune-checkpoint.pt'}"), \
            got["unseen"]
        assert got["gate"].startswith("HetpruneError: resume: the gate phase: rank 1 cannot follow rank 0's decision: "
                                      f"it finds no {tmp_path / 'gate' / 'rank1' / 'gate-checkpoint.pt'}"), got["gate"]


def test_points_of_two_ranks_are_merged_without_locks_and_the_image_folder_is_listed_on_rank_0(tmp_path):
    from hetprune.training.image_folders import image_folder

    ranks = run_workers("shared", 2, tmp_path)
    for got in ranks:   # each rank appended to its own file, and every rank reads both
        assert got["points"] == {"0+1": 50.0, "1+1": 51.0}
        assert got["files"] == ["map-points.jsonl", "map-points.rank1.jsonl"]
    single = image_folder(tmp_path / "imgs", tiny(0)).fingerprint
    assert ranks[0]["fingerprint"] == ranks[1]["fingerprint"] == single
    images = sorted(str(p) for p in (tmp_path / "imgs").rglob("*.png"))
    assert ranks[0]["stats"] == {p: 1 for p in images}   # rank 0: each image stat'ed once
    assert ranks[1]["stats"] == {}                       # the others: never


@pytest.mark.parametrize("fail", [False, True])
def test_the_process_group_is_destroyed_at_exit_also_after_an_error(tmp_path, fail):
    # torchrun looks at its ranks every 2 s here, so it does not stop a rank before that rank's own exit
    proc = launch(2, [__file__, "exit-error" if fail else "exit", str(tmp_path)], tmp_path, check=not fail,
                  run_options=("--monitor-interval", "2"))
    assert (proc.returncode != 0) == fail
    assert sorted(p.name for p in tmp_path.glob("destroyed-*")) == ["destroyed-0", "destroyed-1"]


# -- the same, without torchrun --------------------------------------------------------------------------------

def test_a_point_store_writes_one_file_per_rank_and_reads_them_all(tmp_path, monkeypatch):
    """No file lock (Lustre mounted without flock refuses fcntl.flock): each rank appends to a file of its own,
    rank 0's the main one, and a load merges them; where two ranks hold one split, the lower rank's wins; a
    single file of an older run reads as it did."""
    import fcntl

    import hetprune.pruning.point_store as points_mod
    from hetprune.pruning.point_store import PointStore

    def refuse(*args):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", refuse)
    path = tmp_path / "map-points.jsonl"
    path.write_text(json.dumps({"n_attn": 2, "n_act": 0, "accuracy": 70.0, "key": "k"}) + "\n")   # an old file
    store = PointStore(path, "k")
    for rank, pair, metric in ((0, (0, 1), 90.0), (3, (1, 1), 80.0), (1, (0, 2), 85.0), (3, (0, 1), 10.0)):
        monkeypatch.setattr(points_mod.dist, "rank", lambda rank=rank: rank)
        store.append({"n_attn": pair[0], "n_act": pair[1], "metric": metric})
    assert sorted(f.name for f in tmp_path.iterdir()) == ["map-points.jsonl", "map-points.rank1.jsonl",
                                                          "map-points.rank3.jsonl"]
    got = {pair: p["metric"] for pair, p in store.load().items()}
    assert got == {(2, 0): 70.0, (0, 1): 90.0, (1, 1): 80.0, (0, 2): 85.0}
    assert PointStore(path, "another key").load() == {}


def test_the_collective_timeout_is_a_setting_the_process_group_is_made_with(monkeypatch):
    import atexit
    import datetime

    from hetprune.core import config, distributed as dist

    from hetprune.core import loader
    from hetprune.pruning import run_start

    made, registered = [], []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("HETPRUNE_DIST_TIMEOUT_MIN", raising=False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kwargs: made.append(kwargs))
    monkeypatch.setattr(atexit, "register", registered.append)
    run_start.run_device(loader.resolve(sets=["dist_timeout_min=7"]))
    run_start.run_device(loader.resolve())
    assert [m["timeout"] for m in made] == [datetime.timedelta(minutes=7), datetime.timedelta(minutes=30)]
    assert registered == [dist.shutdown, dist.shutdown]     # the group is destroyed at exit
    monkeypatch.setenv("HETPRUNE_DIST_TIMEOUT_MIN", "1")    # the environment overrides it (test harnesses)
    run_start.run_device(loader.resolve(sets=["dist_timeout_min=7"]))
    assert made[-1]["timeout"] == datetime.timedelta(minutes=1)
    with pytest.raises(hetprune.HetpruneError, match="dist_timeout_min must be minutes > 0"):
        loader.resolve(sets=["dist_timeout_min=0"])
    # it shapes no result: a compare row keeps its key whatever the timeout
    assert config.keyed(loader.resolve(sets=["dist_timeout_min=7"])) == config.keyed(loader.resolve())


def test_a_per_gpu_batch_becomes_the_global_batch_the_lr_rule_scales_by():
    from hetprune.core import config
    from hetprune.training.train import TrainConfig, scaled_lr

    cfg = TrainConfig(batch_size=128, batch_per_gpu=True, lr=5e-4, lr_scale="linear", lr_base_batch=512)
    assert cfg.global_batch(8).batch_size == 1024 and not cfg.global_batch(8).batch_per_gpu
    assert scaled_lr(cfg.global_batch(8)) == pytest.approx(1e-3)
    assert TrainConfig(batch_size=128).global_batch(8).batch_size == 128          # the default: global already
    settings = loader.resolve(sets=["finetune.batch_size=128", "finetune.batch_per_gpu=true"])
    resolved = settings.per_gpu_resolved(8).as_settings()
    assert resolved["finetune"]["batch_size"] == 1024 and "batch_per_gpu" not in resolved["finetune"]
    assert resolved["finetune"] == loader.resolve(sets=["finetune.batch_size=1024"]).as_settings()["finetune"]
    assert "batch_per_gpu" not in loader.resolve().as_settings()["finetune"]     # off: absent, keys unchanged
    plain = loader.resolve()
    assert plain.per_gpu_resolved(8) is plain and config.per_gpu_resolved(plain.as_settings(), 1) is not None


def test_a_job_made_in_code_keys_its_points_by_the_global_batch(tmp_path):
    from hetprune.pruning.budget import Budget
    from hetprune.training.embedded_data import digits
    from hetprune.pruning.pipeline import PruneJob
    from hetprune.core.plugins import get_registry

    registry = get_registry()
    strategy = registry.build("strategy", "hetdpt")

    def key(*sets):
        points = ["hetdpt.point_selection=oneshot", "hetdpt.point_finetune=short_finetune"]   # keyed by the schedule
        settings = hetprune.core.loader.resolve(strategy.defaults, sets=[*points, *sets])
        job = PruneJob(dense=tiny(0), spec=TINY_SPEC, data=digits(), budget=Budget(sites=2), settings=settings,
                       registry=registry, workdir=tmp_path, progress=False)
        return strategy.points_key(job), job.config.short_finetune.batch_size

    # one process: 16 per GPU is a global batch of 16, the same points as batch_size 16
    assert key("short_finetune.batch_size=16", "short_finetune.batch_per_gpu=true") == \
        key("short_finetune.batch_size=16")


if __name__ == "__main__":   # a torchrun rank of run_workers (or of the exit test)
    if sys.argv[1].startswith("exit"):
        sys.exit(exit_worker(Path(sys.argv[2]), fail=sys.argv[1] == "exit-error"))
    sys.exit(worker(sys.argv[1], Path(sys.argv[2])))
