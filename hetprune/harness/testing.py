"""The conformance kit: check that a component keeps the plugin contract.

One function per component kind runs the contract against tiny models and
data it builds itself (a depth-4, width-32 ViT; a few dozen digits images),
in seconds, and raises `ConformanceError` (an ``AssertionError``, so
pytest shows it as a failure) saying which rule was broken::

    from hetprune.harness.testing import check_predictor

    def test_my_predictor_keeps_the_contract():
        check_predictor(MyPredictor, k=2)     # options go to the constructor

The rules are those hetprune enforces at run time (`hetprune.core.contract`)
plus deeper ones only a test can afford (the model is left as it was, exact in
float64, the result reloads, the budget is kept). Each kind's record
(`hetprune.harness.kinds`) names its check; `check` dispatches on it (`CHECKS`
reads them by kind), and ``hetprune plugins --check`` runs it on installed
components. Each check first holds the component to its kind's protocol (the
record's, which ``hetprune.plugin_api`` exports): a missing method is named
there. A new kind's check does the same with `UnderTest`.
"""

from __future__ import annotations

import copy
import functools
import math
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ..core import contract, kinds
from ..model import checks as model_checks, surgery
from ..pruning import protocols, result_checks
from ..pruning.budget import Budget
from ..core.contract import Violation
from ..model.checks import outputs, relative_error
from ..core.errors import HetpruneError
from ..core.settings import Settings
from ..model.spec import ModelSpec, build
from ..model.sites import Site, sites

TINY_SPEC = ModelSpec("vit_tiny_patch16_224", dict(img_size=16, patch_size=4, in_chans=1, num_classes=10,
                                                   embed_dim=32, depth=4, num_heads=2, init_values=0.1))
FP64_TOLERANCE = 1e-9   # a merge that is exact up to rounding stays within this in float64 (relative)

# fine-tunes and scoring small enough for seconds: one epoch over a few dozen images
TINY_SETTINGS = {
    "finetune": {"epochs": 1, "subset": 48, "batch_size": 16, "warmup_epochs": 0},
    "short_finetune": {"epochs": 1, "subset": 32, "batch_size": 16, "warmup_epochs": 0},
    "scoring": {"batches": 1, "batch_size": 16, "subset": 16},
    "device": "cpu",
}


class ConformanceError(AssertionError):
    """A component broke a rule of the plugin contract; the message says which and how."""


# -- tiny things the checks (and your own tests) can use ------------------------------------------

def tiny_model(seed: int = 0) -> nn.Module:
    """A depth-4, width-32 timm ViT for 16x16 one-channel images (random weights, seeded)."""
    torch.manual_seed(seed)
    return build(TINY_SPEC)


@functools.lru_cache(maxsize=1)
def tiny_data():
    """scikit-learn's digits at 16x16 (the settings of `tiny_settings` use a few dozen of them)."""
    from ..training.embedded_data import digits

    return digits()


def tiny_settings(strategy_defaults: dict | None = None, changes: dict | None = None) -> Settings:
    """Full settings (core defaults + a strategy's own sections: give the strategy, or a mapping of its
    sections' defaults) with tiny fine-tunes, then ``changes`` on top, checked as a run's are."""
    from ..core.loader import resolve

    return resolve(strategy_defaults, overrides=_merged(TINY_SETTINGS, changes or {}))


def _merged(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def tiny_job(budget: Budget, workdir: str | Path, strategy_defaults: dict | None = None,
             settings: dict | None = None, model: nn.Module | None = None, name: str = "under-test"):
    """A [`hetprune.PruneJob`][hetprune.pruning.pipeline.PruneJob] on `tiny_model` and `tiny_data`, with the installed plugins."""
    from ..pruning.pipeline import PruneJob
    from ..core.plugins import get_registry

    dense = model if model is not None else tiny_model()
    return PruneJob(dense=dense, spec=TINY_SPEC, data=tiny_data(), budget=budget,
                    settings=tiny_settings(strategy_defaults, settings), registry=get_registry(),
                    workdir=Path(workdir), base_info={"hash": "tiny", "top1": None}, progress=False,
                    log=lambda msg: None, strategy_name=name)


def scoring_context(model: nn.Module, workdir: str | Path, settings: dict | None = None):
    """A [`hetprune.ScoringContext`][hetprune.pruning.pipeline.ScoringContext] on `tiny_data` with ``model`` as the teacher."""
    from ..pruning.pipeline import ScoringContext

    return ScoringContext(data=tiny_data(), teacher=copy.deepcopy(model).eval(), settings=tiny_settings(None, settings),
                          device="cpu", seed=0, workdir=Path(workdir), progress=False, log=lambda msg: None)


# -- running a component under the rules -----------------------------------------------------------

class UnderTest:
    """A component built from ``cls``, held to its kind's protocol and called through the kind's rules; any
    breach is a ConformanceError. Every check builds its component with it (a new kind's check too)."""

    def __init__(self, kind: str, cls: Any, options: dict):
        self.kind = kind
        self.name = getattr(cls, "name", None)
        if not isinstance(self.name, str) or not self.name:
            raise ConformanceError(f"{kind} {cls!r} has no 'name': a component needs a non-empty string "
                                   "class attribute 'name'")
        if not isinstance(cls, type):   # a ready component (an adapter from hetprune.model.adapters.generic)
            self.obj = cls
        else:
            try:
                self.obj = cls(**options)
            except Exception as exc:
                self.fail(f"cannot be built with options {options}: {type(exc).__name__}: {exc}", exc)
        self.conforms()

    def conforms(self) -> None:
        """The component has every member of its kind's protocol (its record's, what ``hetprune.plugin_api``
        exports), or a ConformanceError names the first it lacks."""
        record = kinds.get(self.kind)
        protocol = record.protocol
        if isinstance(self.obj, protocol) and not kinds.lacks(self.obj, protocol):
            return
        if any(self.offers(other) for other in record.instead):
            return   # what the kind may be instead (a scorer that only selects), as the registry takes it
        gaps = kinds.lacks(self.obj, protocol) or [f"what isinstance(obj, {protocol.__name__}) requires"]
        self.fail(f"it has no {gaps[0]}; a {self.kind} has {kinds.describe(protocol)} "
                  f"({kinds.home(protocol)})")

    def fail(self, what: str, cause: BaseException | None = None):
        raise ConformanceError(f"{self.kind} {self.name!r} breaks the plugin contract: {what}") from cause

    def offers(self, protocol: type) -> bool:
        """Whether the component has what an optional protocol of its kind names (its record's ``optional``)."""
        return isinstance(self.obj, protocol) and not kinds.lacks(self.obj, protocol)

    def call(self, method: str, *args, refusal_ok: bool = False, **kwargs):
        """Call ``method`` through its rule; a HetpruneError passes only when ``refusal_ok``."""
        function = getattr(self.obj, method, None)
        if not callable(function):
            self.fail(f"it has no {method}() method")
        rule = contract.RULES.get(self.kind, {}).get(method)
        try:
            if rule is None:
                return function(*args, **kwargs)
            return rule(self.obj, function, *args, **kwargs)
        except Violation as exc:
            self.fail(str(exc), exc)
        except HetpruneError as exc:
            if refusal_ok and type(exc) is HetpruneError:
                raise
            self.fail(f"{method}() raised {type(exc).__name__} on valid input: {exc}", exc)
        except Exception as exc:
            self.fail(f"{method}() raised {type(exc).__name__}: {exc}", exc)

    def rule(self, check: Callable[[], None]) -> None:
        """Run a kit-only check that raises Violation."""
        try:
            check()
        except Violation as exc:
            self.fail(str(exc), exc)


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- one check per kind ----------------------------------------------------------------------------

def check_checks(cls, **options) -> None:
    """A checks policy on budget lines of 1 to 7 feasible splits with known values: ``measure`` is pipeline
    or points; ``most``, ``known`` and ``candidates`` return what their rules allow (feasible, distinct, no
    more than ``most``) and the same each time; where the splits are ``known``, ``candidates`` gives no
    other; a pipeline policy's sizing, where it has one, is one the checks can use."""
    c = UnderTest("checks", cls, options)
    if c.obj.measure not in ("pipeline", "points"):
        c.fail(f"measure is {c.obj.measure!r}; it must be 'pipeline' or 'points'")
    if c.offers(protocols.SizesChecks):
        if c.obj.unit not in ("images", "finetunes"):
            c.fail(f"unit is {c.obj.unit!r}; it must be 'images' or 'finetunes'")
    for n in range(1, 8):
        pairs = [(a, n - 1 - a) for a in range(n)]
        for sign in (1, -1):
            value = {p: 90.0 - (p[0] - 2) ** 2 - 0.3 * p[1] for p in pairs}
            for loo in (None, 0.5):
                got = c.call("candidates", pairs, value, loo, sign)
                if c.call("candidates", pairs, value, loo, sign) != got:
                    c.fail(f"candidates() gave two answers for one budget line of {n} split(s); a policy is a "
                           "function of what it is given")
        known = c.call("known", pairs)
        if known is not None and sorted(known) != sorted(c.call("candidates", pairs, value, None, 1) or known):
            c.fail(f"known({pairs}) is {known} and candidates() chose others: the splits known before stage 1 "
                   "are the ones checked")


def check_predictor(cls, **options) -> None:
    """Fit on points of a known smooth surface; predictions finite numbers everywhere, fit report a dict.

    Also: ``fit([])`` raises HetpruneError (a fit that cannot be made is said,
    not guessed), and predicting one split twice gives one value.
    """
    def truth(a, m):
        return 95.0 - 2.0 * a - 0.5 * m - 0.2 * a * a + 0.1 * a * m

    c = UnderTest("predictor", cls, options)
    try:
        c.obj.fit([])
    except HetpruneError:
        pass
    except Exception as exc:
        c.fail(f"fit([]) raised {type(exc).__name__}: {exc}; it must raise HetpruneError saying how many points "
               "it needs", exc)
    else:
        c.fail("fit([]) accepted no points; it must raise HetpruneError saying how many points it needs")
    points = [(a, m, truth(a, m)) for a in range(5) for m in range(5 - a)]
    points += [(1, 1, truth(1, 1) + 0.5)]  # a repeated split, as several seeds give
    c.call("fit", points)
    for a in range(9):
        for m in range(9 - a):
            value = c.call("predict", a, m)
            if c.call("predict", a, m) != value:
                c.fail(f"predict({a}, {m}) gave two different values; a fitted predictor is a function")
    if c.offers(protocols.ReportsFit):
        c.call("fit_report")


def check_scorer(cls, **options) -> None:
    """Score every kind on a tiny model, whole and partly pruned: one finite score per candidate, model untouched.

    With ``select``: choose 1 attention and 2 activation sites; every site stays present and the model runs. A
    scorer that only selects (``select`` without ``score``, the registry takes it so) is checked by ``select``.
    """
    c = UnderTest("scorer", cls, options)
    with tempfile.TemporaryDirectory(prefix="hetprune-check-") as tmp:
        for pruned in (False, True):
            model = tiny_model()
            if pruned:  # candidates are only the sites still present
                surgery.remove_attention(model, 0)
                surgery.remove_activation(model, 2)
            ctx = scoring_context(model, Path(tmp) / "score")
            for kind in ("attn", "act") if c.offers(protocols.Scorer) else ():   # a selector alone: select()
                state = _state(model)
                c.call("score", model, sites(model, kind), ctx)
                if not _same_state(state, _state(model)):
                    c.fail(f"score() changed the model's weights ({kind} sites); a scorer must leave the model as "
                           "it was")
        if c.offers(protocols.SelectingScorer):
            model = tiny_model()
            ctx = scoring_context(model, Path(tmp) / "select")
            c.call("select", model, {"attn": 1, "act": 2}, ctx)
            c.rule(lambda: model_checks.runs(model, model_checks.example_input(model), "select()"))


def check_remover(cls, **options) -> None:
    """Remove each site of the remover's kind from a fresh tiny model: exactly that site goes, the model runs.

    Then two removals in one model, whose recipe must rebuild it exactly
    (``hetprune.save`` + ``hetprune.load``): a removal a recipe cannot replay
    cannot be saved.
    """
    from ..model.recipe import arch_of, recipe_from_model

    c = UnderTest("remover", cls, options)
    kind = getattr(c.obj, "kind", None)
    if kind not in ("attn", "act"):
        c.fail(f"its kind is {kind!r}; a remover has kind 'attn' or 'act'")
    base = tiny_model()
    for site in sites(base, kind):
        c.call("remove", copy.deepcopy(base), site)
    model = copy.deepcopy(base)
    for site in (Site(1, kind), Site(3, kind)):
        c.call("remove", model, site)

    def reloads():
        try:
            recipe = recipe_from_model(model, TINY_SPEC, arch_of(base))
        except HetpruneError as exc:
            raise Violation(f"a recipe cannot describe the model after remove(): {exc}") from exc
        result_checks.check_reloads(model, recipe, model_checks.example_input(model))

    c.rule(reloads)


def _linear_model(dtype=torch.float32) -> nn.Module:
    """A tiny model with two linear MLPs (activation removed), one attention site gone, non-trivial norms."""
    model = tiny_model()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():  # LayerNorm affines and LayerScale away from 1 and 0
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    surgery.remove_activation(model, 0)
    surgery.remove_activation(model, 2)
    surgery.remove_attention(model, 1)
    return model.to(dtype).eval()


def check_merger(cls, **options) -> None:
    """Merge a tiny model with linear MLPs: exact within the declared ``tolerance`` (float32) and within
    1e-9 in float64 (exact up to rounding, not merely close); sites unchanged; a second merge and a
    merge of a dense model are exact too."""
    c = UnderTest("merger", cls, options)
    c.rule(lambda: model_checks.tolerance_of(c.obj))
    model = _linear_model()
    changed = c.call("merge", model)
    if not all(0 <= b < len(sites(model, "attn", present_only=False)) for b in changed):
        c.fail(f"merge() returned block indices {changed}, not all blocks of the model")
    c.call("merge", model)
    c.call("merge", tiny_model())

    model64 = _linear_model(torch.float64)
    reference = copy.deepcopy(model64)
    x = model_checks.example_input(model64, n=4)
    c.call("merge", model64)
    err = relative_error(outputs(reference, x), outputs(model64, x))
    if not err <= FP64_TOLERANCE:
        c.fail(f"in float64 merge() changed the outputs by {err:.3g} (relative); a merge exact up to rounding "
               f"stays within {FP64_TOLERANCE:g} there, so this one only approximates the model")


def check_width_pruner(cls, **options) -> None:
    """Prune a tiny model to 60 % of its MACs: at most the target, runnable, and its widths reload exactly."""
    from ..model.macs import count_macs
    from ..model.recipe import arch_of, recipe_from_model
    from ..model.widths import read_widths

    c = UnderTest("width_pruner", cls, options)
    base = tiny_model()
    model = copy.deepcopy(base)
    x = model_checks.example_input(model)
    target = 0.6 * count_macs(model, x[:1])
    c.call("prune", model, target, x, None)

    def reloads():
        recipe = recipe_from_model(model, TINY_SPEC, arch_of(base), widths=read_widths(model))
        result_checks.check_reloads(model, recipe, x)

    c.rule(reloads)


def check_cost_model(cls, **options) -> None:
    """Cost a tiny model and a pruned copy: positive finite numbers, the model left as it was, a ``unit``;
    removing every activation site and merging (fewer MACs, fewer layers) must not raise the cost by more
    than half (a cost that grows when work is removed cannot steer a budget); ``measure``, where present,
    gives each model a positive cost."""
    c = UnderTest("cost_model", cls, options)
    if not isinstance(getattr(c.obj, "unit", None), str) or not c.obj.unit:
        c.fail("it has no 'unit': a cost model needs a non-empty string attribute 'unit' (e.g. 'MACs', 's')")
    model = tiny_model()
    before = _state(model)
    x = model_checks.example_input(model)
    dense = c.call("cost", model, x)
    if not _same_state(before, _state(model)):
        c.fail("cost() changed the model's weights")
    pruned = copy.deepcopy(model)
    for b in range(len(sites(pruned, "act"))):
        surgery.remove_activation(pruned, b)
    surgery.merge_all(pruned)
    cheaper = c.call("cost", pruned, x)
    if cheaper > 1.5 * dense:
        c.fail(f"cost() of the model without its activations ({cheaper:g}) is far above the dense one "
               f"({dense:g}); removing work must not make a model cost more")
    if c.offers(protocols.MeasuresCost):
        c.call("measure", {"dense": model, "pruned": pruned}, x)


def check_strategy(cls, *, budgets: tuple[Budget, ...] | None = None, settings: dict | None = None,
                   **options) -> None:
    """Run the strategy on a tiny model with tiny fine-tunes, with the installed plugins.

    Each budget in ``budgets`` (default: 2 sites, else half the dense MACs)
    is tried in turn until one is accepted; refusing a budget with
    HetpruneError is allowed, refusing all is not. The accepted run must:
    leave ``job.dense`` unchanged, return a PruneResult with a complete report,
    reload from its recipe and weights to the same outputs, and keep the budget.
    ``settings`` changes the tiny settings (e.g. ``{"mix": {"ratio": 0.25}}``).
    """
    c = UnderTest("strategy", cls, options)
    refusals = []
    for budget in budgets or (Budget(sites=2), Budget(target_macs=0.5)):
        with tempfile.TemporaryDirectory(prefix="hetprune-check-") as tmp:
            job = tiny_job(budget, tmp, c.obj, settings, name=c.name)
            try:
                result = c.call("run", job, refusal_ok=True)
            except HetpruneError as exc:
                refusals.append(f"{budget.describe()}: {exc}")
                continue
        report = result.report
        if budget.sites is not None and report["n_attn"] + report["n_act"] > budget.sites:
            c.fail(f"it removed {report['n_attn']} + {report['n_act']} sites for a budget of {budget.sites}")
        limit = budget.mac_limit(report["dense_macs"])
        if limit is not None and report["macs"] > limit:
            c.fail(f"its result has {report['macs']} MACs, above the budget's {math.floor(limit)}")
        return
    c.fail("it refused every budget it was given: " + "; ".join(refusals))


def check_architecture(cls, make_model: Callable[[], nn.Module] | None = None, example: torch.Tensor | None = None,
                       **options) -> None:
    """An adapter on a tiny model of its family: it recognises the model, removal of every site (one at a
    time, and several together) equals the functional reference in float64, merges are exact, the pruned
    model reloads bit-identically from its recipe, and MAC counts equal FlopCounterMode's count.

    ``make_model`` builds a tiny model of the family (random weights); without it the adapter's
    ``example_spec`` (a [`hetprune.ModelSpec`][hetprune.model.spec.ModelSpec]) is built. The reload is checked either way: with
    ``make_model``, the saved recipe and weights are applied to a fresh ``make_model()`` (what
    [`hetprune.apply_recipe`][hetprune.model.recipe.apply_recipe] users do); with ``example_spec``, through [`hetprune.load`][hetprune.model.recipe.load].

    ``cls`` may also be a ready adapter, such as ``hetprune.model.adapters.generic(blocks=..., layout=...)`` for
    a transformer you wrote: it is pinned for the check instead of registered. ``example``: an input batch,
    for a model whose input shape hetprune cannot tell (one it did not build).
    """
    from types import SimpleNamespace

    from ..core import plugins
    from ..model.adapters import adapter_for, serving
    from ..core.hookspecs import hookimpl

    c = UnderTest("architecture", cls, options)
    spec = getattr(c.obj, "example_spec", None)
    rebuild = make_model   # a fresh base for the reload check; None: hetprune.load builds example_spec
    if make_model is None:
        if spec is None:
            c.fail("it has no example_spec (a ModelSpec of a tiny model of its family), and no make_model was "
                   "given to the check")
        make_model = functools.partial(build, spec)
    torch.manual_seed(0)
    try:
        base = make_model().eval().double()
    except HetpruneError as exc:  # e.g. the family's optional library is not installed
        c.fail(f"cannot build its example model: {exc}", exc)
    if not c.obj.matches(base):
        c.fail(f"matches() is False for a {type(base).__name__}, the model it was given as its family's")
    if not isinstance(cls, type):   # a ready adapter: pinned for the check, as a job pins it
        try:
            c.obj.check(base)
            with serving(c.obj), model_checks.examples_from(example):
                c.rule(lambda: _architecture_rules(base, spec, rebuild))
        except HetpruneError as exc:
            c.fail(f"{type(exc).__name__}: {exc}", exc)
        return
    name = "hetprune-testing-architecture"
    registry = plugins.get_registry()
    installed = any(registry.component("architecture", n).factory is cls for n in registry.names("architecture"))
    if not installed:  # an adapter under development: registered for the duration of the check
        plugins.register_plugin(SimpleNamespace(register_architectures=hookimpl(lambda register: register(cls))),
                                name=name)
    try:
        if type(contract.unwrap(adapter_for(base))) is not cls:
            c.fail(f"another adapter ({adapter_for(base).name}) already claims {type(base).__name__}")
        with model_checks.examples_from(example):
            c.rule(lambda: _architecture_rules(base, spec, rebuild))
    except HetpruneError as exc:
        c.fail(f"{type(exc).__name__}: {exc}", exc)
    finally:
        if not installed:
            plugins.unregister_plugin(name)


def _reloaded(model: nn.Module, base: nn.Module, spec: ModelSpec | None,
              rebuild: Callable[[], nn.Module] | None) -> nn.Module:
    """``model`` saved with its recipe and loaded back: by [`hetprune.load`][hetprune.model.recipe.load] (``rebuild`` None), or by
    applying the saved recipe and weights to a fresh ``rebuild()`` base, as [`hetprune.apply_recipe`][hetprune.model.recipe.apply_recipe]
    users do for a model hetprune cannot build by name."""
    from ..model.recipe import WEIGHTS_FILE, apply_recipe, arch_of, load, load_recipe, recipe_from_model, save
    from ..core.io import load_weights
    from ..model.spec import load_state_into

    named = spec or ModelSpec(f"{type(base).__name__} (built by make_model)")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "m"
        try:
            save(folder, model, recipe_from_model(model, named, arch_of(base)))
            if rebuild is None:
                return load(folder)
            fresh = apply_recipe(rebuild().float(), load_recipe(folder), compute_merge=False)
            load_state_into(fresh, load_weights(folder / WEIGHTS_FILE), "the saved weights")
            return fresh.eval()
        except HetpruneError as exc:
            raise Violation(f"the pruned model does not reload from its recipe and weights: {exc}") from exc


def _architecture_rules(base: nn.Module, spec: ModelSpec | None, rebuild: Callable[[], nn.Module] | None) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from ..model.macs import count_macs

    x = model_checks.example_input(base, n=2).double()
    n = len(sites(base, "attn", present_only=False))
    if sites(base) != [Site(i, k) for i in range(n) for k in ("attn", "act")]:
        raise Violation(f"sites() are not two per block in block order: {sites(base)}")

    def removed(plan):
        model = copy.deepcopy(base)
        for site in plan:
            (surgery.remove_attention if site.kind == "attn" else surgery.remove_activation)(model, site.block)
        with surgery.functional_reference(base, plan):
            reference = outputs(base, x)
        err = relative_error(reference, outputs(model, x))
        if not err <= FP64_TOLERANCE:
            raise Violation(f"removing {', '.join(map(str, plan))} differs from the functional reference (attention "
                            f"-> zeros, activation -> identity) by {err:.3g} (relative, float64)")
        return model

    for site in sites(base):
        removed([site])
    plan = [Site(0, "attn"), Site(0, "act"), Site(n - 1, "act")]
    model = removed(plan)
    before = outputs(model, x)
    surgery.merge_all(model)
    err = relative_error(before, outputs(model, x))
    if not err <= FP64_TOLERANCE:
        raise Violation(f"merging changed the outputs by {err:.3g} (relative, float64)")
    model = model.float().eval()
    if not torch.equal(outputs(_reloaded(model, base, spec, rebuild), x.float()), outputs(model, x.float())):
        onto = " onto a fresh make_model() base" if rebuild is not None else ""
        raise Violation(f"the pruned model does not reload bit-identically from its recipe and weights{onto}")
    for what, m in (("dense", base.float()), ("pruned", model)):
        counter = FlopCounterMode(display=False)
        with sdpa_kernel(SDPBackend.MATH), counter:
            m(x.float())
        macs, flops = count_macs(m, x.float()), counter.get_total_flops() / 2 / x.shape[0]
        if macs != flops:
            raise Violation(f"the {what} model counts {macs} MACs per image, FlopCounterMode {flops:g}: the adapter's "
                            "attention_macs (or a layer applied without its module) is off")


# kind -> its check, for every kind whose record names one (`hetprune.harness.kinds`)
CHECKS = kinds.ByKind(lambda record: record.check, when=lambda record: record.check is not None)


def check(kind: str, cls, **options) -> None:
    """Run the check of component kind ``kind`` (its record's) on ``cls``."""
    if kind not in CHECKS:
        raise HetpruneError(f"no conformance check for component kind {kind!r}; kinds: {', '.join(CHECKS)}")
    CHECKS[kind](cls, **options)
