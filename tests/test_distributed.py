"""torchrun with 2 CPU processes (gloo) follows the single-process run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import hetprune
from hetprune.cli import main
from conftest import tiny_example

FT = ["--set", "finetune.epochs=2", "--set", "finetune.subset=64", "--set", "finetune.batch_size=16",
      "--set", "short_finetune.epochs=1", "--set", "short_finetune.subset=32", "--set", "short_finetune.batch_size=16",
      "--set", "scoring.subset=32", "--set", "scoring.batches=1"]


def model_args(trained_tiny):
    _, spec, ckpt = trained_tiny
    return ["--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt)]


def torchrun(args, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "hetprune", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_torchrun_finetune_matches_single_process(trained_tiny, tmp_path):
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
