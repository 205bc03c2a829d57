"""Issue 58: the first compare's default schedule is what the docs say. ``hetprune compare --plan`` of the
embedded default (counts only: nothing trained, no probe) against the compare guide's transcript of the timed
first compare (benchmarks/first_compare.py --transcript): the same rows, as many MAP points, and the same
number of checks spread along the line. Changing compare's or hetdpt's defaults without rerunning the
transcript fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "compare.md"


def transcript() -> list[str]:
    text = GUIDE.read_text()
    block = text[text.index("```text\n$ hetprune compare\n"):]
    return block[:block.index("\n```")].splitlines()


def test_the_default_compares_plan_is_the_run_the_guide_shows(tmp_path, monkeypatch):
    from hetprune.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["compare", "--plan", "--plan-probe", "0", "--out", str(tmp_path / "out")]) == 0
    plan = json.loads((tmp_path / "out" / "work" / "plan.json").read_text())
    steps = {s["stage"]: s["what"] for s in plan["steps"]}

    lines = transcript()
    rows = [m.group(2) for m in (re.match(r"\[(\d+)/\d+\] (\S+)__target_macs([\d.]+)__seed(\d+): running", line)
                                 for line in lines) if m]
    assert plan["title"] == f"compare {', '.join(rows)}, {len(rows)} rows"
    assert all("__target_macs0.45__seed0: running" in line for line in lines if line.endswith(": running"))
    points = [line for line in lines if line.startswith("[hetdpt] MAP point ")]
    assert steps["hetdpt: stage 1: MAP points"].startswith(f"{len(points)} points, ")
    [checked] = [line for line in lines if line.startswith("[hetdpt] checking the best predicted split of each part")]
    splits = checked.split(": ", 1)[1].split(", ")
    checks = steps["hetdpt: stage 1: pipeline checks"]
    assert checks.startswith(f"{len(splits)} splits by successive halving") and checks.endswith(
        "one in each part of the line")
    # the gate phase the guide's rows learned on is the default's (scoring.subset 300 a gate epoch)
    assert re.search(r"epochs x 300 images", steps["hetdpt: select: gate phase"])
