"""The public plugin surface (issue 59, item 3): ``hetprune.plugin_api`` holds what a plugin may use, the built-in
plugins import nothing else of hetprune's, one protocol per component kind (the kit checks the same), and "rank 0
decides a resume, everyone follows" written once (`hetprune.core.distributed.follow_saved`)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import hetprune
from hetprune import HetpruneError
from hetprune.core import distributed as dist


# -- rank 0 decides a resume, everyone follows ---------------------------------------------------------------

def _as_rank(monkeypatch, rank: int, box: dict) -> None:
    """This process plays ``rank`` of two: rank 0's broadcast lands in ``box``, rank 1 reads it from there."""
    monkeypatch.setattr(dist, "active", lambda: True)
    monkeypatch.setattr(dist, "is_main", lambda: rank == 0)

    def on_main(fn):
        if rank == 0:
            box["token"] = fn()
        return box["token"]

    monkeypatch.setattr(dist, "on_main", on_main)
    monkeypatch.setattr(dist, "all_gather", lambda obj: [None, obj] if rank else [obj, None])


def _saved(tmp_path, name: str, step: int):
    file = tmp_path / name
    file.write_text(str(step))
    return file


def _read(file):
    return {"step": int(file.read_text())}


def test_outside_torchrun_the_first_reusable_file_is_the_decision(tmp_path):
    files = [tmp_path / "missing", _saved(tmp_path, "b", 2), _saved(tmp_path, "c", 1)]
    said = []
    found = dist.follow_saved(files, _read, lambda s: s["step"], "resume: test",
                              reuse=lambda file, state: said.append(file.name) or state["step"] < 2)
    assert found == (2, {"step": 1}) and said == ["b", "c"]
    assert dist.follow_saved(files[:1], _read, lambda s: s["step"], "resume: test") is None
    assert dist.follow_saved(files, _read, lambda s: s["step"], "x", distributed=False) == (1, {"step": 2})


def test_every_rank_follows_rank_0s_file_or_every_rank_stops_with_one_error(tmp_path, monkeypatch):
    mine, theirs = tmp_path / "rank0", tmp_path / "rank1"
    mine.mkdir(), theirs.mkdir()
    box: dict = {}
    _as_rank(monkeypatch, 0, box)
    decided = dist.follow_saved([_saved(mine, "ckpt", 3)], _read, lambda s: s["step"], "resume: test")
    assert decided == (0, {"step": 3})

    _as_rank(monkeypatch, 1, box)
    with pytest.raises(HetpruneError, match=r"^resume: test: rank 1 cannot follow rank 0's decision: it finds no "
                                            rf"{theirs / 'ckpt'}, which rank 0 continues from"):
        dist.follow_saved([theirs / "ckpt"], _read, lambda s: s["step"], "resume: test")
    _saved(theirs, "ckpt", 4)
    with pytest.raises(HetpruneError, match=r"its .*ckpt \(step 4\) is not the one rank 0 continues path p from "
                                            r"\(step 3\)"):
        dist.follow_saved([theirs / "ckpt"], _read, lambda s: s["step"], "resume: test", continues=" path p",
                          describe=lambda step: f"step {step}")
    _saved(theirs, "ckpt", 3)
    assert dist.follow_saved([theirs / "ckpt"], _read, lambda s: s["step"], "resume: test") == (0, {"step": 3})
    # by_name: rank 0's file itself, whatever this rank's own paths are
    assert dist.follow_saved([tmp_path / "elsewhere"], _read, lambda s: s["step"], "resume: test",
                             by_name=True) == (0, {"step": 3})


# -- one protocol per component kind, the same the kit checks ---------------------------------------------------

def test_every_kind_the_registry_builds_has_a_protocol_covering_the_methods_its_rules_check():
    from hetprune.core import contract
    from hetprune.core.plugins import KINDS
    from hetprune.harness import testing
    from hetprune.pruning import protocols

    assert set(protocols.PROTOCOLS) == set(KINDS) == set(testing.CHECKS)
    for kind, protocol in protocols.PROTOCOLS.items():
        declared = set(protocols.members(protocol))
        for optional in protocols.OPTIONAL.get(kind, ()):
            declared |= set(protocols.members(optional))
        assert set(contract.rules_for(kind)) <= declared, (kind, set(contract.rules_for(kind)) - declared)


def test_a_prune_job_has_everything_the_job_view_names():
    from hetprune.pruning.job import PruneJob
    from hetprune.pruning.protocols import Job, members

    fields = set(PruneJob.__dataclass_fields__)
    assert [m for m in members(Job) if m not in fields and not hasattr(PruneJob, m)] == []


def test_every_builtin_component_class_meets_its_kinds_protocol():
    from hetprune.core import plugins
    from hetprune.pruning.protocols import PROTOCOLS, members

    registry = plugins.get_registry()
    for kind, protocol in PROTOCOLS.items():
        for name in registry.names(kind):
            factory = registry.component(kind, name).factory
            if registry.origin(registry.component(kind, name).plugin).builtin:
                gaps = [m for m, method in members(protocol).items()
                        if not (callable(getattr(factory, m, None)) if method else hasattr(factory, m))]
                assert gaps == [], (kind, name, gaps)


def test_the_kit_names_a_missing_method_through_the_protocol():
    from hetprune.harness import testing

    class NoScore:
        name = "no-score"

        def scores(self, model, sites, ctx):   # misnamed
            return {}

    with pytest.raises(testing.ConformanceError, match=r"scorer 'no-score' breaks the plugin contract: it has no "
                                                       r"score\(\) method; a scorer has name, score\(\) "
                                                       r"\(hetprune.plugin_api.Scorer\)"):
        testing.check_scorer(NoScore)

    class SelectOnly:   # the hookspec: a scorer that learns while it removes may provide select() instead
        name = "select-only"

        def select(self, model, counts, ctx):
            return [s for kind in ("attn", "act") for s in hetprune.sites(model, kind)[:counts[kind]]]

    testing.check_scorer(SelectOnly)

    class NoUnit:
        name = "no-unit"

        def cost(self, model, example):
            return 1.0

    with pytest.raises(testing.ConformanceError, match=r"it has no 'unit'; a cost_model has name, unit, cost\(\)"):
        testing.check_cost_model(NoUnit)


def test_the_plugin_api_exports_every_name_it_lists():
    import hetprune.plugin_api as api

    assert len(set(api.__all__)) == len(api.__all__)
    assert [n for n in api.__all__ if not hasattr(api, n)] == []
    assert api.Scorer is __import__("hetprune.pruning.protocols", fromlist=["Scorer"]).Scorer
    assert api.distributed.follow_saved is dist.follow_saved and api.distributed is dist


# -- a narrow surface (issue 72, item 3) ------------------------------------------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"


def test_the_plugin_api_is_at_most_sixty_names():
    import hetprune.plugin_api as api

    assert len(api.__all__) <= 60, len(api.__all__)


def test_every_plugin_api_name_is_documented_in_its_section_of_the_plugin_reference():
    import hetprune.plugin_api as api

    section = DOCS.read_text().split("\n## The plugin API\n", 1)[1].split("\n## ", 1)[0]
    assert [n for n in api.__all__ if f"`{n}`" not in section] == []


def test_a_name_that_left_the_surface_still_imports_for_a_release_saying_where_it_is_now():
    import hetprune.plugin_api as api

    assert {"select_sites", "PointStore", "count_macs", "follow_saved", "Schedule"} <= set(api.MOVED)
    assert not set(api.MOVED) & set(api.__all__)
    for name, now in api.MOVED.items():
        with pytest.warns(DeprecationWarning, match=rf"hetprune\.plugin_api\.{name} is no longer part of the "
                                                    rf"plugin API; use {re.escape(now)} \(it goes .* in "
                                                    rf"hetprune {api.REMOVED_IN}\)"):
            value = getattr(api, name)
        assert value is api.resolve(now), name
    with pytest.warns(DeprecationWarning, match="use hetprune.plugin_api.pipeline.select_sites"):
        from hetprune.plugin_api import select_sites
    assert select_sites is api.pipeline.select_sites is __import__(
        "hetprune.pruning.steps", fromlist=["select_sites"]).select_sites
    with pytest.raises(ImportError, match="cannot import name 'no_such_name'"):
        from hetprune.plugin_api import no_such_name  # noqa: F401


# -- the built-in plugins import only the plugin API and the top-level package --------------------------------

PLUGINS = Path(__file__).resolve().parent.parent / "plugins"
PUBLIC = {"hetprune", "hetprune.plugin_api"}


def foreign_imports(path: Path) -> list[str]:
    """``file:line: what`` for each import in ``path`` (anywhere: inside functions and under TYPE_CHECKING too)
    of hetprune other than the names of ``hetprune.plugin_api`` and of the top-level ``hetprune`` package."""
    import hetprune
    import hetprune.plugin_api as plugin_api

    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if a.name.split(".")[0] == "hetprune" and a.name not in PUBLIC]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "hetprune":
            if node.module == "hetprune":   # from hetprune import X: X must be a public name of the package
                bad = [f"hetprune.{a.name}" for a in node.names if a.name not in hetprune.__all__]
            elif node.module == "hetprune.plugin_api":   # and of the plugin API, its surface (not a deprecated name)
                bad = [f"hetprune.plugin_api.{a.name}" for a in node.names if a.name not in plugin_api.__all__]
            else:
                bad = [] if node.module in PUBLIC else [node.module]
        else:
            continue
        found += [f"{path.relative_to(PLUGINS.parent)}:{node.lineno}: {name}" for name in bad]
    return found


def test_builtin_plugins_import_only_the_plugin_api_and_the_top_level_package():
    files = sorted(PLUGINS.rglob("*.py"))
    assert len(files) > 20
    found = [line for path in files for line in foreign_imports(path)]
    assert not found, ("built-in plugins import only the names of hetprune.plugin_api's __all__ and hetprune's "
                       "top-level names; promote what they need there (documented) or keep it in the plugin:\n"
                       + "\n".join(found))


def test_the_import_rule_sees_every_kind_of_import(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "PLUGINS", tmp_path / "plugins")
    code = tmp_path / "plugins" / "p" / "m.py"
    code.parent.mkdir(parents=True)
    code.write_text("import hetprune\nfrom hetprune import Site, not_public\n"
                    "from hetprune.plugin_api import storage, PointStore\n"
                    "def f():\n    from hetprune.core import distributed\n    import hetprune.model.surgery as s\n"
                    "from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from hetprune.pruning.job import PruneJob\n")
    assert sorted(foreign_imports(code)) == ["plugins/p/m.py:2: hetprune.not_public",
                                             "plugins/p/m.py:3: hetprune.plugin_api.PointStore",
                                             "plugins/p/m.py:5: hetprune.core",
                                             "plugins/p/m.py:6: hetprune.model.surgery",
                                             "plugins/p/m.py:9: hetprune.pruning.job"]
