"""scripts/gpu-check.sh (issue 42, item 8): its --cpu-smoke passes here within its budget, the caps fit the
budget or the script refuses to start, and everything comes back as one tar file."""

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
    assert "the steps' caps add up to 465s, over the 100s budget" in done.stderr
    assert not (tmp_path / "r.tar.gz").exists() and list((tmp_path / "r").iterdir()) == []


def test_an_unknown_option_is_one_line(tmp_path):
    done = run(tmp_path / "r", "--gpu-please", timeout=60)
    assert done.returncode == 2 and "unknown option --gpu-please; allowed: --cpu-smoke" in done.stderr


@pytest.mark.slow
def test_the_cpu_smoke_passes_every_step_and_packs_one_tar(tmp_path):
    out = tmp_path / "results"
    done = run(out, "--cpu-smoke")
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stdout[-2000:] + done.stderr[-2000:]
    for step in ("environment", "speed-deitb", "probe-batch", "probe-accum", "pytest-cuda", "hetdpt-plus-speed"):
        assert f"{step}: passed" in summary, summary
    with tarfile.open(out.parent / "results.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"summary.txt", "plan-16.json", "plan-64.json", "probe-accum.log"} <= names
    assert "images" not in names   # the generated images are not packed
