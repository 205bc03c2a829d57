"""Cost models for hetprune, as a plugin: ``macs`` (counted multiply-accumulates)
and ``latency`` (measured time on the run's device, from a cached per-device
table of block times). Uses only the public plugin API."""

import hetprune
from hetprune.plugin_api import CostModel, Register

from .cost_models import LatencyCost, MacCost

__version__ = hetprune.__version__


@hetprune.hookimpl
def register_cost_models(register: Register[CostModel]) -> None:
    register(MacCost)
    register(LatencyCost)
