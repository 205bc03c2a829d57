"""The settings loader: the one way a run's settings are made, [`resolve`][hetprune.core.loader.resolve]:
defaults (the core's and each strategy's sections) <- a YAML file (``--config``, or a shipped config by name)
<- the Python call's ``settings`` and the command line's flags <- ``--set`` items. Every value is converted to
its field's type and every section checked whole; unknown keys are errors naming the key and where it came
from. What it returns is the typed [`Settings`][hetprune.core.settings.Settings] a job carries: below the loader,
code reads typed sections, and a dict appears again only where a key is made or a report written.

The sections and their fields (the schema) are `hetprune.core.config`'s.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import yaml

from .config import (CORE_DEFAULTS, OPTIONAL_NUMBERS, TRAIN_SECTIONS, RunSettings, ScoringConfig, TrainConfig,
                     _section_classes, epochs_over_passes, field_types, train_config, with_later_settings,
                     without_later_defaults)
from .errors import HetpruneError, on_command_line
from .settings import Settings

# The type of settings whose default is null, or that may be set to null ("all images").
DECLARED_TYPES: dict[str, tuple] = {
    **{f"{section}.{name}": (int, None) for section in TRAIN_SECTIONS for name in ("subset", "image_passes")},
    "scoring.subset": (int, None),
    **{f"{section}.{name}": (float, None) for section in TRAIN_SECTIONS for name in OPTIONAL_NUMBERS},
}
_TYPE_NAMES = {bool: "true or false", int: "a whole number", float: "a number", str: "text", list: "a list",
               dict: "a mapping", None: "null"}
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def expected_type(default, declared: tuple | None = None) -> tuple | None:
    """What a setting accepts: its declared type, else its default's type (None: anything)."""
    if declared is not None:
        return declared
    for t in (bool, int, float, str, list, dict):
        if isinstance(default, t):
            return (t,)
    return None


def _finite(key: str, value, where: str) -> None:
    """Refuse NaN and infinities anywhere in a value (also inside free-form option mappings)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise HetpruneError(f"{where}: {key} = {value!r} is not a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            _finite(f"{key}.{k}", v, where)
    elif isinstance(value, list):
        for v in value:
            _finite(key, v, where)


def _as_number(value):
    """A number from a number or from text that reads as one (YAML reads ``1e-5`` as text); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        text = value.strip()
        return int(text) if text.lstrip("+-").isdigit() else float(text)
    return None


def typed(key: str, value, expected: tuple | None, where: str):
    """``value`` converted to the setting's type, or one clear error naming key, value and type."""
    _finite(key, value, where)
    if expected is None or (value is None and None in expected):
        return value
    for t in expected:
        if t is bool and isinstance(value, bool):
            return value
        if t in (str, list, dict) and isinstance(value, t):
            return value
        number = _as_number(value) if t in (int, float) else None
        if number is None:
            continue
        if t is float:
            return float(number)
        if float(number).is_integer():
            return int(number)
    wanted = " or ".join(_TYPE_NAMES[t] for t in expected)
    raise HetpruneError(f"{where}: {key} = {value!r} is not {wanted}")


def _merge(base: dict, update: dict, where: str, path: str = "", schema: dict | None = None,
           declared: dict | None = None, foreign: dict | None = None) -> dict:
    """``base`` updated by ``update``; every value checked against ``schema`` (the defaults) and converted.
    ``foreign``: why a top-level section of a strategy the run does not run is not a key here."""
    schema = base if schema is None else schema
    declared = DECLARED_TYPES if declared is None else declared
    out = copy.deepcopy(base)
    for key, value in update.items():
        full = f"{path}{key}"
        if key not in base and not path and key in (foreign or {}):
            raise HetpruneError(f"settings section {key!r} in {where} {foreign[key]}")
        if key not in base:
            allowed = ", ".join(sorted(base))
            raise HetpruneError(f"unknown key {full!r} in {where}; allowed here: {allowed}")
        default = schema.get(key)
        if isinstance(base[key], dict) and base[key] and not key.endswith("_options"):
            if not isinstance(value, dict):
                raise HetpruneError(f"{full!r} in {where} must be a mapping, got {value!r}")
            out[key] = _merge(base[key], value, where, f"{full}.", default if isinstance(default, dict) else {},
                              declared)
        else:
            out[key] = typed(full, copy.deepcopy(value), expected_type(default, declared.get(full)), where)
    return out


def sections_of(strategies) -> tuple[dict, dict]:
    """The settings sections that ``strategies`` add to the core's (a strategy, a list of them, or a mapping
    of section name to defaults), as ``(defaults, declared types)``. A strategy declares typed sections in
    ``sections`` (name -> `Section` subclass); an outside strategy may still give plain ``defaults`` (typed by
    their values) and ``setting_types`` for defaults that are null."""
    if strategies is None:
        return {}, {}
    if isinstance(strategies, dict):
        items = [strategies]
    else:
        items = list(strategies) if isinstance(strategies, (list, tuple)) else [strategies]
    defaults: dict = {}
    types_: dict = {}
    for item in items:
        if isinstance(item, dict):
            defaults.update(copy.deepcopy(item))
            continue
        for name, cls in (getattr(item, "sections", None) or {}).items():
            defaults[name] = cls.defaults()
            types_.update({f"{name}.{k}": v for k, v in field_types(cls).items()})
        for name, value in (getattr(item, "defaults", None) or {}).items():
            defaults.setdefault(name, copy.deepcopy(value))
        types_.update(getattr(item, "setting_types", None) or {})
    return defaults, types_


def typed_sections(strategies) -> dict[str, type]:
    """The typed sections ``strategies`` declare, by name."""
    out: dict = {}
    items = [] if strategies is None or isinstance(strategies, dict) else (
        list(strategies) if isinstance(strategies, (list, tuple)) else [strategies])
    for item in items:
        if not isinstance(item, dict):
            out.update(getattr(item, "sections", None) or {})
    return out


def defaults_for(strategy_defaults: dict | None = None) -> dict:
    d = copy.deepcopy(CORE_DEFAULTS)
    for key, value in (strategy_defaults or {}).items():
        d[key] = copy.deepcopy(value)
    return d


def yaml_problem(exc: Exception) -> str:
    """What PyYAML found wrong and where (1-based line and column), on one line."""
    problem = getattr(exc, "problem", None) or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


SHIPPED_CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def shipped_configs() -> list[str]:
    """The names of the configs that ship with hetprune (``--config deit-b-paper``)."""
    return sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.yaml"))


def config_path(name: str | Path) -> Path:
    """A config file's path: a file, else the shipped config of that name; one error naming the shipped ones."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = SHIPPED_CONFIGS / f"{name}.yaml"
    if path.name == str(name) and shipped.is_file():
        return shipped
    raise HetpruneError(f"config file {name} does not exist; shipped configs: {', '.join(shipped_configs())} "
                        f"(their files: {SHIPPED_CONFIGS})")


def read_yaml(path: str | Path) -> dict:
    path = config_path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:  # PyYAML's text is several lines with carets: one line here, all under --debug
        raise HetpruneError(f"config file {path} is not valid YAML: {yaml_problem(exc)}") from exc
    except UnicodeDecodeError as exc:
        raise HetpruneError(f"config file {path} is not UTF-8 text (a YAML file is): {exc.reason} at byte "
                            f"{exc.start}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise HetpruneError(f"config file {path} must hold a mapping of settings, got {type(data).__name__}")
    return data


def parse_set(items: list[str]) -> dict:
    """``--set finetune.epochs=5`` (values parsed as YAML) into a nested dict."""
    out: dict = {}
    for item in items or []:
        if "=" not in item:
            raise HetpruneError(f"--set {item!r}: write KEY=VALUE, e.g. finetune.epochs=5")
        key, raw = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise HetpruneError(f"--set {item!r}: {part} was already given a value, not a mapping")
        try:
            node[parts[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            why = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise HetpruneError(f"--set {item!r}: the value is not valid YAML ({why})") from None
    return out


def resolve(strategies=None, config_file: str | None = None, overrides: dict | None = None,
            sets: list[str] | None = None, types: dict | None = None, elsewhere: dict | None = None) -> Settings:
    """A run's settings, the one way they are made: defaults (the core's and every section ``strategies``
    add: a strategy, a list of them, or a mapping of section defaults) <- the YAML file <- ``overrides``
    (the Python call's ``settings`` and keyword options, or the command line's flags) <- ``--set`` items.

    Every value is converted and checked against its field's type (``types``, keyed ``section.key``,
    declares more, e.g. ``(int, None)``); then every typed section is validated as a whole, so a bad value
    fails now, not after an hour of work. ``elsewhere`` names, per settings section of a strategy this run
    does not run, the strategies that declare it: such a section is refused saying so, not as an unknown key.
    Returns the typed `Settings` a job carries (its ``as_settings()``: the nested dict reports and keys hold).
    """
    section_defaults, section_types = sections_of(strategies)
    schema = with_later_settings(defaults_for(section_defaults))
    declared = {**DECLARED_TYPES, **{k: v for k, v in field_types(RunSettings).items()
                                     if k not in (*TRAIN_SECTIONS, "scoring")},
                **{f"{section}.{k}": v for section in TRAIN_SECTIONS for k, v in field_types(TrainConfig).items()},
                **section_types, **(types or {})}
    settings = copy.deepcopy(schema)
    running = ", ".join(getattr(s, "name", type(s).__name__) for s in (
        strategies if isinstance(strategies, (list, tuple)) else [strategies]) if not isinstance(s, dict | None))
    foreign = {section: (f"belongs to strategy {owners[0]}, which is not" if len(owners) == 1 else
                         f"belongs to strategies {', '.join(owners)}, none of which is")
                        + f" among this run's strategies ({running or 'none'}): run it, or drop its settings"
               for section, owners in (elsewhere or {}).items() if section not in schema}
    layers = []
    if config_file:
        given = read_yaml(config_file)
        if config_path(config_file).parent == SHIPPED_CONFIGS:   # made for hetdpt: another strategy takes the rest
            given = {k: v for k, v in given.items() if k in schema}
        layers.append((given, f"config file {config_file}"))
    if overrides:
        where = "command-line options" if on_command_line() else "the settings argument"   # from Python
        layers.append(({k: v for k, v in overrides.items() if v is not None}, where))
    if sets:
        layers.append((parse_set(sets), "--set options"))
    for given, where in layers:
        given = upgraded(given, settings, where)
        settings = epochs_over_passes(_merge(settings, given, where, schema=schema, declared=declared,
                                             foreign=foreign), given, where)
    settings = without_later_defaults(settings)
    validate(settings, strategies)
    return Settings(settings)


def upgraded(given: dict, settings: dict, where: str) -> dict:
    """A layer of settings (``given``) with what a section renamed read in its new form (`Section.upgrade`),
    over the ``settings`` so far."""
    out = given
    for name, value in given.items():
        if isinstance(value, dict):
            for cls in _section_classes(name):
                upgrade = getattr(cls, "upgrade", None)
                if upgrade is not None:
                    value = upgrade(value, settings.get(name) or {}, where)
            if value is not given[name]:
                out = {**out, name: value}
    return out


def validate(settings: dict, strategies=None) -> None:
    """Every typed section of ``settings`` checked as a whole (the core's, each schedule, the scoring
    batches, and the sections ``strategies`` declare)."""
    RunSettings.of(settings)
    ScoringConfig.of(settings)
    for section in TRAIN_SECTIONS:
        if section in settings:   # the base's schedule is left out at its default
            train_config(settings, section)  # validates the schedule now, not after an hour
    for cls in typed_sections(strategies).values():
        cls.of(settings)

