"""The plugin contract of hetprune: every hook a plugin may implement.

A plugin is a module (or object) with functions decorated ``@hetprune.hookimpl``
whose names match the hooks below. Registration hooks hand the plugin a
``register`` callback; call it once per component. A component is a class (or
any callable returning an object) with a ``name`` attribute; hetprune builds
it with keyword options when a run asks for it by name.

Each registration hook belongs to one kind of component, whose record
(`hetprune.harness.kinds`) names it beside the kind's protocol, rules and
conformance check; a kind added outside hetprune brings its own hookspec in
its record (`hetprune.core.plugins.register_kind`).

Every call hetprune makes into a component is checked against the contract
below (`hetprune.core.contract`): a broken promise, or an exception from plugin
code, is one error naming the plugin, the component and the stage.
``hetprune.harness.testing`` checks a component against the same contract in a test.

Built-in components are plugins like yours: see ``plugins/`` in the repository.
"""

from __future__ import annotations

from typing import Callable, Protocol, TypeVar

import pluggy

PROJECT = "hetprune"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

_Built = TypeVar("_Built", contravariant=True)


class Register(Protocol[_Built]):
    """The ``register`` callback a registration hook receives: call it once per component, with a class (or any
    callable) that builds one. Annotated with the kind's protocol (``register: Register[Scorer]``), it lets a
    type checker hold every class a plugin registers to that protocol; hetprune checks what it builds at run
    time either way."""

    def __call__(self, component: Callable[..., _Built], /) -> None: ...


@hookspec
def register_predictors(register: Register) -> None:
    """Register metric predictors (stage 1 of HetDPT: budget allocation; MAP predicts accuracy, or whatever
    the task measures).

    A predictor class has a ``name`` and, once built, two methods:

    * ``fit(points)`` — ``points`` is a list of ``(n_attn, n_act, metric)``
      triples measured with a short fine-tune. Raise ``HetpruneError`` when
      the points cannot support the fit (say how many are needed).
    * ``predict(n_attn, n_act) -> float`` — the predicted metric.

    Optional: ``fit_report() -> dict`` with fit errors (for example ``mae``,
    ``rmse``, ``loo_mae``), copied into the run report; ``uncertainty(n_attn,
    n_act) -> float``, the standard deviation of a prediction, reported beside
    it.
    """


@hookspec
def register_checks(register: Register) -> None:
    """Register checks policies (stage 1 of HetDPT, past the paper: which splits are checked after the
    predictor's fit, and how; ``hetdpt.checks`` names one, ``hetdpt.checks_options`` gives its options).

    A policy class has a ``name``, a ``measure`` (``"pipeline"``: each candidate through the final run's own
    selection and fine-tune, by successive halving; ``"points"``: a point of the run's point scheme) and,
    once built, three methods:

    * ``most(pairs) -> int`` — the most splits it checks of the feasible ``pairs`` (0: none; what ``--plan``
      counts).
    * ``known(pairs)`` — the splits it checks where they are known before any point (then no point is
      measured and no predictor fitted: the pick is the best checked), else None.
    * ``candidates(pairs, value, loo_mae, sign)`` — the splits to check, best first, chosen by ``value``
      (split -> the predicted or refined metric; ``sign`` -1: lower is better) and the predictor's
      leave-one-out error (None where it cannot say).

    A pipeline policy may size its checks with ``budget``, ``unit``, ``selection`` and
    ``selection_at_least`` (as the built-in ones do; the defaults where it has none).
    """


@hookspec
def register_scorers(register: Register) -> None:
    """Register importance scorers (stage 2: which sites of one kind to remove).

    A scorer class has a ``name`` and, once built, the method
    ``score(model, sites, ctx) -> dict[Site, float]`` giving every candidate
    site (all of one kind) a score: higher means more important, keep it.
    ``ctx`` is a [`hetprune.ScoringContext`][hetprune.pruning.pipeline.ScoringContext] (data, loss, device, seed).

    A scorer that learns while it removes (the paper's gates) may instead
    provide ``select(model, counts, ctx) -> list[Site]``, where ``counts`` is
    ``{"attn": n_attn, "act": n_act}``; the pipeline then calls it in place
    of ranking by ``score``.
    """


@hookspec
def register_removers(register: Register) -> None:
    """Register layer removers: turn one site off in a model, in place.

    A remover class has a ``name``, a ``kind`` (``"attn"`` or ``"act"``) and
    ``remove(model, site) -> dict`` returning what it did, for the recipe
    (for example ``{"attn_mode": "identity"}``).
    """


@hookspec
def register_mergers(register: Register) -> None:
    """Register mergers: fold what removal made linear, in place.

    A merger class has a ``name`` and ``merge(model) -> list[int]`` returning
    the block indices it changed. It must leave the model's function
    unchanged up to float rounding: each merge is checked against the
    unmerged model, within the class attribute ``tolerance`` (relative output
    error, default ``1e-4``) in the model's dtype.
    """


@hookspec
def register_strategies(register: Register) -> None:
    """Register pruning strategies: complete recipes for pruning a model.

    A strategy class has a ``name``, a one-line ``description`` and
    ``run(job) -> hetprune.PruneResult`` where ``job`` is a
    [`hetprune.PruneJob`][hetprune.pruning.pipeline.PruneJob] (dense model, data, budget, settings,
    registry, events, a work folder for resumable state). Most depth
    strategies subclass [`hetprune.DepthStrategy`][hetprune.pruning.pipeline.DepthStrategy] and only override
    ``allocate``.
    """


@hookspec
def register_width_pruners(register: Register) -> None:
    """Register width pruners (heads, head dimension, MLP hidden, embedding).

    A width pruner class has a ``name`` and
    ``prune(model, target_macs, example_inputs, ctx) -> dict | None`` which
    shrinks the model in place until its MACs are at most ``target_macs`` and
    may return what it did, for the run report. The pipeline records the
    resulting widths in the recipe.
    """


@hookspec
def register_architectures(register: Register) -> None:
    """Register architecture adapters: everything one model family means for pruning.

    An adapter class has a ``name``, a one-line ``description`` and, once
    built, ``matches(model) -> bool`` (by module types, never by model name)
    plus the operations of `hetprune.model.adapters.Adapter`: where the
    blocks are, how to remove a site, whether and how an MLP merges, where
    scorers hook, how attention is counted in MACs. Most families subclass
    `hetprune.model.adapters.PreNormAdapter` and only name their types and
    child names. Of the adapters that match a model, the most specific serves it (a higher ``priority``,
    then the nearest model type, then the nearest block type: `hetprune.model.adapters.adapter_for`);
    registration order never decides, and two equally specific adapters are an error naming both.
    """


@hookspec
def register_cost_models(register: Register) -> None:
    """Register cost models: what a budget in cost (``--target-speedup``, ``--target-latency``) counts.

    A cost model class has a ``name``, a ``unit`` (text, e.g. ``"MACs"`` or
    ``"s"``) and, once built, ``cost(model, example) -> float``: the cost of
    one forward pass of ``model`` (a positive finite number; only ratios and
    absolute targets in ``unit`` are compared). ``example`` is a batch of
    inputs on the run's device. Strategies turn a budget into splits with it,
    so every strategy of a comparison is held to the same model.

    Optional: ``measure(models, example) -> dict[str, float]`` (``models``:
    name -> module) the measured cost of whole models in ``unit``, reported
    beside the prediction; ``describe() -> dict`` facts for the run report
    (device, batch size, cache file); ``prepare(models, example)`` called
    with models (a dense one and its variants) before they are costed, so a
    measuring model can time them together (the latency table does: times
    from one session compare, times from sessions seconds apart may not).
    """


@hookspec
def on_stage_start(stage: str, info: dict) -> None:
    """Observe: a pipeline stage (``allocate``, ``select``, ``finetune``,
    ``merge``, ``measure``, ...) is starting. ``info`` names the strategy, the
    run's work folder (``workdir``), the run (``run``: one id for all its
    stages) and whether it resumes an earlier one (``resume``), and the
    settings of the stage."""


@hookspec
def on_stage_end(stage: str, info: dict) -> None:
    """Observe: a pipeline stage finished; ``info`` holds its results."""


@hookspec
def on_point_collected(point: dict) -> None:
    """Observe: one predictor point was measured. ``point`` has ``n_attn``,
    ``n_act``, ``metric`` (the task's metric there; older points files say ``accuracy``)
    and the sites that were removed."""


@hookspec
def on_epoch_end(stage: str, epoch: int, metrics: dict) -> None:
    """Observe: a training epoch ended inside ``stage``; ``metrics`` has at
    least ``loss``; a fine-tune's epochs also ``lr``, ``images_per_s`` and
    ``seconds`` and, where evaluated, ``metric`` (``accuracy`` too for top-1)
    and ``ema_metric``."""
