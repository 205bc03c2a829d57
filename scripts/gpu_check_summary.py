"""The one table scripts/gpu-check.sh prints at its end: each step's outcome, its seconds, and what it measured,
read from the JSON the steps wrote into the results folder.

    python scripts/gpu_check_summary.py RESULTS_DIR SECONDS
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def speed(folder: Path) -> str:
    res = read(folder / "gpu-speed.json")
    if not res or not res.get("rows"):
        return ""
    largest = max(r["batch"] for r in res["rows"])
    rows = [r for r in res["rows"] if r["batch"] == largest]
    return (f"batch {largest}: " + " | ".join(f"{r['mode']} {r['speedup']:.2f}x ({r['pruned_img_s']:,.0f} img/s)"
                                              for r in rows) + f"; MAC ratio {rows[0]['mac_ratio']:.2f}x")


def loader(folder: Path) -> str:
    res = read(folder / "loader.json")
    rows = (res or {}).get("rows") or []
    parts = []
    for r in rows:
        rate, per = r.get("images_per_s"), r.get("images_per_s_per_worker")
        if rate is None:
            continue
        parts.append(f"{r.get('pipeline', '?')}/{r.get('augment', '?')} x{r.get('workers', '?')}: {rate:,.0f} img/s"
                     + (f" ({per:,.0f}/worker)" if per is not None else ""))
    return " | ".join(parts)


def probe(folder: Path) -> str:
    p = (read(folder / "plan.json") or {}).get("probe")
    if not p:
        return ""
    text = f"training {p['train_ips']:,.0f} img/s at batch {p['batch']} ({p['amp']})"
    if p.get("step_ips") and p.get("loader_ips"):
        text += (f"; step alone {p['step_ips']:,.0f}, loader alone {p['loader_ips']:,.0f} ({p.get('workers')} "
                 f"workers): bound by {p['bound']}")
    if p.get("peak_memory_gb") is not None:
        text += f"; {p['peak_memory_gb']:.1f} GiB peak"
    return text


def pytest_counts(folder: Path) -> str:
    try:
        suite = ET.parse(folder / "pytest-cuda.xml").getroot()
    except (OSError, ET.ParseError):
        return ""
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    if suite is None:
        return ""
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return (f"{n['tests'] - n['failures'] - n['errors'] - n['skipped']} passed, {n['failures']} failed, "
            f"{n['errors']} errors, {n['skipped']} skipped")


def plus(folder: Path) -> str:
    for path in sorted(folder.glob("hetdpt-plus-speed-*.json")):
        res = read(path) or {}
        rows = [r for r in res.get("results", []) if r.get("speedup") and r["model"] != res.get("reference")]
        if rows:
            return " | ".join(f"{r['model']} {r['speedup']:.2f}x at batch {r['batch_size']}" for r in rows)
    return ""


def environment(folder: Path) -> str:
    env = read(folder / "environment.json") or {}
    gpus = env.get("gpus") or []
    what = ", ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in gpus) or "no GPU"
    return f"{what}; torch {env.get('torch')}, CUDA {env.get('cuda')}, {env.get('cpus')} CPUs"


MEASURED = {"environment": environment, "speed": speed, "loader": loader, "probe": probe,
            "pytest-cuda": pytest_counts, "hetdpt-plus-speed": plus}


def main(folder: str, seconds: str) -> int:
    folder = Path(folder)
    steps = [line.split("\t") for line in (folder / "steps.tsv").read_text().splitlines() if line.strip()]
    failed = sum(1 for _, status, _ in steps if not status.startswith(("passed", "skipped")))
    print(f"GPU check: {environment(folder)}; {seconds} s; {failed} step(s) did not pass")
    width = max(len(name) for name, _, _ in steps)
    for name, status, took in steps:
        measured = MEASURED.get(name, lambda f: "")(folder) if name != "environment" else ""
        print(f"{name:<{width}}  {status:<28}  {took:>4}s  {measured}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
