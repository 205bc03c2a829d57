"""Issue 2, points 3 and 4: the plugin contract, its documentation, and plugin loading.

Entry points (an outside package really installed, in a temporary folder),
``--plugin module.path``, ``HETPRUNE_PLUGINS``, objects registered in code,
``hetprune plugins [--json]``, and the errors for unknown or clashing names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hetprune
from conftest import PluginOf
from hetprune import HetpruneError
from hetprune.core.errors import PluginError
from hetprune.core import hookspecs, plugins
from hetprune.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "plugins.md"
EXAMPLE = ROOT / "examples" / "hetprune-example-plugin"


@pytest.fixture(autouse=True)
def clean_plugins(monkeypatch):
    """Each test starts from the installed plugins only, and leaves nothing behind."""
    monkeypatch.setattr(plugins, "_extra_modules", [])
    monkeypatch.setattr(plugins, "_extra_objects", [])
    monkeypatch.delenv("HETPRUNE_PLUGINS", raising=False)
    plugins.reset()
    yield
    plugins.reset()


def hook_names() -> list[str]:
    return sorted(n for n, f in vars(hookspecs).items() if callable(f) and hasattr(f, f"{hookspecs.PROJECT}_spec"))


def write_module(folder: Path, name: str, source: str, monkeypatch) -> str:
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def subprocess_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HETPRUNE_PLUGINS"}
    env.update(extra)
    return env


# -- point 3: the contract and its documentation -------------------------------------------------

def markdown_headings(text: str) -> list[str]:
    """Headings outside fenced code blocks (where '#' starts a comment, not a heading)."""
    headings, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6}\s", line):
            headings.append(line)
    return headings


def test_every_hook_is_documented_in_a_heading_of_the_plugin_docs():
    names = hook_names()
    assert len(names) >= 10  # the six registration hooks and four event hooks at least
    headings = markdown_headings(DOCS.read_text(encoding="utf-8"))
    undocumented = [n for n in names if not any(re.search(rf"\b{n}\b", h) for h in headings)]
    assert not undocumented, f"hooks missing a heading in {DOCS.relative_to(ROOT)}: {undocumented}"


def test_plugin_docs_name_no_hook_that_does_not_exist():
    headings = markdown_headings(DOCS.read_text(encoding="utf-8"))
    named = {m for h in headings for m in re.findall(r"`((?:register|on)_\w+)`", h)}
    assert named, "hook headings should name the hook in backticks"
    assert named <= set(hook_names()), f"docs name hooks that hookspecs.py lacks: {sorted(named - set(hook_names()))}"


def test_every_hook_has_a_docstring_and_every_registration_hook_a_kind():
    for name in hook_names():
        assert (getattr(hookspecs, name).__doc__ or "").strip(), f"hookspec {name} has no docstring"
    registration = {n for n in hook_names() if n.startswith("register_")}
    assert registration == set(plugins.KINDS.values())


def test_plugin_docs_describe_the_example_package_that_exists():
    text = DOCS.read_text(encoding="utf-8")
    assert "examples/hetprune-example-plugin" in text
    pyproject = (EXAMPLE / "pyproject.toml").read_text()
    assert 'example = "hetprune_example"' in pyproject and 'example = "hetprune_example"' in text
    assert "--predictor nearest" in text


# -- the registry: built-ins, names, errors -------------------------------------------------------

def test_builtin_plugins_are_entry_points_with_versions_and_components():
    registry = hetprune.get_registry()
    infos = {i.name: i for i in registry.plugins()}
    assert {"hetdpt", "baselines"} <= set(infos)
    hetdpt = infos["hetdpt"]
    assert hetdpt.version == hetprune.__version__
    assert hetdpt.source == "entry point hetprune_hetdpt"
    assert "poly" in hetdpt.components["predictor"]
    assert "hetdpt" in hetdpt.components["strategy"]
    assert {"attn-identity", "attn-ln-residual", "act-identity"} <= set(hetdpt.components["remover"])
    assert "mix50" in infos["baselines"].components["strategy"]
    assert registry.component("predictor", "poly").plugin == "hetdpt"


def test_plugins_command_lists_each_plugin_with_version_and_components_by_kind(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^hetdpt {re.escape(hetprune.__version__)}\s+\(entry point hetprune_hetdpt\)", out, re.M)
    assert re.search(r"^\s+predictor\s+poly\s+\S", out, re.M)  # kind, name, one-line description
    assert re.search(r"^\s+strategy\s+mix50\s", out, re.M)

    assert main(["plugins", "--json"]) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert listed["hetdpt"]["version"] == hetprune.__version__
    assert listed["hetdpt"]["components"]["predictor"] == ["gp", "local", "poly"]
    assert set(listed["hetdpt"]["components"]) <= set(plugins.KINDS)
    assert "strategy" in listed["baselines"]["components"]


class ConstantPredictor:
    """Predicts the same accuracy everywhere."""

    name = "constant"

    def __init__(self, value: float = 50.0):
        self.value = value

    def fit(self, points):
        return self

    def predict(self, n_attn, n_act):
        return self.value


class PredictorPlugin:
    def __init__(self, *components):
        self.components = components or (ConstantPredictor,)

    @hetprune.hookimpl
    def register_predictors(self, register):
        for c in self.components:
            register(c)


def test_register_and_unregister_a_plugin_object():
    name = hetprune.register_plugin(PredictorPlugin(), name="in-code")
    registry = hetprune.get_registry()
    assert registry.component("predictor", "constant").plugin == "in-code"
    assert registry.build("predictor", "constant", value=7.0).predict(1, 2) == 7.0
    info = {i.name: i for i in registry.plugins()}["in-code"]
    assert info.source == "code" and info.components == {"predictor": ["constant"]}
    hetprune.unregister_plugin(name)
    assert "constant" not in hetprune.get_registry().names("predictor")


def test_unknown_component_name_lists_the_registered_names_of_that_kind():
    registry = hetprune.get_registry()
    with pytest.raises(HetpruneError, match=r"no predictor named 'nope'.*registered predictors: gp, local, poly"):
        registry.build("predictor", "nope")
    with pytest.raises(HetpruneError) as err:
        registry.component("strategy", "nope")
    for known in ("hetdpt", "mix50", "attn-only"):
        assert known in str(err.value)
    with pytest.raises(HetpruneError, match="unknown component kind 'gizmo'; kinds are: predictor, checks, scorer"):
        registry.component("gizmo", "x")


def test_unknown_strategy_on_the_command_line_is_one_error_line(capsys):
    assert main(["prune", "--strategy", "nope", "--budget", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no strategy named 'nope'") and "hetdpt" in err and err.count("\n") == 1


def test_options_a_component_does_not_take_are_an_error():
    with pytest.raises(HetpruneError, match="poly"):
        hetprune.get_registry().build("predictor", "poly", k=3)


def test_two_plugins_registering_the_same_name_is_an_error_naming_both():
    class Poly(ConstantPredictor):
        name = "poly"

    hetprune.register_plugin(PredictorPlugin(Poly), name="impostor")
    with pytest.raises(HetpruneError) as err:
        hetprune.get_registry()
    msg = str(err.value)
    assert "'poly'" in msg and "'hetdpt'" in msg and "'impostor'" in msg


def test_one_plugin_registering_two_different_components_under_one_name_is_an_error():
    class Other(ConstantPredictor):
        pass

    hetprune.register_plugin(PredictorPlugin(ConstantPredictor, Other), name="careless")
    with pytest.raises(HetpruneError, match="'constant' is registered twice.*'careless'"):
        hetprune.get_registry()


def test_component_without_a_name_is_an_error_naming_the_plugin():
    class Nameless:
        pass

    hetprune.register_plugin(PredictorPlugin(Nameless), name="sloppy")
    with pytest.raises(HetpruneError, match="plugin 'sloppy' registered a predictor without a string 'name'"):
        hetprune.get_registry()


def test_a_component_that_lacks_what_its_kind_has_is_refused_when_built_naming_it():
    """The registry checks a built component against its kind's Protocol (`hetprune.plugin_api`), so a
    predictor without ``predict`` fails when the run builds it, not at the first prediction hours in."""
    class NoPredict:
        name = "half"

        def fit(self, points):
            return self

    hetprune.register_plugin(PredictorPlugin(NoPredict), name="half-done")
    with pytest.raises(PluginError, match=r"predictor 'half' lacks predict\(\) method; a predictor has name, "
                                          r"fit\(\), predict\(\) \(hetprune.plugin_api.Predictor\)") as err:
        hetprune.get_registry().build("predictor", "half")
    assert err.value.plugin == "half-done" and err.value.stage == "build"


def test_two_plugin_objects_under_one_name_are_refused():
    hetprune.register_plugin(PredictorPlugin(), name="twin")
    with pytest.raises(HetpruneError, match="already registered as 'twin'"):
        hetprune.register_plugin(PredictorPlugin(), name="twin")


# -- --plugin module.path -----------------------------------------------------------------------

LOCAL_PLUGIN = '''
    import hetprune

    __version__ = "3.1.4"


    class Constant:
        """Scores every site 1.0."""

        name = "constant"

        def score(self, model, sites, ctx):
            return {s: 1.0 for s in sites}


    @hetprune.hookimpl
    def register_scorers(register):
        register(Constant)
'''


def test_plugin_flag_loads_a_local_module_on_any_command(tmp_path, monkeypatch, capsys):
    name = write_module(tmp_path, "hp_local_scorer_plugin", LOCAL_PLUGIN, monkeypatch)
    assert "constant" not in hetprune.get_registry().names("scorer")
    assert main(["plugins", "--json", "--plugin", name]) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert listed[name] == {"name": name, "version": "3.1.4", "source": "--plugin",
                            "components": {"scorer": ["constant"]}}
    scorer = hetprune.get_registry().build("scorer", "constant")
    assert scorer.score(None, [hetprune.Site(0, "attn")], None) == {hetprune.Site(0, "attn"): 1.0}
    # every sub-command accepts it (the parser is shared); a bad one fails the same way everywhere
    from hetprune.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert {"plugins", "apply", "prune"} <= set(sub.choices)
    for command, subparser in sub.choices.items():
        assert "--plugin" in subparser._option_string_actions, f"hetprune {command} lacks --plugin"


def test_plugin_flag_with_a_module_that_cannot_be_imported(capsys):
    assert main(["plugins", "--plugin", "no_such_module_hp"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --plugin 'no_such_module_hp' cannot be imported") and "Traceback" not in err


def test_plugin_flag_with_a_module_that_raises_on_import(tmp_path, monkeypatch, capsys):
    name = write_module(tmp_path, "hp_broken_plugin", "raise RuntimeError('half-written plugin')\n", monkeypatch)
    assert main(["plugins", "--plugin", name]) == 2
    assert "half-written plugin" in capsys.readouterr().err


def test_plugin_with_a_misspelled_hook_is_an_error_listing_the_hooks(tmp_path, monkeypatch, capsys):
    name = write_module(tmp_path, "hp_typo_plugin", """
        import hetprune

        @hetprune.hookimpl
        def register_predictor(register):
            pass
    """, monkeypatch)
    assert main(["plugins", "--plugin", name]) == 2
    err = capsys.readouterr().err
    assert "register_predictor'" in err and "register_predictors" in err


def test_plugin_with_a_wrong_hook_signature_is_an_error(tmp_path, monkeypatch, capsys):
    name = write_module(tmp_path, "hp_badarg_plugin", """
        import hetprune

        @hetprune.hookimpl
        def register_scorers(reg):
            pass
    """, monkeypatch)
    assert main(["plugins", "--plugin", name]) == 2
    err = capsys.readouterr().err
    assert "does not fit the hetprune plugin contract" in err and "reg" in err


def test_plugin_flag_naming_an_installed_plugin_does_not_load_it_twice(capsys):
    assert main(["plugins", "--json", "--plugin", "hetprune_hetdpt"]) == 0
    listed = [p["name"] for p in json.loads(capsys.readouterr().out)]
    assert listed.count("hetdpt") == 1 and "hetprune_hetdpt" not in listed


# -- HETPRUNE_PLUGINS --------------------------------------------------------------------------

def test_allow_list_restricts_entry_points(monkeypatch):
    monkeypatch.setenv("HETPRUNE_PLUGINS", "hetdpt")
    plugins.reset()
    registry = hetprune.get_registry()
    assert [i.name for i in registry.plugins()] == ["hetdpt"]
    with pytest.raises(HetpruneError, match=r"no strategy named 'mix50'.*registered strategies: hetdpt"):
        registry.build("strategy", "mix50")

    monkeypatch.setenv("HETPRUNE_PLUGINS", " baselines , hetdpt ")
    plugins.reset()
    assert [i.name for i in hetprune.get_registry().plugins()] == ["baselines", "hetdpt"]

    monkeypatch.setenv("HETPRUNE_PLUGINS", "")
    plugins.reset()
    assert hetprune.get_registry().plugins() == []


def test_allow_list_naming_a_missing_plugin_is_an_error(monkeypatch, capsys):
    monkeypatch.setenv("HETPRUNE_PLUGINS", "hetdpt,nothere")
    assert main(["plugins"]) == 2
    err = capsys.readouterr().err
    assert "HETPRUNE_PLUGINS names nothere" in err and "baselines, costs, hetdpt" in err


def test_allow_list_does_not_block_plugin_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HETPRUNE_PLUGINS", "hetdpt")
    name = write_module(tmp_path, "hp_local_scorer_plugin2", LOCAL_PLUGIN, monkeypatch)
    assert main(["plugins", "--json", "--plugin", name]) == 0
    assert [p["name"] for p in json.loads(capsys.readouterr().out)] == ["hetdpt", name]


# -- event hooks --------------------------------------------------------------------------------

def docs_code_block(first_line: str) -> str:
    """The fenced Python block of docs/plugins.md that starts with ``first_line``."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    found = [b for b in blocks if b.startswith(first_line)]
    assert len(found) == 1, f"docs/plugins.md should hold one python block starting {first_line!r}"
    return found[0]


def test_event_hook_example_from_the_docs_sees_every_event(tmp_path, monkeypatch):
    """The event logger shown in docs/plugins.md, loaded with --plugin, logs what the pipeline announces."""
    write_module(tmp_path, "event_logger", docs_code_block("# event_logger.py"), monkeypatch)
    log = tmp_path / "events.jsonl"
    monkeypatch.setenv("HETPRUNE_EVENTS", str(log))
    plugins.load_module("event_logger")
    hook = hetprune.get_registry().hook
    hook.on_stage_start(stage="finetune", info={"strategy": "hetdpt"})
    hook.on_epoch_end(stage="finetune", epoch=1, metrics={"loss": 0.5})
    hook.on_point_collected(point={"n_attn": 1, "n_act": 2, "metric": 91.0, "sites": ["attn3"]})
    hook.on_stage_end(stage="finetune", info={"strategy": "hetdpt", "top1": 95.0})
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["event"] for r in records] == ["on_stage_start", "on_epoch_end", "on_point_collected", "on_stage_end"]
    assert records[1]["metrics"] == {"loss": 0.5} and records[2]["point"]["metric"] == 91.0
    assert records[3]["info"]["top1"] == 95.0


def test_event_hooks_reach_every_plugin_through_the_job(tiny_model, tmp_path):
    from hetprune.pruning.budget import Budget
    from hetprune.pruning.pipeline import PruneJob

    seen = []

    class Watcher:
        @hetprune.hookimpl
        def on_stage_start(self, stage, info):
            seen.append(("start", stage, info["strategy"]))

        @hetprune.hookimpl
        def on_stage_end(self, stage, info):
            seen.append(("end", stage, info["n"]))

    hetprune.register_plugin(Watcher(), name="watcher")
    from hetprune.harness.testing import tiny_data

    job = PruneJob(dense=tiny_model, spec=None, data=tiny_data(), budget=Budget(sites=1), settings={},
                   registry=hetprune.get_registry(), workdir=tmp_path, strategy_name="demo")
    started = job.stage_start("allocate")
    job.stage_end("allocate", started, n=3)
    assert seen == [("start", "allocate", "demo"), ("end", "allocate", 3)]


# -- the outside package: installed for real, in a temporary folder -----------------------------

def example_module():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import hetprune_example.predictor as mod
    finally:
        sys.path.remove(str(EXAMPLE))
    return mod


def test_example_package_tests_pass_and_use_the_conformance_kit():
    """The example's own tests (what a plugin author copies) run and pass, the kit's check among them."""
    tests = EXAMPLE / "tests" / "test_nearest.py"
    assert "check_predictor(NearestPredictor" in tests.read_text()
    env = subprocess_env(PYTHONPATH=os.pathsep.join([str(EXAMPLE), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
                       capture_output=True, text=True, env=env, timeout=300, cwd=EXAMPLE)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "5 passed" in r.stdout


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory):
    """``pip install`` the example package into a fresh folder (not into the running environment)."""
    src = tmp_path_factory.mktemp("example-src") / "hetprune-example-plugin"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path_factory.mktemp("example-site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(target.glob("hetprune_example_plugin-0.1.0.dist-info"))
    return target


def test_installed_outside_package_is_listed_by_hetprune_plugins(installed_example):
    assert "nearest" not in hetprune.get_registry().names("predictor")  # not in this environment
    env = subprocess_env(PYTHONPATH=os.pathsep.join([str(installed_example), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "hetprune", "plugins", "--json"], capture_output=True, text=True,
                       env=env, timeout=120, cwd=installed_example)
    assert r.returncode == 0, r.stderr
    listed = {p["name"]: p for p in json.loads(r.stdout)}
    assert listed["example"] == {"name": "example", "version": "0.1.0", "source": "entry point hetprune_example",
                                 "components": {"predictor": ["nearest"]}}
    assert {"hetdpt", "baselines"} <= set(listed)
    r = subprocess.run([sys.executable, "-m", "hetprune", "plugins", "--check", "example"], capture_output=True,
                       text=True, env=env, timeout=300, cwd=installed_example)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok    predictor     nearest            (example)" in r.stdout


USE_EXAMPLE = '''
import json
from hetprune import get_registry
from hetprune.cli import build_parser
from hetprune.core.contract import unwrap
from hetprune.cli.commands.prune_cmd import settings_options
from hetprune.core.loader import resolve

registry = get_registry()
points = [(0, 0, 98.0), (4, 0, 90.0), (0, 4, 96.0), (2, 2, 94.0)]
by_name = registry.build("predictor", "nearest", k=2).fit(points)
# the command line of docs/plugins.md, as far as building the predictor it asks for
args = build_parser().parse_args(["prune", "--strategy", "hetdpt", "--budget", "4", "--predictor", "nearest",
                                  "--set", "hetdpt.predictor_options={nearest: {k: 2}}"])
strategy = registry.build("strategy", args.strategy)
opts = resolve([strategy], **settings_options(args, [strategy]))["hetdpt"]
from_cli = registry.build("predictor", opts["predictor"], **opts["predictor_options"]["nearest"]).fit(points)
print(json.dumps({
    "plugins": [p.name for p in registry.plugins()],
    "plugin": registry.component("predictor", "nearest").plugin,
    "class": type(unwrap(by_name)).__module__ + "." + type(unwrap(by_name)).__name__,
    "at_point": by_name.predict(4, 0), "between": by_name.predict(3, 1), "from_cli": from_cli.predict(3, 1),
    "origin": registry.origin("example").describe(),
    "report": by_name.fit_report(),
}))
'''


def test_installed_outside_predictor_is_usable_by_name(installed_example):
    env = subprocess_env(PYTHONPATH=os.pathsep.join([str(installed_example), os.environ.get("PYTHONPATH", "")]),
                         HETPRUNE_PLUGINS="example,hetdpt")
    r = subprocess.run([sys.executable, "-c", USE_EXAMPLE], capture_output=True, text=True, env=env, timeout=120,
                       cwd=installed_example)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["plugins"] == ["example", "hetdpt"]  # the allow-list held
    assert out["plugin"] == "example" and out["class"] == "hetprune_example.predictor.NearestPredictor"
    assert out["at_point"] == 90.0 and 90.0 < out["between"] < 94.0
    assert out["from_cli"] == out["between"]
    assert out["origin"] == "plugin 'example' (hetprune-example-plugin 0.1.0)"  # how its faults are named
    assert out["report"]["points"] == 4 and out["report"]["loo_mae"] > 0


# -- the other code examples of the docs run as shown ------------------------------------------

def test_docs_scorer_example_scores_every_site(tiny_model):
    namespace: dict = {}
    exec(docs_code_block("from hetprune.model.adapters import adapter_for"), namespace)
    scorer_cls = namespace["WeightNorm"]
    hetprune.register_plugin(PluginOf("register_scorers", scorer_cls), name="docs-scorer")
    scorer = hetprune.get_registry().build("scorer", "weight-norm")
    for kind in ("attn", "act"):
        sites = hetprune.sites(tiny_model, kind)
        scores = scorer.score(tiny_model, sites, None)
        assert sorted(scores) == sites and all(v > 0 for v in scores.values())


def test_docs_strategy_example_allocates_two_thirds_to_attention():
    namespace: dict = {}
    exec(docs_code_block("from hetprune.pruning.pipeline import DepthStrategy"), namespace)
    strategy_cls = namespace["AttnHeavy"]
    hetprune.register_plugin(PluginOf("register_strategies", strategy_cls), name="docs-strategy")
    strategy = hetprune.get_registry().build("strategy", "attn-heavy")

    class Job:
        def feasible_pairs(self):
            return [(a, 6 - a) for a in range(7)]

    assert strategy.allocate(Job()) == ((4, 2), {"rule": "2/3 attention"})




# -- which adapter serves a model: the most specific, never the first registered (issue 26, item 10) ---------

def _block_subclass_model():
    """The tiny ViT with its blocks of a subclass of timm's Block (a family a plugin serves better)."""
    from hetprune.harness.testing import tiny_model
    from timm.models.vision_transformer import Block

    class TunedBlock(Block):
        pass

    model = tiny_model()
    for block in model.blocks:
        block.__class__ = TunedBlock
    return model, TunedBlock


def _adapter(name_: str, **attrs):
    from hetprune_timm.vit import TimmViT

    return type("Adapter_" + name_.replace("-", "_"), (TimmViT,), {"name": name_, **attrs})


def test_an_adapter_for_a_block_subclass_beats_the_generic_one_registered_before_it():
    from hetprune.model.adapters import adapter_for
    from hetprune.harness.testing import tiny_model

    model, tuned = _block_subclass_model()
    # the generic timm-vit comes first (an entry point); the specific adapter is registered after it
    hetprune.register_plugin(PluginOf("register_architectures", _adapter("tuned-vit", block_types=(tuned,))),
                             name="tuned")
    assert [a.name for a in plugins.get_registry().adapters()][-1] == "tuned-vit"
    assert adapter_for(model).name == "tuned-vit"
    assert adapter_for(tiny_model()).name == "timm-vit"   # plain blocks: the generic one is the nearer


def test_the_specific_adapter_still_serves_a_copy_whose_blocks_all_lost_their_attention():
    import copy

    from hetprune.model import surgery
    from hetprune.model.adapters import adapter_for

    model, tuned = _block_subclass_model()
    hetprune.register_plugin(PluginOf("register_architectures", _adapter("tuned-vit", block_types=(tuned,))),
                             name="tuned")
    for b in range(len(model.blocks)):
        surgery.remove_attention(model, b)
    assert adapter_for(copy.deepcopy(model)).name == "tuned-vit"


def test_a_declared_priority_beats_a_nearer_type():
    from hetprune.model.adapters import adapter_for
    from hetprune.harness.testing import tiny_model

    hetprune.register_plugin(PluginOf("register_architectures", _adapter("preferred-vit", priority=1)),
                             name="preferred")
    assert adapter_for(tiny_model()).name == "preferred-vit"


def test_two_equally_specific_adapters_are_an_error_naming_both():
    from hetprune.model.adapters import adapter_for
    from hetprune.harness.testing import tiny_model

    hetprune.register_plugin(PluginOf("register_architectures", _adapter("twin-vit")), name="twin")
    with pytest.raises(HetpruneError, match="adapters 'timm-vit' and 'twin-vit' both match VisionTransformer "
                                            "equally specifically"):
        adapter_for(tiny_model())
