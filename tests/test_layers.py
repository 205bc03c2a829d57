"""The layers of hetprune/: each module imports only modules of its own layer or below (imports inside
functions count too, and so do imports by name: ``importlib.import_module``, ``__import__`` and strings that
name a hetprune module, the way core once loaded the component protocols and rules above it, issue 72), so the
architecture README's Layout describes is the one the code has."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "hetprune"

# bottom to top: each layer is the subpackage of that name (docs/development.md, "Layout", says the same); on
# top, the module hetprune.plugin_api, which gathers what plugins may use from every layer: nothing imports it
LAYERS = ["core", "model", "training", "pruning", "measure", "harness", "cli", "plugin_api"]
# ``python -m hetprune`` runs the command line; the old import paths' finder answers an old path with its new
# module, in any layer, so it sits on top; nothing else sits outside a layer
TOP = {"__main__": "cli", "aliases": "plugin_api"}


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
    return (found | named_imports(name, tree, package, known)) - {name, ""}


MODULE_PATH = re.compile(r"hetprune(\.[A-Za-z_]\w*)+(:\w+)?")   # "hetprune.pruning.protocols", "...:PROTOCOLS"
IMPORT_CALLS = {"import_module", "__import__"}

# tables of module names that are names, not imports: (module, the name it assigns them to) -> why
NAMES_NOT_IMPORTS = {
    ("core.keys", "MOVED"): "the modules' names before the layout of issue 41, which version-1 keys hold",
    ("core.keys", "SPLIT_FROM"): "the module a moved class is keyed by, for version-1 keys",
}
# modules that import by a name computed at run time, which this test cannot read -> what they import
COMPUTED_IMPORTS = {
    "core.plugins": "a user's --plugin module (never hetprune's own)",
    "aliases": "an old import path's new module, when the user imports the old path",
    "measure.export.common": "an optional dependency of an export format (onnx, onnxruntime, ...)",
}


def named_imports(name: str, tree: ast.AST, package: list[str], known: dict) -> set[str]:
    """The hetprune modules ``name`` reaches by name: ``importlib.import_module("hetprune.x")`` (or relative, from
    ``__name__``), ``__import__``, and any string that is a hetprune module's path (a table of modules loaded
    later), docstrings aside. An import by a name computed at run time is an error unless `COMPUTED_IMPORTS`
    says what it imports."""
    skip = {id(n) for n in ast.walk(tree) for body in [getattr(n, "body", None)]
            if isinstance(body, list) and body and _is_docstring(body[0]) for n in [body[0].value]}
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                isinstance(t, ast.Name) and (name, t.id) in NAMES_NOT_IMPORTS for t in targets):
            skip |= {id(n) for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called(node) in IMPORT_CALLS and node.args:
            path = _import_path(node, name, package)
            if path is None:
                assert name in COMPUTED_IMPORTS, (f"{name} imports by a name computed at run time (line "
                                                  f"{node.lineno}); import by statement, or say in "
                                                  "COMPUTED_IMPORTS what it imports")
                continue
            found |= {m for m in [_module_of(path, known)] if m}
            skip |= {id(n) for n in ast.walk(node.args[0])}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip \
                and MODULE_PATH.fullmatch(node.value):
            found |= {m for m in [_module_of(node.value.split(":")[0], known)] if m}
    return found


def _is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _called(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _import_path(call: ast.Call, name: str, package: list[str]) -> str | None:
    """The dotted path an import call names (an f-string: up to its first placeholder), or None if computed.
    A relative path counts from the package argument, ``__name__`` or ``__package__``, as importlib does."""
    arg = call.args[0]
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        text = arg.values[0].value.rpartition(".")[0]
    elif isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        text = arg.value
    else:
        return None
    if text.startswith("."):
        given = call.args[1] if len(call.args) > 1 else None
        base = {"__name__": name.split("."), "__package__": package}.get(getattr(given, "id", None))
        if base is None:
            return None
        level = len(text) - len(text.lstrip("."))
        text = ".".join(["hetprune", *base[: len(base) - level + 1], text.lstrip(".")]).rstrip(".")
    return text


def _module_of(path: str, known: dict) -> str | None:
    """The hetprune module a dotted path names (its longest prefix that is one), or None if none."""
    parts = path.split(".")
    if parts[0] != "hetprune":
        return None
    for i in range(len(parts), 1, -1):
        if ".".join(parts[1:i]) in known:
            return ".".join(parts[1:i])
    return None


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


@pytest.mark.parametrize("code, reached", [
    ("import importlib\ndef f():\n    importlib.import_module('hetprune.pruning.protocols')\n", {"pruning.protocols"}),
    ("from importlib import import_module\nimport_module('..harness.testing', __package__)\n", {"harness.testing"}),
    ("from importlib import import_module\nimport_module('...harness.api', __name__)\n", {"harness.api"}),
    ("__import__('hetprune.model.checks')\n", {"model.checks"}),
    ("HOMES = {'scorer': 'hetprune.model.checks', 'x': 'hetprune.pruning.protocols:PROTOCOLS'}\n",
     {"model.checks", "pruning.protocols"}),
    ("import importlib\nimportlib.import_module(f'hetprune.cli.commands.{1}_cmd')\n", {"cli.commands"}),
    ('"""Rules live in hetprune.model.checks."""\ndef f():\n    "hetprune.model.checks"\n', set()),
    ("X = 'see hetprune.model.checks'\n", set()),
])
def test_the_check_sees_an_import_by_name(tmp_path, code, reached):
    """Core once loaded pruning.protocols, model.checks and pruning.result_checks by name (issue 72): imports by
    name count like statements; a docstring or a sentence that mentions a module does not."""
    path = tmp_path / "m.py"
    path.write_text(code)
    assert imports("core.plugins", path, modules()) == reached


def test_an_import_by_a_computed_name_must_say_what_it_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import importlib\ndef f(name):\n    return importlib.import_module(name)\n")
    with pytest.raises(AssertionError, match="computed at run time"):
        imports("core.contract", path, modules())
    assert imports("core.plugins", path, modules()) == set()   # said: a user's --plugin module
