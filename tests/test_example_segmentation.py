"""examples/segmentation.py, tiny: a ViT backbone inside the user's module, pruned for mIoU by three
strategies through hetprune.prune with the example's own training loop."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

import hetprune

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "segmentation.py"


def load_example():
    spec = importlib.util.spec_from_file_location("segmentation_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_segmentation_example_prunes_for_miou_with_its_own_loop(tmp_path, capsys):
    seg = load_example()
    table = tmp_path / "table.md"
    assert seg.main(["--tiny", "--out", str(tmp_path / "runs"), "--markdown", str(table)]) == 0
    rows = [line.split("|")[1:-1] for line in table.read_text().splitlines() if line.startswith("| ")][1:]
    assert [r[0].strip() for r in rows] == ["dense", "hetdpt", "act-only", "mix50"]
    for name in ("hetdpt", "act-only", "mix50"):
        report = json.loads((tmp_path / "runs" / name / "report.json").read_text())
        row = next(r for r in rows if r[0].strip() == name)
        assert report["metric_name"] == "mIoU" and "top1" not in report
        assert float(row[2]) == round(report["metric"], 2)
        assert report["macs"] <= 0.55 * report["dense_macs"]            # the MAC target was met
    # the labels are per pixel, the metric is the example's own: recompute it for one saved model
    model = seg.Segmenter(depth=4, dim=32)
    loaded = hetprune.load(tmp_path / "runs" / "mix50", model=model)
    _, val = seg.digit_masks()
    val = torch.utils.data.Subset(val, range(128))
    miou = seg.miou(loaded.eval(), torch.utils.data.DataLoader(val, batch_size=256))
    report = json.loads((tmp_path / "runs" / "mix50" / "report.json").read_text())
    assert abs(miou - report["metric"]) < 0.05   # measured before the merge, which moves the last digits only
