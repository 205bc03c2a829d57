"""Phase 1 of a comparison: plan every (strategy, budget, seed) row, prune and fine-tune it (or reuse it,
finished earlier with the same settings), and save its model and its row the moment it finishes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

from torch import nn

from ...core import distributed as dist
from ...core.errors import BudgetUnreachable, HetpruneError
from ...core.keys import before
from ...core.io import ResultFolder, check_result_folder, make_result_folder
from ...training.loaders import available_cpus, busy_elsewhere, row_threading, row_threads, seed_everything
from ...model.spec import model_hash
from ...pruning.behaviours import behaviours
from ...pruning.behaviours import changed as behaviour_changed
from ...pruning.pipeline import PruneJob
from ...core.plugins import Registry
from ...training.resume import made_when, note_saved, now
from ...training.task import classification, format_metric
from .spec import CompareSpec, RowPlan, model_folder, row_id, row_key


ROWS_FILE = "rows.jsonl"


class RowStore:
    """Finished rows, one JSON object per line, appended and fsynced as they finish."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / ROWS_FILE

    def load(self) -> dict[str, dict]:
        rows: dict[str, dict] = {}
        if not self.path.is_file():
            return rows
        for lineno, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                rows[row["key"]] = row
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise HetpruneError(f"compare rows file {self.path} line {lineno} is corrupt or truncated ({exc}); "
                                    "delete that line to redo the row") from exc
        return rows

    def append(self, row: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        note_saved(f"a row in {self.path}")


# what hetprune writes in a compare folder (an ablation's is hetprune.harness.ablate.ABLATION_FOLDER)
COMPARE_FOLDER = ResultFolder("compare", frozenset({ROWS_FILE, "results.md", "results.csv", "results.json",
                                                    "pareto.png", "models", "work"}), resumable=True,
                              folders=frozenset({"models", "work"}))


def prepare_out(out: Path, resume: bool, overwrite: bool, kind: ResultFolder = COMPARE_FOLDER) -> Path:
    """Refuse to mix a new run into an earlier one's folder unless told how, and never touch what hetprune
    did not write: ``resume`` continues the earlier run, ``overwrite`` deletes its entries (only those).
    Returns the folder to write (a link's target: a linked folder is written through)."""
    return make_result_folder(check_result_folder(out, kind, overwrite, resume=resume), kind, resume, overwrite)


def _fmt_eta(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def time_left(running: list[tuple[float, float]], queued: list[float], jobs: int, now: float) -> float:
    """Seconds until every row is done, with ``jobs`` rows at a time: each row ``running`` (when it started, how
    long it takes) ends then (or about now, where it ran longer), then the ``queued`` ones (how long each takes,
    in order) take the first lanes free. A row half done is half done, and a hetdpt row is not a baseline's:
    the rows left divided by the jobs at the mean row's length said "about 2s left" with a whole row to run."""
    lanes = sorted(max(now, start + length) for start, length in running)
    lanes += [now] * max(0, min(jobs, len(running) + len(queued)) - len(lanes))
    for length in queued:
        lanes.sort()
        lanes[0] += length
    return max(lanes, default=now) - now


# a row's work in image passes: its training images, and its evaluation images at a third of their cost (the
# probe of the guide's run evaluated three times as fast as it trained)
EVAL_SHARE = 1 / 3


def plan_rows(spec: CompareSpec, base_hash: str, data_fp: str) -> list[RowPlan]:
    plans = []
    for budget in spec.budgets:
        for seed in spec.seeds:
            for name in spec.strategies:
                settings = spec.settings.replace(seed=seed)
                plans.append(RowPlan(row_id(name, budget, seed), name, budget, seed, settings,
                                     row_key(spec, name, budget, seed, base_hash, data_fp)))
    return plans


def run_one(plan: RowPlan, registry: Registry, dense: nn.Module, model_spec, task, base_info: dict, out: Path,
            resume: bool, log: Callable[[str], None], progress: bool, adapter=None) -> dict:
    """Prune + fine-tune one row, save its model, and return the row."""
    from ...model.recipe import save

    started = time.time()
    head = {"key": plan.key, "id": plan.id, "strategy": plan.label or plan.strategy, "budget": plan.budget.to_dict(),
            "seed": plan.seed, "behaviours": row_behaviours(plan, registry)}
    seed_everything(plan.seed)   # a row is the same whichever rows ran before it, in this process or another
    strategy, job = row_job(plan, registry, dense, model_spec, task, base_info, out, resume, log, progress, adapter)
    try:
        with job.serving():
            result = strategy.run(job)
    except BudgetUnreachable as exc:   # the row says so, and the comparison goes on
        log(f"[{plan.label or plan.strategy}] {exc}")
        return {**head, "unreachable": str(exc), "wall_s": round(time.time() - started, 1), "finished_at": now()}
    model_dir = Path("models") / model_folder(plan)
    if dist.is_main():
        save(out / model_dir, result.model, result.recipe, overwrite=True,
             extra_files={"report.json": result.report})
    r = result.report
    row = {
        **head, "n_attn": r["n_attn"], "n_act": r["n_act"], "sites": r["sites"],
        **metric_columns(r),
        "params": r["params"], "macs": r["macs"], "dense_macs": r["dense_macs"],
        **({"budget_met": r["budget_met"]} if "budget_met" in r else {}),
        "wall_s": round(time.time() - started, 1), "model_dir": str(model_dir),
        "weights": model_hash(result.model),   # rows of several seeds that made the very same model say so
        "finished_at": now(),
    }
    if plan.split:
        row["scorer"] = plan.settings.run.scorer
    alloc = r.get("allocation")
    if isinstance(alloc, dict) and isinstance(alloc.get("pick"), dict):
        row["predicted_metric"] = alloc["pick"].get("predicted")
        if r["metric_name"] == "top1":
            row["predicted_top1"] = row["predicted_metric"]
    if "cost" in r:   # a time cost model: its prediction, checked against phase 2's measurement
        row["predicted_speedup"] = r["cost"]["predicted_speedup"]
        row["cost_batch"] = r["cost"].get("about", {}).get("batch_size")
    return row


def row_job(plan: RowPlan, registry: Registry, dense: nn.Module, model_spec, task, base_info: dict, out: Path,
            resume: bool = False, log: Callable[[str], None] = print, progress: bool = False, adapter=None):
    """A row's strategy and its job (in ``out/work/ROW``, sharing ``out/work/shared``; the model is timed in
    phase 2, not by the job)."""
    from ...pruning.pipeline import FixedSplit

    strategy = FixedSplit(*plan.split) if plan.split else registry.build("strategy", plan.strategy)
    job = PruneJob(dense=dense, spec=model_spec, data=None, task=task, budget=plan.budget, settings=plan.settings,
                   registry=registry, workdir=out / "work" / plan.id, shared_dir=out / "work" / "shared",
                   base_info=dict(base_info), resume=resume, progress=progress, log=log,
                   strategy_name=plan.label or plan.strategy, measure_cost=False, adapter=adapter)
    return strategy, job


def check_rows(plans: list[RowPlan], registry: Registry, dense: nn.Module, model_spec, task, base_info: dict,
               out: Path, adapter=None) -> dict[str, float]:
    """Every row's refusals (`hetprune.pruning.pipeline.check_job`) before the first row trains; returns each
    row's work as its strategy plans it (image passes, `EVAL_SHARE` for evaluations; None where the strategy
    does not plan its stages): what the time left is counted in."""
    from ...pruning.pipeline import check_job

    work = {}
    for plan in plans:
        strategy, job = row_job(plan, registry, dense, model_spec, task, base_info, out, log=lambda m: None,
                                adapter=adapter)
        with job.serving():
            steps = check_job(strategy, job)
        work[plan.id] = None if steps is None else float(sum(s.train_images + EVAL_SHARE * s.eval_images
                                                             for s in steps))
    return work


def metric_columns(report: dict) -> dict:
    """A row's metric entries: ``metric`` and ``metric_before_finetune`` (named by ``metric_name``), and for
    top-1 the ``top1`` columns too, as rows had them before tasks had other metrics."""
    cols = {"metric_name": report["metric_name"], "metric_before_finetune": report["metric_before_finetune"],
            "metric": report["metric"]}
    if report["metric_name"] == "top1":
        cols.update(top1_before_finetune=report["metric_before_finetune"], top1=report["metric"])
    return cols


def row_behaviours(plan: RowPlan, registry: Registry) -> dict[str, int]:
    """The behaviour numbers of what makes a row (`hetprune.pruning.behaviours`): a fixed split has no strategy of
    its own."""
    return behaviours(registry, plan.settings, None if plan.split else plan.strategy)


def reusable_rows(plans: list[RowPlan], done: dict[str, dict], registry: Registry, reuse_older: bool,
                  log: Callable[[str], None]) -> dict[int, dict]:
    """The finished rows of ``plans`` a resume takes, by plan index: each stored under the plan's key (or key
    version 1's) and made by this release's behaviour of every component it used. A row another behaviour made
    (or one made before rows recorded it) is made again, said in one line, unless ``reuse_older``: then it is
    taken, marked ``older`` with what differs (the table says so)."""
    taken, older = {}, []
    for i, plan in enumerate(plans):
        row = done.get(plan.key) or done.get(before(plan.key))   # (a row stored under key version 1 too)
        if row is None:
            continue
        why = behaviour_changed(row.get("behaviours"), row_behaviours(plan, registry))
        if why is not None:
            older.append(why)
            if not reuse_older:
                continue
            row = {**row, "older": why}
        taken[i] = row
    if older:
        whys = "; ".join(sorted(set(older)))
        log(f"resume: {len(older)} finished row(s) were made by another behaviour than this release's ({whys}): "
            + ("reused, as --reuse-older asks; the table marks them" if reuse_older else
               "made again; --reuse-older reuses them, marked in the table"))
    return taken


def row_workers(plans: list[RowPlan], task) -> int:
    """The loader workers each row's fine-tunes read with: the schedule's, else the data's own default."""
    if not plans:
        return 0
    own = plans[0].settings.run.schedule("finetune").workers
    return own or int(getattr(getattr(task, "data", None), "workers", None) or 0)


def row_device(plans: list[RowPlan]):
    """Where the rows train (their settings' resolved device)."""
    import torch

    return torch.device(plans[0].settings.run.device if plans else "cpu")


def _worker(payload: dict) -> dict:
    """Run one row in a fresh process with the threads the parent gave it (``--jobs N``)."""
    import torch

    from ...training.data import load_data
    from ...core.io import load_weights
    from ...model.spec import ModelSpec, build, load_state_into
    from ...core.plugins import get_registry, load_module

    torch.set_num_threads(payload.get("threads", 1))   # the parent's row_threads for its jobs
    for module in payload["plugin_modules"]:
        load_module(module)
    model_spec = ModelSpec.from_dict(payload["model_spec"])
    dense = build(model_spec)
    load_state_into(dense, load_weights(payload["dense_weights"]), "dense model")
    data = load_data(payload["data_spec"], dense, seed=payload["data_seed"], augment=payload["augment"] or "light",
                     workers=payload.get("workers"), selection=payload.get("selection"))
    if payload.get("fingerprint"):   # the parent's (an ImageFolder's may have been read by content): the same keys
        data.fingerprint = payload["fingerprint"]
    plan = RowPlan.from_payload(payload["plan"])
    return run_one(plan, get_registry(), dense, model_spec, classification(data), payload["base_info"],
                   Path(payload["out"]),
                   payload["resume"], log=lambda msg: print(f"  ({plan.id}) {msg}", flush=True), progress=False)


def run_rows(plans: list[RowPlan], registry: Registry, dense: nn.Module, model_spec, task, base_info: dict,
             out: Path, resume: bool, log: Callable[[str], None] = print, progress: bool = True,
             jobs: int = 1, data_spec: str | None = None, adapter=None, reuse_older: bool = False) -> list[dict]:
    """Phase 1: prune and fine-tune every planned row (or reuse finished ones).

    With ``jobs > 1`` rows run in parallel single-threaded processes (at these
    model sizes one thread per job is the faster use of the cores), which
    rebuild the base model from ``model_spec`` and the data from ``data_spec``
    (an embedded name or an ImageFolder path); each row is saved the moment it
    finishes either way.
    """
    if not dist.is_main():
        log = lambda msg: None  # noqa: E731 - under torchrun rank 0 alone reports
    store = RowStore(out)
    done = dist.on_main(store.load) if resume else {}   # rank 0 decides which rows are reused; every rank follows
    results = reusable_rows(plans, done, registry, reuse_older, log)
    todo = []
    for i, plan in enumerate(plans):
        row = results.get(i)
        if row is not None:
            made = ("an older behaviour: " + row["older"]) if row.get("older") else "this release's behaviour"
            log(f"[{i + 1}/{len(plans)}] {plan.id}: reused, finished {made_when([row], 'finished_at')} "
                f"(the same base model, task, data and settings, made by {made}; {store.path})")
        else:
            todo.append((i, plan))
    work = check_rows([plan for _, plan in todo], registry, dense, model_spec, task, base_info, out, adapter)
    lanes = min(max(1, jobs), len(todo)) if todo else 1
    queue = [plan.id for _, plan in todo]   # rows start in this order, each as a lane frees up
    running: dict[str, float] = {}   # the rows running now, by when they started
    done_work, done_s = 0.0, 0.0     # what the rows that ran did, and in how long: the rate the time left uses

    def start_next(now: float) -> None:
        while queue and len(running) < lanes:
            running[queue.pop(0)] = now

    def eta(now: float) -> str:
        if not done_s or None in work.values():   # nothing measured yet, or rows whose work nobody can count
            return ""
        rate = done_work / done_s
        left = time_left([(t, work[r] / rate) for r, t in running.items()], [work[r] / rate for r in queue], lanes,
                         now)
        return f"; about {_fmt_eta(left)} left"

    def finished(i: int, row: dict) -> None:
        nonlocal done_work, done_s
        if dist.is_main():
            store.append(row)
        results[i] = row
        running.pop(row["id"], None)
        if "unreachable" not in row and work.get(row["id"]):   # a row refused at once did no work to time
            done_work, done_s = done_work + work[row["id"]], done_s + max(row["wall_s"], 1e-3)
        now = time.time()
        start_next(now)
        later = eta(now) if len(results) < len(plans) else ""
        what = ("cannot reach the budget" if "unreachable" in row else
                f"{format_metric(row['metric_name'], row['metric'])} ({row['n_attn']} attn + {row['n_act']} act)")
        log(f"[{len(results)}/{len(plans)}] {row['id']}: {what} in {row['wall_s']:.0f}s{later}")

    workers = row_workers(plans, task)
    if jobs <= 1 or len(todo) <= 1:
        with row_threading(row_device(plans), 1, workers, log if todo else None):
            start_next(time.time())
            for i, plan in todo:
                log(f"[{len(results) + 1}/{len(plans)}] {plan.id}: running")
                finished(i, run_one(plan, registry, dense, model_spec, task, base_info, out, resume, log, progress,
                                    adapter))
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        from ...core.io import save_weights
        from ...core.plugins import extra_modules

        if data_spec is None or model_spec is None or model_spec.is_user_built:
            raise HetpruneError("jobs > 1 runs rows in fresh processes that rebuild the base model and the data by "
                                "name; a model or a Task made in code runs with jobs=1")

        dense_path = out / "work" / "dense.safetensors"
        save_weights(dense_path, dense)
        common = {"model_spec": model_spec.to_dict(), "dense_weights": str(dense_path), "data_spec": data_spec,
                  "data_seed": 0, "augment": getattr(getattr(task, "data", None), "augment", None),
                  "workers": getattr(getattr(task, "data", None), "workers", None),
                  "selection": len(getattr(getattr(task, "data", None), "selection", None) or ()),
                  "fingerprint": getattr(getattr(task, "data", None), "fingerprint", None), "base_info": base_info,
                  "out": str(out), "resume": resume, "plugin_modules": extra_modules()}
        busy = busy_elsewhere()
        threads = row_threads(jobs, workers, busy)
        log(f"running {len(todo)} rows in {jobs} parallel processes ...")
        if row_device(plans).type == "cpu":
            log(f"cpu: {threads} torch thread(s) per row ({available_cpus()} CPUs, {busy} kept busy by other programs, "
                f"{jobs} rows at a time, {workers} loader worker(s) each)")
        common["threads"] = threads
        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(_worker, {**common, "plan": plan.to_payload()}): i for i, plan in todo}
            start_next(time.time())
            for fut in as_completed(futures):
                finished(futures[fut], fut.result())
    return [results[i] for i in sorted(results)]
