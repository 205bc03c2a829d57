"""Phase 2 of a comparison: time the dense model and every pruned model, interleaved, in one process, so
that timing never competes with training; and say when the timing cannot be trusted."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable

from torch import nn

from ...core.keys import fingerprint
from .spec import CompareSpec


def measure_rows(spec: CompareSpec, dense: nn.Module, rows: list[dict], out: Path, input_shape,
                 log: Callable[[str], None] = print, model_spec=None, adapter=None) -> dict:
    """Phase 2: time the dense model and every pruned model, interleaved, in this process.

    Each row's model is loaded back from its folder as a user would load it (onto a fresh copy of the dense
    model where the base was built in code; the run's own model kwargs are trusted)."""
    from ...measure.bench import measure
    from ...model.recipe import load

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
    from ...model.recipe import load_recipe

    recipe = load_recipe(folder).to_dict()
    recipe.pop("provenance", None)
    return fingerprint(recipe)


def attach_speed(rows: list[dict], dense_row: dict, timing: dict) -> None:
    """Copy throughput and speedup per row out of a bench.measure result: ``throughput_bN``, ``speedup_bN``,
    ``speedup_bN_spread`` and ``mac_ratio_bN`` for every batch size N that was timed (named by it), and the
    same under ``*_large`` for the largest (``large_batch``), the one the table's speed column and the plot
    show."""
    results = timing["results"]
    sizes = sorted({r["batch_size"] for r in results})
    by = {(r["model"], r["batch_size"]): r for r in results}
    for row in [dense_row, *rows]:
        name = "dense" if row is dense_row else row.get("timed_as", row["id"])
        for tag, size in [*((f"b{n}", n) for n in sizes), ("large", sizes[-1])]:
            r = by.get((name, size))
            if r is None:
                continue
            row[f"throughput_{tag}"] = r["throughput_img_s"]
            row[f"speedup_{tag}"] = r.get("speedup", 1.0)
            row[f"speedup_{tag}_spread"] = r.get("speedup_spread", 0.0)
            row[f"mac_ratio_{tag}"] = r.get("mac_ratio", 1.0)
        row["batch_sizes"], row["large_batch"] = sizes, sizes[-1]
        if row.get("cost_batch") is not None and (name, row["cost_batch"]) in by:
            row["measured_speedup"] = by[(name, row["cost_batch"])].get("speedup", 1.0)
            row["prediction_error"] = row["predicted_speedup"] / row["measured_speedup"] - 1
