"""Where a checked pick's regret comes from (issue 43): the predictor, or the checks? No training: it reads the
committed map-points studies.

A scheme with checks (``hetdpt.verify=K``) fits a predictor on its points, measures the K best predicted
splits (a check each), and picks the best measured one. Its regret against the truth (every split fine-tuned
on the final schedule, mean over seeds) splits in two, per seed:

* predictor: the truth's best split minus the best of the K checked (by their truth): the best split was not
  among those checked;
* checks: the best of the K checked minus the pick (both by their truth): the checks ranked the K otherwise
  than the final pipeline does.

Also per checked split: its check minus that seed's own truth row for the split (what the check measured
against what the final run on that seed made of it), and, over the pairs of checked splits whose truths differ
by more than the target's seed-noise floor, the share the checks order as the truth does.

    python benchmarks/check_regret.py      # reads map-points-selection.json and map-points-scoring1000.json

Writes benchmarks/results/check-regret.{md,json}.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

from studylib.files import add_study_arguments, read_studies, write
from studylib.runs import floors_of
from studylib.tables import table

RESULTS = Path(__file__).resolve().parent / "results"
STUDIES = ["map-points-selection", "map-points-scoring1000"]


def checks_of(fit: dict) -> dict[str, float] | None:
    """The K checked splits and what their check measured: ``verified`` (checks by points) or the first round
    of successive halving (``verify_by pipeline``), where every one of the K was measured."""
    if fit.get("verified"):
        return dict(fit["verified"])
    rounds = (fit.get("pipeline") or {}).get("rounds") or []
    if rounds:
        return {f"{m['n_attn']}+{m['n_act']}": m["metric"] for m in rounds[0]["measured"]}
    return None


def split_regret(study: dict) -> list[dict]:
    """One row per (benchmark, target, scheme, predictor) with checks: both parts of the regret per seed."""
    floors = floors_of(study["oracle"])
    picks = {(r["bench"], r["target"], r["scheme"], r["predictor"], s["seed"]): (s["pick"], s["regret"])
             for r in study["rows"] for s in r["seeds"]}
    rows = []
    for u in study["units"]:
        for target, pt in u["per_target"].items():
            truth = study["truth"].get(f"{u['bench']}|{target}")
            if truth is None:
                continue
            true = {k: v["true"] for k, v in truth["splits"].items()}
            own = {k: v["per_seed"].get(str(u["seed"])) for k, v in truth["splits"].items()}
            best = max(true, key=lambda k: (true[k], -int(k.split("+")[0])))   # ties: fewer attention, as map_points
            floor = floors[(u["bench"], target)]
            for label, fit in pt["fits"].items():
                checks = checks_of(fit)
                pick, regret = picks.get((u["bench"], target, u["scheme"], label, u["seed"]), (None, None))
                if not checks or pick is None:
                    continue
                if pick not in checks or abs(true[best] - true[pick] - regret) > 1e-6:
                    raise SystemExit(f"{u['bench']} {target} {u['scheme']} {label} seed {u['seed']}: the study's "
                                     f"pick {pick} (regret {regret}) is not the best of its checks {checks}")
                best_checked = max(true[k] for k in checks)
                errors = [checks[k] - own[k] for k in checks if own[k] is not None]
                apart = [(a, b) for a, b in itertools.combinations(checks, 2) if abs(true[a] - true[b]) > floor]
                agree = [(checks[a] - checks[b]) * (true[a] - true[b]) > 0 for a, b in apart]
                rows.append({"bench": u["bench"], "target": target, "scheme": u["scheme"], "predictor": label,
                             "seed": u["seed"], "best": best, "checked": checks,
                             "truth_of_checked": {k: true[k] for k in checks}, "pick": pick,
                             "predictor_part": true[best] - best_checked, "checks_part": best_checked - true[pick],
                             "check_minus_own_truth": errors, "pairs_apart": len(apart),
                             "pairs_ordered_as_truth": sum(agree), "floor": floor})
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per (benchmark, target, scheme, predictor): both parts' means over the seeds, the checks' mean error
    against their own seed's truth and the share of clearly apart pairs they order as the truth does."""
    out = []
    key = lambda r: (r["bench"], r["target"], r["scheme"], r["predictor"])  # noqa: E731
    for k, group in itertools.groupby(sorted(rows, key=key), key=key):
        group = list(group)
        errors = [e for r in group for e in r["check_minus_own_truth"]]
        apart = sum(r["pairs_apart"] for r in group)
        out.append({"bench": k[0], "target": k[1], "scheme": k[2], "predictor": k[3], "seeds": len(group),
                    "floor": group[0]["floor"],
                    "predictor_part": statistics.mean(r["predictor_part"] for r in group),
                    "checks_part": statistics.mean(r["checks_part"] for r in group),
                    "mean_check_error": statistics.mean(errors) if errors else None,
                    "mean_abs_check_error": statistics.mean(abs(e) for e in errors) if errors else None,
                    "pairs_apart": apart,
                    "ordered_as_truth": (sum(r["pairs_ordered_as_truth"] for r in group) / apart) if apart else None})
    return out


def target_name(target: str) -> str:
    return f"budget {target[1:]}" if target.startswith("b") else f"MACs {target[4:]}"


def fmt(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)


def markdown(studies: dict[str, dict], summaries: dict[str, list[dict]], command: str) -> str:
    lines = ["# Where a checked pick's regret comes from: the predictor or the checks", "",
             f"Produced by `{command}` from the committed studies (no training; the studies' own commands, "
             "machines and seeds are in their files).", "",
             "Per seed, a checked scheme's regret (the truth's best split minus its pick, by the truth: every "
             "split fine-tuned on the final schedule, mean over seeds) is the sum of two parts: **predictor** "
             "(the best split was not among the K checked: the truth's best minus the best checked one) and "
             "**checks** (the checks ranked the K otherwise than the truth: the best checked one minus the "
             "pick). Both are means over the seeds, in points. **check - truth**: a check's value minus the "
             "same seed's truth row for that split (the check's schedule and data against the final run's), "
             "mean over the checked splits; **ordered**: of the pairs of checked splits whose truths differ by "
             "more than the target's seed-noise floor, the share the checks order as the truth does.", ""]
    for name, summ in summaries.items():
        chosen = studies[name]["choice"]["chosen"]
        sets = " ".join(f"`--set {s}`" for s in studies[name].get("sets") or []) or "the defaults"
        lines += [f"## {name} ({sets})", "",
                  f"Its rule chose `{chosen['scheme']}` with `{chosen['predictor']}`. Per target, the rows of "
                  "`gp` (the predictor the 1,000-image study chose for its checks; every predictor's totals "
                  "below):", ""]
        lines += table(["scheme / predictor", "target", "floor", "regret = predictor + checks",
                        "check - truth (mean, mean abs)", "ordered"],
                       [[f"{s['scheme']} / {s['predictor']}", f"{s['bench']} {target_name(s['target'])}",
                         f"{s['floor']:.2f}", f"{s['predictor_part'] + s['checks_part']:.2f} = "
                         f"{s['predictor_part']:.2f} + {s['checks_part']:.2f}",
                         f"{fmt(s['mean_check_error'], '+.1f')}, {fmt(s['mean_abs_check_error'], '.1f')}",
                         f"{fmt(s['ordered_as_truth'], '.0%')} of {s['pairs_apart']}"]
                        for s in summ if s["predictor"] == "gp"])
        totals = {}
        for s in summ:
            t = totals.setdefault((s["scheme"], s["predictor"]), {"p": [], "c": [], "o": [], "n": 0, "e": [], "a": []})
            t["p"].append(s["predictor_part"])
            t["c"].append(s["checks_part"])
            if s["mean_check_error"] is not None:
                t["e"].append(s["mean_check_error"])
                t["a"].append(s["mean_abs_check_error"])
            if s["ordered_as_truth"] is not None:
                t["o"].append(s["ordered_as_truth"] * s["pairs_apart"])
                t["n"] += s["pairs_apart"]
        lines += ["", "Over every target (mean of the targets' parts), every predictor:", ""]
        lines += table(["scheme / predictor", "predictor part", "checks part", "ordered as the truth",
                        "check - truth (mean, mean abs)"],
                       [[f"{scheme} / {predictor}", f"{statistics.mean(t['p']):.2f}", f"{statistics.mean(t['c']):.2f}",
                         f"{fmt(sum(t['o']) / t['n'] if t['n'] else None, '.0%')} of {t['n']}",
                         f"{fmt(statistics.mean(t['e']) if t['e'] else None, '+.1f')}, "
                         f"{fmt(statistics.mean(t['a']) if t['a'] else None, '.1f')}"]
                        for (scheme, predictor), t in sorted(totals.items())])
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_study_arguments(p, STUDIES, "check-regret", RESULTS)
    args = p.parse_args(argv)
    studies = read_studies(args.results, args.studies, p.error)
    summaries = {name: summary(split_regret(study)) for name, study in studies.items()}
    command = "python benchmarks/check_regret.py" + ("" if args.studies == ",".join(STUDIES)
                                                     else f" --studies {args.studies}")
    res = {"command": command, "studies": list(studies), "summary": summaries}   # per seed: rerun it
    write(args.results, args.name, res, markdown(studies, summaries, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
