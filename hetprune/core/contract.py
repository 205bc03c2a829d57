"""The plugin contract, enforced: every component the registry builds is
wrapped in `Checked`, which validates what the contract methods return
and turns a broken promise or an exception from plugin code into a
[`PluginError`][hetprune.core.errors.PluginError] naming the plugin, the component, the
stage and what was wrong.

Each kind's rules are a table of functions, one per method, held by the kind's record
(`hetprune.core.kinds.ComponentKind`): here those that need no model surgery (predictors, cost
models, adapters); those that run a model (scorers, removers, mergers, width pruners) and check a
strategy's result live above the modules they need and come in through their kinds' records, which
load them the first time the registry builds a component of the kind (`rules_for`). So this module
names no module above it, no component runs unchecked, and a kind without rules is an error.
``hetprune.harness.testing`` runs the same rules, plus deeper ones, on tiny models.
Exceptions raised by hetprune's own code (the core, or a built-in plugin) are
hetprune's bugs and pass through unchanged, traceback and all.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import numbers
import os
import sys
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

from . import kinds
from .config import ATTN_MODES
from .errors import HetpruneError, PluginError, ValReadWhileChoosing




class Violation(Exception):
    """A broken rule of the contract; the message says what was wrong and what is required."""


# -- the pipeline stage, for messages --------------------------------------------------------------

_stages: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("hetprune_stages", default=())


def enter_stage(stage: str) -> None:
    _stages.set(_stages.get() + (stage,))


def leave_stage(stage: str) -> None:
    stack = _stages.get()
    if stack and stack[-1] == stage:
        _stages.set(stack[:-1])


def current_stage() -> str | None:
    stack = _stages.get()
    return stack[-1] if stack else None


# -- choices: what a strategy decides from measurements (never from the val set the result reports) ----

_choosing: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("hetprune_choosing", default=())


@contextlib.contextmanager
def choosing(what: str):
    """A part of a run that decides something from measurements (a split, the sites, a share, a best epoch):
    inside it a task with a selection split refuses to evaluate on its val set (`check_val_read`)."""
    token = _choosing.set(_choosing.get() + (what,))
    try:
        yield
    finally:
        _choosing.reset(token)


def current_choice() -> str | None:
    """What is being chosen now (the innermost `choosing`), or None outside every choice."""
    stack = _choosing.get()
    return stack[-1] if stack else None


def check_val_read(task_name: str) -> None:
    """Refuse a read of a task's val set while a choice is made: the number it gives would pick what the
    result then reports on the same images (a strategy that tries K splits and keeps the best on val beats a
    baseline that runs once). Called by a task that has a selection split to measure choices on instead."""
    what = current_choice()
    if what is not None:
        stage = current_stage()
        raise ValReadWhileChoosing(
            f"the val set of task {task_name!r} was read while choosing {what}"
            f"{f' (stage {stage})' if stage else ''}: every choice is measured on the task's selection split "
            "(job.choice_metric(model), or task.evaluate(model, split='selection')), never on the val set the "
            "result reports")


# -- who a component belongs to ----------------------------------------------------------------------

@dataclass(frozen=True)
class Origin:
    """Where a component comes from, for messages and for telling its faults from hetprune's."""

    plugin: str
    version: str = ""
    distribution: str = ""
    source: str = "registered in code"
    builtin: bool = False            # shipped with hetprune: its exceptions are hetprune's bugs
    homes: tuple[str, ...] = ()      # files and folders holding the plugin's own code

    def describe(self) -> str:
        if self.distribution:
            where = f"{self.distribution} {self.version}".strip()
        else:
            where = self.source + (f", version {self.version}" if self.version else ", no version")
        return f"plugin {self.plugin!r} ({where})"


def code_home(module_name: str | None) -> list[str]:
    """The file, or the top-level package folder, holding a module's code."""
    if not module_name:
        return []
    top = sys.modules.get(module_name.split(".")[0]) or sys.modules.get(module_name)
    if top is None:
        return []
    paths = list(getattr(top, "__path__", None) or [])
    if not paths and getattr(top, "__file__", None):
        paths = [top.__file__]
    return [str(Path(p).resolve()) for p in paths]


def _hetprune_home() -> str:
    return str(Path(__file__).resolve().parent.parent)   # the hetprune package


def _under(filename: str, roots: list[str]) -> bool:
    try:
        path = str(Path(filename).resolve())
    except (OSError, RuntimeError):
        return False
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def plugin_fault(exc: BaseException, origin: Origin, ours: list[str], skip: int = 1) -> bool:
    """Whether ``exc`` (raised through a component call) is the plugin's fault rather than hetprune's.

    Why file paths: a plugin may be an installed distribution, a local module given with ``--plugin`` or
    code registered in a session; the one thing every exception carries about who raised it is its
    traceback, and the file of each frame says whose code that frame ran (hetprune's folder, a built-in
    plugin's, the plugin's own ``homes``, or a library's).

    The innermost frame in either hetprune's code (``ours``: the core and the
    built-in plugins) or the plugin's own code decides; frames in libraries
    (torch, numpy, ...) count for whoever called them. ``skip`` leaves out the
    calling frames of the check itself.
    """
    if origin.builtin:
        return False
    homes = list(origin.homes)
    owner = None
    for frame, _ in list(traceback.walk_tb(exc.__traceback__))[skip:]:
        name = frame.f_code.co_filename
        if _under(name, homes):
            owner = "plugin"
        elif _under(name, ours):
            owner = "hetprune"
    return owner != "hetprune"


# -- small readers shared by the rules --------------------------------------------------------------

def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def type_name(value: Any) -> str:
    return type(value).__name__


def jsonable(value: Any, what: str) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise Violation(f"{what} must be JSON-serialisable (it goes into report.json): {exc}") from exc


# -- the rules, one function per contract method ----------------------------------------------------
# Each takes ``(component, call, *args, **kwargs)``: ``call`` runs the plugin's method with the same
# arguments. It returns what the pipeline should get, or raises Violation.

def _site_count(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0


def fit_points(points: Any) -> list:
    """``fit()``'s points as the hookspec promises them: ``(n_attn, n_act, metric)`` triples with whole
    site counts >= 0 and a finite metric. Bad points are the caller's fault, not the predictor's:
    a HetpruneError, so the predictor is not blamed."""
    bad = None if isinstance(points, (list, tuple)) else f"a {type_name(points)}"
    for p in points if bad is None else ():
        if not (isinstance(p, (list, tuple)) and len(p) == 3 and _site_count(p[0]) and _site_count(p[1])
                and is_number(p[2]) and math.isfinite(p[2])):
            bad = f"the point {p!r}"
            break
    if bad is not None:
        raise HetpruneError(f"a predictor's fit() was given {bad}; points must be a list of (n_attn, n_act, "
                            "metric) triples with whole site counts >= 0 and a finite metric")
    return list(points)


def finite_numbers(value: Any, where: str) -> None:
    """Every number in ``value`` (nested dicts and lists too) is finite: JSON writes NaN and inf silently."""
    if isinstance(value, dict):
        for k, v in value.items():
            finite_numbers(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            finite_numbers(v, f"{where}[{i}]")
    elif is_number(value) and not math.isfinite(value):
        raise Violation(f"{where} is {value}; the numbers of a fit report must be finite (None for one that "
                        "cannot be computed)")


def _other(call, component, method: str):
    """Another method of ``component`` for a rule to call: through the proxy where there is one (so an
    exception is attributed as a direct call's), else the method itself (the conformance kit)."""
    other = getattr(call, "other", None)
    return partial(other, method) if other is not None else getattr(component, method)


def predictor_fit(component, call, points, *args, **kwargs):
    """Well-formed points in; out, a predictor that predicts a finite number at every split it was fitted
    on and reports finite fit errors."""
    points = fit_points(points)
    result = call(points, *args, **kwargs)
    for a, m in sorted({(p[0], p[1]) for p in points}):
        try:
            predictor_predict(component, _other(call, component, "predict"), a, m)
        except Violation as exc:
            raise Violation(f"{exc} (after fit(), at a split it was fitted on)") from exc
        except HetpruneError as exc:
            if type(exc) is not HetpruneError:   # a PluginError already names the plugin and the method
                raise
            raise Violation(f"after fit(), predict({a}, {m}) refused a split it was fitted on: {exc}") from exc
    if callable(getattr(component, "fit_report", None)):
        try:
            predictor_fit_report(component, _other(call, component, "fit_report"))
        except Violation as exc:
            raise Violation(f"after fit(), {exc}") from exc
    return result


def predictor_predict(component, call, n_attn, n_act, *args, **kwargs):
    value = call(n_attn, n_act, *args, **kwargs)
    if not is_number(value):
        raise Violation(f"predict({n_attn}, {n_act}) returned a {type_name(value)} ({value!r}); "
                        "a prediction must be a finite real number (float)")
    if not math.isfinite(value):
        raise Violation(f"predict({n_attn}, {n_act}) returned {value}; a prediction must be a finite number")
    return float(value)


def predictor_fit_report(component, call, *args, **kwargs):
    report = call(*args, **kwargs)
    if not isinstance(report, dict):
        raise Violation(f"fit_report() returned a {type_name(report)}; it must return a dict of fit errors")
    bad = [k for k in report if not isinstance(k, str)]
    if bad:
        raise Violation(f"fit_report() has non-string keys {bad!r}; its keys must be strings")
    jsonable(report, "fit_report()")
    finite_numbers(report, "fit_report()")
    return report


def cost_model_cost(component, call, model, example, *args, **kwargs):
    value = call(model, example, *args, **kwargs)
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        raise Violation(f"cost() returned {value!r} ({type_name(value)}); it must return a positive finite "
                        f"number, the cost of one forward pass in {getattr(component, 'unit', 'its unit')}")
    return float(value)


def cost_model_measure(component, call, models, example, *args, **kwargs):
    value = call(models, example, *args, **kwargs)
    if not isinstance(value, dict) or set(value) != set(models) or not all(
            is_number(v) and math.isfinite(v) and v > 0 for v in value.values()):
        raise Violation(f"measure() returned {value!r}; it must return a positive finite cost for each of the "
                        f"models {sorted(models)}")
    return {k: float(v) for k, v in value.items()}


# -- architecture adapters: asked wherever a model is read, so each rule is cheap -------------------------

def architecture_matches(component, call, model, *args, **kwargs):
    value = call(model, *args, **kwargs)
    if not isinstance(value, bool):
        raise Violation(f"matches() returned {value!r} ({type_name(value)}); it must return True or False")
    return value


def architecture_specificity(component, call, model, *args, **kwargs):
    value = call(model, *args, **kwargs)
    if not isinstance(value, tuple) or not all(is_number(v) for v in value):
        raise Violation(f"specificity() returned {value!r}; it must return a tuple of numbers (larger: more "
                        "specific), as hetprune.model.adapters.Adapter.specificity does")
    return value


def architecture_blocks(component, call, model, *args, **kwargs):
    from torch import nn

    blocks = call(model, *args, **kwargs)
    if not isinstance(blocks, list) or not all(isinstance(b, nn.Module) for b in blocks):
        raise Violation(f"blocks() returned a {type_name(blocks)}; it must return a list of the model's blocks "
                        "(torch modules), in the order of the sites")
    return blocks


def architecture_block_slots(component, call, model, *args, **kwargs):
    from torch import nn

    slots = call(model, *args, **kwargs)
    good = isinstance(slots, list) and all(
        isinstance(s, tuple) and len(s) == 2 and isinstance(s[0], nn.Module) and isinstance(s[1], str)
        and isinstance(getattr(s[0], s[1], None), nn.Module) for s in slots)
    if not good:
        raise Violation(f"block_slots() returned {slots!r:.200}; it must return a list of (parent module, child "
                        "name) pairs, each naming one block of the model")
    return slots


def architecture_max_removals(component, call, model, *args, **kwargs):
    limits = call(model, *args, **kwargs)
    n = len(component.block_slots(model))
    whole = isinstance(limits, dict) and set(limits) == {"attn", "act"} and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= n for v in limits.values())
    if not whole:
        raise Violation(f"max_removals() returned {limits!r}; it must return {{'attn': a, 'act': m}} with whole "
                        f"numbers from 0 to the model's {n} blocks")
    return limits


def architecture_removed(component, call, model, block, kind, *args, **kwargs):
    value = call(model, block, kind, *args, **kwargs)
    if not isinstance(value, bool):
        raise Violation(f"removed({block}, {kind!r}) returned {value!r} ({type_name(value)}); it must return True "
                        "or False")
    return value


def architecture_attn_mode(component, call, model, block, *args, **kwargs):
    mode = call(model, block, *args, **kwargs)
    if mode is not None and mode not in ATTN_MODES:
        raise Violation(f"attn_mode({block}) returned {mode!r}; it must return None (attention present) or one of "
                        f"{', '.join(ATTN_MODES)}")
    return mode


def architecture_arch(component, call, model, *args, **kwargs):
    facts = call(model, *args, **kwargs)
    if not isinstance(facts, dict) or not all(isinstance(k, str) for k in facts):
        raise Violation(f"arch() returned {facts!r}; it must return a dict of shape facts (depth, embed_dim, ...)")
    jsonable(facts, "arch()")
    return facts


# -- checks policies -----------------------------------------------------------------------------------------

def _splits_of(result, pairs, what: str) -> list[tuple[int, int]]:
    """``result`` as distinct feasible splits (tuples), or a Violation saying what it was."""
    if not isinstance(result, (list, tuple)):
        raise Violation(f"{what} returned a {type_name(result)}; it must return a list of (n_attn, n_act) splits")
    feasible = {tuple(p) for p in pairs}
    out = []
    for split in result:
        split = tuple(split) if isinstance(split, (list, tuple)) else split
        if split not in feasible:
            raise Violation(f"{what} returned {split!r}, which is not one of the feasible splits it was given")
        if split in out:
            raise Violation(f"{what} returned {split!r} twice; each split is checked once")
        out.append(split)
    return out


def checks_most(component, call, pairs, *args, **kwargs):
    value = call(pairs, *args, **kwargs)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
        raise Violation(f"most() returned {value!r}; it must return a whole number of splits >= 0")
    return int(value)


def checks_known(component, call, pairs, *args, **kwargs):
    value = call(pairs, *args, **kwargs)
    return None if value is None else _splits_of(value, pairs, "known()")


def checks_candidates(component, call, pairs, value, *args, **kwargs):
    result = _splits_of(call(pairs, value, *args, **kwargs), pairs, "candidates()")
    most = checks_most(component, _other(call, component, "most"), pairs)
    if len(result) > max(most, 1):
        raise Violation(f"candidates() returned {len(result)} splits and most() says {most}: --plan counts "
                        "most(), so a run must not check more")
    return result


# method -> rule, for the kinds whose rules need no model (their records, `hetprune.harness.kinds`, hold them)
PREDICTOR_RULES: dict[str, Callable] = {"fit": predictor_fit, "predict": predictor_predict,
                                        "fit_report": predictor_fit_report}
CHECKS_RULES: dict[str, Callable] = {"most": checks_most, "known": checks_known, "candidates": checks_candidates}
COST_MODEL_RULES: dict[str, Callable] = {"cost": cost_model_cost, "measure": cost_model_measure}
ARCHITECTURE_RULES: dict[str, Callable] = {
    "matches": architecture_matches, "specificity": architecture_specificity, "blocks": architecture_blocks,
    "block_slots": architecture_block_slots, "max_removals": architecture_max_removals,
    "removed": architecture_removed, "attn_mode": architecture_attn_mode, "arch": architecture_arch}


def rules_for(kind: str) -> dict[str, Callable]:
    """The rules of ``kind``, from its record (loaded the first time); a kind without rules is an error, so no
    component is ever built unchecked."""
    record = kinds.RECORDS.get(kind)
    if record is None or not record.loaded_rules:
        with_rules = ", ".join(sorted(name for name, r in kinds.RECORDS.items() if r is not record))
        raise HetpruneError(f"the plugin contract has no rules for components of kind {kind!r}; kinds with "
                            f"rules: {with_rules}")
    return record.loaded_rules


# kind -> method -> rule, for every kind registered (each kind's rules load when first read)
RULES = kinds.ByKind(lambda record: rules_for(record.name))


# -- the proxy ----------------------------------------------------------------------------------------

class Checked:
    """A component as hetprune uses it: the contract methods are checked, everything else passes through.

    ``origin`` is called (once, when needed) for the component's `Origin`.
    """

    __slots__ = ("_target", "_kind", "_name", "_origin_fn", "_origin", "_ours_fn")

    def __init__(self, target: Any, kind: str, name: str, origin: Callable[[], Origin],
                 ours: Callable[[], list[str]] = list):
        for attr, value in (("_target", target), ("_kind", kind), ("_name", name), ("_origin_fn", origin),
                            ("_origin", None), ("_ours_fn", ours)):
            object.__setattr__(self, attr, value)

    # A checked component stands in for the plugin's object everywhere hetprune and plugins hold one, so
    # ``isinstance(component, TheClass)`` must keep answering for the plugin's class: ``__class__`` reports
    # the target's type (``type(component)`` still says Checked; `unwrap` gives the object itself).
    @property
    def __class__(self):
        return type(self._target)

    def __getattr__(self, attr: str):
        value = getattr(self._target, attr)
        rule = rules_for(self._kind).get(attr)
        if rule is None or not callable(value):
            return value
        return partial(self._call, attr, value, rule)

    def __setattr__(self, attr: str, value) -> None:
        setattr(self._target, attr, value)

    def __repr__(self) -> str:
        return f"<checked {self._kind} {self._name!r}: {self._target!r}>"

    @property
    def origin(self) -> Origin:
        if self._origin is None:
            object.__setattr__(self, "_origin", self._origin_fn())
        return self._origin

    def _call(self, method: str, function: Callable, rule: Callable, *args, **kwargs):
        saved = _stages.get()
        try:
            result = rule(self._target, _Call(self, method, function), *args, **kwargs)
        except Violation as exc:
            raise self._error(method, f"broke the plugin contract: {exc}") from exc
        finally:
            if method == "run":  # a failed stage never reached stage_end: forget it
                _stages.set(saved)
        return self if result is self._target else result

    def _invoke(self, method: str, function: Callable, *args, **kwargs):
        try:
            return function(*args, **kwargs)
        except (HetpruneError, Violation):  # the user's mistake, said by the plugin; or a nested check
            raise
        except Exception as exc:
            ours = [_hetprune_home(), *self._ours()]
            if plugin_fault(exc, self.origin, ours):
                hint = "; --debug (or HETPRUNE_DEBUG=1) shows the traceback"
                raise self._error(method, f"raised {type(exc).__name__}: {exc}{hint}") from exc
            raise  # hetprune's own bug: keep the traceback

    def _ours(self) -> list[str]:
        """Where hetprune's own built-in plugins live (the registry says): their faults are hetprune bugs."""
        return self._ours_fn()

    def _error(self, method: str, what: str) -> PluginError:
        stage = current_stage()
        where = f"stage {stage}, {method}()" if stage else f"{method}()"
        origin = self.origin
        return PluginError(f"{origin.describe()}: {self._kind} {self._name!r} {what} [{where}]",
                           plugin=origin.plugin, kind=self._kind, component=self._name, stage=stage or method)


class _Call:
    """What a rule calls: the checked method, and (`other`) another method of the same component,
    each with the fault attribution of a direct call through the proxy."""

    def __init__(self, proxy: Checked, method: str, function: Callable):
        self.proxy, self.method, self.function = proxy, method, function

    def __call__(self, *args, **kwargs):
        return self.proxy._invoke(self.method, self.function, *args, **kwargs)

    def other(self, method: str, *args, **kwargs):
        return self.proxy._invoke(method, getattr(self.proxy._target, method), *args, **kwargs)


def unwrap(component: Any) -> Any:
    """The plugin's own object behind a checked component."""
    return object.__getattribute__(component, "_target") if type(component) is Checked else component
