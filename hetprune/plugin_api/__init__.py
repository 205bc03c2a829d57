"""The plugin API: everything a hetprune plugin may use, in one place.

An outside plugin imports from here (and from the top-level ``hetprune`` package); the built-in plugins under
``plugins/`` do too and nothing else of hetprune's (a test enforces it), so what they need is here and what is
here is supported. Every name is a re-export: the classes keep the modules they are defined in (stored keys
name some of them), this module only gathers them.

* **Components**: one `typing.Protocol` per kind the registry builds (`Predictor`, `Scorer`, `Remover`,
  `Merger`, `Strategy`, `WidthPruner`, `Architecture`, `CostModel`), the optional parts of a kind
  (`ReportsFit`, `SelectingScorer`, `MeasuresCost`, ...), `PROTOCOLS` and `OPTIONAL` by kind, and `lacks`.
  The conformance kit (``hetprune.harness.testing``) checks a component against the same protocols.
* **The job**: `Job`, the read-only view of a `PruneJob` a strategy uses; `ScoringContext`, a scorer's;
  `Budget`, `Site`, `Task`.
* **Pipeline steps**: `DepthStrategy`, `select_sites`, `remove_sites`, `finetune`, `finetune_and_measure`,
  `merge`, `finish`, `PruneResult`; budget arithmetic (`kind_savings`, `pair_cost`, ...).
* **Fine-tune and evaluate**: `train`, `evaluate`, `TrainConfig`, and the modules `training` (the one training
  loop and its pieces a learning scorer runs: ``training.make_scheduler``, ``training.optimisation_step``, ...)
  and `devices` (``devices.resolve``, ``devices.resolve_amp``); read through the module at call time, so what
  a test patches there reaches the plugin too.
* **Stores and resume**: `PointStore` and `metric_of` (MAP points, pipeline checks), `fingerprint` (a `Key`:
  this release's key, with ``before``, the key version 1 made), `found` and `matches` (where a store looks: under
  both keys), `reusable`, `weights_key`, `save_torch_atomic`.
* **Plan steps** (``--plan``): `PlanStep`, `finetune_step`, `epoch_images`, `val_size`.
* **Settings**: `Settings`, the typed object a job carries (``job.settings.replace(...)`` for a sub-job's);
  sections: `Section`, `setting`, `number`, `whole`, `RunSettings`, `changed`.
* **Distributed**: the module `distributed` (``dist.on_main``, ``dist.is_main``, ...) and
  `follow_saved`: rank 0 decides a resume, everyone follows.
* **Models**: `surgery`, the adapters (`Adapter`, `PreNormAdapter`, `adapter_for`, `WidthInfo`), the block
  modules (`BlockLayout`, `HetBlock`, ...), MAC counting, widths, latency tables.

It sits above every layer of the package (a layer of its own, on top) and nothing in hetprune imports it.
"""

from __future__ import annotations

from .. import bench
from ..core import devices, distributed
from ..core.config import RunSettings, Section, TrainConfig, changed, number, setting, whole
from ..core.settings import Settings
from ..core.distributed import follow_main, follow_saved
from ..core.errors import BudgetUnreachable, HetpruneError, PluginError
from ..core.keys import Key, before, fingerprint, found, matches
from ..core.hookspecs import hookimpl, hookspec
from ..core.io import made_when, note_saved, now, save_torch_atomic
from ..core.plugins import get_registry
from ..measure.latency_table import LatencyTable, default_dtype
from ..model import surgery
from ..model.adapters import Adapter, PreNormAdapter, WidthInfo, adapter_for, attention_matmul_macs
from ..model.block_modules import (BlockLayout, DroppedBlock, EagerDroppedBlock, EagerHetBlock, HetBlock, LinearMlp,
                                   MergedMlp)
from ..model.macs import CONVENTION, count_macs, human
from ..model.sites import Site, depth, sites
from ..model.spec import ModelSpec, model_hash
from ..model.widths import read_widths, track_kept, width_info
from ..pruning.budget import Budget, kind_savings, max_per_kind, pair_cost, site_savings
from ..pruning.pipeline import (DepthStrategy, FixedSplit, PruneJob, PruneResult, ScoringContext, finetune,
                               finetune_and_measure, finish, merge, rank_lowest, remove_sites, scoring_context,
                               select_sites)
from ..pruning.plan import PlanStep, epoch_images, finetune_step, val_size
from ..pruning.point_store import PointStore, metric_of
from ..pruning.protocols import (OPTIONAL, PROTOCOLS, Architecture, ChecksPolicy, CostModel, DescribesCost, Job,
                                MeasuresCost, Merger, Predictor, PreparesCost, Remover, ReportsFit,
                                ReportsUncertainty, Scorer, SelectingScorer, SizesChecks, Strategy, WidthPruner,
                                lacks)
from ..training.resume import reusable, weights_key
from ..training.task import Schedule, Task
from ..training import train as training
from ..training.train import NonFiniteLoss, batch_split, evaluate, train

__all__ = [
    # components: the protocols
    "PROTOCOLS", "OPTIONAL", "lacks", "Predictor", "ReportsFit", "ReportsUncertainty", "Scorer", "SelectingScorer",
    "Remover", "Merger", "Strategy", "WidthPruner", "Architecture", "CostModel", "MeasuresCost", "DescribesCost",
    "PreparesCost", "ChecksPolicy", "SizesChecks",
    # hooks, registry, errors
    "hookimpl", "hookspec", "get_registry", "HetpruneError", "PluginError", "BudgetUnreachable",
    # the job and what it holds
    "Job", "PruneJob", "ScoringContext", "scoring_context", "Budget", "Site", "sites", "depth", "Task", "Schedule",
    "ModelSpec", "model_hash",
    # pipeline steps and budget arithmetic
    "DepthStrategy", "FixedSplit", "PruneResult", "select_sites", "rank_lowest", "remove_sites", "finetune",
    "finetune_and_measure", "merge", "finish", "kind_savings", "max_per_kind", "pair_cost", "site_savings",
    # fine-tune and evaluate
    "TrainConfig", "train", "evaluate", "batch_split", "NonFiniteLoss", "training", "devices",
    # stores and resume
    "PointStore", "metric_of", "fingerprint", "Key", "before", "found", "matches", "reusable", "weights_key",
    "made_when", "now", "note_saved", "save_torch_atomic",
    # plan steps
    "PlanStep", "finetune_step", "epoch_images", "val_size",
    # settings sections
    "Settings", "Section", "setting", "number", "whole", "RunSettings", "changed",
    # distributed
    "distributed", "follow_saved", "follow_main",
    # models: surgery, adapters, block modules, costs, widths
    "surgery", "Adapter", "PreNormAdapter", "WidthInfo", "adapter_for", "attention_matmul_macs", "BlockLayout",
    "DroppedBlock", "EagerDroppedBlock", "EagerHetBlock", "HetBlock", "LinearMlp", "MergedMlp", "count_macs",
    "human", "CONVENTION", "read_widths", "track_kept", "width_info", "bench", "LatencyTable", "default_dtype",
]
