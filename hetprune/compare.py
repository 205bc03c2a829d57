"""The comparison harness: several strategies, budgets and seeds on the same
dense model, data, settings and timer; one table and one plot.

Work happens in two phases so that timing never competes with training:
1. prune + fine-tune every (strategy, budget, seed) row, saving each pruned
   model and its row the moment it finishes (``rows.jsonl``);
2. time every pruned model against the dense one, interleaved, in one process.
A rerun with ``--resume`` reuses every finished row whose settings match, so an
interrupted run loses at most the row in progress.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from torch import nn

from . import distributed as dist
from .budget import Budget
from .cache import fingerprint
from .errors import BudgetUnreachable, HetpruneError
from .io import no_empty_folder_on_error, write_json_atomic, write_text_atomic
from . import result_checks  # noqa: F401 - adds the strategy rule: every row's result is checked
from .pipeline import PruneJob, resolve_adapter
from .task import classification, format_metric
from .plugins import Registry

DEFAULT_STRATEGIES = ("hetdpt", "attn-only", "act-only", "mix50")
ROWS_FILE = "rows.jsonl"


@dataclass
class CompareSpec:
    strategies: list[str]
    budgets: list[Budget]
    seeds: list[int]
    settings: dict                      # one settings dict for every strategy (all sections merged)
    batch_sizes: list[int] = field(default_factory=lambda: [1, 256])
    device: str = "cpu"
    speed_repeats: int = 7
    speed_spread: float = 0.02          # time until every speedup is known within ±2 % ...
    speed_budget_s: float = 15.0        # ... or this many more seconds per batch size have passed


def row_id(strategy: str, budget: Budget, seed: int) -> str:
    b = "-".join(f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in budget.to_dict().items())
    return f"{strategy}__{b}__seed{seed}"


def row_key(spec: CompareSpec, strategy: str, budget: Budget, seed: int, base_hash: str, data_fp: str) -> str:
    """What a finished row depends on: reuse it only when all of this matches."""
    return fingerprint({"strategy": strategy, "budget": budget.to_dict(), "seed": seed, "settings": spec.settings,
                        "base": base_hash, "data": data_fp})


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


def prepare_out(out: Path, resume: bool, overwrite: bool, what: str) -> None:
    """Refuse to mix a new run into an earlier one's folder unless told how."""
    import shutil

    from .io import check_writable

    if out.exists() and not out.is_dir():
        raise HetpruneError(f"output path {out} exists and is not a folder")
    check_writable(out)

    if (out / ROWS_FILE).exists() and not resume:
        if not overwrite:
            raise HetpruneError(f"{out} holds an earlier {what}; pass --resume to reuse its finished rows "
                                "or --overwrite to start over")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def _fmt_eta(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


@dataclass
class RowPlan:
    """One row to run: a strategy (registered name, or a fixed split), budget, seed and full settings."""

    id: str
    strategy: str
    budget: Budget
    seed: int
    settings: dict
    key: str
    split: tuple[int, int] | None = None   # run hetprune.pipeline.FixedSplit instead of a named strategy
    label: str | None = None               # what the row is called in tables (default: the strategy)

    def to_payload(self) -> dict:
        return {"id": self.id, "strategy": self.strategy, "budget": self.budget.to_dict(), "seed": self.seed,
                "settings": self.settings, "key": self.key, "split": self.split, "label": self.label}

    @classmethod
    def from_payload(cls, d: dict) -> "RowPlan":
        return cls(**{**d, "budget": Budget(**d["budget"]), "split": tuple(d["split"]) if d["split"] else None})


def plan_rows(spec: CompareSpec, base_hash: str, data_fp: str) -> list[RowPlan]:
    plans = []
    for budget in spec.budgets:
        for seed in spec.seeds:
            for name in spec.strategies:
                settings = json.loads(json.dumps(spec.settings))
                settings["seed"] = seed
                plans.append(RowPlan(row_id(name, budget, seed), name, budget, seed, settings,
                                     row_key(spec, name, budget, seed, base_hash, data_fp)))
    return plans


def run_one(plan: RowPlan, registry: Registry, dense: nn.Module, model_spec, task, base_info: dict, out: Path,
            resume: bool, log: Callable[[str], None], progress: bool, adapter=None) -> dict:
    """Prune + fine-tune one row, save its model, and return the row."""
    from .pipeline import FixedSplit
    from .recipe import save

    started = time.time()
    head = {"key": plan.key, "id": plan.id, "strategy": plan.label or plan.strategy, "budget": plan.budget.to_dict(),
            "seed": plan.seed}
    strategy = FixedSplit(*plan.split) if plan.split else registry.build("strategy", plan.strategy)
    job = PruneJob(dense=dense, spec=model_spec, data=None, task=task, budget=plan.budget, settings=plan.settings,
                   registry=registry, workdir=out / "work" / plan.id, shared_dir=out / "work" / "shared",
                   base_info=dict(base_info), resume=resume, progress=progress, log=log,
                   strategy_name=plan.label or plan.strategy, measure_cost=False,  # phase 2 times every model
                   adapter=adapter)
    try:
        with job.serving():
            result = strategy.run(job)
    except BudgetUnreachable as exc:   # the row says so, and the comparison goes on
        log(f"[{plan.label or plan.strategy}] {exc}")
        return {**head, "unreachable": str(exc), "wall_s": round(time.time() - started, 1)}
    if dist.is_main():
        save(out / "models" / plan.id, result.model, result.recipe, overwrite=True,
             extra_files={"report.json": result.report})
    r = result.report
    row = {
        **head, "n_attn": r["n_attn"], "n_act": r["n_act"], "sites": r["sites"],
        **metric_columns(r),
        "params": r["params"], "macs": r["macs"], "dense_macs": r["dense_macs"],
        **({"budget_met": r["budget_met"]} if "budget_met" in r else {}),
        "wall_s": round(time.time() - started, 1), "model_dir": str(Path("models") / plan.id),
    }
    if plan.split:
        row["scorer"] = plan.settings["scorer"]
    alloc = r.get("allocation")
    if isinstance(alloc, dict) and isinstance(alloc.get("pick"), dict):
        row["predicted_metric"] = alloc["pick"].get("predicted")
        if r["metric_name"] == "top1":
            row["predicted_top1"] = row["predicted_metric"]
    if "cost" in r:   # a time cost model: its prediction, checked against phase 2's measurement
        row["predicted_speedup"] = r["cost"]["predicted_speedup"]
        row["cost_batch"] = r["cost"].get("about", {}).get("batch_size")
    return row


def metric_columns(report: dict) -> dict:
    """A row's metric entries: ``metric`` and ``metric_before_finetune`` (named by ``metric_name``), and for
    top-1 the ``top1`` columns too, as rows had them before tasks had other metrics."""
    cols = {"metric_name": report["metric_name"], "metric_before_finetune": report["metric_before_finetune"],
            "metric": report["metric"]}
    if report["metric_name"] == "top1":
        cols.update(top1_before_finetune=report["metric_before_finetune"], top1=report["metric"])
    return cols


def metric_label(name: str) -> str:
    return "top-1 %" if name == "top1" else name


def _worker(payload: dict) -> dict:
    """Run one row in a fresh single-threaded process (``--jobs N``)."""
    import torch

    from .data import load_data
    from .io import load_weights
    from .models import ModelSpec, build, load_state_into
    from .plugins import get_registry, load_module

    torch.set_num_threads(1)
    for module in payload["plugin_modules"]:
        load_module(module)
    model_spec = ModelSpec.from_dict(payload["model_spec"])
    dense = build(model_spec)
    load_state_into(dense, load_weights(payload["dense_weights"]), "dense model")
    data = load_data(payload["data_spec"], dense, seed=payload["data_seed"])
    plan = RowPlan.from_payload(payload["plan"])
    return run_one(plan, get_registry(), dense, model_spec, classification(data), payload["base_info"],
                   Path(payload["out"]),
                   payload["resume"], log=lambda msg: print(f"  ({plan.id}) {msg}", flush=True), progress=False)


def run_rows(plans: list[RowPlan], registry: Registry, dense: nn.Module, model_spec, task, base_info: dict,
             out: Path, resume: bool, log: Callable[[str], None] = print, progress: bool = True,
             jobs: int = 1, data_spec: str | None = None, adapter=None) -> list[dict]:
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
    done = store.load() if resume else {}
    results: dict[int, dict] = {}
    todo = []
    for i, plan in enumerate(plans):
        if plan.key in done:
            log(f"[{i + 1}/{len(plans)}] {plan.id}: reused (finished earlier)")
            results[i] = done[plan.key]
        else:
            todo.append((i, plan))
    durations: list[float] = []

    def finished(i: int, row: dict) -> None:
        if dist.is_main():
            store.append(row)
        results[i] = row
        durations.append(row["wall_s"])
        left = len(plans) - len(results)
        eta = f"; about {_fmt_eta(statistics.mean(durations) * left / max(1, jobs))} left" if left else ""
        what = ("cannot reach the budget" if "unreachable" in row else
                f"{format_metric(row['metric_name'], row['metric'])} ({row['n_attn']} attn + {row['n_act']} act)")
        log(f"[{len(results)}/{len(plans)}] {row['id']}: {what} in {row['wall_s']:.0f}s{eta}")

    if jobs <= 1 or len(todo) <= 1:
        for i, plan in todo:
            log(f"[{len(results) + 1}/{len(plans)}] {plan.id}: running")
            finished(i, run_one(plan, registry, dense, model_spec, task, base_info, out, resume, log, progress,
                                adapter))
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        from .io import save_weights
        from .plugins import extra_modules

        if data_spec is None or model_spec is None or model_spec.is_user_built:
            raise HetpruneError("jobs > 1 runs rows in fresh processes that rebuild the base model and the data by "
                                "name; a model or a Task made in code runs with jobs=1")

        dense_path = out / "work" / "dense.safetensors"
        save_weights(dense_path, dense)
        common = {"model_spec": model_spec.to_dict(), "dense_weights": str(dense_path), "data_spec": data_spec,
                  "data_seed": 0, "base_info": base_info, "out": str(out), "resume": resume,
                  "plugin_modules": extra_modules()}
        log(f"running {len(todo)} rows in {jobs} parallel processes ...")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(_worker, {**common, "plan": plan.to_payload()}): i for i, plan in todo}
            for fut in as_completed(futures):
                finished(futures[fut], fut.result())
    return [results[i] for i in sorted(results)]


def measure_rows(spec: CompareSpec, dense: nn.Module, rows: list[dict], out: Path, input_shape,
                 log: Callable[[str], None] = print, model_spec=None, adapter=None) -> dict:
    """Phase 2: time the dense model and every pruned model, interleaved, in this process.

    Each row's model is loaded back from its folder as a user would load it (onto a fresh copy of the dense
    model where the base was built in code; the run's own model kwargs are trusted)."""
    from .bench import measure
    from .recipe import load

    models = {"dense": dense}
    user_built = model_spec is None or model_spec.is_user_built
    trusted = list((model_spec.kwargs if model_spec is not None else {}) or {})
    timed_as: dict[str, str] = {}   # structure -> the row whose model is timed for every row of that structure
    for row in rows:
        row["structure"] = structure_of(out / row["model_dir"])
        row["timed_as"] = timed_as.setdefault(row["structure"], row["id"])
        if row["timed_as"] == row["id"]:
            models[row["id"]] = load(out / row["model_dir"], allow_kwargs=trusted, adapter=adapter,
                                     model=copy.deepcopy(dense) if user_built else None)
    log(f"timing the dense model and {len(models) - 1} distinct pruned models ({len(rows)} rows) interleaved at "
        f"batch sizes {spec.batch_sizes} on {spec.device} ...")
    return measure(models, input_shape=input_shape, batch_sizes=spec.batch_sizes, device=spec.device,
                   reference="dense", repeats=spec.speed_repeats, spread_target=spec.speed_spread,
                   spread_budget_s=spec.speed_budget_s)


def structure_of(folder: Path) -> str:
    """What a saved model's speed depends on: its recipe apart from provenance (sites, merges, widths, base
    architecture), not its weights. Rows with the same structure are the same model to a timer."""
    from .recipe import load_recipe

    recipe = load_recipe(folder).to_dict()
    recipe.pop("provenance", None)
    return fingerprint(recipe)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def aggregate(rows: list[dict]) -> list[dict]:
    """Mean and standard deviation over seeds, per (strategy, budget)."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["strategy"], json.dumps(row["budget"], sort_keys=True)), []).append(row)
    out = []
    for (name, budget), members in groups.items():
        if any("unreachable" in m for m in members):   # the strategy cannot meet this budget on this model
            out.append({"strategy": name, "budget": json.loads(budget), "seeds": len(members), "structures": [],
                        "unreachable": next(m["unreachable"] for m in members if "unreachable" in m)})
            continue

        def stat(key, _m=members):
            vals = [m[key] for m in _m if m.get(key) is not None]
            return mean_std(vals) if vals else (None, None)

        agg = {"strategy": name, "budget": json.loads(budget), "seeds": len(members)}
        for key in ("metric", "metric_before_finetune", "top1", "top1_before_finetune", "n_attn", "n_act", "macs",
                    "params", "speedup_large", "speedup_b1", "speedup_large_spread", "speedup_b1_spread",
                    "throughput_large", "throughput_b1", "wall_s", "predicted_speedup", "measured_speedup",
                    "prediction_error"):
            agg[key], agg[f"{key}_std"] = stat(key)
        agg["splits"] = sorted({f"{m['n_attn']}+{m['n_act']}" for m in members})
        agg["budget_missed"] = sum(m.get("budget_met") is False for m in members)
        agg["structures"] = sorted({m["structure"] for m in members if "structure" in m})
        out.append(agg)
    for agg, note in zip(out, speed_notes(out)):
        agg["speed_note"] = note
    return out


def speed_interval(agg: dict, tag: str = "large") -> tuple[float, float] | None:
    """The speedup's plausible range: ± its timing spread, or ± its spread over seeds where that is larger."""
    s = agg.get(f"speedup_{tag}")
    if s is None:
        return None
    half = s * max(agg.get(f"speedup_{tag}_spread") or 0.0, (agg.get(f"speedup_{tag}_std") or 0.0) / s)
    return s - half, s + half


def speed_notes(aggregates: list[dict]) -> list[str]:
    """Per aggregate, what its speed column cannot tell apart: the strategies at the same budget that made
    the very same model (timed once, shared), and those whose speedups overlap within their spreads."""
    notes = []
    for a in aggregates:
        peers = [b for b in aggregates if b is not a and b["budget"] == a["budget"]]
        same = [b["strategy"] for b in peers if a["structures"] and b["structures"] == a["structures"]]
        mine = speed_interval(a)
        tied = [b["strategy"] for b in peers if b["strategy"] not in same and mine is not None
                and (theirs := speed_interval(b)) is not None and mine[0] <= theirs[1] and theirs[0] <= mine[1]]
        parts = ([f"same model as {', '.join(same)}"] if same else []) + (
            [f"speed tie with {', '.join(tied)}"] if tied else [])
        notes.append("; ".join(parts))
    return notes


def _pm(mean, std, digits=2) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if std else f"{mean:.{digits}f}"


def budget_text(budget: dict) -> str:
    if "sites" in budget:
        return str(budget["sites"])
    if "target_macs" in budget:
        return f"MACs≤{budget['target_macs']:g}"
    by = f" ({budget['cost_model']})" if budget.get("cost_model") not in (None, "macs") else ""
    if "target_latency" in budget:
        return f"latency≤{budget['target_latency'] * 1e3:g}ms"
    return f"speedup≥{budget['target_speedup']:g}{by}"


def markdown_table(dense_row: dict, aggregates: list[dict], large: int, metric: str = "top1") -> str:
    label = metric_label(metric)
    head = (f"| strategy | budget | seeds | split (attn+act) | {label} before FT | {label} | MACs | params | "
            f"img/s b1 | img/s b{large} | speedup b{large} (± spread) | MAC ratio | speed note |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = [f"| dense | - | - | - | - | {dense_row['metric']:.2f} | {dense_row['macs'] / 1e6:.2f}M | "
             f"{dense_row['params'] / 1e6:.3f}M | {dense_row.get('throughput_b1', 0):.0f} | "
             f"{dense_row.get('throughput_large', 0):.0f} | 1.00 | 1.00 | |"]
    for a in aggregates:
        if "unreachable" in a:
            lines.append(f"| {a['strategy']} | {budget_text(a['budget'])} | {a['seeds']} | - | - | cannot reach the "
                         f"budget | - | - | - | - | - | - | {a['unreachable']} |")
            continue
        mac_ratio = dense_row["macs"] / a["macs"] if a["macs"] else float("nan")
        lines.append(
            f"| {a['strategy']} | {budget_text(a['budget'])} | {a['seeds']} | {', '.join(a['splits'])} | "
            f"{_pm(a['metric_before_finetune'], a['metric_before_finetune_std'])} | "
            f"{_pm(a['metric'], a['metric_std'])} | "
            f"{macs_text(a, dense_row)} | {a['params'] / 1e6:.3f}M | "
            f"{_pm(a['throughput_b1'], a['throughput_b1_std'], 0)} | "
            f"{_pm(a['throughput_large'], a['throughput_large_std'], 0)} | "
            f"{speed_text(a)} | {mac_ratio:.2f} | {a.get('speed_note', '')} |")
    return head + "\n".join(lines) + "\n"


def macs_text(agg: dict, dense_row: dict) -> str:
    """``2.11M (52%)``: the MACs a row reached and their share of dense, flagged where a seed missed its
    cost target (no site left saved cost)."""
    text = f"{agg['macs'] / 1e6:.2f}M ({agg['macs'] / dense_row['macs']:.0%})"
    return text + (f" ✗ target missed ({agg['budget_missed']} of {agg['seeds']})" if agg.get("budget_missed") else "")


def speed_text(agg: dict, tag: str = "large") -> str:
    """``1.63x ±1.2%``: the speedup (mean over seeds) and its spread (timing, or over seeds where larger)."""
    interval = speed_interval(agg, tag)
    if interval is None:
        return "-"
    s = agg[f"speedup_{tag}"]
    return f"{s:.2f}x ±{(interval[1] - s) / s:.1%}"


def prediction_table(rows: list[dict], aggregates: list[dict]) -> str:
    """Predicted (time cost model) against measured speedup, per strategy and budget; empty without one."""
    mine = [a for a in aggregates if a.get("predicted_speedup") is not None]
    if not mine:
        return ""
    batch = next((r["cost_batch"] for r in rows if r.get("cost_batch")), "?")
    lines = [f"\nSpeedup predicted by the cost model against measured (batch {batch}, same timing as above):\n",
             "| strategy | budget | predicted speedup | measured speedup | predicted / measured - 1 |",
             "|---|---|---|---|---|"]
    for a in mine:
        err = a.get("prediction_error")
        lines.append(f"| {a['strategy']} | {budget_text(a['budget'])} | "
                     f"{_pm(a['predicted_speedup'], a['predicted_speedup_std'])} | "
                     f"{_pm(a.get('measured_speedup'), a.get('measured_speedup_std'))} | "
                     f"{'-' if err is None else f'{err:+.1%}'} |")
    return "\n".join(lines) + "\n"


def rows_csv(rows: list[dict], metric: str = "top1") -> str:
    """One line per row; the metric's columns are named by the metric (``top1``, ``mIoU``, ...)."""
    cols = ["strategy", "budget", "seed", "n_attn", "n_act", "sites", f"{metric}_before_finetune", metric, "params",
            "macs", "throughput_b1", "throughput_large", "speedup_b1", "speedup_b1_spread", "speedup_large",
            "speedup_large_spread", "timed_as", "wall_s", "unreachable"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({**r, "budget": budget_text(r["budget"]), "sites": " ".join(r.get("sites", [])),
                    f"{metric}_before_finetune": r.get("metric_before_finetune"), metric: r.get("metric")})
    return buf.getvalue()


def pareto_plot(path: Path, dense_row: dict, aggregates: list[dict], title: str, metric: str = "top1") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = "osD^v<>phX*"
    names = sorted({a["strategy"] for a in aggregates})
    for i, name in enumerate(names):
        pts = [a for a in aggregates if a["strategy"] == name and a.get("speedup_large") is not None]
        if not pts:
            continue
        xerr = [p["speedup_large"] - speed_interval(p)[0] for p in pts]   # timing spread, or over seeds
        ax.errorbar([p["speedup_large"] for p in pts], [p["metric"] for p in pts],
                    xerr=xerr, yerr=[p["metric_std"] or 0 for p in pts],
                    fmt=markers[i % len(markers)], capsize=3, label=name, linestyle="none")
        for p in pts:
            ax.annotate(budget_text(p["budget"]), (p["speedup_large"], p["metric"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    ax.scatter([1.0], [dense_row["metric"]], marker="*", s=160, color="black", label="dense", zorder=5)
    ax.set_xlabel("measured speedup over dense (large batch)")
    ax.set_ylabel("top-1 accuracy (%)" if metric == "top1" else metric)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def attach_speed(rows: list[dict], dense_row: dict, timing: dict) -> None:
    """Copy throughput and speedup per row out of a bench.measure result."""
    results = timing["results"]
    sizes = sorted({r["batch_size"] for r in results})
    small, large = sizes[0], sizes[-1]
    by = {(r["model"], r["batch_size"]): r for r in results}
    for row in [dense_row, *rows]:
        name = "dense" if row is dense_row else row.get("timed_as", row["id"])
        for tag, size in (("b1", small), ("large", large)):
            r = by.get((name, size))
            if r is None:
                continue
            row[f"throughput_{tag}"] = r["throughput_img_s"]
            row[f"speedup_{tag}"] = r.get("speedup", 1.0)
            row[f"speedup_{tag}_spread"] = r.get("speedup_spread", 0.0)
            row[f"mac_ratio_{tag}"] = r.get("mac_ratio", 1.0)
        row["large_batch"] = large
        if row.get("cost_batch") is not None and (name, row["cost_batch"]) in by:
            row["measured_speedup"] = by[(name, row["cost_batch"])].get("speedup", 1.0)
            row["prediction_error"] = row["predicted_speedup"] / row["measured_speedup"] - 1


def untrusted_timing(timing: dict | None, rows: list[dict], far: float = 0.5) -> list[str]:
    """Why this comparison's speed columns cannot be trusted, one sentence per reason (none: they can).

    A loaded machine times every model under others' noise. The timing itself keeps every core busy, so a
    load average about the core count is the run's own; above it by more than a quarter (at the start and
    the end of timing alike), other work shared the machine. A model so small that fixed per-call overheads
    dominate shows it in every row: the measured speedup is far from the MAC ratio (below ``1 - far`` or
    above ``1 + far`` of it) on every row."""
    reasons = []
    env = (timing or {}).get("environment", {})
    cores = os.cpu_count() or 1
    loads = [v[0] for v in (env.get("load_start"), env.get("load_end")) if v]
    if loads and min(loads) > 1.25 * cores:
        reasons.append(f"the load average was {min(loads):.1f}-{max(loads):.1f} on {cores} cores while the models "
                       "were timed: other work shared the machine; rerun on a quiet one.")
    ratios = [r["speedup_large"] / r["mac_ratio_large"] for r in rows
              if r.get("speedup_large") and r.get("mac_ratio_large")]
    if ratios and all(not (1 - far) <= x <= (1 + far) for x in ratios):
        reasons.append(f"on every row the measured speedup is far from the MAC ratio ({min(ratios):.0%}-"
                       f"{max(ratios):.0%} of it): fixed per-call overheads dominate a model this small, so the "
                       "speed columns say little about the models; time a larger model or batch.")
    return reasons


def write_outputs(out: Path, spec: CompareSpec, dense_row: dict, rows: list[dict], timing: dict | None,
                  meta: dict) -> dict:
    aggregates = aggregate(rows)
    metric = meta.get("metric_name", "top1")
    large = dense_row.get("large_batch", max(spec.batch_sizes))
    md = markdown_table(dense_row, aggregates, large, metric) + prediction_table(rows, aggregates)
    machine = (timing or {}).get("environment", {})
    budgets = sorted({json.dumps(a["budget"], sort_keys=True) for a in aggregates},
                     key=lambda b: sorted(v for v in json.loads(b).values() if isinstance(v, (int, float))))
    title = (f"{meta.get('model', '')} on {meta.get('data', '')}: budget " +
             ", ".join(budget_text(json.loads(b)) for b in budgets))
    warnings_ = "".join(f"**Timing cannot be trusted here:** {why}\n\n" for why in untrusted_timing(timing, rows))
    header = (f"# hetprune compare\n\n{title}; seeds {spec.seeds}.\n\n{warnings_}"
              f"Machine: {machine.get('device_name', '?')}, torch {machine.get('torch', '?')}, "
              f"{machine.get('threads', '?')} threads. Command: `{meta.get('command', '')}`\n\n"
              f"{base_text(meta.get('base') or {})}"
              "MACs per image (1 MAC = 2 FLOPs). Speedup = dense time / pruned time, timed interleaved in one "
              f"process at batch {large}; models with the same structure are timed once; ± is the spread (half "
              "the interquartile range of the per-round ratios, or the spread over seeds where larger), and rows "
              "whose ranges overlap are a tie on speed.\n\n")
    write_text_atomic(out / "results.md", header + md)
    write_text_atomic(out / "results.csv", rows_csv(rows, metric))
    data = {"meta": meta, "dense": dense_row, "rows": rows, "aggregates": aggregates, "timing": timing,
            "untrusted_timing": untrusted_timing(timing, rows),
            "settings": spec.settings}
    write_json_atomic(out / "results.json", data)
    pareto_plot(out / "pareto.png", dense_row, aggregates, title, metric)
    return {"markdown": warnings_ + md, "aggregates": aggregates}


def base_text(base: dict) -> str:
    """Where the dense model came from, for the results' header (its weights, where hetprune made them)."""
    if not base.get("source"):
        return ""
    weights = f"; weights {base['weights']}" if base.get("weights") else ""
    return f"Base model: {base['source']}{weights}.\n\n"


@dataclass
class CompareResult:
    """What :func:`compare` returns: one row per (strategy, budget, seed), their mean ± std per (strategy,
    budget), the dense model's row, and the Markdown table also written to ``out/results.md``."""

    rows: list[dict]
    aggregates: list[dict]
    dense: dict
    markdown: str
    out: Path


def merged_settings(strategies: list, settings: dict | None = None, config_file: str | None = None,
                    sets: list[str] | None = None, **overrides) -> dict:
    """One settings dict for every strategy compared: all their sections merged, then the user's values."""
    from . import config as config_mod

    defaults: dict = {}
    types: dict = {}
    for s in strategies:
        defaults.update(getattr(s, "defaults", {}))
        types.update(getattr(s, "setting_types", None) or {})
    given = {**(settings or {}), **{k: v for k, v in overrides.items() if v is not None}}
    return config_mod.resolve(defaults, config_file, given, sets, types=types)


def compare(model: nn.Module, task, strategies=DEFAULT_STRATEGIES, budgets=(12,), seeds=(0,), *,
            settings: dict | None = None, out: str | Path = "runs/compare", resume: bool = False,
            overwrite: bool = False, batch_sizes=(1, 256), speed_budget_s: float = CompareSpec.speed_budget_s,
            jobs: int = 1, spec=None, base_info: dict | None = None,
            registry: Registry | None = None, device: str | None = None, amp: str | None = None, adapter=None,
            data_spec: str | None = None, meta: dict | None = None, log: Callable[[str], None] = print,
            progress: bool = True) -> CompareResult:
    """Run several strategies on ``model`` for ``task`` under one harness: the same dense model, data,
    settings, seeds and timer; write ``results.md``, ``results.csv``, ``results.json`` and ``pareto.png``
    to ``out`` and return the rows.

    ``speed_budget_s``: seconds per batch size the timer may add to know every speedup within ±2 %
    (models with the same structure are timed once and share their figure).
    ``budgets`` are site counts or :class:`~hetprune.budget.Budget` objects (``Budget(target_macs=0.5)``);
    every other argument means what it means for :func:`hetprune.prune`. Finished rows are kept as they
    finish, so ``resume=True`` continues an interrupted comparison.
    """
    from . import cost_model, devices
    from .api import check_names, dense_info, run_device
    from .plugins import get_registry
    from .task import as_task

    registry = registry or get_registry()
    names = [strategies] if isinstance(strategies, str) else list(strategies)
    if not names or len(set(names)) != len(names):
        raise HetpruneError(f"strategies must name each strategy once, got {names}")
    built = [registry.build("strategy", n) for n in names]
    the_budgets = [b if isinstance(b, Budget) else Budget(sites=_whole(b, "a budget")) for b in budgets]
    seeds = [_whole(s, "a seed") for s in seeds]
    batch_sizes = [_whole(b, "a batch size") for b in batch_sizes]
    if not the_budgets or not seeds or not batch_sizes or any(b < 1 for b in batch_sizes):
        raise HetpruneError(f"compare needs budgets, seeds and batch sizes >= 1; got {list(budgets)}, {seeds}, "
                            f"{batch_sizes}")
    if jobs < 1:
        raise HetpruneError(f"jobs must be >= 1, got {jobs}")
    if dist.active() and jobs > 1:
        raise HetpruneError("jobs > 1 runs rows in parallel processes on one machine; under torchrun use jobs=1")
    run_settings = merged_settings(built, settings, device=device, amp=amp)
    dev = run_device(run_settings)
    check_names(registry, run_settings)
    the_budgets = [cost_model.bind(b, run_settings, registry) for b in the_budgets]
    for name in sorted(cost_model.refuse_parallel(jobs, the_budgets, run_settings)):
        cm = cost_model.build(registry, name, run_settings)   # time the models where it predicts, too
        if isinstance(getattr(cm, "batch_size", None), int) and cm.batch_size not in batch_sizes:
            batch_sizes.append(cm.batch_size)
    task = as_task(task)
    out = Path(out)
    with no_empty_folder_on_error(out):   # bad input found after the folder was made leaves none behind
        prepare_out(out, resume, overwrite, "compare")
        if not (isinstance(speed_budget_s, (int, float)) and speed_budget_s >= 0):
            raise HetpruneError(f"speed_budget_s must be a number of seconds >= 0, got {speed_budget_s!r}")
        spec_ = CompareSpec(names, the_budgets, seeds, run_settings, batch_sizes=batch_sizes,
                            device=run_settings["device"], speed_budget_s=float(speed_budget_s))
        adapter = resolve_adapter(model, adapter)   # a model no adapter serves fails before any work
        info = dense_info(model, task, spec, base_info, run_settings)
        plans = plan_rows(spec_, info["hash"], task.fingerprint)
        rows = run_rows(plans, registry, model, spec, task, info, out, resume=resume, jobs=jobs, data_spec=data_spec,
                        adapter=adapter, log=log, progress=progress)
        if not dist.is_main():  # rank 0 times the models and writes the results
            return CompareResult(rows, [], {}, "", out)
        from .costs import cost_summary

        example = devices.place(task.example(2), dev)
        dense_row = {"strategy": "dense", "metric": info["metric"], **cost_summary(model, example)}
        if task.metric_name == "top1":
            dense_row["top1"] = info["metric"]
        reached = [r for r in rows if "unreachable" not in r]   # a row that cannot meet its budget has no model
        timing = measure_rows(spec_, model, reached, out, input_shape=tuple(example.shape[1:]), log=log,
                              model_spec=spec, adapter=adapter)
        attach_speed(reached, dense_row, timing)
        written = write_outputs(out, spec_, dense_row, rows, timing,
                                {"model": spec.name if spec is not None else info["source"],
                                 "data": task.name, "metric_name": task.metric_name,
                                 "higher_is_better": task.higher_is_better, "base": info, **(meta or {})})
        return CompareResult(rows, written["aggregates"], dense_row, written["markdown"], out)


def _whole(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HetpruneError(f"{what} must be a whole number, got {value!r}")
    return value
