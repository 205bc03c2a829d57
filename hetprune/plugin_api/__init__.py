"""The plugin API: what a hetprune plugin uses, in one place.

An outside plugin imports from here (and from the top-level ``hetprune`` package); the built-in plugins
under ``plugins/`` do too and nothing else of hetprune's (a test enforces it), so what they need is here
and what is here is supported. Every name is a re-export: the classes keep the modules they are defined in
(stored keys name some of them), this module only gathers them. `__all__` is the surface, each name
documented in docs/plugins.md ("The plugin API"):

* **Components**: one `typing.Protocol` per kind the registry builds (`Predictor`, `ChecksPolicy`,
  `Scorer`, `Remover`, `Merger`, `Strategy`, `WidthPruner`, `Architecture`, `CostModel`), the optional parts
  of a kind (`ReportsFit`, `SelectingScorer`, `MeasuresCost`, ...), `PROTOCOLS` and `OPTIONAL` by kind,
  and `lacks`. The conformance kit (``hetprune.harness.testing``) checks a component against the same
  protocols.
* **Hooks and errors**: `hookimpl`, `hookspec`, `Register` (the registration callback, typed by the kind it
  registers: with ``register: Register[Scorer]`` a type checker holds each registered class to `Scorer`),
  `get_registry`, `HetpruneError`, `PluginError`, `BudgetUnreachable`.
* **The job**: `Job`, the read-only view of a `PruneJob` a strategy uses; `ScoringContext`, a scorer's;
  `Budget`, `Site`, `sites`, `depth`, `Task`, `ModelSpec`.
* **Settings**: `Settings`, the typed object a job carries (``job.settings.replace(...)`` for a sub-job's),
  `RunSettings` (``job.config``), `TrainConfig` (a fine-tune's schedule); a component's own section:
  `Section`, `setting`, `number`, `whole`.
* **Strategies**: `DepthStrategy` (subclass it, override ``allocate``), `PruneResult` (what ``run``
  returns), and the modules `pipeline` (the shared steps: ``pipeline.select_sites``, ``remove_sites``,
  ``finetune``, ``merge``, ``finish``, ...), `budget` (what removals save: ``budget.kind_savings``,
  ``pair_cost``, ...) and `plan` (what ``--plan`` counts: ``plan.PlanStep``, ``plan.finetune_step``, ...).
* **Training**: the modules `training` (``training.train``, ``training.evaluate`` and the pieces of the one
  training loop a learning scorer runs), `devices` and `distributed` (``distributed.on_main``,
  ``distributed.follow_saved``: rank 0 decides a resume, everyone follows); read through the module at
  call time, so what a test patches there reaches the plugin too.
* **Storage**: the namespace `storage` (keys, checkpoints, measured points: ``storage.fingerprint``,
  ``storage.PointStore``, ...).
* **Models**: `Adapter`, `PreNormAdapter` and `BlockLayout` (an architecture adapter), and the modules
  `adapters`, `surgery` (removal and merging, the block modules), `macs` (MAC counting), `widths` (width
  pruning's record) and `latency_table` (measured block times).

Names this module exported before issue 72 and no longer lists still import, with a `DeprecationWarning`
naming where they are now, until hetprune `REMOVED_IN`.

It sits above every layer of the package (a layer of its own, on top) and nothing in hetprune imports it.
"""

from __future__ import annotations

import sys
import warnings
from functools import reduce

from ..core import devices, distributed
from ..core.config import RunSettings, Section, TrainConfig, number, setting, whole
from ..core.errors import BudgetUnreachable, HetpruneError, PluginError
from ..core.hookspecs import Register, hookimpl, hookspec
from ..core.plugins import get_registry
from ..core.settings import Settings
from ..measure import latency_table
from ..model import adapters, macs, surgery, widths
from ..model.adapters import Adapter, PreNormAdapter
from ..model.block_modules import BlockLayout
from ..model.sites import Site, depth, sites
from ..model.spec import ModelSpec
from ..pruning import budget, pipeline, plan
from ..pruning.budget import Budget
from ..pruning.pipeline import DepthStrategy, PruneJob, PruneResult, ScoringContext
from ..pruning.protocols import (OPTIONAL, PROTOCOLS, Architecture, ChecksPolicy, CostModel, DescribesCost, Job,
                                MeasuresCost, Merger, Predictor, PreparesCost, Remover, ReportsFit,
                                ReportsUncertainty, Scorer, SelectingScorer, SizesChecks, Strategy, WidthPruner,
                                lacks)
from ..training import train as training
from ..training.task import Task
from . import storage

__all__ = [
    # components: the protocols
    "PROTOCOLS", "OPTIONAL", "lacks", "Register", "Predictor", "ReportsFit", "ReportsUncertainty", "ChecksPolicy",
    "SizesChecks", "Scorer", "SelectingScorer", "Remover", "Merger", "Strategy", "WidthPruner", "Architecture",
    "CostModel", "MeasuresCost", "DescribesCost", "PreparesCost",
    # hooks, registry, errors
    "hookimpl", "hookspec", "get_registry", "HetpruneError", "PluginError", "BudgetUnreachable",
    # the job and what it holds
    "Job", "PruneJob", "ScoringContext", "Budget", "Site", "sites", "depth", "Task", "ModelSpec",
    # settings
    "Settings", "RunSettings", "TrainConfig", "Section", "setting", "number", "whole",
    # strategies: the base class, the result, the shared steps, budget arithmetic, plan steps
    "DepthStrategy", "PruneResult", "pipeline", "budget", "plan",
    # training, devices, distributed; storage
    "training", "devices", "distributed", "storage",
    # models: adapters, surgery, MACs, widths, latency
    "Adapter", "PreNormAdapter", "BlockLayout", "adapters", "surgery", "macs", "widths", "latency_table",
]

REMOVED_IN = "0.3"   # the release after this one: the names of MOVED import from here until then

# names this module exported before issue 72 -> where they are now (a name here, or hetprune's top level)
MOVED = {
    **{name: f"hetprune.plugin_api.pipeline.{name}" for name in (
        "FixedSplit", "scoring_context", "select_sites", "rank_lowest", "remove_sites", "finetune",
        "finetune_and_measure", "merge", "finish")},
    **{name: f"hetprune.plugin_api.budget.{name}" for name in (
        "kind_savings", "max_per_kind", "pair_cost", "site_savings")},
    **{name: f"hetprune.plugin_api.plan.{name}" for name in ("PlanStep", "finetune_step", "epoch_images",
                                                             "val_size")},
    **{name: f"hetprune.plugin_api.training.{name}" for name in ("train", "evaluate", "batch_split",
                                                                 "NonFiniteLoss")},
    **{name: f"hetprune.plugin_api.storage.{name}" for name in storage.__all__},
    "model_hash": "hetprune.model.spec.model_hash",
    **{name: f"hetprune.plugin_api.distributed.{name}" for name in ("follow_saved", "follow_main")},
    **{name: f"hetprune.plugin_api.adapters.{name}" for name in ("WidthInfo", "adapter_for",
                                                                 "attention_matmul_macs")},
    **{name: f"hetprune.plugin_api.surgery.{name}" for name in ("HetBlock", "DroppedBlock", "LinearMlp",
                                                                "MergedMlp")},
    **{name: f"hetprune.model.block_modules.{name}" for name in ("EagerHetBlock", "EagerDroppedBlock")},
    **{name: f"hetprune.plugin_api.macs.{name}" for name in ("count_macs", "human", "CONVENTION")},
    **{name: f"hetprune.plugin_api.widths.{name}" for name in ("read_widths", "track_kept", "width_info")},
    **{name: f"hetprune.plugin_api.latency_table.{name}" for name in ("LatencyTable", "default_dtype")},
    "changed": "hetprune.config.changed",
    "Schedule": "hetprune.Schedule",
    "bench": "hetprune.bench",
}


def resolve(path: str):
    """The object at a dotted ``path`` (``hetprune.plugin_api.pipeline.select_sites``), attribute by attribute
    from the package (which imports its top-level names on first use)."""
    first, *rest = path.split(".")
    return reduce(getattr, rest, sys.modules[first])


def __getattr__(name: str):
    """A name of `MOVED`, with a `DeprecationWarning` that says where it is now."""
    if name not in MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"hetprune.plugin_api.{name} is no longer part of the plugin API; use {MOVED[name]} "
                  f"(it goes from hetprune.plugin_api in hetprune {REMOVED_IN})", DeprecationWarning, stacklevel=2)
    return resolve(MOVED[name])
