"""scripts/gpu-check.sh (issue 42, item 8; issue 57, item 6): its --cpu-smoke passes here within its budget, the
caps fit its budget (5.6 minutes, sized by the run on one H200) or the script refuses to start, it prints one summary table, and everything comes back as one
small tar file of logs and JSON."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def run(out: Path, *extra: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(out), *extra], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def test_caps_over_the_budget_are_refused_before_anything_runs(tmp_path):
    done = run(tmp_path / "r", "--cpu-smoke", env={"GPU_CHECK_BUDGET_S": "100"}, timeout=60)
    assert done.returncode == 2
    assert "the steps' caps add up to 335s, over the 100s budget" in done.stderr
    assert not (tmp_path / "r.tar.gz").exists() and list((tmp_path / "r").iterdir()) == []


def test_an_unknown_option_is_one_line(tmp_path):
    done = run(tmp_path / "r", "--gpu-please", timeout=60)
    assert done.returncode == 2 and "unknown option --gpu-please; allowed: --cpu-smoke" in done.stderr


def test_the_caps_fit_the_default_budget():
    text = SCRIPT.read_text()
    caps = text.split("CAPS=(", 1)[1].split(")", 1)[0].split()
    assert sum(int(c.split(":")[1]) for c in caps) <= 335
    assert "BUDGET=${GPU_CHECK_BUDGET_S:-335}" in text


@pytest.mark.slow
def test_the_cpu_smoke_passes_every_step_and_packs_one_small_tar(tmp_path):
    out = tmp_path / "results"
    done = run(out, "--cpu-smoke")
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stdout[-2000:] + done.stderr[-2000:]
    lines = summary.splitlines()
    assert lines[0].startswith("GPU check: ") and "0 step(s) did not pass" in lines[0]
    for step in ("environment", "speed", "probe", "pytest-cuda", "hetdpt-plus-speed"):
        row = next(line for line in lines if line.startswith(step + " "))
        assert "passed" in row, summary
    speed = next(line for line in lines if line.startswith("speed "))
    assert "fp32" in speed and "bf16-weights" in speed and "MAC ratio" in speed
    probe = next(line for line in lines if line.startswith("probe "))
    assert "step alone" in probe and "loader alone" in probe and "bound by the" in probe
    tar = out.parent / "results.tar.gz"
    assert tar.stat().st_size < 1_000_000
    with tarfile.open(tar) as packed:
        names = {Path(n).name for n in packed.getnames()}
    assert {"summary.txt", "plan.json", "gpu-speed.json", "environment.json", "probe.log"} <= names
    assert not {n for n in names if n.endswith((".jpg", ".safetensors", ".pt"))}   # no images, no weights
