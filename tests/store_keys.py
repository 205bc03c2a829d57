"""The keys stored results are found by, per store (issue 59): MAP points of every scheme (the progressive
paths and checks too), pipeline checks, HetDPT+'s share points and an ablation's truth rows, for one fixed job
(a tiny ViT from seed 0, the digits, the defaults plus a few settings that reach every branch).

``python tests/store_keys.py`` prints them (key version 2); tests/data/store-keys-v2.json holds what it printed when
version 2 came, and tests/data/store-keys.json what the code made at 2e9158a, under key version 1 (one entry
moved since, on purpose: the pipeline checks in images, when issue 58 made spread checks with a 300-image floor
under their selection the default, so checks made under the old defaults are not taken for new ones). test_keys.py
compares both: a refactor of settings or keys must leave every key where it was, and every key's ``before``
where version 1 put it (so results stored by earlier releases stay found). (Resume keys, a compare row's:
layout_keys.py.)"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def job_for(folder: Path, *sets: str):
    from hetprune.core.loader import resolve
    from hetprune.core.plugins import get_registry
    from hetprune.model.spec import build
    from hetprune.pruning.budget import Budget
    from hetprune.pruning.pipeline import PruneJob
    from hetprune.training.embedded_data import digits
    from hetprune_hetdpt.strategy import HetDPT
    from hetprune_width.strategies import HetDPTPlus

    sys.path.insert(0, str(HERE))
    from conftest import TINY_SPEC

    torch.manual_seed(0)
    model = build(TINY_SPEC)
    settings = resolve([HetDPT(), HetDPTPlus()], sets=list(sets))
    return PruneJob(dense=model, spec=TINY_SPEC, data=digits(), budget=Budget(sites=4), settings=settings,
                    registry=get_registry(), workdir=folder / "work", shared_dir=folder / "shared",
                    base_info={"hash": "store-keys"}, progress=False, log=lambda s: None, strategy_name="hetdpt")


def keys_now() -> dict:
    from hetprune.harness.ablate import split_plans
    from hetprune_hetdpt.halving import PipelineChecks
    from hetprune_hetdpt.strategy import HetDPT
    from hetprune_width.options import WidthOptions
    from hetprune_width.share_search import points_key

    out: dict = {"points": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for scheme_name in ("oneshot", "gradual", "progressive"):
            job = job_for(folder, f"hetdpt.point_selection={scheme_name}", "hetdpt.checks_options.spread.count=2")
            scheme = HetDPT().scheme(job)
            out["points"][scheme_name] = scheme.key
            if scheme_name == "progressive":
                scheme.plan(job.feasible_pairs())
                out["points"]["progressive paths"] = {p.name: scheme.path_key(p) for p in scheme._paths}
                out["points"]["progressive checks"] = scheme.verify_key
        # the checks' settings before issue 58 made them the defaults (their own selection, in final fine-tunes)
        job = job_for(folder, "hetdpt.checks=spread",
                      "hetdpt.checks_options={spread: {count: 2, selection: 1, selection_at_least: null, "
                      "unit: finetunes}}")
        out["pipeline checks"] = PipelineChecks(job).key
        job = job_for(folder, "hetdpt.checks_options={spread: {count: 2, budget: auto, selection: 0.5}}", "amp=none")
        out["pipeline checks in images"] = PipelineChecks(job).key
        job = job_for(folder)
        out["share points"] = points_key(job, HetDPT(), 1e6, WidthOptions.of(job.settings))
        plans = split_plans([(1, 1)], [0], job.settings, 2, job.base_key, job.task.key, unused=("hetdpt",))
        out["truth row"] = plans[0].key
    return out


if __name__ == "__main__":
    print(json.dumps(keys_now(), indent=1, sort_keys=True))   # a key is this release's string
