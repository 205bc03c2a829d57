"""HetDPT as a hetprune plugin: the MAP predictor, the checks policies, the scorers,
removers and mergers, and the ``hetdpt`` strategy. Uses only the public plugin API."""

import hetprune
from hetprune.plugin_api import ChecksPolicy, Merger, Predictor, Register, Remover, Scorer, Strategy

from .checks import POLICIES
from .mergers import LayerNormFold, LinearMerge
from .predictors import GPPredictor, LocalPredictor, PolyPredictor
from .removers import ActIdentity, AttnIdentity, AttnLnResidual
from .scorers import (BlockInfluenceScorer, GateTaylorScorer, LossDropScorer, MagnitudeScorer, RandomScorer,
                      TaylorScorer)
from .strategy import HetDPT

__version__ = hetprune.__version__


@hetprune.hookimpl
def register_predictors(register: Register[Predictor]) -> None:
    register(PolyPredictor)
    register(LocalPredictor)
    register(GPPredictor)


@hetprune.hookimpl
def register_checks(register: Register[ChecksPolicy]) -> None:
    for policy in POLICIES:
        register(policy)


@hetprune.hookimpl
def register_scorers(register: Register[Scorer]) -> None:
    for scorer in (GateTaylorScorer, TaylorScorer, LossDropScorer, BlockInfluenceScorer, MagnitudeScorer,
                   RandomScorer):
        register(scorer)


@hetprune.hookimpl
def register_removers(register: Register[Remover]) -> None:
    for remover in (AttnIdentity, AttnLnResidual, ActIdentity):
        register(remover)


@hetprune.hookimpl
def register_mergers(register: Register[Merger]) -> None:
    register(LinearMerge)
    register(LayerNormFold)


@hetprune.hookimpl
def register_strategies(register: Register[Strategy]) -> None:
    register(HetDPT)
