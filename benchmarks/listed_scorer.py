"""A control scorer for benchmarks/scorer_study.py: ``listed`` removes exactly the sites it is given.

It separates *which sites* a scorer picks from *how* it removes them: gate-taylor
trains the weights while it removes sites one at a time, the one-shot scorers do
not. Giving ``listed`` gate-taylor's picks prunes those sites all at once, with
only the final fine-tune, like ``random``.

    PYTHONPATH=benchmarks hetprune prune --plugin listed_scorer --scorer listed \
        --set 'scorer_options={listed: {sites: [attn0, act3]}}' ...
"""

import hetprune
from hetprune import HetpruneError, Site


class ListedScorer:
    """Scores the listed sites 0 and every other site 1 (higher = keep)."""

    name = "listed"
    description = "benchmark control: removes exactly the sites of its 'sites' option"

    def __init__(self, sites=()):
        try:
            self.sites = {Site.parse(str(s)) for s in sites}
        except (ValueError, HetpruneError) as exc:
            raise HetpruneError(f"listed scorer: bad site in {list(sites)!r} ({exc})") from exc
        if not self.sites:
            raise HetpruneError("listed scorer needs scorer_options.listed.sites, e.g. [attn0, act3]")

    def score(self, model, sites, ctx):
        unknown = sorted(str(s) for s in self.sites if s.kind == sites[0].kind and s not in sites) if sites else []
        if unknown:
            raise HetpruneError(f"listed scorer: {', '.join(unknown)} not among the candidates "
                                f"{', '.join(str(s) for s in sites)}")
        return {s: 0.0 if s in self.sites else 1.0 for s in sites}


@hetprune.hookimpl
def register_scorers(register):
    register(ListedScorer)
