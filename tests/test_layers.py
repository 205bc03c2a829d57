"""The layers of hetprune/: each module imports only modules of its own layer or below (imports inside
functions count too), so the architecture README's Layout describes is the one the code has."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "hetprune"

# bottom to top: each layer is the subpackage of that name (docs/development.md, "Layout", says the same); on
# top, the module hetprune.plugin_api, which gathers what plugins may use from every layer: nothing imports it
LAYERS = ["core", "model", "training", "pruning", "measure", "harness", "cli", "plugin_api"]
TOP = {"__main__": "cli"}   # ``python -m hetprune`` runs the command line; nothing else sits outside a layer


def layer_of(module: str) -> int:
    """A module's layer, read from its path: the first package name under hetprune/."""
    first = TOP.get(module, module.split(".")[0])
    if first not in LAYERS:
        raise KeyError(module)
    return LAYERS.index(first)


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict) -> set[str]:
    """The hetprune modules ``name`` imports, wherever the import stands (inside functions and under
    TYPE_CHECKING too: a type-only import still ties the modules together)."""
    tree = ast.parse(path.read_text())
    skip: set = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
            elif (node.module or "").startswith("hetprune"):
                base = []
                node_module = node.module.split(".")[1:]
                target = ".".join(node_module)
                found |= {t for t in [target] + [f"{target}.{a.name}".strip(".") for a in node.names] if t in known}
                continue
            else:
                continue
            target = ".".join(base + ([node.module] if node.module else []))
            found |= {t for t in [target] + [f"{target}.{a.name}".strip(".") for a in node.names] if t in known}
        elif isinstance(node, ast.Import):
            found |= {a.name[len("hetprune."):] for a in node.names if a.name[len("hetprune."):] in known}
    return found - {name, ""}


def test_every_module_has_a_layer():
    unplaced = [m for m in modules() if not _placed(m)]
    assert not unplaced, f"put these modules in a layer's subpackage ({', '.join(LAYERS)}): {unplaced}"


def _placed(module: str) -> bool:
    try:
        layer_of(module)
        return True
    except KeyError:
        return False


@pytest.mark.parametrize("module", sorted(modules()))
def test_a_module_imports_only_its_layer_and_those_below(module):
    known = modules()
    mine = layer_of(module)
    names = LAYERS
    upward = sorted(f"{t} ({names[layer_of(t)]})" for t in imports(module, known[module], known)
                    if layer_of(t) > mine)
    assert not upward, f"{module} ({names[mine]}) imports from a layer above it: {', '.join(upward)}"


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from ..pruning.pipeline import PruneJob\n    from ..harness import api\n")
    assert imports("model.sites", path, modules()) == {"pruning.pipeline", "harness", "harness.api"}


def test_the_layer_is_read_from_the_first_package_name():
    assert [LAYERS[layer_of(m)] for m in ("core.errors", "model.adapters.base", "cli", "__main__", "plugin_api")] == \
        ["core", "model", "cli", "cli", "plugin_api"]
    with pytest.raises(KeyError):
        layer_of("task")   # a module outside every layer's subpackage has no layer


def test_a_type_checking_import_counts(tmp_path):
    code = tmp_path / "x.py"
    code.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .rows import CompareSpec\n")
    assert imports("compare.report", code, {"compare.rows": None, "compare.report": None}) == {"compare.rows"}
