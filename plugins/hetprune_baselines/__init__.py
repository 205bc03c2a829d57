"""Baseline strategies as a hetprune plugin: fixed splits of the budget and
classic block dropping. Each uses the same scorer, fine-tune, KD and merge as
hetdpt, so ``hetprune compare`` differs in the split alone."""

import hetprune
from hetprune.plugin_api import Register, Strategy

from .strategies import ActOnly, AttnOnly, BlockDrop, Mix, Mix50

__version__ = hetprune.__version__


@hetprune.hookimpl
def register_strategies(register: Register[Strategy]) -> None:
    for strategy in (AttnOnly, ActOnly, Mix, Mix50, BlockDrop):
        register(strategy)
