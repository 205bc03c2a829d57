"""A comparison's results: mean ± std over seeds per (strategy, budget), the Markdown table, the CSV, the
JSON and the accuracy-against-speedup plot."""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
from pathlib import Path

from ...core.io import write_json_atomic, write_text_atomic
from ...pruning.report import legacy_metric

from .spec import CompareSpec, budget_text


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
            read = (lambda m: legacy_metric(m, key[len("metric"):])) if key.startswith("metric") else \
                (lambda m: m.get(key))
            vals = [read(m) for m in _m if read(m) is not None]
            return mean_std(vals) if vals else (None, None)

        agg = {"strategy": name, "budget": json.loads(budget), "seeds": len(members)}
        speed = sorted({k for m in members for k in m if k.startswith(("throughput_", "speedup_", "mac_ratio_"))})
        for key in ("metric", "metric_before_finetune", "n_attn", "n_act", "macs", "params", *speed, "wall_s",
                    "predicted_speedup", "measured_speedup", "prediction_error"):
            agg[key], agg[f"{key}_std"] = stat(key)
        if all(m.get("metric_name", "top1") == "top1" for m in members):   # top-1 rows keep their old columns
            for key in ("metric", "metric_before_finetune"):
                old = "top1" + key[len("metric"):]
                agg[old], agg[f"{old}_std"] = agg[key], agg[f"{key}_std"]
        agg["splits"] = sorted({f"{m['n_attn']}+{m['n_act']}" for m in members})
        agg["budget_missed"] = sum(m.get("budget_met") is False for m in members)
        agg["structures"] = sorted({m["structure"] for m in members if "structure" in m})
        weights = [m.get("weights") for m in members]
        # several seeds that made the very same model: their std of 0 is no evidence of stability
        agg["identical_seeds"] = len(members) > 1 and None not in weights and len(set(weights)) == 1
        agg["older"] = sorted({m["older"] for m in members if m.get("older")})   # reused by --reuse-older
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


def metric_label(name: str) -> str:
    return "top-1 %" if name == "top1" else name


def markdown_table(dense_row: dict, aggregates: list[dict], large: int, metric: str = "top1",
                   sizes: list[int] | None = None) -> str:
    """The results table: a throughput column per timed batch size (``sizes``; default the largest only),
    the speedup at the largest (``large``)."""
    label = metric_label(metric)
    sizes = list(sizes or [large])
    head = (f"| strategy | budget | seeds | split (attn+act) | {label} before FT | {label} | MACs | params | "
            + "".join(f"img/s b{n} | " for n in sizes) + f"speedup b{large} (± spread) | MAC ratio | note |\n"
            + "|---" * (11 + len(sizes)) + "|\n")
    lines = [f"| dense | - | - | - | - | {dense_row['metric']:.2f} | {dense_row['macs'] / 1e6:.2f}M | "
             f"{dense_row['params'] / 1e6:.3f}M | "
             + "".join(f"{dense_row.get(f'throughput_b{n}', 0):.0f} | " for n in sizes) + "1.00 | 1.00 | |"]
    for a in aggregates:
        if "unreachable" in a:
            lines.append(f"| {a['strategy']} | {budget_text(a['budget'])} | {a['seeds']} | - | - | cannot reach the "
                         "budget | - | - | " + "- | " * len(sizes) + f"- | - | {a['unreachable']} |")
            continue
        mac_ratio = dense_row["macs"] / a["macs"] if a["macs"] else float("nan")
        notes = [n for n in (a.get("speed_note", ""), "every seed made the very same model (std 0 says nothing)"
                             if a.get("identical_seeds") else "",
                             f"made by an older behaviour ({'; '.join(a['older'])}), reused by --reuse-older"
                             if a.get("older") else "") if n]
        lines.append(
            f"| {a['strategy']} | {budget_text(a['budget'])} | {a['seeds']} | {', '.join(a['splits'])} | "
            f"{_pm(a['metric_before_finetune'], a['metric_before_finetune_std'])} | "
            f"{_pm(a['metric'], a['metric_std'])} | "
            f"{macs_text(a, dense_row)} | {a['params'] / 1e6:.3f}M | "
            + "".join(f"{_pm(a.get(f'throughput_b{n}'), a.get(f'throughput_b{n}_std'), 0)} | " for n in sizes)
            + f"{speed_text(a)} | {mac_ratio:.2f} | {'; '.join(notes)} |")
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


def rows_csv(rows: list[dict], metric: str = "top1", sizes: list[int] | None = None) -> str:
    """One line per row; the metric's columns are named by the metric (``top1``, ``mIoU``, ...), the speed
    columns by the batch sizes that were timed (``sizes``)."""
    speed = [c for n in (sizes or []) for c in (f"throughput_b{n}", f"speedup_b{n}", f"speedup_b{n}_spread")]
    cols = ["strategy", "budget", "seed", "n_attn", "n_act", "sites", f"{metric}_before_finetune", metric, "params",
            "macs", *speed, "timed_as", "weights", "wall_s", "unreachable"]
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


def write_outputs(out: Path, spec: CompareSpec, dense_row: dict, rows: list[dict], timing: dict | None,
                  meta: dict) -> dict:
    aggregates = aggregate(rows)
    metric = meta.get("metric_name", "top1")
    large = dense_row.get("large_batch", max(spec.batch_sizes))
    sizes = dense_row.get("batch_sizes", sorted(spec.batch_sizes))
    md = markdown_table(dense_row, aggregates, large, metric, sizes) + prediction_table(rows, aggregates)
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
    write_text_atomic(out / "results.csv", rows_csv(rows, metric, sizes))
    data = {"meta": meta, "dense": dense_row, "rows": rows, "aggregates": aggregates, "timing": timing,
            "untrusted_timing": untrusted_timing(timing, rows),
            "settings": spec.settings.as_settings()}
    write_json_atomic(out / "results.json", data)
    pareto_plot(out / "pareto.png", dense_row, aggregates, title, metric)
    return {"markdown": warnings_ + md, "aggregates": aggregates}


def base_text(base: dict) -> str:
    """Where the dense model came from, for the results' header (its weights, where hetprune made them)."""
    if not base.get("source"):
        return ""
    weights = f"; weights {base['weights']}" if base.get("weights") else ""
    return f"Base model: {base['source']}{weights}.\n\n"


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
