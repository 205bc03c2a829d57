"""The old ``hetdpt.verify_*`` settings, read for one release (issue 71): each combination they allowed is a
``checks`` policy (checks.py) with options, and a checks policy they could spell is keyed by them, so results
stored under the old names (a compare row's key holds the whole settings) are still found.

`upgrade` reads a layer of settings that uses the old names (a config file, ``--set``, a Python call's
settings, a stored section) and says the new spelling in one deprecation line; `key_form` turns a section
back into the old names for a key. Both go when the old names do.
"""

from __future__ import annotations

import warnings

from hetprune import HetpruneError
from hetprune.plugin_api import whole

from .checks import POLICIES, AllChecks, NoChecks, PointChecks, Sized

# the old names and their defaults, in the order the section declared them
LEGACY = {"verify": 6, "verify_when": "always", "verify_among": "spread", "verify_by": "pipeline",
          "verify_budget": None, "verify_images": "auto", "verify_selection": 0.07, "verify_selection_at_least": 300}
SIZING = ("verify_budget", "verify_images", "verify_selection", "verify_selection_at_least")
BY_NAME = {cls.name: cls for cls in POLICIES}


def from_legacy(old: dict) -> tuple[str, dict]:
    """The checks policy and options (those off their defaults) that the old names ``old`` (all eight)
    spell; the combinations they refused are refused as they were."""
    count, by, among, when = old["verify"], old["verify_by"], old["verify_among"], old["verify_when"]
    changed = [n for n in LEGACY if n != "verify" and old[n] != LEGACY[n]]
    if not whole(count, 0) or count == 1:
        raise HetpruneError(f"hetdpt.verify must be 0 (no checks) or a count of splits >= 2, got {count!r}")
    if count == 0:
        if changed:
            raise HetpruneError(f"hetdpt.{changed[0]} shapes the checks of hetdpt.verify, which is 0 (no checks): "
                                "set hetdpt.checks to a checks policy instead")
        return "none", {}
    for name, value, allowed in (("verify_by", by, ("points", "pipeline")), ("verify_when", when, ("always", "unsure")),
                                 ("verify_among", among, ("best", "spread"))):
        if value not in allowed:
            raise HetpruneError(f"hetdpt.{name} must be one of {', '.join(allowed)}, got {value!r}")
    if among == "spread" and when == "unsure":
        raise HetpruneError("hetdpt.verify_among spread checks one split in every part of the budget line, and "
                            "hetdpt.verify_when unsure only the splits near the predicted best: write "
                            "hetdpt.checks near-ties")
    rule = "near-ties" if when == "unsure" else among
    options = {"count": count} if count != LEGACY["verify"] else {}
    if by == "points":
        sizing = [n for n in changed if n in SIZING]
        if sizing:
            raise HetpruneError(f"hetdpt.{sizing[0]} applies to checks through the final pipeline, and "
                                "hetdpt.verify_by points checks as points: drop it")
        return "points", {**options, **({"among": rule} if rule != PointChecks.among else {})}
    images, budget = old["verify_images"], old["verify_budget"]
    if budget is not None and images not in (None, "auto"):
        raise HetpruneError(f"hetdpt.verify_budget ({budget:g} final fine-tunes) and hetdpt.verify_images "
                            f"({images}) both size the pipeline checks: set one of them")
    sized = ({"unit": "finetunes", "budget": budget} if budget is not None else
             {"unit": "finetunes"} if images is None else {"budget": images})
    sized.update(selection=old["verify_selection"], selection_at_least=old["verify_selection_at_least"])
    default = Sized()
    options.update({k: v for k, v in sized.items() if v != getattr(default, k)})
    return rule, options


def legacy_of(checks: str, options: dict) -> dict | None:
    """The old names (all eight) that spell policy ``checks`` with ``options``, or None where they cannot
    (``all``, a plugin's policy, options it would refuse)."""
    cls = BY_NAME.get(checks)
    if cls is None:
        return None
    try:
        policy = cls(**(options or {}))
    except (TypeError, HetpruneError):
        return None
    if isinstance(policy, AllChecks):
        return None
    if isinstance(policy, NoChecks):
        return {**LEGACY, "verify": 0}
    rule = policy.among if isinstance(policy, PointChecks) else policy.name
    out = {**LEGACY, "verify": policy.count, "verify_among": "best" if rule == "near-ties" else rule,
           "verify_when": "unsure" if rule == "near-ties" else "always"}
    if isinstance(policy, PointChecks):
        return {**out, "verify_by": "points"}
    if policy.unit == "finetunes":   # in final fine-tunes: auto was both null, a number verify_budget alone
        out.update(verify_images=None if policy.budget == "auto" else "auto",
                   verify_budget=None if policy.budget == "auto" else policy.budget)
    else:
        out.update(verify_images=policy.budget)
    return {**out, "verify_selection": policy.selection, "verify_selection_at_least": policy.selection_at_least}


def key_form(d: dict) -> dict:
    """``d`` (the hetdpt section) with ``checks`` and ``checks_options`` as the old names, where they spell it,
    at the place the old names held in the section."""
    if "checks" not in d:
        return d
    old = legacy_of(d["checks"], (d.get("checks_options") or {}).get(d["checks"], {}))
    if old is None:
        return d
    out = {}
    for k, v in d.items():
        if k == "checks":
            out.update(old)
        elif k != "checks_options":
            out[k] = v
    return out


def upgrade(given: dict, held: dict, where: str) -> dict:
    """``given`` with its old names replaced by ``checks`` and ``checks_options``, read over what ``held``
    (the section so far) spells, and a deprecation line giving the new spelling; ``given`` itself where it
    has none."""
    named = [n for n in LEGACY if n in given]
    if not named:
        return given
    if "checks" in given or "checks_options" in given:
        raise HetpruneError(f"{where} gives hetdpt.checks and the old hetdpt.{named[0]}: write the checks "
                            "policy alone (hetdpt.checks, hetdpt.checks_options)")
    checks = held.get("checks", "spread")
    old = legacy_of(checks, (held.get("checks_options") or {}).get(checks, {})) or dict(LEGACY)
    old.update({n: given[n] for n in named})
    policy, options = from_legacy(old)
    flow = ", ".join(f"{k}: {'null' if v is None else v}" for k, v in options.items())   # as YAML writes it
    spelled = f"hetdpt.checks: {policy}" + (f", hetdpt.checks_options: {{{policy}: {{{flow}}}}}" if options else "")
    # one line where the user's settings are read, whatever called the loader (shown by default: FutureWarning)
    warnings.warn_explicit(f"{where}: {', '.join(f'hetdpt.{n}' for n in named)} "
                           f"{'is' if len(named) == 1 else 'are'} deprecated (read for one release): write {spelled}",
                           FutureWarning, filename="hetdpt settings", lineno=0)
    out = {k: v for k, v in given.items() if k not in LEGACY}
    return {**out, "checks": policy, "checks_options": {policy: options} if options else {}}
