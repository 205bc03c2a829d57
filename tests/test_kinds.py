"""A component kind is one record (issue 72): a package adds a kind with one call, and the registry, the
contract's run-time checks and the conformance kit all take it from that record; core reads every kind, the
built-in ones too, only from the records the layers above hand it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Protocol, runtime_checkable

import pytest

import hetprune
from conftest import PluginOf
from hetprune import HetpruneError, PluginError
from hetprune.cli import main
from hetprune.core import contract, plugins
from hetprune.core.contract import Violation
from hetprune.core.kinds import ComponentKind
from hetprune.harness import kinds as builtin, testing
from hetprune.harness.testing import ConformanceError
from hetprune.pruning import protocols


# -- the test package's kind: a sprocket gives a finite gear ratio for a number of teeth ---------------------------

@hetprune.hookspec
def register_sprockets(register) -> None:
    """Register sprockets."""


@runtime_checkable
class Sprocket(Protocol):
    name: str

    def ratio(self, teeth: int) -> float:
        """A finite gear ratio."""


def sprocket_ratio(component, call, teeth, *args, **kwargs):
    value = call(teeth, *args, **kwargs)
    if not contract.is_number(value) or not math.isfinite(value):
        raise Violation(f"ratio({teeth}) returned {value!r}; a ratio must be a finite number")
    return float(value)


def check_sprocket(cls, **options) -> None:
    c = testing.UnderTest("sprocket", cls, options)
    for teeth in (1, 2, 3):
        c.call("ratio", teeth)


SPROCKET = ComponentKind("sprocket", register_sprockets, Sprocket, rules={"ratio": sprocket_ratio},
                         check=check_sprocket)


class Gear:
    name = "gear"

    def __init__(self, scale: float = 0.5):
        self.scale = scale

    def ratio(self, teeth):
        return self.scale * teeth


class Slipping(Gear):
    name = "slipping"

    def ratio(self, teeth):
        return math.nan


class Toothless:
    name = "toothless"


@pytest.fixture
def sprockets():
    """The kind registered with one call, and a plugin registering three sprockets (one good, two broken)."""
    plugins.register_kind(SPROCKET)
    name = hetprune.register_plugin(PluginOf("register_sprockets", Gear, Slipping, Toothless), name="sprocket-works")
    try:
        yield hetprune.get_registry()
    finally:
        hetprune.unregister_plugin(name)
        plugins.unregister_kind("sprocket")


def test_a_kind_added_with_one_call_is_in_every_table(sprockets):
    assert plugins.KINDS["sprocket"] == "register_sprockets"
    assert protocols.PROTOCOLS["sprocket"] is Sprocket
    assert contract.RULES["sprocket"] == {"ratio": sprocket_ratio}
    assert testing.CHECKS["sprocket"] is check_sprocket
    assert sprockets.names("sprocket") == ["gear", "slipping", "toothless"]


def test_the_registry_builds_a_new_kind_checked_and_refuses_protocol_gaps(sprockets):
    gear = sprockets.build("sprocket", "gear", scale=2)
    assert isinstance(gear, Gear) and gear.ratio(3) == 6.0
    with pytest.raises(PluginError, match=r"sprocket 'slipping' broke the plugin contract: ratio\(3\) returned nan"):
        sprockets.build("sprocket", "slipping").ratio(3)
    with pytest.raises(PluginError, match=r"sprocket 'toothless' lacks ratio\(\) method; a sprocket has name, "
                                          r"ratio\(\)") as info:
        sprockets.build("sprocket", "toothless")
    # the Protocol named where its author defined it: hetprune.plugin_api holds only hetprune's own kinds'
    assert f"({__name__}.Sprocket)" in str(info.value) and "plugin_api" not in str(info.value)
    assert (info.value.plugin, info.value.kind, info.value.stage) == ("sprocket-works", "sprocket", "build")


def test_the_kit_runs_a_new_kinds_check(sprockets):
    testing.check("sprocket", Gear, scale=3)
    with pytest.raises(ConformanceError, match=r"ratio\(1\) returned nan; a ratio must be a finite number"):
        testing.check("sprocket", Slipping)
    with pytest.raises(ConformanceError, match=r"it has no ratio\(\) method; a sprocket has name, ratio\(\)"):
        testing.check("sprocket", Toothless)


def test_the_command_line_lists_a_new_kinds_components(sprockets, capsys):
    assert main(["plugins", "--json"]) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert listed["sprocket-works"]["components"] == {"sprocket": ["gear", "slipping", "toothless"]}


def test_a_kind_taken_away_is_gone(sprockets):
    plugins.unregister_kind("sprocket")
    assert "sprocket" not in plugins.KINDS and "sprocket" not in testing.CHECKS
    with pytest.raises(HetpruneError, match="'sprocket-works' implements a hook hetprune does not define"):
        hetprune.get_registry()   # its plugin is left implementing a hook no kind has
    hetprune.unregister_plugin("sprocket-works")
    with pytest.raises(HetpruneError, match="unknown component kind 'sprocket'"):
        hetprune.get_registry().component("sprocket", "gear")


def test_a_kind_is_registered_once_under_a_name_and_hook_of_its_own(sprockets):
    plugins.register_kind(SPROCKET)   # the same record again: nothing changes
    assert list(plugins.KINDS).count("sprocket") == 1
    scorer = builtin.KINDS[[k.name for k in builtin.KINDS].index("scorer")]
    for clash in (ComponentKind("scorer", register_sprockets, Sprocket, rules={}),
                  ComponentKind("cog", scorer.hook, Sprocket, rules={})):
        with pytest.raises(HetpruneError, match="clashes with the kind"):
            plugins.register_kind(clash)

    def register_cogs(register):
        """Not decorated with hetprune.hookspec."""

    with pytest.raises(HetpruneError, match="is not a hookspec"):
        plugins.register_kind(ComponentKind("cog", register_cogs, Sprocket, rules={}))
    assert "cog" not in plugins.KINDS


def test_import_hetprune_registers_the_builtin_kinds_without_torch():
    """Core loads no kind by name: the package's import hands it the records, before anything can ask."""
    code = """
import sys
from hetprune.core.plugins import KINDS
print(",".join(KINDS), "torch" in sys.modules, "hetprune.model.checks" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [",".join(k.name for k in builtin.KINDS), "False", "False"]
