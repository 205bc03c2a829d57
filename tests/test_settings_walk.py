"""Issue 56: a walk over every leaf setting. Each one, changed to another allowed value, is either refused with
one error naming it (the run would ignore it), or keyed (a compare row made with it is not taken for one made
without it), or declared unkeyed with its reason (``keyed=False, why=...`` in its field:
`hetprune.core.config.unkeyed_settings`). A setting added without a place here fails the walk: say what it
changes to below."""

from __future__ import annotations

import copy

import pytest

from hetprune import HetpruneError, get_registry
from hetprune.core import config
from hetprune.core import loader
from hetprune.harness.compare.spec import CompareSpec, row_key
from hetprune.pruning.budget import Budget

# another allowed value of every leaf, by its name (the last part of its key); a number is changed by itself
OTHER = {
    "augment": "none", "selection": 0, "tf32": False, "scorer": "taylor", "attn_remover": "attn-ln-residual",
    "act_remover": "act-identity-alt", "mergers": [], "cost_model": "macs", "device": "cpu", "amp": "none",
    "kd": "hard", "subset": 64, "drop_path": 0.1, "teacher": "vit_tiny_patch16_224",
    "teacher_kwargs": {"depth": 1}, "teacher_checkpoint": "teacher.safetensors", "clip_grad": 1.0,
    "clip_mode": "value", "lr_scale": "linear", "warmup_lr": 1e-6, "min_lr": 1e-6, "keep": "best",
    "predictor": "local", "point_selection": "progressive", "point_finetune": "finetune", "interleave_first": "attn",
    "point_scorer": "magnitude", "checks": "best", "checks_options": {"spread": {"count": 3}}, "order": "depth-width",
    "depth_strategy": "another-depth-strategy", "depth_sites": 2, "intermediate_finetune": "finetune",
    "pruner": "another-width-pruner",   # names are checked when a run starts (start_run), not when settings are read
    "scorer_options": {"gate-taylor": {"score_lr": 0.5}}, "cost_model_options": {"latency": {"batch_size": 8}},
    "predictor_options": {"poly": {"degree": 2}}, "pruner_options": {"round_to": 16}, "image_passes": 5000,
    "compile": False,
}
# the settings a changed value of a leaf needs beside it to be used at all, the words it is refused with where it
# would be ignored, and where that is (a checks policy's options: where hetdpt.checks names another policy)
CHECKS_OFF = {"hetdpt": {"checks": "none"}}
WITH = {"hetdpt.checks_options": ({}, "hetdpt.checks_options gives options of spread, and hetdpt.checks is none",
                                  CHECKS_OFF),
        **{f"{section}.{name}": ({section: {"teacher": "vit_tiny_patch16_224"}},
                                 "teacher_checkpoint, teacher_pretrained and teacher_kwargs describe a separate", {})
           for section in config.TRAIN_SECTIONS
           for name in ("teacher_kwargs", "teacher_checkpoint", "teacher_pretrained")},
        **{f"{section}.keep": ({section: {"eval_every": 1}}, "keep: best needs eval_every >= 1", {})
           for section in config.TRAIN_SECTIONS},
        # a base hetprune makes has no teacher: its distillation settings are refused whatever else is set (None)
        **{f"{base}.{name}": (None, f"{base}: a base hetprune makes learns from the data's labels alone", {})
           for base in config.BASE_SCHEDULES.values() for name in ("kd", "teacher")},
        **{f"{base}.kd_token": (None, "kd_token distils into the distillation token", {})
           for base in config.BASE_SCHEDULES.values()},
        **{f"{base}.{name}": (None, "describe a separate teacher", {}) for base in config.BASE_SCHEDULES.values()
           for name in ("teacher_kwargs", "teacher_checkpoint", "teacher_pretrained")}}


def strategies():
    registry = get_registry()
    return [registry.build("strategy", name) for name in registry.names("strategy")]


def leaves(tree: dict, prefix: str = ""):
    """Every leaf key of a settings tree (a component's option mapping is one leaf)."""
    for key, value in tree.items():
        if isinstance(value, dict) and value and not key.endswith("_options"):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def schema() -> dict:
    """Every setting a run of any installed strategy may name, at its default."""
    defaults, _ = loader.sections_of(strategies())
    return config.with_later_settings(loader.defaults_for(defaults))


def other_value(key: str, value):
    name = key.rsplit(".", 1)[-1]
    if name in OTHER:
        return copy.deepcopy(OTHER[name])
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.1
    raise AssertionError(f"the settings walk has no other value for {key} ({value!r}): add one to OTHER")


def nested(key: str, value) -> dict:
    out: dict = {}
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def merged(a: dict, b: dict) -> dict:
    out = copy.deepcopy(a)
    for key, value in b.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def compare_key(settings: dict) -> str:
    spec = CompareSpec(["hetdpt"], [Budget(sites=2)], [0], settings)
    return row_key(spec, "hetdpt", Budget(sites=2), 0, "base", "data")


WALK = list(leaves(schema()))


def test_the_walk_covers_every_section_and_declares_each_unkeyed_setting_with_its_reason():
    names = {key.split(".")[0] for key, _ in WALK}
    assert {"finetune", "short_finetune", "base_scratch", "base_finetune", "scoring", "hetdpt", "hetdpt_plus", "width",
            "scorer_options"} <= names
    walked = {key for key, _ in WALK}
    assert config.unkeyed_settings() and all(key in walked and len(why) > 20
                                              for key, why in config.unkeyed_settings().items())


@pytest.mark.parametrize("key, default", WALK, ids=[key for key, _ in WALK])
def test_every_setting_is_keyed_refused_or_declared_unkeyed(key, default):
    run = strategies()
    needs, refused, ignored_in = WITH.get(key, ({}, None, {}))
    change = nested(key, other_value(key, default))
    if refused is not None:   # where it would be ignored: refused, naming it
        with pytest.raises(HetpruneError, match=refused):
            loader.resolve(run, overrides=merged(ignored_in, change))
    if needs is None:   # refused whatever else is set
        return
    reference = loader.resolve(run, overrides=needs)
    changed = loader.resolve(run, overrides=merged(needs, change))   # used: accepted ...
    if key in config.unkeyed_settings():   # ... and keyed, or declared unkeyed with its reason
        assert compare_key(changed) == compare_key(reference), f"{key} is declared unkeyed, but moves a row's key"
    else:
        assert compare_key(changed) != compare_key(reference), (
            f"{key} changed to {other_value(key, default)!r} leaves a compare row's key as it was: a row made "
            "without it would be reused; key it, refuse it where it is ignored, or declare it keyed=False in its field "
            "with its reason")


def _options_by_name(tree: dict, prefix: str = ""):
    """Every options mapping of the schema keyed by component name (``scorer_options``, ``cost_model_options``,
    ``hetdpt.predictor_options``), with its kind."""
    from hetprune.core.plugins import KINDS

    for key, value in tree.items():
        kind = key[:-len("_options")] if key.endswith("_options") else None
        if kind in KINDS:
            yield f"{prefix}{key}", kind
        elif isinstance(value, dict) and kind is None:
            yield from _options_by_name(value, f"{prefix}{key}.")


OPTIONS_BY_NAME = list(_options_by_name(schema()))


def test_the_walk_finds_every_options_block_keyed_by_a_component_name():
    assert {"scorer_options", "cost_model_options", "hetdpt.predictor_options", "hetdpt.checks_options"} <= {
        k for k, _ in OPTIONS_BY_NAME}


@pytest.mark.parametrize("key, kind", OPTIONS_BY_NAME, ids=[k for k, _ in OPTIONS_BY_NAME])
def test_options_for_a_name_nobody_registers_are_refused_naming_the_registered_ones(key, kind):
    """Issue 70, item 6: a misspelt key under a real name was refused, a misspelt name was not (the run used the
    defaults). Refused now when the run starts, before anything trains; a registered name is taken."""
    from hetprune.pruning.run_start import start_run

    registry = get_registry()
    owner = key.split(".")[0] if "." in key else None
    strategy = {"hetdpt": "hetdpt", "hetdpt_plus": "hetdpt-plus", "width": "isomorphic"}.get(owner, "hetdpt")
    real = registry.names(kind)[0]

    def options_of(name):   # a checks policy's options are only those of the policy the run uses
        return merged(nested(key, {name: {}}), {"hetdpt": {"checks": name}} if kind == "checks" else {})

    with pytest.raises(HetpruneError, match=rf"setting {key}\.{real}x: .*{real}"):
        start_run([strategy], [Budget(sites=2)], settings=options_of(f"{real}x"), registry=registry)
    start_run([strategy], [Budget(sites=2)], settings=options_of(real), registry=registry)


def test_settings_replace_takes_every_setting_the_loader_takes():
    """Issue 70, item 7: Settings.replace refused tf32, selection and augment, which the loader takes (they are
    left out of the settings at their defaults), so a strategy could not make a sub-job with tf32 off."""
    from hetprune.core.settings import Settings

    settings = Settings(loader.resolve())
    for key, value in (("tf32", False), ("selection", 0), ("augment", "crop")):
        changed = settings.replace(**{key: value})
        assert getattr(changed.run, key) == value and changed.as_settings()[key] == value
        assert changed.replace(**{key: getattr(config.RunSettings(), key)}) == settings   # at its default: left out
    with pytest.raises(HetpruneError, match="unknown setting 'tf3'"):
        settings.replace(tf3=False)
