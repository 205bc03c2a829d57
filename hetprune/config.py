"""Settings of a pruning run: defaults, a YAML file (``--config``) and
command-line overrides, merged in that order. Unknown keys are errors that
name the key and where it came from.

The core owns the sections every strategy shares; a strategy adds its own
section through its ``defaults`` attribute (for example ``hetdpt:``).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import yaml

from .errors import HetpruneError, on_command_line

KD_MODES = ("soft", "hard", "none")
ATTN_MODES = ("identity", "ln-residual")   # how an attention sub-block is removed (hetprune.layers.HetBlock)
RUN_KEYS = ("seed", "device", "amp")   # a fine-tune takes these from the run, never from its own section


@dataclass
class TrainConfig:
    """One fine-tune schedule (lives here, not in ``train``, so reading settings never imports torch)."""

    epochs: int = 3
    lr: float = 5e-4
    batch_size: int = 32
    weight_decay: float = 0.05
    warmup_epochs: int = 0
    kd: str = "soft"            # soft | hard | none
    kd_temperature: float = 2.0
    kd_alpha: float = 0.5       # weight of the distillation term; (1 - alpha) on the labels
    subset: int | None = None   # train on this many training images (seeded), None = all
    seed: int = 0
    device: str = "cpu"         # a device name, or a torch.device already resolved (a job's)
    workers: int = 0            # data-loading worker processes (ImageFolder data)
    amp: str = "none"           # bf16 | fp16 | none | auto (hetprune.devices.resolve_amp)

    def __post_init__(self):
        for name in ("epochs", "batch_size", "warmup_epochs", "workers", "seed", "subset"):
            value = getattr(self, name)
            if not (value is None and name == "subset") and (isinstance(value, bool) or not isinstance(value, int)):
                raise HetpruneError(f"training setting {name} must be a whole number, got {value!r}")
        for name in ("lr", "weight_decay", "kd_temperature", "kd_alpha"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise HetpruneError(f"training setting {name} must be a finite number, got {value!r}")
        if self.kd not in KD_MODES:
            raise HetpruneError(f"kd must be one of {KD_MODES}, got {self.kd!r}")
        if self.epochs < 0 or self.batch_size < 1 or self.lr <= 0:
            raise HetpruneError(f"bad training settings: epochs={self.epochs}, batch_size={self.batch_size}, "
                                f"lr={self.lr} (need epochs >= 0, batch_size >= 1, lr > 0)")
        if not 0.0 <= self.kd_alpha <= 1.0:
            raise HetpruneError(f"kd_alpha must be within [0, 1], got {self.kd_alpha}")
        if self.kd_temperature <= 0:
            raise HetpruneError(f"kd_temperature must be > 0, got {self.kd_temperature}")
        if self.workers < 0:
            raise HetpruneError(f"workers must be >= 0, got {self.workers}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["device"] = str(d["device"])   # a resolved torch.device reads as its name
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "training settings") -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise HetpruneError(f"unknown key(s) {', '.join(unknown)} in {where}; allowed: {', '.join(sorted(known))}")
        return cls(**d)


def _schedule(cfg: TrainConfig) -> dict:
    d = cfg.to_dict()
    for key in RUN_KEYS:
        del d[key]
    return d


# Chosen so the embedded default tells strategies apart (README: "Why these defaults").
CORE_DEFAULTS: dict = {
    "scorer": "gate-taylor",
    "scorer_options": {},   # per scorer name, e.g. {"gate-taylor": {"epochs_per_removal": 2}}
    "attn_remover": "attn-identity",
    "act_remover": "act-identity",
    "mergers": ["linear-merge"],
    "cost_model": "auto",   # what --target-speedup counts: auto (latency on CUDA, else macs), macs, latency, ...
    "cost_model_options": {},   # per cost model name, e.g. {"latency": {"batch_size": 1}}
    "seed": 0,
    "device": "cpu",        # cpu | cuda | cuda:N | auto, resolved once when a command starts
    "amp": "auto",          # bf16 | fp16 | none; auto = bf16 on CUDA with native bf16, else none
    # "seed", "device" and "amp" of a fine-tune always come from the run's own (top level)
    "finetune": _schedule(TrainConfig(epochs=3, lr=5e-4, subset=300, kd="soft")),
    "short_finetune": _schedule(TrainConfig(epochs=2, lr=5e-4, subset=150, kd="soft")),
    "scoring": {"batches": 4, "batch_size": 64, "subset": 300},
}


# The type of settings whose default is null, or that may be set to null ("all images").
DECLARED_TYPES: dict[str, tuple] = {
    "finetune.subset": (int, None),
    "short_finetune.subset": (int, None),
    "scoring.subset": (int, None),
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
           declared: dict | None = None) -> dict:
    """``base`` updated by ``update``; every value checked against ``schema`` (the defaults) and converted."""
    schema = base if schema is None else schema
    declared = DECLARED_TYPES if declared is None else declared
    out = copy.deepcopy(base)
    for key, value in update.items():
        full = f"{path}{key}"
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


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise HetpruneError(f"config file {path} does not exist")
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


def resolve(strategy_defaults: dict | None, config_file: str | None = None, overrides: dict | None = None,
            sets: list[str] | None = None, types: dict | None = None) -> dict:
    """Defaults <- YAML file <- explicit overrides <- ``--set`` items.

    Every value is typed by its default (``types``, keyed ``section.key``,
    declares the type of settings whose default is null, e.g. ``(int, None)``).
    """
    schema = defaults_for(strategy_defaults)
    declared = {**DECLARED_TYPES, **(types or {})}
    settings = copy.deepcopy(schema)
    if config_file:
        settings = _merge(settings, read_yaml(config_file), f"config file {config_file}", schema=schema,
                          declared=declared)
    if overrides:
        where = "command-line options" if on_command_line() else "the settings argument"   # from Python
        settings = _merge(settings, {k: v for k, v in overrides.items() if v is not None}, where,
                          schema=schema, declared=declared)
    if sets:
        settings = _merge(settings, parse_set(sets), "--set options", schema=schema, declared=declared)
    for section in ("finetune", "short_finetune"):
        train_config(settings, section)  # validates the schedule now, not after an hour
    return settings


def train_config(settings: dict, section: str, device=None, amp: str | None = None, **changes) -> TrainConfig:
    """The TrainConfig of a settings section; seed, device and amp are the run's (``device``/``amp``: the
    run's already resolved, e.g. a job's ``torch.device``, instead of the settings' names)."""
    d = {**settings[section], **changes}
    for key in RUN_KEYS:
        if key in settings[section]:
            raise HetpruneError(f"{section}.{key} is not a setting: the run's top-level {key!r} applies to every "
                                "fine-tune")
    d["seed"] = int(settings.get("seed", 0))
    d["device"] = settings.get("device", "cpu") if device is None else device
    d["amp"] = settings.get("amp", "none") if amp is None else amp
    return TrainConfig.from_dict(d, where=f"settings section {section!r}")
