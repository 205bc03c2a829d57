"""Every MAP point scheme by its ``hetdpt.point_selection`` name, and the one a job uses."""

from __future__ import annotations

from hetprune import HetpruneError
from hetprune.plugin_api import PruneJob

from .options import HetDPTOptions
from .point_schemes import GradualPoints, OneShotPoints, PointScheme
from .progressive import ProgressivePoints

SCHEMES: dict[str, type[PointScheme]] = {cls.name: cls for cls in (OneShotPoints, ProgressivePoints, GradualPoints)}


def scheme_for(job: PruneJob, strategy, schemes: dict | None = None) -> PointScheme:
    """The job's point scheme (``hetdpt.point_selection``), built once per job with its settings resolved."""
    table = schemes or SCHEMES
    name = job.options(HetDPTOptions).point_selection
    if name not in table:
        raise HetpruneError(f"hetdpt.point_selection must be one of {', '.join(table)}, got {name!r}")
    return job.once(("point scheme", name), lambda: table[name](job, strategy))
