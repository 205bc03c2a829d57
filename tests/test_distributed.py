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
from conftest import TINY_SPEC, PluginOf, tiny_example

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


def launch(nproc: int, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node nproc ARGS``; a collective mismatch fails within a minute."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HETPRUNE_DIST_TIMEOUT_MIN": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def torchrun(args, tmp_path, nproc: int = 2):
    return launch(nproc, ["-m", "hetprune", *args], tmp_path)


def run_workers(scenario: str, nproc: int, out: Path) -> list[dict]:
    """Run this file's ``scenario`` on ``nproc`` ranks; what each rank wrote, by rank."""
    launch(nproc, [__file__, scenario, str(out)], out)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(nproc)]


# -- the training and evaluation scenario -----------------------------------------------------------------------

def tiny(seed: int):
    from hetprune.models import build

    torch.manual_seed(seed)
    return build(TINY_SPEC)


def train_case(data, n: int, batch_size: int) -> tuple[torch.nn.Module, list[dict]]:
    """A tiny model trained with soft KD on ``n`` images, ``batch_size`` at a time (under torchrun: split)."""
    from hetprune.train import TrainConfig, train

    model, teacher = tiny(0), tiny(1).eval()
    cfg = TrainConfig(epochs=2, lr=LR, batch_size=batch_size, subset=n, kd="soft", warmup_epochs=0)
    return model, train(model, data, cfg, teacher=teacher, progress=False)


def val_set(data):
    return torch.utils.data.Subset(data.val, list(range(VAL_ITEMS)))


def training_worker(out: Path) -> dict:
    from hetprune import distributed as dist
    from hetprune.data import digits
    from hetprune.train import evaluate_dataset

    data, result = digits(), {}
    for n, batch_size in CASES[dist.world()]:
        model, history = train_case(data, n, batch_size)
        result[f"{n}@{batch_size}"] = {"state": model.state_dict(), "loss": [h["loss"] for h in history],
                                       "top1": evaluate_dataset(model, val_set(data), batch_size=2)}
    return result


# -- the planning scenario ----------------------------------------------------------------------------------------

class RankSkewed:
    """A 'measured' cost that differs between ranks: MACs x (1 + rank x 0.1 per attention sub-block still
    present), as if each rank timed attention differently."""

    name = "rank-skewed"
    unit = "units"

    def cost(self, model, example):
        from hetprune import distributed as dist, surgery
        from hetprune.costs import count_macs
        from hetprune.sites import sites

        kept = sum(not surgery.site_removed(model, s) for s in sites(model, "attn"))
        return float(count_macs(model, example) * (1 + dist.rank() * 0.1 * kept))


PLAN_SETS = ["finetune.epochs=1", "finetune.subset=33", "finetune.batch_size=16", "short_finetune.epochs=1",
             "short_finetune.subset=16", "short_finetune.batch_size=8", "scoring.subset=16", "scoring.batches=1",
             "scorer=magnitude", "hetdpt.point_scorer=magnitude", "hetdpt.point_finetune=short_finetune",
             "hetdpt.point_selection=oneshot", "hetdpt.verify=0",   # refinement measures any split: one-shot
             "hetdpt.axis_points=2", "hetdpt.mixed_points=1", "hetdpt.refine=1"]
PLAN_BUDGET = dict(target_speedup=1.3, cost_model=RankSkewed.name)


def planning_worker(out: Path) -> dict:
    from hetprune import distributed as dist
    from hetprune.budget import Budget, feasible_pairs
    from hetprune.data import digits
    from hetprune.pipeline import PruneJob
    from hetprune.plugins import get_registry

    hetprune.register_plugin(PluginOf("register_cost_models", RankSkewed), "test-rank-skewed")
    registry = get_registry()
    strategy = registry.build("strategy", "hetdpt")
    settings = hetprune.config.resolve(strategy.defaults, overrides=None, sets=PLAN_SETS)
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
    from hetprune import distributed as dist
    from hetprune.errors import HetpruneError
    from hetprune.task import Task, UserSource
    from hetprune.train import TrainConfig, train

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
    from hetprune.embedded import embedded_model

    os.environ["HETPRUNE_CACHE"] = str(out / "cache")
    model = embedded_model("digits", spec=TINY_SPEC, training={"epochs": 1}, progress=False, log=lambda m: None)
    return {"weights": hetprune.models.model_hash(model)}

# -- the progressive-points scenario: one path per rank ------------------------------------------------------

PATH_SETS = ["hetdpt.point_selection=progressive", "short_finetune.epochs=1", "short_finetune.subset=16",
             "short_finetune.batch_size=8", "scoring.subset=16", "scoring.batches=1"]


def paths_worker(out: Path) -> dict:
    import hetprune.task
    from hetprune.budget import Budget
    from hetprune.data import digits
    from hetprune.pipeline import PruneJob
    from hetprune.plugins import get_registry

    fine_tunes = []
    real = hetprune.task.train

    def counted(*args, **kwargs):
        fine_tunes.append(1)
        return real(*args, **kwargs)

    hetprune.task.train = counted
    registry = get_registry()
    strategy = registry.build("strategy", "hetdpt")
    settings = hetprune.config.resolve(strategy.defaults, overrides=None, sets=PATH_SETS)
    job = PruneJob(dense=tiny(0), spec=TINY_SPEC, data=digits(), budget=Budget(sites=4), settings=settings,
                   registry=registry, workdir=out / "work", progress=False, strategy_name="hetdpt")
    plan = strategy.point_plan(job, job.feasible_pairs())
    points = strategy.collect_points(job, plan)
    return {"points": json.dumps(points, sort_keys=True), "fine_tunes": len(fine_tunes)}


# -- the mixing scenario: mixup / cutmix batches and training on 2 ranks ------------------------------------

MIX_CFG = dict(epochs=1, lr=LR, batch_size=15, subset=45, kd="soft", warmup_epochs=0, mixup=0.8, cutmix=1.0,
               label_smoothing=0.1, accum_steps=2)   # micro-batches too: DDP synchronises the last only


def mixed_rows(data, rank: int, world: int, seed: int) -> dict:
    """Item index -> (mixed image, soft target) of the first two global batches, this rank's share."""
    from hetprune.train import ClassificationSource, TrainConfig

    cfg = TrainConfig(**MIX_CFG, seed=seed)
    from hetprune.data import GlobalBatchSampler

    sampler = GlobalBatchSampler(45, 15, seed, rank=rank, world=world, pad_empty=world > 1, pairs=True)
    out = {}
    for (batch, share, _), items, _ in zip(ClassificationSource(data).epoch(cfg, seed, rank, world,
                                                                            torch.device("cpu"), world > 1),
                                           sampler, range(2)):
        for i, item in enumerate(items[:share]):
            out[item] = (batch[0][i], batch[1][i])
    return out


def mix_train(data, seed: int = 0) -> torch.nn.Module:
    from hetprune.train import TrainConfig, train

    model, teacher = tiny(0), tiny(1).eval()
    train(model, data, TrainConfig(**MIX_CFG, seed=seed), teacher=teacher, progress=False)
    return model


def mix_worker(out: Path) -> dict:
    from hetprune import distributed as dist
    from hetprune.data import digits

    data = digits()
    return {"rows": {seed: mixed_rows(data, dist.rank(), dist.world(), seed) for seed in (0, 1)},
            "state": mix_train(data).state_dict()}


def worker(scenario: str, out: Path) -> int:
    from hetprune import distributed as dist

    torch.set_num_threads(1)
    dist.init_from_env("cpu")
    result = {"train": training_worker, "plan": planning_worker, "task": task_worker,
              "retrain": retrain_worker, "paths": paths_worker, "mix": mix_worker}[scenario](out)
    torch.save(result, out / f"rank{dist.rank()}.pt")
    dist.barrier()
    return 0


# -- the tests ----------------------------------------------------------------------------------------------------

def test_every_rank_takes_every_step_and_the_shares_weigh_each_item_once():
    from hetprune.data import GlobalBatchSampler

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
    from hetprune.data import digits
    from hetprune.train import evaluate_dataset

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


def test_mixup_and_cutmix_batches_and_training_are_the_same_on_2_ranks(tmp_path):
    """Each rank mixes its own share of a global batch (pairs stay on one rank, lambda and box from the global
    step), item for item as one process mixes the whole batch; so DDP training with mixing (and gradient
    accumulation over micro-batches) follows it too."""
    from hetprune.data import digits

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
            *FT, "--set", "hetdpt.axis_points=2", "--set", "hetdpt.mixed_points=1", "--out", str(tmp_path / "out")]
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

def test_torchrun_walks_each_progressive_path_once_on_its_own_rank(tmp_path):
    ranks = run_workers("paths", 3, tmp_path)
    assert all(got["points"] == ranks[0]["points"] for got in ranks[1:])   # every rank reads the same points
    lines = [json.loads(line) for line in (tmp_path / "work" / "map-points.jsonl").read_text().splitlines()]
    pairs = [(p["n_attn"], p["n_act"]) for p in lines]
    assert len(pairs) == len(set(pairs)) == len(json.loads(ranks[0]["points"]))   # each point measured once
    # one path per rank (attention: 3 steps, activation: 4, interleaved: 4), each fine-tune on its rank alone
    assert [got["fine_tunes"] for got in ranks] == [3, 4, 4]


if __name__ == "__main__":   # a torchrun rank of run_workers
    sys.exit(worker(sys.argv[1], Path(sys.argv[2])))
