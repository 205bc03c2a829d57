"""Issue 70, item 5: a result records the behaviour of every component that made it, and a resume reuses only
results this release's behaviours would make again (``--reuse-older`` takes the others, marked).

The numbers are backed by pins: a small run per strategy and per scorer on a tiny trained model, whose sites and
metric are kept in tests/data/behaviours/. When one moves while the behaviour numbers of everything it used
stayed, the test says which number to bump. To write the pins again after a bump (or a change that moves nothing
it should): ``HETPRUNE_PIN_BEHAVIOURS=1 python -m pytest tests/test_behaviours.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import hetprune
from hetprune.cli import main
from hetprune.core import loader
from hetprune.core.plugins import get_registry
from hetprune.harness.testing import TINY_SETTINGS
from hetprune.pruning.behaviours import behaviours, changed

PINS = Path(__file__).parent / "data" / "behaviours"
PINNING = os.environ.get("HETPRUNE_PIN_BEHAVIOURS") == "1"
# each strategy at a budget it can meet on the tiny depth-4 model, with its stage 1 cut short
RUNS = {
    "hetdpt": ({"budget": 2}, {"hetdpt": {"axis_points": 2, "mixed_points": 1, "checks_options": {"spread": {"count": 2}}}}),
    "hetdpt-plus": ({"target_macs": 0.6}, {"hetdpt": {"axis_points": 2, "mixed_points": 1, "checks": "none"}}),
    "attn-only": ({"budget": 2}, {}), "act-only": ({"budget": 2}, {}), "mix50": ({"budget": 2}, {}),
    "mix": ({"budget": 2}, {}), "block-drop": ({"budget": 1}, {}), "isomorphic": ({"target_macs": 0.6}, {}),
}


def _merged(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = _merged(out.get(key, {}), value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else value
    return out


def pinned_run(trained_tiny, strategy: str, scorer: str = "gate-taylor") -> tuple[dict, dict]:
    """The pinned run: ``(its result, the behaviour numbers of what made it)``."""
    budget, extra = RUNS[strategy]
    settings = _merged({**TINY_SETTINGS, "scorer": scorer, "seed": 0}, extra)
    torch.manual_seed(0)
    result = hetprune.prune(trained_tiny[0], hetprune.harness.testing.tiny_data(), strategy, **budget,
                            settings=settings, progress=False, log=lambda m: None)
    recipe = result.recipe
    made = {"attn": sorted(recipe.attn_removed), "act": sorted(recipe.act_removed),
            "dropped": sorted(getattr(recipe, "dropped", []) or []), "widths": json.loads(json.dumps(recipe.widths)),
            "metric": round(float(result.report["metric"]), 6)}
    return made, behaviours(get_registry(), loader.resolve(get_registry().build("strategy", strategy),
                                                           overrides=settings), strategy)


CASES = [(s, "gate-taylor") for s in RUNS] + [("mix50", name) for name in get_registry().names("scorer")
                                               if name != "gate-taylor"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy, scorer", CASES, ids=[f"{s}-{c}" for s, c in CASES])
def test_a_component_whose_results_move_has_its_behaviour_bumped(trained_tiny, strategy, scorer):
    made, numbers = pinned_run(trained_tiny, strategy, scorer)
    path = PINS / f"{strategy}--{scorer}.json"
    cpu = torch.backends.cpu.get_cpu_capability()
    if PINNING:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"result": made, "behaviours": numbers, "cpu": cpu}, indent=1) + "\n")
        return
    assert path.is_file(), f"no pin for {strategy} with {scorer}: HETPRUNE_PIN_BEHAVIOURS=1 pytest {__file__}"
    pin = json.loads(path.read_text())
    compared = dict(made) if pin["cpu"] == cpu else {k: v for k, v in made.items() if k != "metric"}
    expected = {k: v for k, v in pin["result"].items() if k in compared}
    if compared == expected:
        assert numbers == pin["behaviours"], (
            f"{strategy} with {scorer}: the same result under other behaviour numbers ({changed(pin['behaviours'], numbers)}): "
            f"write the pins again (HETPRUNE_PIN_BEHAVIOURS=1 pytest {__file__})")
        return
    moved = changed(pin["behaviours"], numbers)
    assert moved is not None, (
        f"{strategy} with {scorer} now makes {compared}, pinned {expected}, and no behaviour number of what made it "
        f"moved: bump the behaviour of the component whose change moved it (one of {sorted(numbers)}: its class's "
        "`behaviour`, or hetprune.pruning.behaviours.CORE), then write the pins again "
        f"(HETPRUNE_PIN_BEHAVIOURS=1 pytest {__file__})")
    pytest.fail(f"{strategy} with {scorer}: behaviour bumped ({moved}) and its result moved: write the pins again "
                f"(HETPRUNE_PIN_BEHAVIOURS=1 pytest {__file__})")


def test_every_builtin_strategy_and_scorer_has_a_pinned_run():
    registry = get_registry()
    assert set(RUNS) == set(registry.names("strategy"))
    assert {c for _, c in CASES} == set(registry.names("scorer"))


# -- a resume across a behaviour change ---------------------------------------------------------------------------

def test_rows_another_behaviour_made_are_made_again_or_with_the_flag_reused_and_marked(tmp_path, capsys,
                                                                                         monkeypatch):
    from hetprune.harness.compare.rows import ROWS_FILE

    out = tmp_path / "c"
    args = ["compare", "--data", "digits", "--strategies", "act-only,mix50", "--budgets", "1", "--scorer", "magnitude",
            "--speed-budget", "0", "--batch-sizes", "1,2", "--set", "finetune.epochs=1", "--set",
            "finetune.subset=32", "--set", "scoring.batches=1", "--out", str(out)]
    assert main(args) == 0
    rows = [json.loads(line) for line in (out / ROWS_FILE).read_text().splitlines()]
    assert all(r["behaviours"]["scorer:magnitude"] == 1 and r["behaviours"]["core:trainer"] == 1 for r in rows)
    assert "strategy:act-only" in rows[0]["behaviours"] and "strategy:mix50" not in rows[0]["behaviours"]
    capsys.readouterr()

    # this release's behaviours: every row reused
    assert main([*args, "--resume"]) == 0
    assert capsys.readouterr().out.count("made by this release's behaviour") == 2

    # a release whose magnitude scorer makes other sites (its number bumped): made again, said in one line
    scorer = get_registry().component("scorer", "magnitude").factory
    monkeypatch.setattr(scorer, "behaviour", 2, raising=False)
    assert main([*args, "--resume"]) == 0
    said = capsys.readouterr().out
    assert "resume: 2 finished row(s) were made by another behaviour than this release's (magnitude 1 -> 2): made " \
           "again; --reuse-older reuses them" in said and ": reused" not in said
    # with the flag the older rows are taken, marked in the table
    monkeypatch.setattr(scorer, "behaviour", 3, raising=False)
    assert main([*args, "--resume", "--reuse-older"]) == 0
    said = capsys.readouterr().out
    assert said.count("made by an older behaviour: magnitude 2 -> 3") == 2
    assert "made by an older behaviour (magnitude 2 -> 3), reused by --reuse-older" in (out / "results.md").read_text()

    # rows of a release before behaviour numbers: never taken for this release's without the flag
    lines = [json.loads(line) for line in (out / ROWS_FILE).read_text().splitlines()]
    (out / ROWS_FILE).write_text("".join(json.dumps({k: v for k, v in r.items() if k != "behaviours"}) + "\n"
                                         for r in lines))
    assert main([*args, "--resume"]) == 0
    assert "(made before results recorded their behaviour): made again" in capsys.readouterr().out
    # the flag without --resume would be ignored: refused
    assert main([*args, "--reuse-older", "--overwrite"]) == 2
    assert "--reuse-older reuses finished rows of a resumed run: give it with --resume" in capsys.readouterr().err
