"""Ablation: does the accuracy predictor, fitted on cheap short fine-tunes,
pick the split that full fine-tuning would? And which scorer's sites recover
best for that split?

Ground truth is every feasible split (n_attn, n_act) of the budget, each
pruned and fine-tuned with the full schedule (``hetprune.pipeline.FixedSplit``
under the compare harness, so rows are saved as they finish and resumable).
"""

from __future__ import annotations

import json
from pathlib import Path

from scipy import stats

from .cache import fingerprint
from .compare import RowPlan, mean_std
from .errors import HetpruneError
from .io import write_json_atomic, write_text_atomic

Pair = tuple[int, int]


def argmax_pair(values: dict[Pair, float]) -> Pair:
    """The best pair; ties go to fewer attention removals (as hetdpt breaks them)."""
    return max(values, key=lambda p: (values[p], -p[0]))


def _stat(value) -> float | None:
    value = float(value)
    return None if value != value else value  # NaN (e.g. constant input) -> None


def predictor_metrics(predicted: dict[Pair, float], true: dict[Pair, float], tolerance: float = 0.3) -> dict:
    """How good a predictor's pick is against the ground truth over the same splits."""
    pairs = sorted(true)
    missing = [p for p in pairs if p not in predicted]
    if missing:
        raise HetpruneError(f"the predictor gave no value for splits {missing}")
    pick = argmax_pair({p: predicted[p] for p in pairs})
    best = argmax_pair({p: true[p] for p in pairs})
    regret = true[best] - true[pick]
    pred = [predicted[p] for p in pairs]
    truth = [true[p] for p in pairs]
    enough = len(pairs) >= 2
    return {
        "pick": list(pick), "pick_predicted": predicted[pick], "pick_true": true[pick],
        "best": list(best), "best_true": true[best], "regret": regret,
        "spearman": _stat(stats.spearmanr(pred, truth).statistic) if enough else None,
        "kendall": _stat(stats.kendalltau(pred, truth).statistic) if enough else None,
        "within_tolerance": regret <= tolerance + 1e-12, "tolerance": tolerance,
    }


def budget_words(budget) -> str:
    """An ablation's budget: a site count (int), or a cost budget's description."""
    return f"{budget} sites" if isinstance(budget, int) else str(budget)


def split_plans(pairs: list[Pair], seeds: list[int], settings: dict, budget, base_hash: str, data_fp: str,
                scorer: str | None = None, kind: str = "truth", unused: tuple[str, ...] = ()) -> list[RowPlan]:
    """Rows that fine-tune each split fully (ground truth), or one split per scorer. ``unused``: settings
    sections a fixed split never reads (the allocating strategy's own), left out of the rows' keys so that
    ablations of that strategy's options share one ground truth."""
    plans = []
    for seed in seeds:
        for a, m in pairs:
            s = json.loads(json.dumps(settings))
            s["seed"] = seed
            if scorer:
                s["scorer"] = scorer
            tag = f"{kind}-a{a}-m{m}" + (f"-{scorer}" if scorer else "") + f"__seed{seed}"
            keyed = {k: v for k, v in s.items() if k not in unused}
            key = fingerprint({"kind": kind, "split": [a, m], "seed": seed, "settings": keyed, "base": base_hash,
                               "data": data_fp})
            label = f"scorer {scorer}" if scorer else f"split {a}+{m}"
            plans.append(RowPlan(tag, "fixed-split", budget, seed, s, key, split=(a, m), label=label))
    return plans


def mean_by_pair(rows: list[dict]) -> tuple[dict[Pair, float], dict[Pair, float]]:
    groups: dict[Pair, list[float]] = {}
    for r in rows:
        groups.setdefault((r["n_attn"], r["n_act"]), []).append(r["top1"])
    stats_ = {p: mean_std(v) for p, v in groups.items()}
    return {p: m for p, (m, _) in stats_.items()}, {p: s for p, (_, s) in stats_.items()}


def markdown(result: dict) -> str:
    schedule = result.get("point_finetune", "short_finetune")   # the section that fine-tuned the cheap points
    lines = [f"# hetprune ablate: budget {budget_words(result['budget'])}, seeds {result['seeds']}", "",
             f"Command: `{result.get('command', '')}`", "",
             "Ground truth: every feasible split fine-tuned with the full schedule "
             f"(`finetune`: {result['finetune']}); predictors fitted on the cheap points "
             + (f"(`{schedule}`: {result[schedule]})."
                if result.get("point_selection", "oneshot") == "oneshot" else
                f"(chosen gradually by the run's scorer `{result.get('scorer')}`, no further fine-tune)."), "",
             "## Predictors", "",
             "| predictor | pick (attn+act) | predicted % | true % of pick | best split | best true % | regret (points) "
             "| Spearman | Kendall | within 0.3 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in result["predictors"].items():
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"| {name} | {m['pick'][0]}+{m['pick'][1]} | {m['pick_predicted']:.2f} | {m['pick_true']:.2f} | "
                     f"{m['best'][0]}+{m['best'][1]} | {m['best_true']:.2f} | {m['regret']:.2f} | "
                     f"{fmt(m['spearman'])} | {fmt(m['kendall'])} | {'yes' if m['within_tolerance'] else 'no'} |")
    lines += ["", "## Every split", "", "| split (attn+act) | true top-1 % (mean ± std) | cheap point % | "
              + " | ".join(f"{n} predicted %" for n in result["predictors"]) + " |",
              "|---|---|---|" + "---|" * len(result["predictors"])]
    for s in result["splits"]:
        cheap = "-" if s["cheap"] is None else f"{s['cheap']:.2f}"
        preds = " | ".join(f"{s['predicted'][n]:.2f}" for n in result["predictors"])
        lines.append(f"| {s['n_attn']}+{s['n_act']} | {s['true']:.2f} ± {s['true_std']:.2f} | {cheap} | {preds} |")
    if result.get("scorers"):
        split = result["scorer_split"]
        lines += ["", f"## Scorers at split {split[0]}+{split[1]}", "",
                  "| scorer | top-1 % (mean ± std) | top-1 before fine-tune % | sites (first seed) |",
                  "|---|---|---|---|"]
        for name, s in result["scorers"].items():
            lines.append(f"| {name} | {s['top1']:.2f} ± {s['top1_std']:.2f} | {s['before']:.2f} | "
                         f"{' '.join(s['sites'])} |")
    return "\n".join(lines) + "\n"


def plots(out: Path, result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = result["splits"]
    x = [s["n_attn"] for s in splits]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.errorbar(x, [s["true"] for s in splits], yerr=[s["true_std"] for s in splits], fmt="o-", color="black",
                capsize=3, label="true (full fine-tune)")
    cheap = [(s["n_attn"], s["cheap"]) for s in splits if s["cheap"] is not None]
    if cheap:
        ax.plot(*zip(*cheap), "s", color="gray", alpha=0.7, label="cheap points (short fine-tune)")
    for name, m in result["predictors"].items():
        line, = ax.plot(x, [s["predicted"][name] for s in splits], "--", label=f"{name} (predicted)")
        ax.axvline(m["pick"][0], color=line.get_color(), alpha=0.4, linestyle=":")
    ax.set_xlabel("attention sites removed" + (f" (activation sites = {result['budget']} - x)"
                                                if isinstance(result["budget"], int) else ""))
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title(f"budget {budget_words(result['budget'])}: predicted vs true accuracy of every split", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "splits.png", dpi=120)
    plt.close(fig)
    if result.get("scorers"):
        names = list(result["scorers"])
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar(names, [result["scorers"][n]["top1"] for n in names],
               yerr=[result["scorers"][n]["top1_std"] for n in names], capsize=4, color="tab:blue")
        lo = min(result["scorers"][n]["top1"] - result["scorers"][n]["top1_std"] for n in names)
        ax.set_ylim(max(0, lo - 5), 100)
        split = result["scorer_split"]
        ax.set_ylabel("top-1 after fine-tune (%)")
        ax.set_title(f"scorers at split {split[0]}+{split[1]}", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "scorers.png", dpi=120)
        plt.close(fig)


def write(out: Path, result: dict) -> None:
    write_json_atomic(out / "ablation.json", result)
    write_text_atomic(out / "ablation.md", markdown(result))
    plots(out, result)
