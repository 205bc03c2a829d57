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
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import yaml

from .errors import HetpruneError, on_command_line

KD_MODES = ("soft", "hard", "none")
ATTN_MODES = ("identity", "ln-residual")   # how an attention sub-block is removed (hetprune.layers.HetBlock)
RUN_KEYS = ("seed", "device", "amp")   # a fine-tune takes these from the run, never from its own section


LR_SCALES = ("none", "linear", "sqrt")   # timm's rule: lr * (global batch / lr_base_batch), or its square root
CLIP_MODES = ("norm", "value", "agc")   # timm.utils.dispatch_clip_grad
KEEPS = ("last", "best", "ema")       # which weights a fine-tune returns
SCHEDULES = ("finetune", "short_finetune")   # the settings sections that are a TrainConfig


@dataclass
class TrainConfig:
    """One fine-tune schedule (lives here, not in ``train``, so reading settings never imports torch).

    The fields after ``amp`` came with the long-schedule recipes (issue 42). Each defaults to off, and at its
    default it is left out of `to_dict` and of the settings: every key made from a schedule before them
    (stored MAP points, compare rows, checkpoints) stays what it was.
    """

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
    workers: int = 0            # data-loading worker processes (0: the data set's own default)
    amp: str = "none"           # bf16 | fp16 | none | auto (hetprune.devices.resolve_amp)
    # -- issue 42: long-schedule recipes; every one off by default ------------------------------------------
    mixup: float = 0.0          # mixup alpha (0: off)
    cutmix: float = 0.0         # cutmix alpha (0: off)
    mix_prob: float = 1.0       # probability that a batch is mixed (with mixup or cutmix on)
    mix_switch_prob: float = 0.5   # with both on: probability of cutmix rather than mixup
    label_smoothing: float = 0.0
    drop_path: float | None = None   # stochastic depth of the student while it trains (None: as the model is)
    ema_decay: float = 0.0      # an EMA of the weights (0: none), e.g. 0.99996
    teacher: str = ""           # a timm model name: a teacher other than the dense model ("": the dense model)
    teacher_kwargs: dict = field(default_factory=dict)
    teacher_checkpoint: str = ""   # its weights (.safetensors or .pth)
    teacher_pretrained: bool = False   # its weights from timm's hub
    kd_token: bool = False      # distil into a distilled model's distillation-token head (DeiT)
    accum_steps: int = 1        # micro-batches per rank that make one global batch
    clip_grad: float | None = None   # gradient clipping (None: none)
    clip_mode: str = "norm"     # norm | value | agc
    lr_scale: str = "none"      # none | linear | sqrt: lr * (batch_size / lr_base_batch) [** 0.5]
    lr_base_batch: int = 512
    warmup_lr: float | None = None   # the learning rate warm-up starts from (None: lr * 0.01)
    min_lr: float | None = None      # the cosine schedule's floor (None: lr * 0.01)
    eval_every: int = 0         # evaluate every N epochs and at the last (0: never during the fine-tune)
    keep: str = "last"          # last | best (the best evaluated epoch) | ema (the EMA weights)
    save_every_steps: int = 0   # recovery checkpoints every N steps inside an epoch (0: at epoch ends only)
    compile: bool = False       # torch.compile the training forward
    check_every: int = 50       # steps between checks that the loss is finite (one host sync per check)
    repeats: int = 1            # repeated augmentation: each image shown this many times per epoch

    def __post_init__(self):
        for name in ("epochs", "batch_size", "warmup_epochs", "workers", "seed", "subset", "accum_steps",
                     "lr_base_batch", "eval_every", "save_every_steps", "check_every", "repeats"):
            value = getattr(self, name)
            if not (value is None and name == "subset") and (isinstance(value, bool) or not isinstance(value, int)):
                raise HetpruneError(f"training setting {name} must be a whole number, got {value!r}")
        for name in ("lr", "weight_decay", "kd_temperature", "kd_alpha", "mixup", "cutmix", "mix_prob",
                     "mix_switch_prob", "label_smoothing", "ema_decay", "drop_path", "clip_grad", "warmup_lr",
                     "min_lr"):
            value = getattr(self, name)
            if value is None and name in OPTIONAL_NUMBERS:
                continue
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
        self._check_recipe_options()

    def _check_recipe_options(self) -> None:
        """The issue-42 options: each wrong value is one error that names what is allowed."""
        for name in ("mixup", "cutmix"):
            if getattr(self, name) < 0:
                raise HetpruneError(f"{name} is an alpha >= 0 (0: off), got {getattr(self, name)}")
        for name in ("mix_prob", "mix_switch_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise HetpruneError(f"{name} is a probability within [0, 1], got {getattr(self, name)}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise HetpruneError(f"label_smoothing must be within [0, 1), got {self.label_smoothing}")
        if self.drop_path is not None and not 0.0 <= self.drop_path < 1.0:
            raise HetpruneError(f"drop_path must be within [0, 1) or null (the model's own), got {self.drop_path}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise HetpruneError(f"ema_decay must be within [0, 1) (0: no EMA), got {self.ema_decay}")
        for name, allowed in (("clip_mode", CLIP_MODES), ("lr_scale", LR_SCALES), ("keep", KEEPS)):
            if getattr(self, name) not in allowed:
                raise HetpruneError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.clip_grad is not None and self.clip_grad <= 0:
            raise HetpruneError(f"clip_grad must be > 0 or null (no clipping), got {self.clip_grad}")
        for name in ("warmup_lr", "min_lr"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise HetpruneError(f"{name} must be >= 0 or null (lr * 0.01), got {getattr(self, name)}")
        for name, least in (("accum_steps", 1), ("lr_base_batch", 1), ("check_every", 1), ("repeats", 1),
                            ("eval_every", 0), ("save_every_steps", 0)):
            if getattr(self, name) < least:
                raise HetpruneError(f"{name} must be >= {least}, got {getattr(self, name)}")
        for name in ("teacher", "teacher_checkpoint"):
            if not isinstance(getattr(self, name), str):
                raise HetpruneError(f"{name} must be text (\"\": none), got {getattr(self, name)!r}")
        if not isinstance(self.teacher_kwargs, dict):
            raise HetpruneError(f"teacher_kwargs must be a mapping, got {self.teacher_kwargs!r}")
        for name in ("teacher_pretrained", "kd_token", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise HetpruneError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if (self.teacher_checkpoint or self.teacher_pretrained or self.teacher_kwargs) and not self.teacher:
            raise HetpruneError("teacher_checkpoint, teacher_pretrained and teacher_kwargs describe a separate "
                                "teacher: name its timm model in teacher too")
        if self.teacher_checkpoint and self.teacher_pretrained:
            raise HetpruneError("give the teacher either teacher_checkpoint or teacher_pretrained, not both")
        if self.kd_token and self.kd == "none":
            raise HetpruneError("kd_token distils into the distillation token: it needs kd soft or hard, not none")
        if self.keep == "best" and not self.eval_every:
            raise HetpruneError("keep: best needs eval_every >= 1 (the epochs it chooses from are the evaluated ones)")
        if self.keep == "ema" and not self.ema_decay:
            raise HetpruneError("keep: ema needs ema_decay > 0 (no EMA is kept otherwise)")

    @property
    def mixes(self) -> bool:
        """Whether batches are mixed (mixup or cutmix): pairs of a global batch then go to one rank."""
        return self.mixup > 0 or self.cutmix > 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["device"] = str(d["device"])   # a resolved torch.device reads as its name
        for name, default in RECIPE_DEFAULTS.items():   # off: absent, so keys made before them do not move
            if d[name] == default:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "training settings") -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise HetpruneError(f"unknown key(s) {', '.join(unknown)} in {where}; allowed: {', '.join(sorted(known))}")
        return cls(**d)


OPTIONAL_NUMBERS = ("drop_path", "clip_grad", "warmup_lr", "min_lr")   # null: off / the old rule
_FIRST_RECIPE_FIELD = "mixup"
RECIPE_DEFAULTS: dict = {}   # the issue-42 fields and their defaults (off), filled below


def _recipe_defaults() -> dict:
    names = [f.name for f in fields(TrainConfig)]
    base = TrainConfig()
    return {n: copy.deepcopy(getattr(base, n)) for n in names[names.index(_FIRST_RECIPE_FIELD):]}


RECIPE_DEFAULTS.update(_recipe_defaults())


INTERPOLATIONS = ("", "bilinear", "bicubic", "random")   # "": the model's own (timm's data config)


@dataclass(frozen=True)
class Augmentation:
    """An ImageFolder's training transform, in the terms of timm's ``create_transform`` (`hetprune.data`
    builds it). ``--augment NAME`` picks one of `AUGMENTATIONS`; Python may pass its own."""

    name: str = "custom"
    scale: tuple | None = (0.6, 1.0)   # random-resized-crop area range (None: timm's 8-100 %)
    hflip: float = 0.5
    color_jitter: float | None = None  # timm turns it off while RandAugment is on, as DeiT's recipe does
    auto_augment: str | None = None    # e.g. rand-m9-mstd0.5 (RandAugment, magnitude 9, std 0.5)
    re_prob: float = 0.0               # random erasing probability
    re_mode: str = "pixel"
    interpolation: str = ""
    plain: bool = False                # the validation transform instead (no augmentation)

    def __post_init__(self):
        if self.interpolation not in INTERPOLATIONS:
            raise HetpruneError(f"augmentation interpolation must be one of {', '.join(map(repr, INTERPOLATIONS))}, "
                                f"got {self.interpolation!r}")
        for name in ("hflip", "re_prob"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise HetpruneError(f"augmentation {name} is a probability within [0, 1], got {value!r}")
        if self.auto_augment is not None and not (isinstance(self.auto_augment, str) and
                                                  self.auto_augment.startswith(("rand", "augmix", "original", "v0"))):
            raise HetpruneError(f"augmentation auto_augment must be a timm policy string (rand-m9-mstd0.5, augmix-..., "
                                f"original, v0...), got {self.auto_augment!r}")

    def transform_args(self) -> dict:
        """The keyword arguments of timm's ``create_transform`` beside the model's data config."""
        args = {"scale": self.scale, "hflip": self.hflip, "color_jitter": self.color_jitter,
                "auto_augment": self.auto_augment, "re_prob": self.re_prob, "re_mode": self.re_mode}
        if self.interpolation:
            args["interpolation"] = self.interpolation
        return {k: v for k, v in args.items() if not (k == "scale" and v is None)}

    @classmethod
    def from_dict(cls, d: dict, where: str = "augmentation") -> "Augmentation":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise HetpruneError(f"unknown key(s) {', '.join(unknown)} in {where}; allowed: {', '.join(sorted(known))}")
        return cls(**{k: tuple(v) if k == "scale" and isinstance(v, list) else v for k, v in d.items()})


# --augment NAME: light (the default), imagenet (timm's recipe from scratch), paper (the DeiT recipe of the
# authors' long fine-tune), none (the validation transform)
AUGMENTATIONS: dict[str, Augmentation] = {
    "light": Augmentation("light", scale=(0.6, 1.0), hflip=0.5, color_jitter=None),
    "imagenet": Augmentation("imagenet", scale=None, hflip=0.5, color_jitter=0.4, re_mode="const"),
    "none": Augmentation("none", plain=True),
    "paper": Augmentation("paper", scale=None, hflip=0.5, color_jitter=0.3, auto_augment="rand-m9-mstd0.5",
                          re_prob=0.25, re_mode="pixel", interpolation="bicubic"),
}


def augmentation(value) -> Augmentation:
    """An `Augmentation` from its name (``--augment``), a mapping, or itself; one error naming the names."""
    if isinstance(value, Augmentation):
        return value
    if isinstance(value, dict):
        return Augmentation.from_dict(value)
    if value not in AUGMENTATIONS:
        raise HetpruneError(f"augment {value!r} is not one of {', '.join(AUGMENTATIONS)} (light: crops of 60-100 % "
                            "and flips, the default; imagenet: timm's full recipe; none: no augmentation; paper: "
                            "the DeiT recipe of the paper's long fine-tune: RandAugment rand-m9-mstd0.5, random "
                            "erasing 0.25, bicubic)")
    return AUGMENTATIONS[value]


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
    **{f"{section}.{name}": (float, None) for section in SCHEDULES for name in OPTIONAL_NUMBERS},
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
    schema = with_recipe_options(defaults_for(strategy_defaults))
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
    settings = without_recipe_defaults(settings)
    for section in SCHEDULES:
        train_config(settings, section)  # validates the schedule now, not after an hour
    return settings


def with_recipe_options(settings: dict) -> dict:
    """``settings`` whose schedule sections also hold the issue-42 options at their defaults: what a file or
    ``--set`` may name (the defaults themselves leave them out)."""
    out = copy.deepcopy(settings)
    for section in SCHEDULES:
        if isinstance(out.get(section), dict):
            out[section] = {**out[section], **{k: copy.deepcopy(v) for k, v in RECIPE_DEFAULTS.items()
                                               if k not in out[section]}}
    return out


def without_recipe_defaults(settings: dict) -> dict:
    """``settings`` with every issue-42 option that is at its default (off) left out of the schedule sections,
    so a run that uses none of them has the settings, and the keys, it had before they existed."""
    out = copy.deepcopy(settings)
    for section in SCHEDULES:
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items()
                            if not (k in RECIPE_DEFAULTS and v == RECIPE_DEFAULTS[k])}
    return out


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
