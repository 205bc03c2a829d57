"""The built-in component kinds, one record each (`hetprune.core.kinds.ComponentKind`): the hook that registers
the kind's components, the Protocol they meet, the rules every call is checked against and the conformance
kit's check. Adding a kind is one record here (with its hook, protocol, rules and check written where they
belong).

The records sit in the harness layer because it is the lowest that sees all four (the kit is here), and core's
registry takes them from here (`hetprune.core.plugins.register_kind`), so core names no module above it.
``import hetprune`` imports this module (the package sits above every layer), so every kind is registered
before anything asks for one. What needs torch (the rules that run a model, the kit) loads the first time it
is used: ``import hetprune`` stays cheap.
"""

from __future__ import annotations

from ..core import contract, hookspecs
from ..core.kinds import ComponentKind
from ..core.plugins import register_kind
from ..pruning import protocols as p


def _model_checks():
    from ..model import checks   # rules that run a model: torch, loaded when such a component is first built

    return checks


def _result_checks():
    from ..pruning import result_checks   # a strategy's result: the pipeline and the recipe

    return result_checks


def _kit():
    from . import testing   # the conformance kit builds tiny torch models

    return testing


KINDS = (
    ComponentKind("predictor", hookspecs.register_predictors, p.Predictor, rules=contract.PREDICTOR_RULES,
                  check=lambda cls, **options: _kit().check_predictor(cls, **options),
                  optional=(p.ReportsFit, p.ReportsUncertainty)),
    ComponentKind("checks", hookspecs.register_checks, p.ChecksPolicy, rules=contract.CHECKS_RULES,
                  check=lambda cls, **options: _kit().check_checks(cls, **options), optional=(p.SizesChecks,)),
    ComponentKind("scorer", hookspecs.register_scorers, p.Scorer, rules=lambda: _model_checks().SCORER_RULES,
                  check=lambda cls, **options: _kit().check_scorer(cls, **options),
                  optional=(p.SelectingScorer,), instead=(p.SelectingScorer,)),
    ComponentKind("remover", hookspecs.register_removers, p.Remover, rules=lambda: _model_checks().REMOVER_RULES,
                  check=lambda cls, **options: _kit().check_remover(cls, **options)),
    ComponentKind("merger", hookspecs.register_mergers, p.Merger, rules=lambda: _model_checks().MERGER_RULES,
                  check=lambda cls, **options: _kit().check_merger(cls, **options)),
    ComponentKind("strategy", hookspecs.register_strategies, p.Strategy,
                  rules=lambda: _result_checks().STRATEGY_RULES,
                  check=lambda cls, **options: _kit().check_strategy(cls, **options)),
    ComponentKind("width_pruner", hookspecs.register_width_pruners, p.WidthPruner,
                  rules=lambda: _model_checks().WIDTH_PRUNER_RULES,
                  check=lambda cls, **options: _kit().check_width_pruner(cls, **options)),
    ComponentKind("architecture", hookspecs.register_architectures, p.Architecture,
                  rules=contract.ARCHITECTURE_RULES,
                  check=lambda cls, **options: _kit().check_architecture(cls, **options)),
    ComponentKind("cost_model", hookspecs.register_cost_models, p.CostModel, rules=contract.COST_MODEL_RULES,
                  check=lambda cls, **options: _kit().check_cost_model(cls, **options),
                  optional=(p.MeasuresCost, p.DescribesCost, p.PreparesCost)),
)

for _kind in KINDS:
    register_kind(_kind)
