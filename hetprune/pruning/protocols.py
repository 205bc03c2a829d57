"""The component kinds as `typing.Protocol` classes: what a plugin's component has, in a form a type checker
(and ``isinstance``) can see.

One protocol per kind the registry builds, with the methods and signatures the hooks describe
(`hetprune.core.hookspecs`) and the rules check at run time (`hetprune.core.contract.RULES`:
`hetprune.core.contract` for predictors, cost models and adapters, `hetprune.model.checks` for scorers,
removers, mergers and width pruners, `hetprune.pruning.result_checks` for strategies). What a kind may have
but need not is a protocol of its own (`ReportsFit`, `SelectingScorer`, `MeasuresCost`, ...). Each kind's
record (`hetprune.harness.kinds`) names its protocols; `PROTOCOLS` and `OPTIONAL` read them from the records
by kind. `Job` is the read-only view of a
[`PruneJob`][hetprune.pruning.job.PruneJob] that strategies and point schemes use (for type checkers).
Authors import all of it from ``hetprune.plugin_api``; the conformance kit (``hetprune.harness.testing``)
checks a component against its kind's protocol first.

The component protocols are ``runtime_checkable``: ``isinstance(obj, Scorer)`` says whether ``obj`` has every member
(not the signatures; the kit and the contract's rules check what the methods return). `lacks` names the
members an object is missing.
"""

from __future__ import annotations

from pathlib import Path
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Protocol, runtime_checkable

from ..core.kinds import ByKind, describe, lacks, members  # noqa: F401 - members, lacks, describe: read protocols

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..core.config import RunSettings, TrainConfig
    from ..core.plugins import Registry
    from ..model.adapters import Adapter
    from ..model.sites import Site
    from ..model.spec import ModelSpec
    from ..training.task import Task
    from .budget import Budget
    from .job import PruneJob, ScoringContext
    from .report import PruneResult


# -- the components, one protocol per kind -----------------------------------------------------------------

@runtime_checkable
class Predictor(Protocol):
    """A metric predictor (hook ``register_predictors``; stage 1 of HetDPT): fitted on measured points, it
    predicts the task's metric at any split."""

    name: str

    def fit(self, points: list[tuple[int, int, float]]) -> Any:
        """Fit on ``(n_attn, n_act, metric)`` points measured with a short fine-tune, in place: the return value
        is ignored (every caller keeps the object; returning ``self`` is handy). Raises HetpruneError when the
        points cannot support the fit, saying how many are needed."""

    def predict(self, n_attn: int, n_act: int) -> float:
        """The predicted metric with ``n_attn`` attention and ``n_act`` activation sites removed: a finite float,
        the same each time it is asked."""


@runtime_checkable
class ChecksPolicy(Protocol):
    """A checks policy (hook ``register_checks``; stage 1 of HetDPT, past the paper): which splits are checked
    after the predictor's fit, and how they are measured. The pick is the best checked."""

    # read-only: a policy is a frozen dataclass, whose name and measure are class variables
    @property
    def name(self) -> str:
        """What ``hetdpt.checks`` names it by."""

    @property
    def measure(self) -> str:
        """``"pipeline"`` (the final run's selection and fine-tune, by successive halving) or ``"points"``."""

    def most(self, pairs: list[tuple[int, int]]) -> int:
        """The most splits checked of the feasible ``pairs`` (0: none, the predictor's pick): what ``--plan``
        counts and the pre-flight sizes."""

    def known(self, pairs: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
        """The splits checked where they are known before any point (then no MAP point is measured and no
        predictor fitted: none could change the pick), else None."""

    def candidates(self, pairs: list[tuple[int, int]], value: dict[tuple[int, int], float],
                   loo_mae: float | None, sign: int) -> list[tuple[int, int]]:
        """The splits to check, best first: distinct splits of ``pairs``, at most ``most(pairs)`` (fewer than
        two: none checked, the best by ``value`` taken). ``value``: the predicted (or refined) metric at every
        split; ``loo_mae``: the predictor's leave-one-out error (None where it cannot say); ``sign`` -1: the
        metric is better lower."""


@runtime_checkable
class SizesChecks(Protocol):
    """Optional for a pipeline checks policy: how its checks are sized (the built-in defaults where absent)."""

    budget: Any               # "auto", or a number in ``unit``
    unit: str                 # "images" (a point's schedule cut to each check's share) or "finetunes" (final ones)
    selection: float          # what each candidate's selection trains on: a share of scoring.subset, or images
    selection_at_least: Any   # the fewest images per gate epoch under a share (None: no floor)


@runtime_checkable
class ReportsFit(Protocol):
    """Optional for a predictor: how well it fits."""

    def fit_report(self) -> dict[str, Any]:
        """Fit errors (``mae``, ``rmse``, ``loo_mae``, ...) with string keys and finite numbers (None for one that
        cannot be computed), JSON-serialisable: copied into the run report."""


@runtime_checkable
class ReportsUncertainty(Protocol):
    """Optional for a predictor: how sure a prediction is."""

    def uncertainty(self, n_attn: int, n_act: int) -> float:
        """The standard deviation of ``predict(n_attn, n_act)``, reported beside it."""


@runtime_checkable
class Scorer(Protocol):
    """An importance scorer (hook ``register_scorers``; stage 2: which sites of one kind go)."""

    name: str

    def score(self, model: nn.Module, sites: list[Site], ctx: ScoringContext) -> dict[Site, float]:
        """One finite score per candidate site (all of one kind), higher: more important, keep it. The model is
        left as it was (weights and sites)."""


@runtime_checkable
class SelectingScorer(Protocol):
    """Optional for a scorer that learns while it removes (the paper's gates): the pipeline calls ``select``
    in place of ranking by ``score``."""

    def select(self, model: nn.Module, counts: dict[str, int], ctx: ScoringContext) -> list[Site]:
        """Exactly ``counts`` (``{"attn": n_attn, "act": n_act}``) distinct sites the model has, to remove; every
        site stays present (the pipeline removes them)."""


@runtime_checkable
class Remover(Protocol):
    """A layer remover (hook ``register_removers``): turns one site of its ``kind`` off, in place."""

    name: str
    kind: str   # "attn" or "act"

    def remove(self, model: nn.Module, site: Site) -> dict[str, Any] | None:
        """Remove exactly ``site`` (the model still runs, same output shape); returns what it did for the recipe,
        JSON-serialisable (e.g. ``{"attn_mode": "identity"}``), or None for nothing to record."""


@runtime_checkable
class Merger(Protocol):
    """A merger (hook ``register_mergers``): folds what removal made linear, in place, keeping the function
    within its class attribute ``tolerance`` (relative output error; default 1e-4)."""

    name: str

    def merge(self, model: nn.Module) -> list[int]:
        """The block indices it changed. Sites are unchanged and the outputs equal the unmerged model's up to
        ``tolerance``."""


@runtime_checkable
class Strategy(Protocol):
    """A pruning strategy (hook ``register_strategies``): a complete recipe for pruning a model. It should
    have a one-line ``description`` too (else its docstring's first line is shown). Most depth strategies
    subclass [`DepthStrategy`][hetprune.pruning.depth.DepthStrategy] and override ``allocate`` only."""

    name: str

    def run(self, job: PruneJob) -> PruneResult:
        """Prune a copy of ``job.dense`` (never the dense model itself) to ``job.budget``; returns a
        PruneResult whose model runs, whose report is complete and JSON-serialisable, and which reloads from
        its recipe (`hetprune.pruning.steps.finish` makes one)."""


@runtime_checkable
class WidthPruner(Protocol):
    """A width pruner (hook ``register_width_pruners``): heads, head dimension, MLP hidden, embedding."""

    name: str

    def prune(self, model: nn.Module, target_macs: float, example_inputs: torch.Tensor,
              ctx: ScoringContext | None) -> dict[str, Any] | None:
        """Shrink ``model`` in place until its MACs (on ``example_inputs[:1]``, or ``ctx.macs_fn``) are at most
        ``target_macs``; it still runs with the same output shape. Returns what it did for the run report
        (JSON-serialisable), or None; the pipeline records the widths in the recipe."""


@runtime_checkable
class Architecture(Protocol):
    """An architecture adapter (hook ``register_architectures``): what one model family means for pruning.
    Subclass [`Adapter`][hetprune.model.adapters.Adapter] (better: `PreNormAdapter`), which has every
    operation below and the rest (where scorers hook, merging, widths)."""

    name: str
    description: str

    def matches(self, model: nn.Module) -> bool:
        """Whether this adapter serves ``model`` (by module types, never by model name)."""

    def specificity(self, model: nn.Module) -> tuple:
        """How specifically it serves ``model``: a tuple of numbers, larger wins among adapters that match."""

    def check(self, model: nn.Module) -> None:
        """Raise HetpruneError for a model of the family that hetprune cannot prune (e.g. post-norm)."""

    def block_slots(self, model: nn.Module) -> list[tuple[nn.Module, str]]:
        """``(parent module, child name)`` of every block, in the order of the sites."""

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The model's blocks (torch modules), in the order of the sites."""

    def max_removals(self, model: nn.Module) -> dict[str, int]:
        """``{"attn": a, "act": m}``: how many sites of each kind may go, whole numbers from 0 to the blocks."""

    def removed(self, model: nn.Module, block: int, kind: str) -> bool:
        """Whether site ``kind`` (``"attn"`` or ``"act"``) of block ``block`` is removed."""

    def attn_mode(self, model: nn.Module, block: int) -> str | None:
        """None while block ``block``'s attention is present, else how it was removed (one of ``ATTN_MODES``)."""

    def remove_attention(self, model: nn.Module, block: int, mode: str) -> None:
        """Remove block ``block``'s attention, in place, the way ``mode`` says."""

    def remove_activation(self, model: nn.Module, block: int) -> None:
        """Remove block ``block``'s MLP activation (the MLP becomes linear), in place."""

    def arch(self, model: nn.Module) -> dict[str, Any]:
        """Shape facts a recipe must agree with (depth, embed_dim, ...), JSON-serialisable, string keys."""


@runtime_checkable
class CostModel(Protocol):
    """A cost model (hook ``register_cost_models``): what a budget in cost counts, in ``unit`` (``"MACs"``,
    ``"s"``, ...)."""

    name: str
    unit: str

    def cost(self, model: nn.Module, example: torch.Tensor) -> float:
        """The cost of one forward pass of ``model`` on ``example`` (a batch on the run's device): a positive
        finite number in ``unit``. The model is left as it was."""


@runtime_checkable
class MeasuresCost(Protocol):
    """Optional for a cost model: the measured cost of whole models, reported beside the prediction."""

    def measure(self, models: dict[str, nn.Module], example: torch.Tensor) -> dict[str, float]:
        """A positive finite cost in ``unit`` for each of ``models`` (name -> module), keyed the same."""


@runtime_checkable
class DescribesCost(Protocol):
    """Optional for a cost model: facts for the run report."""

    def describe(self) -> dict[str, Any]:
        """Device, batch size, cache file, ...: JSON-serialisable facts about how costs are counted."""


@runtime_checkable
class PreparesCost(Protocol):
    """Optional for a cost model: told which models are about to be costed, so it times them together."""

    def prepare(self, models: list[nn.Module], example: torch.Tensor) -> None:
        """Called with a dense model and its variants before they are costed; returns nothing."""


# kind -> the protocol every component of the kind meets (read from the kinds' records)
PROTOCOLS = ByKind(attrgetter("protocol"))

# kind -> what a component of the kind may have besides (each an optional protocol)
OPTIONAL = ByKind(attrgetter("optional"), when=attrgetter("optional"))

# kind -> protocols a component may meet in place of its kind's own: a scorer that only selects (the run's
# scorer; it cannot be a point scorer, refused when a run asks it to be one)
INSTEAD = ByKind(attrgetter("instead"), when=attrgetter("instead"))


# -- what strategies read of a job -----------------------------------------------------------------------

class Job(Protocol):
    """The read-only view of a [`PruneJob`][hetprune.pruning.job.PruneJob] a strategy (and its point schemes,
    its sub-jobs) uses: what the run is, its settings typed, its device, the task's metric and the run's
    costs and events. A strategy reads these and never changes them; a sub-job with other settings is
    ``dataclasses.replace(job, ...)``. For type checkers only (not ``runtime_checkable``: an ``isinstance``
    check would compute every property)."""

    dense: nn.Module            # the model to prune: never modified (prune a copy: ``job.place(copy.deepcopy(...))``)
    spec: ModelSpec             # how to build the base model again
    budget: Budget
    settings: Any               # the run's settings as given (`config` and `options` read them typed)
    registry: Registry          # the components (``registry.build(kind, name, **options)``)
    workdir: Path               # this run's folder for resumable state
    shared_dir: Path            # state reusable across runs of the same settings (MAP points)
    resume: bool
    task: Task                  # what the model is pruned for: its data, loss and metric
    adapter: Adapter            # the dense model's architecture adapter
    strategy_name: str
    base_info: dict
    log: Callable[[str], None]  # says a line (nothing on ranks other than 0)

    @property
    def config(self) -> RunSettings:
        """The run's core settings, typed."""

    @property
    def seed(self) -> int:
        """The run's seed."""

    @property
    def device(self) -> torch.device:
        """This process's device."""

    @property
    def amp(self) -> str:
        """The resolved mixed precision (``"off"``, ``"bf16"``, ...)."""

    @property
    def example(self) -> torch.Tensor:
        """Two inputs of the task on the run's device (exactness checks, costs)."""

    @property
    def base_key(self) -> str:
        """What keys every stored result made from the dense model."""

    @property
    def reuse_tag(self) -> str | None:
        """Which stored MAP points this job may reuse without ``--resume`` (None: all with a matching key)."""

    @property
    def choice_split(self) -> str:
        """``"selection"`` where the task has a selection split, else ``"val"``."""

    @property
    def folds_norm(self) -> bool:
        """Whether a configured merger folds the preceding norm's affine too."""

    def options(self, section: type) -> Any:
        """A strategy's own settings section, typed and checked: ``job.options(MyOptions)``."""

    def place(self, obj: Any) -> Any:
        """A model or batch moved to the run's device."""

    def once(self, name: Any, build: Callable[[], Any]) -> Any:
        """What ``build()`` returns, built the first time ``name`` is asked for in this job."""

    def train_config(self, section: str, **changes: Any) -> TrainConfig:
        """The schedule of settings section ``section`` on the job's device and precision."""

    def teacher_for(self, cfg: TrainConfig) -> tuple[nn.Module, str]:
        """The teacher of a fine-tune on schedule ``cfg`` and its key."""

    def evaluate(self, model: nn.Module) -> float:
        """The task's metric on its val set: what a result reports. Never while choosing (`choice_metric`)."""

    def choice_metric(self, model: nn.Module) -> float:
        """The task's metric on the split choices are made on: what a point, a check or a best-of records."""

    def choosing(self, what: str) -> ContextManager:
        """A context for a part of the run that chooses from measurements (the val set cannot be read in it)."""

    def stage_start(self, stage: str, **info: Any) -> float:
        """Enter a pipeline stage (events, messages); returns the start time for `stage_end`."""

    def stage_end(self, stage: str, started: float, **info: Any) -> None:
        """Leave a stage, with its results."""

    def event(self, name: str, **kwargs: Any) -> None:
        """Call an event hook (``on_point_collected``, ``on_epoch_end``, ...)."""

    def cost(self, model: nn.Module, example: torch.Tensor | None = None) -> float:
        """``model``'s cost in the run's cost model."""

    def prepare_costs(self, models: list[nn.Module], example: torch.Tensor | None = None) -> None:
        """Tell a measuring cost model which models are about to be costed."""

    def feasible_pairs(self) -> list[tuple[int, int]]:
        """The splits ``(n_attn, n_act)`` that meet the budget (rank 0's, on every rank: call it together)."""
