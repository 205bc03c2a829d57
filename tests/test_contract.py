"""Issue 18: the plugin contract, enforced at run time and by the conformance kit.

A set of deliberately broken components (NaN, raise, wrong keys, wrong types,
the wrong site removed, an inexact merge, a strategy returning a non-recipe),
each caught by name when hetprune uses it, and by ``hetprune.harness.testing``.
"""

from __future__ import annotations

import copy
import json
import math
import pickle
import re
import sys
import textwrap

import pytest
import torch

import hetprune
from conftest import PluginOf
from hetprune import HetpruneError, Site
from hetprune.harness import testing
from hetprune.model import surgery
from hetprune.core import plugins
from hetprune.pruning.budget import Budget
from hetprune.cli import main
from hetprune.core.contract import unwrap
from hetprune.core.errors import PluginError
from hetprune.pruning.pipeline import DepthStrategy
from hetprune.harness.testing import ConformanceError


@pytest.fixture(autouse=True)
def clean_plugins(monkeypatch):
    monkeypatch.setattr(plugins, "_extra_modules", [])
    monkeypatch.setattr(plugins, "_extra_objects", [])
    monkeypatch.delenv("HETPRUNE_PLUGINS", raising=False)
    monkeypatch.delenv("HETPRUNE_DEBUG", raising=False)
    plugins.reset()
    yield
    plugins.reset()


def built(kind: str, cls, **options):
    """``cls`` registered by a plugin named 'broken' and built through the registry, as hetprune builds it."""
    hetprune.unregister_plugin("broken")
    hetprune.register_plugin(PluginOf(plugins.KINDS[kind], cls), name="broken")
    return hetprune.get_registry().build(kind, cls.name, **options)


POINTS = [(a, m, 95.0 - 2 * a - m) for a in range(4) for m in range(4 - a)]


# -- the broken components ------------------------------------------------------------------------

class GoodPredictor:
    name = "good-pred"

    def fit(self, points):
        if not points:
            raise HetpruneError("needs at least 1 point")
        self.mean = sum(p[2] for p in points) / len(points)
        return self

    def predict(self, n_attn, n_act):
        return self.mean - n_attn

    def fit_report(self):
        return {"mae": 0.0}


class NanPredictor(GoodPredictor):
    name = "nan-pred"

    def predict(self, n_attn, n_act):
        return float("nan")


class NanAwayPredictor(GoodPredictor):
    """Finite at the splits it was fitted on (0 <= n_attn + n_act <= 3), NaN beyond them."""

    name = "nan-away"

    def predict(self, n_attn, n_act):
        return float("nan") if n_attn + n_act > 3 else super().predict(n_attn, n_act)


class UnfittedPredictor(GoodPredictor):
    name = "unfitted"

    def fit(self, points):
        return self          # forgets to fit: predict() has no mean to use


class RefusingPredictor(GoodPredictor):
    name = "refusing"

    def predict(self, n_attn, n_act):
        raise HetpruneError("not fitted yet")


class NanReportPredictor(GoodPredictor):
    name = "nan-report"

    def fit_report(self):
        return {"mae": 0.1, "coefficients": {"a^1": float("nan")}}


class RaisingFitPredictor(GoodPredictor):
    name = "raise-fit"

    def fit(self, points):
        raise ValueError("singular matrix")


class StringPredictor(GoodPredictor):
    name = "string-pred"

    def predict(self, n_attn, n_act):
        return "93.0"


class ListReportPredictor(GoodPredictor):
    name = "list-report"

    def fit_report(self):
        return [("mae", 0.1)]


class AcceptsNoPoints(GoodPredictor):
    name = "no-points-ok"

    def fit(self, points):
        self.mean = 90.0
        return self


class PartialScorer:
    name = "partial"

    def score(self, model, sites, ctx):
        return {s: 1.0 for s in list(sites)[:1]}


class StringKeyScorer:
    name = "string-keys"

    def score(self, model, sites, ctx):
        return {str(s): 1.0 for s in sites}


class NanScorer:
    name = "nan-scores"

    def score(self, model, sites, ctx):
        return {s: math.nan for s in sites}


class WeightChangingScorer:
    name = "weight-changer"

    def score(self, model, sites, ctx):
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        return {s: float(s.block) for s in sites}


class RemovingSelectScorer:
    name = "removing-select"

    def score(self, model, sites, ctx):
        return {s: float(s.block) for s in sites}

    def select(self, model, counts, ctx):
        chosen = [Site(b, k) for k, n in counts.items() for b in range(n)]
        for s in chosen:  # the pipeline removes them; a scorer must not
            if s.kind == "act":
                surgery.remove_activation(model, s.block)
        return chosen


class WrongSiteRemover:
    name = "wrong-site"
    kind = "act"

    def remove(self, model, site):
        surgery.remove_activation(model, (site.block + 1) % 4)
        return {}


class ListRecordRemover:
    name = "list-record"
    kind = "act"

    def remove(self, model, site):
        surgery.remove_activation(model, site.block)
        return ["act", site.block]


class BreakingRemover:
    name = "breaking"
    kind = "attn"

    def remove(self, model, site):
        surgery.remove_attention(model, site.block)
        model.blocks[site.block].mlp.fc2 = torch.nn.Linear(7, 7)  # the model no longer runs
        return {}


class InexactMerger:
    name = "inexact"

    def merge(self, model):
        done = sorted(surgery.merge_all(model))
        with torch.no_grad():
            model.head.bias.add_(0.05)
        return done


class SlightlyInexactMerger:
    """Off by 1e-7 relative: inside the float32 tolerance, caught only in float64."""

    name = "slightly-inexact"

    def merge(self, model):
        done = sorted(surgery.merge_all(model))
        with torch.no_grad():
            model.head.weight.mul_(1 + 1e-7)
        return done


class BadToleranceMerger:
    name = "bad-tolerance"
    tolerance = "tight"

    def merge(self, model):
        return sorted(surgery.merge_all(model))


class DictStrategy:
    name = "dict-result"
    description = "returns a dict, not a PruneResult"

    def run(self, job):
        return {"model": copy.deepcopy(job.dense), "sites": []}


class DenseChangingStrategy(DepthStrategy):
    name = "dense-changer"
    description = "prunes job.dense itself"

    def prepare(self, job):
        return job.dense

    def allocate(self, job):
        return (0, 1), {}


class StaleRecipeStrategy(DepthStrategy):
    name = "stale-recipe"
    description = "its recipe forgets a removal"

    def allocate(self, job):
        return (0, 1), {}

    def run(self, job):
        result = super().run(job)
        result.recipe.act_removed = []
        return result


class HalfAllocation(DepthStrategy):
    name = "half"
    description = "allocates half a site"

    def allocate(self, job):
        return (0.5, 1.5), {}


# -- at run time: every call through the registry is checked -------------------------------------

def test_nan_prediction_is_a_plugin_error_naming_plugin_component_and_rule():
    p = built("predictor", NanAwayPredictor).fit(POINTS)
    with pytest.raises(PluginError) as info:
        p.predict(2, 2)
    msg = str(info.value)
    assert msg.startswith("plugin 'broken' (registered in code, no version): predictor 'nan-away' broke the "
                          "plugin contract: predict(2, 2) returned nan")
    assert "finite" in msg and msg.endswith("[predict()]")
    assert (info.value.plugin, info.value.kind, info.value.component) == ("broken", "predictor", "nan-away")


@pytest.mark.parametrize("cls, expected", [
    (NanPredictor, "broke the plugin contract: predict(0, 0) returned nan; a prediction must be a finite number "
                   "(after fit(), at a split it was fitted on) [fit()]"),
    (StringPredictor, "broke the plugin contract: predict(0, 0) returned a str ('93.0')"),
    (RefusingPredictor, "broke the plugin contract: after fit(), predict(0, 0) refused a split it was fitted on: "
                        "not fitted yet [fit()]"),
    (UnfittedPredictor, "raised AttributeError: 'UnfittedPredictor' object has no attribute 'mean'; --debug"),
    (NanReportPredictor, "broke the plugin contract: after fit(), fit_report()['coefficients']['a^1'] is nan; the "
                         "numbers of a fit report must be finite"),
])
def test_fit_is_checked_by_predicting_the_fitted_splits_and_reading_the_fit_report(cls, expected):
    with pytest.raises(PluginError, match=re.escape(expected)):
        built("predictor", cls).fit(POINTS)
    built("predictor", GoodPredictor).fit(POINTS)     # the same checks pass a good predictor


def test_a_nan_in_the_fit_report_is_caught_when_it_is_read_too():
    p = built("predictor", NanReportPredictor)
    unwrap(p).fit(POINTS)                                            # fitted behind the contract's back
    with pytest.raises(PluginError, match=re.escape("fit_report()['coefficients']['a^1'] is nan") + r".*\[fit_report\(\)\]$"):
        p.fit_report()


@pytest.mark.parametrize("points, bad", [
    ({"points": POINTS}, "a dict"),
    ([(0, 0, 95.0), (1, 0)], "the point (1, 0)"),
    ([(0, 0, 95.0), (1.5, 0, 93.0)], "the point (1.5, 0, 93.0)"),
    ([(0, 0, 95.0), (-1, 0, 93.0)], "the point (-1, 0, 93.0)"),
    ([(0, 0, 95.0), (True, 0, 93.0)], "the point (True, 0, 93.0)"),
    ([(0, 0, 95.0), (1, 0, float("nan"))], "the point (1, 0, nan)"),
    ([(0, 0, 95.0), (1, 0, "93")], "the point (1, 0, '93')"),
])
def test_fit_refuses_malformed_points_without_blaming_the_predictor(points, bad):
    fitted = []

    class Recording(GoodPredictor):
        name = "recording"

        def fit(self, pts):
            fitted.append(pts)
            return super().fit(pts)

    with pytest.raises(HetpruneError, match=re.escape(f"fit() was given {bad}; points must be")) as info:
        built("predictor", Recording).fit(points)
    assert not isinstance(info.value, PluginError) and not fitted   # refused before the predictor saw them


@pytest.mark.parametrize("kind, cls, call, expected", [
    ("predictor", StringPredictor, lambda c: c.fit(POINTS).predict(0, 0), "returned a str ('93.0')"),
    ("predictor", ListReportPredictor, lambda c: c.fit(POINTS).fit_report(), "fit_report() returned a list"),
    ("predictor", RaisingFitPredictor, lambda c: c.fit(POINTS), "raised ValueError: singular matrix"),
    ("scorer", PartialScorer, lambda c: c.score(testing.tiny_model(), hetprune.sites(testing.tiny_model(), "act"),
                                                None),
     "exactly one score per candidate site; missing: act1, act2, act3"),
    ("scorer", StringKeyScorer, lambda c: c.score(testing.tiny_model(), hetprune.sites(testing.tiny_model(), "attn"),
                                                  None), "not candidates: attn0, attn1, attn2, attn3"),
    ("scorer", NanScorer, lambda c: c.score(testing.tiny_model(), hetprune.sites(testing.tiny_model(), "act"), None),
     "gave act0 the score nan"),
    ("scorer", RemovingSelectScorer, lambda c: c.select(testing.tiny_model(), {"attn": 0, "act": 2}, None),
     "select() removed act0, act1 from the model"),
    ("remover", WrongSiteRemover, lambda c: c.remove(testing.tiny_model(), Site(2, "act")),
     "remove(act2) must remove exactly act2; it removed act3"),
    ("remover", ListRecordRemover, lambda c: c.remove(testing.tiny_model(), Site(2, "act")),
     "remove() returned a list"),
    ("remover", BreakingRemover, lambda c: c.remove(testing.tiny_model(), Site(1, "attn")),
     "the model no longer runs after remove(attn1): RuntimeError"),
    ("merger", InexactMerger, lambda c: c.merge(testing._linear_model()), "merge() changed the model's outputs by"),
    ("merger", BadToleranceMerger, lambda c: c.merge(testing._linear_model()), "tolerance must be a number"),
])
def test_each_broken_component_is_caught_when_hetprune_calls_it(kind, cls, call, expected):
    with pytest.raises(PluginError, match=f"{kind} '{cls.name}' .*" + re.escape(expected)):
        call(built(kind, cls))


def test_a_constructor_that_raises_is_a_plugin_error_at_build_time():
    class Unbuildable(GoodPredictor):
        name = "unbuildable"

        def __init__(self, k: int = 1):
            raise ValueError(f"k={k} is not supported")

    with pytest.raises(PluginError, match=r"predictor 'unbuildable' could not be built with options \{'k': 2\}: "
                                          r"ValueError: k=2 is not supported"):
        built("predictor", Unbuildable, k=2)


def test_an_exception_from_plugin_code_keeps_its_cause_for_debugging():
    with pytest.raises(PluginError) as info:
        built("predictor", RaisingFitPredictor).fit(POINTS)
    assert isinstance(info.value.__cause__, ValueError) and "--debug" in str(info.value)


def test_a_plugin_hetprune_error_is_the_users_mistake_and_passes_unchanged():
    with pytest.raises(HetpruneError) as info:
        built("predictor", GoodPredictor).fit([])
    assert type(info.value) is HetpruneError and str(info.value) == "needs at least 1 point"


def test_an_exception_raised_in_hetprunes_own_code_keeps_its_traceback():
    class CallsIntoHetprune:
        name = "calls-core"
        kind = "act"

        def remove(self, model, site):
            surgery.mergeable(model, 99)  # an IndexError inside hetprune.model.surgery: hetprune's to handle

    with pytest.raises(IndexError):
        built("remover", CallsIntoHetprune).remove(testing.tiny_model(), Site(0, "act"))


def test_an_exception_from_a_builtin_plugin_is_hetprunes_bug_and_keeps_its_traceback(monkeypatch):
    from hetprune_hetdpt.predictors import PolyPredictor

    def broken_predict(self, n_attn, n_act):
        return 1 / 0

    monkeypatch.setattr(PolyPredictor, "predict", broken_predict)
    with pytest.raises(ZeroDivisionError):
        hetprune.get_registry().build("predictor", "poly").fit(POINTS).predict(1, 1)


def test_a_good_component_is_unchanged_by_the_checks():
    p = built("predictor", GoodPredictor)
    assert p.fit(POINTS) is p  # fit returning self returns the checked component
    assert isinstance(p, GoodPredictor) and type(unwrap(p)) is GoodPredictor
    assert p.predict(1, 0) == pytest.approx(sum(q[2] for q in POINTS) / len(POINTS) - 1)
    assert not hasattr(built("scorer", PartialScorer), "select")  # optional methods stay optional


def test_plugin_error_survives_pickling_for_worker_processes():
    err = PluginError("plugin 'x': predictor 'y' broke", plugin="x", kind="predictor", component="y", stage="allocate")
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.plugin, back.kind, back.component, back.stage) == (str(err), "x", "predictor", "y",
                                                                               "allocate")


@pytest.mark.parametrize("cls, expected", [
    (DictStrategy, "run() returned a dict; it must return a hetprune.PruneResult"),
    (DenseChangingStrategy, "run() changed job.dense"),
    (StaleRecipeStrategy, "the result reloaded from its recipe gives other outputs"),
    (HalfAllocation, "allocate() returned ((0.5, 1.5), {}); it must return ((n_attn, n_act), info)"),
])
def test_broken_strategies_are_caught_when_they_run(cls, expected, tmp_path):
    strategy = built("strategy", cls)
    job = testing.tiny_job(Budget(sites=1), tmp_path, settings={"mergers": []}, name=cls.name)
    with pytest.raises(PluginError, match=f"strategy '{cls.name}' broke the plugin contract: .*"
                                          + re.escape(expected)):
        strategy.run(job)


def test_the_stage_is_named_when_a_component_fails_inside_a_strategy(tmp_path):
    hetprune.register_plugin(PluginOf("register_scorers", NanScorer), name="nan-scorer")
    strategy = hetprune.get_registry().build("strategy", "mix50")
    job = testing.tiny_job(Budget(sites=2), tmp_path, strategy.defaults, {"scorer": "nan-scores"}, name="mix50")
    with pytest.raises(PluginError, match=r"scorer 'nan-scores' .* \[stage select, score\(\)\]$"):
        strategy.run(job)


# -- on the command line: one error line, exit 2, nothing half-written ------------------------------

BROKEN_MODULE = '''
import hetprune

__version__ = "0.3"


class NanPredictor:
    name = "nan-pred"

    def fit(self, points):
        if not points:
            raise hetprune.HetpruneError("nan-pred needs at least 1 point")
        return self

    def predict(self, n_attn, n_act):
        return float("nan")


class RaisingFit(NanPredictor):
    name = "raise-fit"

    def fit(self, points):
        raise ValueError("cannot fit these points")


@hetprune.hookimpl
def register_predictors(register):
    register(NanPredictor)
    register(RaisingFit)
'''


@pytest.fixture
def cli_model(tmp_path, monkeypatch):
    """--model/--checkpoint options for a tiny random ViT, and the module broken_plugin_hp on sys.path."""
    from hetprune.core.io import save_weights

    ckpt = tmp_path / "tiny.safetensors"
    save_weights(ckpt, testing.tiny_model())
    (tmp_path / "broken_plugin_hp.py").write_text(textwrap.dedent(BROKEN_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_plugin_hp", raising=False)
    spec = testing.TINY_SPEC
    tiny = [f"--set=finetune.{k}={v}" for k, v in testing.TINY_SETTINGS["finetune"].items()]
    tiny += [f"--set=short_finetune.{k}={v}" for k, v in testing.TINY_SETTINGS["short_finetune"].items()]
    tiny += [f"--set=scoring.{k}={v}" for k, v in testing.TINY_SETTINGS["scoring"].items()]
    return ["--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt),
            "--plugin", "broken_plugin_hp", *tiny]


@pytest.mark.slow
def test_prune_with_a_nan_predictor_fails_by_name_and_saves_nothing(cli_model, tmp_path, capsys):
    out = tmp_path / "pruned"
    # checks none: the predictor's argmax (checks of every split of this small budget would need no predictor)
    rc = main(["prune", *cli_model, "--predictor", "nan-pred", "--budget", "2", "--set", "hetdpt.checks=none",
               "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("error: plugin 'broken_plugin_hp' (--plugin, version 0.3): predictor 'nan-pred' "
                             "broke the plugin contract: predict(")
    assert "returned nan" in err[0] and err[0].endswith("[stage allocate, fit()]")   # caught at its fitted splits
    assert not out.exists()


@pytest.mark.slow
def test_prune_with_a_raising_predictor_names_it_and_debug_shows_the_traceback(cli_model, tmp_path, capsys,
                                                                               monkeypatch):
    args = ["prune", *cli_model, "--predictor", "raise-fit", "--budget", "2", "--set", "hetdpt.checks=none",
            "--out", str(tmp_path / "p")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    assert ("predictor 'raise-fit' raised ValueError: cannot fit these points; --debug (or HETPRUNE_DEBUG=1) shows "
            "the traceback [stage allocate, fit()]") in err
    assert main([*args, "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and 'raise ValueError("cannot fit these points")' in err
    assert err.strip().splitlines()[-1].startswith("error: plugin 'broken_plugin_hp'")
    monkeypatch.setenv("HETPRUNE_DEBUG", "1")
    assert main(args) == 2 and "Traceback" in capsys.readouterr().err


def test_plugins_check_reports_broken_components_and_exits_1(cli_model, capsys):
    assert main(["plugins", "--plugin", "broken_plugin_hp", "--check", "broken_plugin_hp"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  predictor     nan-pred" in out and "predict(0, 0) returned nan" in out
    assert "FAIL  predictor     raise-fit" in out and "raised ValueError: cannot fit these points" in out
    assert "2 components checked: 0 passed, 2 failed" in out
    assert main(["plugins", "--check", "poly"]) == 0
    assert "ok    predictor     poly" in capsys.readouterr().out
    assert main(["plugins", "--check", "no-such-thing"]) == 2
    assert "names no plugin and no component" in capsys.readouterr().err


def test_plugins_check_skips_a_kind_the_kit_has_no_check_for(monkeypatch, capsys):
    from dataclasses import replace

    from hetprune.core import kinds

    monkeypatch.setitem(kinds.RECORDS, "predictor", replace(kinds.RECORDS["predictor"], check=None))
    assert "predictor" not in testing.CHECKS
    assert main(["plugins", "--check", "poly"]) == 0
    out = capsys.readouterr().out
    assert "skip  predictor     poly               (hetdpt) no conformance check for this kind" in out
    assert "0 components checked: 0 passed, 0 failed, 1 skipped" in out


# -- the conformance kit catches each broken component, saying which rule --------------------------

@pytest.mark.parametrize("kind, cls, expected", [
    ("predictor", NanPredictor, "predict(0, 0) returned nan; a prediction must be a finite number"),
    ("predictor", RaisingFitPredictor, "fit([]) raised ValueError: singular matrix; it must raise HetpruneError"),
    ("predictor", StringPredictor, "must be a finite real number"),
    ("predictor", ListReportPredictor, "fit_report() returned a list"),
    ("predictor", AcceptsNoPoints, "fit([]) accepted no points"),
    ("scorer", PartialScorer, "missing: attn1, attn2, attn3"),
    ("scorer", StringKeyScorer, "not candidates"),
    ("scorer", NanScorer, "gave attn0 the score nan"),
    ("scorer", WeightChangingScorer, "score() changed the model's weights"),
    ("scorer", RemovingSelectScorer, "select() removed act0, act1 from the model"),
    ("remover", WrongSiteRemover, "remove(act0) must remove exactly act0; it removed act1"),
    ("remover", ListRecordRemover, "remove() returned a list"),
    ("remover", BreakingRemover, "the model no longer runs after remove(attn0)"),
    ("merger", InexactMerger, "merge() changed the model's outputs by"),
    ("merger", SlightlyInexactMerger, "in float64 merge() changed the outputs by"),
    ("merger", BadToleranceMerger, "tolerance must be a number in (0, 1)"),
    ("strategy", DictStrategy, "run() returned a dict"),
    ("strategy", DenseChangingStrategy, "run() changed job.dense"),
    ("strategy", StaleRecipeStrategy, "from its recipe"),
    ("strategy", HalfAllocation, "allocate() returned ((0.5, 1.5), {})"),
])
def test_the_kit_catches_each_broken_component_and_names_the_rule(kind, cls, expected):
    with pytest.raises(ConformanceError) as info:
        testing.check(kind, cls)
    assert str(info.value).startswith(f"{kind} '{cls.name}' breaks the plugin contract: ")
    assert expected in str(info.value)


def test_the_kit_passes_good_components_and_refuses_a_nameless_one():
    testing.check_predictor(GoodPredictor)
    with pytest.raises(ConformanceError, match="has no 'name'"):
        testing.check_predictor(type("Nameless", (GoodPredictor,), {"name": ""}))


def test_a_strategy_refusing_every_budget_fails_the_kit_with_its_reasons():
    class Refuses:
        name = "refuses"

        def run(self, job):
            raise HetpruneError("not on a model this small")

    with pytest.raises(ConformanceError, match="refused every budget it was given: 2 sites: not on a model"):
        testing.check_strategy(Refuses)


def test_a_result_is_run_on_the_example_in_the_models_own_dtype():
    """A float64 result (e.g. from a float64 job) with the job's float32 example: checked, not refused."""
    from hetprune.model.checks import example_input
    from hetprune.pruning.result_checks import check_result
    from hetprune.pruning.pipeline import REPORT_KEYS, PruneResult
    from hetprune.model.recipe import Recipe

    model = testing.tiny_model().double()
    result = PruneResult(model, Recipe(base=testing.TINY_SPEC, arch={}), {k: 0 for k in REPORT_KEYS})
    example = example_input(testing.tiny_model())
    assert example.dtype == torch.float32
    check_result(result, example)
    with torch.no_grad():   # the model returned is unchanged: still float64
        assert model(example.double()).dtype == torch.float64


# -- architecture adapters are checked like every other component (issue 26, item 10) -----------------------

def _preferred(name_: str, **methods):
    """A timm-vit adapter of higher priority (so it serves the tiny ViT) with some methods broken."""
    from hetprune_timm.vit import TimmViT

    return type("Broken_" + name_.replace("-", "_"), (TimmViT,), {"name": name_, "priority": 1, **methods})


@pytest.mark.parametrize("cls, call, expected", [
    (_preferred("tuple-blocks", blocks=lambda self, model: tuple(model.blocks)),
     lambda model: surgery.dropped_blocks(model), r"blocks\(\) returned a tuple; it must return a list"),
    (_preferred("maybe-matches", matches=lambda self, model: 1),
     lambda model: hetprune.sites(model), r"matches\(\) returned 1 \(int\); it must return True or False"),
    (_preferred("greedy-limits", max_removals=lambda self, model: {"attn": 9, "act": 4}),
     lambda model: hetprune.pruning.budget.max_per_kind(model), r"max_removals\(\) returned \{'attn': 9, 'act': 4\}"),
])
def test_a_broken_adapter_is_caught_by_the_contract_naming_it(cls, call, expected, tiny_model):
    hetprune.register_plugin(PluginOf("register_architectures", cls), name="broken")
    with pytest.raises(PluginError, match=expected) as info:
        call(tiny_model)
    assert (info.value.plugin, info.value.kind, info.value.component) == ("broken", "architecture", cls.name)
    assert str(info.value).startswith(f"plugin 'broken' (registered in code, no version): architecture "
                                      f"'{cls.name}' broke the plugin contract")


# -- explicit contract wiring (issue 41, item 4) ---------------------------------------------------------------

def test_the_registry_loads_the_rules_of_every_kind_it_builds_before_anything_imports_them():
    """A component built before any pipeline code is imported is checked: the registry loads its kind's rules
    (the side-effect imports that used to add them are gone)."""
    import subprocess
    import sys

    code = """
import sys
from hetprune.core.plugins import get_registry
from hetprune import contract
assert "hetprune.model.checks" not in sys.modules and "hetprune.pruning.pipeline" not in sys.modules
r = get_registry()
r.build("scorer", "magnitude")
assert "score" in contract.RULES["scorer"] and "remove" in contract.RULES["remover"]
r.build("strategy", "mix50")
assert "run" in contract.RULES["strategy"]
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_every_kind_has_rules_and_a_kind_without_is_an_error():
    from hetprune.core import contract
    from hetprune.core.plugins import KINDS

    for kind in KINDS:
        assert contract.rules_for(kind), kind
    with pytest.raises(HetpruneError, match="no rules for components of kind 'gadget'"):
        contract.rules_for("gadget")


def test_no_module_imports_the_checks_for_their_side_effect():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "hetprune"
    hits = [f"{p}: {line.strip()}" for p in root.rglob("*.py") for line in p.read_text().splitlines()
            if "import" in line and "checks" in line and "noqa: F401" in line]   # model.checks, result_checks
    assert not hits, hits
