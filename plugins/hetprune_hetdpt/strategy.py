"""The ``hetdpt`` strategy: MAP budget allocation, then the shared depth pipeline
(learned within-kind selection, KD fine-tune, merge)."""

from __future__ import annotations


from hetprune import Site
from hetprune.plugin_api import DepthStrategy, PruneJob, Settings

from .allocation import Allocation, fit, refinement_pairs
from .checks import near_ties, spread
from .halving import checks_policy
from .options import HetDPTOptions
from .point_schemes import OneShotPoints, grid_plan, resolve_finetune
from .point_selection import SCHEMES, scheme_for


class HetDPT(DepthStrategy):
    """HetDPT: split the budget with a fitted accuracy predictor (MAP), learned gates within each kind."""

    name = "hetdpt"
    description = "HetDPT: split the budget with a fitted accuracy predictor (MAP), learned gates within each kind"
    # 2 (issue 71): where the checks cover every feasible split they run without points, fewer attention removals
    # first (before: best predicted first), which can change a tie and the removals the checks share
    behaviour = 2
    sections = {"hetdpt": HetDPTOptions}   # typed: options.py says what each setting does
    defaults = {"hetdpt": HetDPTOptions.defaults()}

    # -- stage 1: points (one scheme object per job: point_schemes.py, progressive.py) -------------
    point_schemes = SCHEMES   # name -> PointScheme class; a strategy built on this one may add its own

    def scheme(self, job: PruneJob):
        """The job's point scheme (``hetdpt.point_selection``), built once per job with its settings resolved."""
        return scheme_for(job, self, self.point_schemes)

    def point_plan(self, job: PruneJob, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The points the job's scheme measures for a budget whose feasible splits are ``pairs``."""
        return self.scheme(job).plan(pairs)

    def grid_plan(self, job: PruneJob, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Axis and budget-line points (``axis_points``, ``mixed_points``, ``dense_point``), whatever the
        scheme: the candidates HetDPT+'s share search measures its own way."""
        return grid_plan(job.options(HetDPTOptions), pairs)

    def collect_points(self, job: PruneJob, plan: list[tuple[int, int]]) -> list[dict]:
        """Measure every planned point not already in the points file (see `PointScheme.collect`)."""
        return self.scheme(job).collect(plan)

    def points_key(self, job: PruneJob) -> str:
        """The key of the job's points (of its dense point, for progressive points, whose paths have theirs)."""
        return self.scheme(job).key

    def removal_orders(self, job: PruneJob, limits: dict[str, int]) -> dict[str, list[Site]]:
        """Per kind, the point scorer's removal order on the dense model (one-shot points; HetDPT+'s share
        search)."""
        return OneShotPoints(job, self).orders(limits)

    POINT_SELECTIONS = tuple(SCHEMES)

    @staticmethod
    def point_finetune(settings: Settings | dict, train_size: int | None = None) -> str:
        """The settings section whose schedule fine-tunes a one-shot point, ``auto`` resolved (``settings``: a
        run's, or a mapping of the settings that say, as a caller gives them)."""
        settings = Settings.of(settings)
        return resolve_finetune(settings.section(HetDPTOptions).point_finetune, settings.run, train_size, "oneshot")

    # -- what ``hetprune ablate`` asks of a strategy with cheap points --------------
    @staticmethod
    def predictor_name(settings: Settings) -> str:
        """The predictor the settings name (``hetdpt.predictor``)."""
        return settings.section(HetDPTOptions).predictor

    @staticmethod
    def point_selection(settings: Settings) -> str:
        """The point scheme the settings name (``hetdpt.point_selection``)."""
        return settings.section(HetDPTOptions).point_selection

    @staticmethod
    def point_scorer(job: PruneJob) -> str:
        """The scorer that orders the points' removals (``hetdpt.point_scorer``): part of their keys."""
        return job.options(HetDPTOptions).point_scorer

    @staticmethod
    def predictor(job: PruneJob, name: str | None = None):
        """Predictor ``name`` (default: the configured one) with its options from ``hetdpt.predictor_options``."""
        opts = job.options(HetDPTOptions)
        name = name or opts.predictor
        return job.registry.build("predictor", name, **opts.predictor_options_for(name))

    checks_policy = staticmethod(checks_policy)   # hetdpt.checks, built once per job (halving.py)

    # -- stage 1: allocation (allocation.py: one object for the run, --plan, the pre-flight and the study) --
    def allocation(self, job: PruneJob) -> Allocation:
        """Stage 1 of ``job`` as one object (`Allocation`)."""
        return Allocation(self, job)

    def allocate(self, job: PruneJob):
        return self.allocation(job).run()

    def plan_allocation(self, job: PruneJob) -> list:
        """Stage 1 counted (``--plan``) by the code that runs it (`Allocation.plan_steps`)."""
        return self.allocation(job).plan_steps()

    def check_settings(self, job: PruneJob) -> None:
        """What the job's hetdpt settings cannot do, refused before stage 1 trains anything
        (`Allocation.check`)."""
        self.allocation(job).check()

    def predictor_for(self, job: PruneJob, plan: list[tuple[int, int]], what: str = "this budget and model",
                      say: bool = True):
        """The predictor that fits ``plan`` (`Allocation.predictor`): HetDPT+'s share search asks it too."""
        return self.allocation(job).predictor(plan, what, say)

    # the rules, as the MAP study and the tests name them (allocation.py and checks.py hold them)
    fit = staticmethod(fit)
    spread = staticmethod(spread)
    near_ties = staticmethod(near_ties)
    refinement_pairs = staticmethod(refinement_pairs)
