"""Issue 71: the studies in benchmarks/ drive the plugins through what they offer; none patches a plugin's
method or reads its private names (benchmarks/map_points.py replaced ``PipelineChecks.selected`` to time the
selections, which the checks now time themselves)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def plugin_methods() -> set[str]:
    """Every method name a class of a built-in plugin defines (its private ones too)."""
    names = set()
    for path in (ROOT / "plugins").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names |= {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names - {"__init__"}


def reaches_in(tree: ast.AST, methods: set[str]) -> list[str]:
    """Where ``tree`` assigns over a plugin method (``obj.selected = ...``, ``setattr(obj, "selected", ...)``),
    imports a private name from a plugin (``hetprune_*``), or reads a private attribute."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        found += [f"line {node.lineno}: assigns over .{t.attr}" for t in targets
                  if isinstance(t, ast.Attribute) and t.attr in methods]
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "setattr" \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in methods:
            found.append(f"line {node.lineno}: setattr over .{node.args[1].value}")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hetprune_"):
            found += [f"line {node.lineno}: imports {a.name} from {node.module}" for a in node.names
                      if a.name.startswith("_")]
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"line {node.lineno}: reads .{node.attr}")
    return found


def test_no_benchmark_patches_a_plugin_or_reads_its_private_names():
    methods = plugin_methods()
    assert {"selected", "run", "allocate"} <= methods   # the scan sees the plugins' classes
    bad = {str(p.relative_to(ROOT)): found for p in sorted((ROOT / "benchmarks").rglob("*.py"))
           if (found := reaches_in(ast.parse(p.read_text()), methods))}
    assert not bad, bad


def test_the_scan_finds_a_patch_a_private_import_and_a_private_read():
    methods = {"selected"}
    code = ("from hetprune_hetdpt.halving import _hidden\n"
            "checks.selected = timed\n"
            "setattr(checks, 'selected', timed)\n"
            "x = checks._models\n")
    assert len(reaches_in(ast.parse(code), methods)) == 4
    assert reaches_in(ast.parse("checks.candidates = []\nx = obj.__class__\n"), methods) == []


def test_the_map_study_drives_stage_1_through_the_runs_allocation():
    """The study's points, candidates and checks come from `Allocation`, the object a run's stage 1 is, not
    from a copy of its logic."""
    tree = ast.parse((ROOT / "benchmarks" / "map_points.py").read_text())
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert {"allocation", "point_plan", "points", "candidates", "checks"} <= calls
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not names & {"to_check", "PipelineChecks", "collect_points"}   # what the study once called itself
