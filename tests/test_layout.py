"""One subpackage per layer (issue 41, item 7): every old import path is the same module object, and no
resume key moved with the files."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hetprune
from hetprune import aliases
from hetprune.core import keys

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "hetprune"


def old_paths() -> dict[str, str]:
    """Every old path the table serves: each entry, and each submodule of a package that moved whole."""
    out = dict(aliases.ALIASES)
    for old, new in aliases.ALIASES.items():
        folder = PACKAGE.joinpath(*new.split(".")[1:])
        if folder.is_dir():
            for path in folder.rglob("*.py"):
                if path.name != "__init__.py":
                    rel = ".".join(path.relative_to(folder).with_suffix("").parts)
                    out[f"{old}.{rel}"] = f"{new}.{rel}"
    return out


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("old, new", sorted(old_paths().items()))
def test_every_old_path_is_the_very_module_of_its_new_home(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)
    if keys.replace_prefix(old, keys.MOVED) is not None:   # moved with the layout: keys name it as it was
        assert keys.stable_name(new) == old
    else:   # moved since (hetprune.core.fingerprint into keys): keys keep the layout's old name of it
        assert keys.replace_prefix(keys.stable_name(new), keys.MOVED) == new


def test_the_table_covers_every_module_that_moved():
    """The modules of 15c341b, before the move (hetprune/*.py and the packages adapters, bench, compare, commands,
    export): each is an old path the table serves, or still where it was."""
    before = ["ablate", "api", "budget", "cache", "cli", "config", "contract", "cost_model", "costs", "data",
              "devices", "distributed", "embedded", "errors", "hookspecs", "io", "latency", "layers", "mixing",
              "model_checks", "models", "pipeline", "plan", "plugins", "points", "recipe", "result_checks", "resume",
              "run_start", "sites", "surgery", "task", "tensors", "testing", "train", "widths",
              "adapters.base", "adapters.generic", "adapters.lookup", "adapters.nested", "bench.environment",
              "bench.report", "bench.timing", "commands.ablate_cmd", "commands.common", "commands.prune_cmd",
              "compare.report", "compare.rows", "compare.spec", "compare.timing", "export.calibration",
              "export.common", "export.hub", "export.ort_model", "export.quantize", "export.to_onnx",
              "export.to_pt2"]
    served = old_paths()
    missing = [m for m in before if f"hetprune.{m}" not in served and m != "cli"]
    assert not missing, f"old paths without an alias: {missing}"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_monkeypatch_through_an_old_path_reaches_the_code_that_runs(monkeypatch):
    from hetprune.training import task as task_now

    monkeypatch.setattr("hetprune.task.metric_number", lambda name, value: "patched")
    assert task_now.metric_number("top1", 1.0) == "patched"
    assert task_now.format_metric("top1", 1.0) == "top-1 patched%"


def test_an_old_path_says_once_where_it_went():
    code = ("import warnings, importlib\n"
            "warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    importlib.import_module('hetprune.pipeline')\n"
            "    importlib.import_module('hetprune.pipeline')\n"
            "print([str(w.message) for w in seen if w.category is DeprecationWarning])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    said = eval(out)   # noqa: S307 - our own subprocess's printed list
    assert said == ["hetprune.pipeline is now hetprune.pruning.pipeline; the old path works as the same module "
                    f"until hetprune {aliases.REMOVED_IN}, which removes it"]


def test_an_old_path_to_a_submodule_leaves_the_packages_same_named_function_alone():
    # hetprune.model.adapters.generic is a function and a submodule; the old path's import used to rebind the
    # package's name to the submodule for the whole process
    code = ("import warnings, sys\nwarnings.simplefilter('ignore')\n"
            "import hetprune.model.adapters as adapters, hetprune.measure.bench as bench\n"
            "import hetprune.adapters.generic, hetprune.bench.environment\n"
            "print(callable(adapters.generic), callable(bench.environment), callable(hetprune.adapters.generic),\n"
            "      type(sys.modules['hetprune.adapters.generic']).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "True", "module"], out


def test_the_new_paths_load_without_a_warning():
    code = ("import warnings\nwarnings.simplefilter('error', DeprecationWarning)\n"
            "import hetprune\nfrom hetprune.pruning import pipeline\nfrom hetprune.harness import testing\n"
            "hetprune.Task, hetprune.compare, hetprune.costs, hetprune.PruneJob\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_nothing_but_the_package_and_python_dash_m_sits_outside_a_layer():
    # aliases.py: the old import paths' finder answers an old path with its new module, in any layer, so it sits
    # above them all (core names nothing above it: issue 72)
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py", "aliases.py"))
    assert not loose, f"modules outside every layer's subpackage: {loose}"


def test_keys_name_hetprunes_classes_by_package_and_name_and_version_1_by_their_old_module():
    from hetprune.model.block_modules import BlockLayout

    assert keys.qualified_name(BlockLayout) == "hetprune:BlockLayout"
    assert keys.qualified_name(BlockLayout).before == "hetprune.layers.BlockLayout"
    assert keys.qualified_name(torch.nn.Linear) == "torch.nn.modules.linear.Linear"   # anyone else's: its module
    assert keys.stable_name("hetprune.training.task") == "hetprune.task"
    assert keys.stable_name("hetprune_timm.vit") == "hetprune_timm.vit"   # what did not move keeps its name
    assert keys.stable_name("hetprune.pruning.job") == "hetprune.pruning.job"   # new since the move: its own


@pytest.mark.slow
def test_no_resume_key_moved_with_the_files():
    """The shipped models' base, structure and configuration keys, a pruned and merged model's, a user Task's
    and a compare row's, against what the code computed at 15c341b (tests/layout_keys.py made the file)."""
    sys.path.insert(0, str(HERE))
    try:
        from layout_keys import keys_now
    finally:
        sys.path.remove(str(HERE))
    made = keys_now()
    assert keys.then(made) == json.loads((HERE / "data" / "layout-keys.json").read_text())   # version 1's keys
    assert made == json.loads((HERE / "data" / "layout-keys-v2.json").read_text())


def test_the_public_names_are_where_the_package_says():
    for name in hetprune.__all__:
        assert getattr(hetprune, name) is not None
