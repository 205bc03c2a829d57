"""The schema of a pruning run's settings: the sections and their fields, with the checks of each and the
operations that keep a settings mapping whole (`changed`, `changed_schedules`, `keyed`). The loader that makes a
run's settings from defaults, a YAML file, the Python call and ``--set`` is
[`hetprune.core.loader`][hetprune.core.loader.resolve].

Settings are typed. Every section is a dataclass ([`Section`][hetprune.core.config.Section]:
``from_dict`` refuses unknown keys and names the allowed ones,
``__post_init__`` validates): the core's ([`RunSettings`][hetprune.core.config.RunSettings],
[`TrainConfig`][hetprune.core.config.TrainConfig] for each fine-tune schedule,
[`ScoringConfig`][hetprune.core.config.ScoringConfig]) and each strategy's own, which it
declares in its ``sections`` attribute (``{"hetdpt": HetDPTOptions}``). A
value's type comes from its field's annotation. Dicts remain only at the
edges: YAML, ``--set``, ``report.json`` and the keys of stored results; code
below a job reads ``job.config`` and ``job.options(HetDPTOptions)``.
"""

from __future__ import annotations

import copy
import math
import types as pytypes
import typing
import warnings
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import ClassVar


from .errors import HetpruneError
from .keys import drop_later_defaults, key_metadata, keyed_settings, later_defaults, unkeyed

KD_MODES = ("soft", "hard", "none")
ATTN_MODES = ("identity", "ln-residual")   # how an attention sub-block is removed (hetprune.model.block_modules.HetBlock)
RUN_KEYS = ("seed", "device", "amp")   # a fine-tune takes these from the run, never from its own section


def setting(default=MISSING, help: str = "", factory=None, keyed: bool = True, why: str = "",
            since: str | None = None):
    """A settings field: its default (``factory`` for a mutable one), one line of help for the settings
    reference (docs/reference/settings.md is generated from these), and how it enters the keys of stored
    results (`hetprune.core.keys`): ``keyed=False`` with ``why`` for a setting that shapes no result,
    ``since`` for one added after keys were first made from its section (left out while at its default)."""
    metadata = key_metadata(help, keyed=keyed, why=why, since=since)
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def refuse_unknown_keys(cls, d: dict, where: str) -> None:
    """One error naming the keys of ``d`` that are not fields of the dataclass ``cls``, and the allowed ones."""
    known = sorted(f.name for f in fields(cls))
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise HetpruneError(f"unknown key(s) {', '.join(unknown)} in {where}; allowed: {', '.join(known)}")


def carried(settings) -> bool:
    """Whether ``settings`` is the `hetprune.core.settings.Settings` object a job carries (it parses each section
    once: ask it) rather than the loader's dict (that module builds on this one, so it is known by its shape)."""
    return not isinstance(settings, dict) and callable(getattr(settings, "section", None))


class Section:
    """A typed settings section: a dataclass whose fields are the section's settings.

    ``section`` is its key in the settings (``"hetdpt"``; empty for the top level). `from_dict` refuses
    unknown keys and names the allowed ones; a subclass validates in ``__post_init__`` with `need`, so a
    bad value is one error naming ``section.key``, what is allowed and what was given.
    """

    section: ClassVar[str] = ""
    declared: ClassVar[dict[str, list[type]]] = {}   # section name -> the classes that declare it (for `keyed`)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.section:
            Section.declared.setdefault(cls.section, []).append(cls)

    @classmethod
    def from_dict(cls, d: dict | None, where: str | None = None):
        where = where or (f"settings section {cls.section!r}" if cls.section else "settings")
        d = dict(cls.upgrade(dict(d or {}), {}, where))
        refuse_unknown_keys(cls, d, where)
        return cls(**d)

    @classmethod
    def upgrade(cls, given: dict, held: dict, where: str) -> dict:
        """``given`` (what a layer of settings, or a stored section, gives this section) with settings renamed
        since read in their new form; ``held``: the section so far. A section that renamed settings says so
        here (with a deprecation line); this one renamed none."""
        return given

    @classmethod
    def key_form(cls, d: dict) -> dict:
        """The section ``d`` as a key made from whole settings hashes it (`keyed`): a section that renamed
        settings keys them by their old names, so results stored before keep their keys; this one, as it is."""
        return d

    @classmethod
    def of(cls, settings: dict):
        """This section of a run's settings (a dict at the edge, or the `hetprune.core.settings.Settings` a job
        carries, which parses each section once), typed and checked."""
        if carried(settings):
            return settings.section(cls)
        if cls.section and cls.section not in settings:
            raise HetpruneError(f"these settings have no {cls.section!r} section (a strategy that declares it adds "
                                "it to the defaults)")
        return cls.from_dict(settings[cls.section] if cls.section else settings)

    @classmethod
    def defaults(cls) -> dict:
        return cls().to_dict()

    def to_dict(self) -> dict:
        return copy.deepcopy(asdict(self))

    def as_settings(self) -> dict:
        """What a run's settings hold of this section (and what keys hash of it: `hetprune.core.keys`)."""
        return self.to_dict()

    def need(self, name: str, ok: bool, what: str) -> None:
        """Refuse field ``name`` unless ``ok``: ``section.name must be WHAT, got VALUE``."""
        if not ok:
            key = f"{self.section}.{name}" if self.section else name
            raise HetpruneError(f"{key} must be {what}, got {getattr(self, name)!r}")


def whole(value, minimum: int | None = None) -> bool:
    """A whole number (not a bool), at least ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and (minimum is None or value >= minimum)


def number(value, low: float | None = None, high: float | None = None) -> bool:
    """A finite number (not a bool) within [low, high]."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (low is None or value >= low) and (high is None or value <= high))


_PLAIN = {int: int, float: float, str: str, bool: bool, dict: dict, list: list, type(None): None}


def field_types(cls) -> dict[str, tuple]:
    """What each field of a section accepts, read from its annotation (``int | None`` -> ``(int, None)``):
    how `resolve` converts and checks a value from YAML or ``--set``. An annotation it cannot read
    (``Any``) accepts anything."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        hint = hints.get(f.name)
        parts = typing.get_args(hint) if isinstance(hint, pytypes.UnionType) or typing.get_origin(hint) is typing.Union \
            else (hint,)
        accepted = tuple(_PLAIN[typing.get_origin(t) or t] for t in parts if (typing.get_origin(t) or t) in _PLAIN)
        if len(accepted) == len(parts):
            out[f.name] = accepted
    return out


LR_SCALES = ("none", "linear", "sqrt")   # timm's rule: lr * (global batch / lr_base_batch), or its square root
CLIP_MODES = ("norm", "value", "agc")   # timm.utils.dispatch_clip_grad
KEEPS = ("last", "best", "ema")       # which weights a fine-tune returns
COMPILE_AUTO = "auto"   # a schedule's compile: on CUDA, off on the CPU (`hetprune.training.train.step_plan`)
# compile given as a word (the Python call's settings; YAML reads on and off as booleans itself)
COMPILE_WORDS = {"auto": COMPILE_AUTO, "on": True, "off": False, "true": True, "false": False}
SCHEDULES = ("finetune", "short_finetune")   # the pruning run's fine-tune schedules (each a TrainConfig)
# the schedule of a dense base hetprune makes, by how it makes it (--base scratch | finetune): a TrainConfig each
BASE_SCHEDULES = {"scratch": "base_scratch", "finetune": "base_finetune"}
TRAIN_SECTIONS = (*SCHEDULES, *BASE_SCHEDULES.values())   # every settings section that is a TrainConfig


class ReadsLikeItsDict:
    """A typed settings object read like the dict it once was (``run.finetune["lr"]``, ``{**run.scoring}``), as a
    plugin written when ``job.config``'s schedules and scoring batches were dicts reads it: it works, with a
    `DeprecationWarning` naming the attribute to read, until hetprune 1.0."""

    def _dict_read(self, what: str) -> dict:
        warnings.warn(self._read_instead(what), DeprecationWarning, stacklevel=3)
        return self.as_settings()

    def _read_instead(self, what: str) -> str:
        """What the warning tells the reader to do instead."""
        return (f"{type(self).__name__} is a typed settings object now: read {what} as an attribute (reading it "
                "like a dict works until hetprune 1.0)")

    def __getitem__(self, key: str):
        return self._dict_read(f".{key}")[key]

    def get(self, key: str, default=None):
        return self._dict_read(f".{key}").get(key, default)

    def keys(self):
        return self._dict_read("each field").keys()


@dataclass
class TrainConfig(ReadsLikeItsDict):
    """One fine-tune schedule (lives here, not in ``train``, so reading settings never imports torch).

    The fields marked ``since`` came later (the long-schedule recipes of issue 42). Each defaults to off, and
    at its default it is left out of `to_dict` and of the settings: every key made from a schedule before them
    (stored MAP points, compare rows, checkpoints) stays what it was.
    """

    epochs: int = setting(3, "passes over the (subset of the) training images")
    lr: float = setting(5e-4, "the peak learning rate (AdamW, cosine schedule)")
    batch_size: int = setting(32, "images per optimisation step, over all ranks (the global batch), or per rank "
                                  "with batch_per_gpu")
    weight_decay: float = setting(0.05, "AdamW's weight decay (none on norms, biases, LayerScale)")
    warmup_epochs: int = setting(0, "epochs of linear warm-up before the cosine decay")
    kd: str = setting("soft", "distillation from the teacher: soft (KL at kd_temperature), hard (its argmax as "
                              "labels) or none")
    kd_temperature: float = setting(2.0, "the soft distillation's temperature")
    kd_alpha: float = setting(0.5, "weight of the distillation term; (1 - alpha) on the labels")
    subset: int | None = setting(None, "train on this many training images (seeded), null = all")
    seed: int = setting(0, "the run's (not settable per schedule)")
    device: str = setting("cpu", "the run's (a device name, or a torch.device already resolved)")
    workers: int = setting(0, "data-loading worker processes (0: the data set's own default; ImageFolder: a share "
                              "of the CPUs per local process)")
    amp: str = setting("none", "the run's: bf16 | fp16 | none | auto (hetprune.core.devices.resolve_amp)")
    # -- issue 42: long-schedule recipes; every one off by default ------------------------------------------
    mixup: float = setting(0.0, "mixup alpha (0: off); pairs are drawn from the global step, the same on every rank",
                           since="issue 42")
    cutmix: float = setting(0.0, "cutmix alpha (0: off)", since="issue 42")
    mix_prob: float = setting(1.0, "probability that a batch is mixed (with mixup or cutmix on)", since="issue 42")
    mix_switch_prob: float = setting(0.5, "with both on: probability of cutmix rather than mixup", since="issue 42")
    label_smoothing: float = setting(0.0, "label smoothing (folded into the soft targets with mixup)", since="issue 42")
    drop_path: float | None = setting(None, "stochastic depth of the student while it trains (null: as the model is)",
                                      since="issue 42")
    ema_decay: float = setting(0.0, "an EMA of the weights (0: none), e.g. 0.99996; evaluated beside them",
                               since="issue 42")
    teacher: str = setting("", "a timm model name: a teacher other than the dense model (\"\": the dense model)",
                           since="issue 42")
    teacher_kwargs: dict = setting(help="the separate teacher's timm kwargs", factory=dict, since="issue 42")
    teacher_checkpoint: str = setting("", "the separate teacher's weights (.safetensors or .pth)", since="issue 42")
    teacher_pretrained: bool = setting(False, "the separate teacher's weights from timm's hub", since="issue 42")
    kd_token: bool = setting(False, "distil into a distilled model's distillation-token head (DeiT)", since="issue 42")
    accum_steps: int = setting(1, "micro-batches per rank that make one global batch (so any batch fits a card)",
                               since="issue 42")
    clip_grad: float | None = setting(None, "gradient clipping (null: none)", since="issue 42")
    clip_mode: str = setting("norm", "norm | value | agc (timm's dispatch_clip_grad)", since="issue 42")
    lr_scale: str = setting("none", "none | linear | sqrt: lr * (batch_size / lr_base_batch) [** 0.5], timm's rule",
                            since="issue 42")
    lr_base_batch: int = setting(512, "the batch the lr is given for (lr_scale)", since="issue 42")
    warmup_lr: float | None = setting(None, "the learning rate warm-up starts from (null: lr * 0.01)", since="issue 42")
    min_lr: float | None = setting(None, "the cosine schedule's floor (null: lr * 0.01)", since="issue 42")
    eval_every: int = setting(0, "evaluate every N epochs and at the last (0: never during the fine-tune)",
                              since="issue 42")
    keep: str = setting("last", "last | best (the best evaluated epoch) | ema (the EMA weights)", since="issue 42")
    save_every_steps: int = setting(0, "recovery checkpoints every N steps inside an epoch (0: at epoch ends only)",
                                    since="issue 42")
    compile: bool | str = setting(COMPILE_AUTO, "torch.compile the student's forward and backward and the teacher's "
                                                "forward: auto (on CUDA, off on the CPU) | true | false (on and off read "
                                                "as true and false)",
                                  since="issue 42")
    check_every: int = setting(50, "steps between checks that the loss is finite (one host sync per check)",
                               since="issue 42")
    repeats: int = setting(1, "repeated augmentation: each image shown this many times per epoch", since="issue 42")
    batch_per_gpu: bool = setting(False, "batch_size is per GPU (per rank): the global batch is batch_size x the "
                                         "ranks, resolved when the run starts (lr_scale scales by that global batch)",
                                  since="issue 42")
    image_passes: int | None = setting(None, "the image passes this schedule trains for in all: once the data's size "
                                             "is known, epochs become image_passes / the images an epoch sees (its "
                                             "subset of the training set), rounded up, so one config suits a folder "
                                             "of any size; an epochs setting given later replaces it (null: epochs as "
                                             "given)", since="issue 69")

    def __post_init__(self):
        for name in ("epochs", "batch_size", "warmup_epochs", "workers", "seed", "subset", "accum_steps",
                     "lr_base_batch", "eval_every", "save_every_steps", "check_every", "repeats", "image_passes"):
            value = getattr(self, name)
            if not (value is None and name in ("subset", "image_passes")) and (
                    isinstance(value, bool) or not isinstance(value, int)):
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
        if self.image_passes is not None and self.image_passes < 1:
            raise HetpruneError(f"image_passes must be >= 1 or null (epochs as given), got {self.image_passes}")
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
        for name in ("teacher_pretrained", "kd_token", "batch_per_gpu"):
            if not isinstance(getattr(self, name), bool):
                raise HetpruneError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.compile, str):
            self.compile = COMPILE_WORDS.get(self.compile.lower(), self.compile)
        if not (isinstance(self.compile, bool) or self.compile == COMPILE_AUTO):
            raise HetpruneError(f"compile must be auto, true or false (on, off), got {self.compile!r}")
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

    def global_batch(self, world: int) -> TrainConfig:
        """This schedule with ``batch_size`` the global batch of a run on ``world`` ranks: ``batch_size x
        world`` when ``batch_per_gpu`` (then off), else as it is. Everything that keys or scales by the batch
        (checkpoints, MAP points, ``lr_scale``) sees the global batch, so one on 8 x 128 is one on 1 x 1024."""
        if not self.batch_per_gpu:
            return self
        return replace(self, batch_size=self.batch_size * world, batch_per_gpu=False)

    @property
    def mixes(self) -> bool:
        """Whether batches are mixed (mixup or cutmix): pairs of a global batch then go to one rank."""
        return self.mixup > 0 or self.cutmix > 0

    def sized(self, train_size: int | None, where: str = "the schedule") -> "TrainConfig":
        """This schedule with ``epochs`` from ``image_passes`` and the training set's size (`image_passes`):
        itself where it has none. A size that is unknown (a Task's batches of no known length) is refused."""
        if self.image_passes is None:
            return self
        if train_size is None:
            raise HetpruneError(f"{where}.image_passes sizes the epochs from the training set's size, which is "
                                f"unknown here (a Task's batches of no known length): give {where}.epochs instead")
        return replace(self, epochs=max(1, math.ceil(self.image_passes / max(1, self.epoch_images(train_size)))))

    def epoch_images(self, train_size: int) -> int:
        """The images one epoch of this schedule trains on: its subset of a training set of ``train_size``."""
        return min(self.subset or train_size, train_size)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["device"] = str(d["device"])   # a resolved torch.device reads as its name
        return drop_later_defaults(d, TrainConfig)   # off: absent, so keys made before them do not move

    def as_settings(self) -> dict:
        """This schedule as a run's settings hold it, and keys hash it: without the run's seed, device and
        precision (`RUN_KEYS`), which are never a schedule's own."""
        d = self.to_dict()
        for key in RUN_KEYS:
            del d[key]
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "training settings") -> "TrainConfig":
        refuse_unknown_keys(cls, d, where)
        return cls(**d)


OPTIONAL_NUMBERS = ("drop_path", "clip_grad", "warmup_lr", "min_lr")   # null: off / the old rule


INTERPOLATIONS = ("", "bilinear", "bicubic", "random")   # "": the model's own (timm's data config)


@dataclass(frozen=True)
class Augmentation:
    """An ImageFolder's training transform, in the terms of timm's ``create_transform``
    (`hetprune.training.image_folders` builds it). ``--augment NAME`` picks one of `AUGMENTATIONS`; Python may pass
    its own."""

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
        refuse_unknown_keys(cls, d, where)
        return cls(**{k: tuple(v) if k == "scale" and isinstance(v, list) else v for k, v in d.items()})


# --augment NAME: light (the default), imagenet (timm's recipe from scratch), paper (the DeiT recipe of the
# authors' long fine-tune), none (the validation transform), crop (light without flips: digits, text, anything a
# mirror changes; what the small-folder config takes)
AUGMENTATIONS: dict[str, Augmentation] = {
    "light": Augmentation("light", scale=(0.6, 1.0), hflip=0.5, color_jitter=None),
    "imagenet": Augmentation("imagenet", scale=None, hflip=0.5, color_jitter=0.4, re_mode="const"),
    "none": Augmentation("none", plain=True),
    "paper": Augmentation("paper", scale=None, hflip=0.5, color_jitter=0.3, auto_augment="rand-m9-mstd0.5",
                          re_prob=0.25, re_mode="pixel", interpolation="bicubic"),
    "crop": Augmentation("crop", scale=(0.6, 1.0), hflip=0.0, color_jitter=None),
}
AUGMENT_HELP = ("light: random crops of 60-100 % of the image and horizontal flips (the default; wrong for digits, "
                "text and anything a mirror changes); crop: the same crops, no flips; imagenet: timm's full recipe "
                "(crops down to 8 %, flips, colour jitter); none: no augmentation (the validation transform); paper: "
                "the DeiT recipe of the paper's long fine-tune (RandAugment rand-m9-mstd0.5, random erasing 0.25, "
                "bicubic, flips)")


def augmentation(value) -> Augmentation:
    """An `Augmentation` from its name (``--augment``), a mapping, or itself; one error naming the names."""
    if isinstance(value, Augmentation):
        return value
    if isinstance(value, dict):
        return Augmentation.from_dict(value)
    if value not in AUGMENTATIONS:
        raise HetpruneError(f"augment {value!r} is not one of {', '.join(AUGMENTATIONS)} ({AUGMENT_HELP})")
    return AUGMENTATIONS[value]


@dataclass(frozen=True)
class ScoringConfig(ReadsLikeItsDict, Section):
    """The few fixed batches one-shot scorers (``taylor``, ``magnitude``, ...) score on."""

    section: ClassVar[str] = "scoring"
    batches: int = setting(4, "batches a one-shot scorer reads")
    batch_size: int = setting(64, "images per scoring batch")
    subset: int | None = setting(300, "the seeded subset of training images the batches come from (null: all)")

    def __post_init__(self):
        self.need("batches", whole(self.batches, 1), "a whole number >= 1")
        self.need("batch_size", whole(self.batch_size, 1), "a whole number >= 1")
        self.need("subset", self.subset is None or whole(self.subset, 1), "a whole number >= 1 or null (all)")


AMPS = ("auto", "bf16", "fp16", "none")
BASE_UNKEYED = ("it shapes only the base model hetprune makes, and every result made from that base is keyed by the "
                "base's weights (and the base by its schedule)")


# Chosen so the embedded default tells strategies apart (README: "Why these defaults").
@dataclass(frozen=True)
class RunSettings(Section):
    """The settings every strategy shares (the top level of a run's settings): the components a depth
    pipeline runs, the cost model, the run's seed, device and precision, the two fine-tune schedules and the
    scoring batches. ``finetune`` and ``short_finetune`` hold a schedule each (`schedule` gives its
    `TrainConfig`); a fine-tune's seed, device and precision are always the run's."""

    scorer: str = setting("gate-taylor", "the scorer that chooses sites within each kind")
    scorer_options: dict = setting(help="per scorer name, its options, e.g. {gate-taylor: {epochs_per_removal: 2}}",
                                   factory=dict)
    attn_remover: str = setting("attn-identity", "how an attention sub-block is removed")
    act_remover: str = setting("act-identity", "how an activation is removed")
    mergers: list = setting(help="what folds the MLPs removal made linear, in order", factory=lambda: ["linear-merge"])
    cost_model: str = setting("auto", "what --target-speedup counts: auto (latency on CUDA, else macs), macs, "
                                      "latency, or a plugin's")
    cost_model_options: dict = setting(help="per cost model name, its options, e.g. {latency: {batch_size: 1}}",
                                       factory=dict)
    seed: int = setting(0, "the run's seed: data order, augmentation, random draws")
    device: str = setting("auto", "auto (cuda where there is one, else cpu) | cpu | cuda | cuda:N, resolved once "
                                  "when a run starts; the log says which")
    amp: str = setting("auto", "bf16 | fp16 | none; auto = bf16 on CUDA with native bf16, else none")
    dist_timeout_min: float = setting(30.0, "under torchrun: minutes a collective waits for a rank that does not "
                                            "come (one lost, stuck, or still busy in a stage rank 0 runs alone, "
                                            "such as timing latency) before every rank stops with an error "
                                            "instead of hanging; not part of any result's key",
                                      keyed=False, why="how long a collective waits for a missing rank: a run "
                                                       "that finishes is the same whatever it is")
    finetune: TrainConfig = setting(help="the fine-tune after pruning (a schedule: see below)",
                                    factory=lambda: TrainConfig(epochs=3, lr=5e-4, subset=300, kd="soft"))
    short_finetune: TrainConfig = setting(help="the short fine-tune of cheap points and between HetDPT+'s steps",
                                          factory=lambda: TrainConfig(epochs=2, lr=5e-4, subset=150, kd="soft"))
    scoring: ScoringConfig = setting(help="the batches one-shot scorers read (see ScoringConfig)",
                                     factory=ScoringConfig)
    # -- came later (since): left out of a run's settings at their defaults, so keys made before them hold ----
    tf32: bool = setting(True, "fp32 matmuls in TF32 on GPUs that have it (Ampere and later), as timm's trainers "
                               "run them: about 8x the fp32 rate, with a 10-bit mantissa; false: full fp32. No "
                               "effect on a CPU", since="issue 56")
    augment: str | None = setting(None, "an ImageFolder's training augmentation: light, imagenet, none, paper or "
                                        "crop (light without flips) (null: the --augment option's, light by "
                                        "default)", since="issue 42")
    base_scratch: TrainConfig = setting(
        help="the schedule of a dense base hetprune trains from random weights before pruning (--base scratch), on "
             "the run's own training split and augmentation, with the seed fixed at 0 whatever the run's; labels "
             "only, no teacher",
        factory=lambda: TrainConfig(epochs=30, lr=1e-3, warmup_epochs=2, subset=None, kd="none"),
        keyed=False, why=BASE_UNKEYED, since="issue 69")
    base_finetune: TrainConfig = setting(
        help="the schedule of a dense base hetprune fine-tunes from --pretrained weights with a new head before "
             "pruning (--base finetune): as base_scratch, at a pretrained model's gentler rate",
        factory=lambda: TrainConfig(epochs=10, lr=1e-4, warmup_epochs=1, subset=None, kd="none"),
        keyed=False, why=BASE_UNKEYED, since="issue 69")
    selection: int | None = setting(None, "items held out of the training data as the selection split, on which "
                                          "every choice is measured (MAP points, checks, share points, a best "
                                          "epoch), never on the val set the result reports; null: the data set's "
                                          "default (digits 300, digit pairs 1000, an ImageFolder a tenth of "
                                          "train/, at most 10,000); 0: none (choices on val, the report says so); "
                                          "a Task or DataBundle built in Python brings its own split: the setting "
                                          "must match it or stay null", since="issue 43")

    def __post_init__(self):
        self.need("augment", self.augment is None or self.augment in AUGMENTATIONS,
                  f"one of {', '.join(AUGMENTATIONS)} or null")
        self.need("selection", self.selection is None or (whole(self.selection) and self.selection >= 0),
                  "a whole number of items >= 0 (0: none) or null (the data set's default)")
        for name in ("scorer", "attn_remover", "act_remover", "cost_model", "device"):
            self.need(name, isinstance(getattr(self, name), str) and getattr(self, name) != "", "a name")
        self.need("mergers", isinstance(self.mergers, list) and all(isinstance(m, str) for m in self.mergers),
                  "a list of merger names")
        self.need("seed", whole(self.seed), "a whole number")
        self.need("amp", self.amp in AMPS, f"one of {', '.join(AMPS)}")
        self.need("tf32", isinstance(self.tf32, bool), "true or false")
        self.need("dist_timeout_min", number(self.dist_timeout_min) and self.dist_timeout_min > 0, "minutes > 0")
        for name in ("scorer_options", "cost_model_options"):
            value = getattr(self, name)
            self.need(name, isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()),
                      "a mapping of component name to its options")
        # the schedules and the scoring batches as typed objects (a dict from the loader, or one already made);
        # a schedule carries the run's seed, device and precision, never its own
        run = {"seed": self.seed, "device": self.device, "amp": self.amp}
        for name in TRAIN_SECTIONS:
            value = getattr(self, name)
            self.need(name, isinstance(value, (dict, TrainConfig)), "a mapping of schedule settings")
            object.__setattr__(self, name, replace(value, **run) if isinstance(value, TrainConfig)
                               else train_config({**run, name: value}, name))
        for name in BASE_SCHEDULES.values():
            base = getattr(self, name)
            if base.kd != "none" or base.teacher or base.kd_token:
                raise HetpruneError(f"{name}: a base hetprune makes learns from the data's labels alone (there is no "
                                    f"dense model yet to learn from), so {name}.kd must be none (got {base.kd!r}) "
                                    f"and {name}.teacher and {name}.kd_token unset")
        if not isinstance(self.scoring, ScoringConfig):
            self.need("scoring", isinstance(self.scoring, dict), "a mapping of scoring settings")
            object.__setattr__(self, "scoring", ScoringConfig.from_dict(self.scoring,
                                                                        where="settings section 'scoring'"))

    def to_dict(self) -> dict:
        """The settings as a run's settings dict holds them: the schedules and scoring batches as mappings."""
        d = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}
        for name in (*TRAIN_SECTIONS, "scoring"):
            d[name] = getattr(self, name).as_settings()
        return d

    @classmethod
    def of(cls, settings: dict) -> "RunSettings":
        """The core part of a run's settings (its strategies' sections are theirs: `Section.of`)."""
        if carried(settings):
            return settings.section(cls)
        return cls.from_dict({f.name: settings[f.name] for f in fields(cls) if f.name in settings})

    def schedule(self, section: str, device=None, amp: str | None = None, **changes) -> "TrainConfig":
        """The `TrainConfig` of schedule ``section`` (``finetune``, ``short_finetune``) with the run's seed,
        device and precision (``device``/``amp``: the job's resolved ones instead of the names)."""
        return train_config(self.to_dict(), section, device=device, amp=amp, **changes)

    @property
    def scoring_batches(self) -> ScoringConfig:
        """The scoring batches (the same object as ``scoring``; the name from when ``scoring`` was a dict)."""
        return self.scoring

    def options_for(self, kind: str, name: str) -> dict:
        """The options the settings give component ``name`` of ``kind`` (``scorer``, ``cost_model``)."""
        return dict(getattr(self, f"{kind}_options").get(name) or {})

    def options_entry(self, kind: str, name: str, label: str) -> dict:
        """``{label: options}`` where the settings give component ``name`` options, else ``{}``: a key entry
        that keeps the keys made before those options were keyed."""
        options = self.options_for(kind, name)
        return {label: options} if options else {}


CORE_DEFAULTS: dict = drop_later_defaults(RunSettings().to_dict(), RunSettings)   # the later ones left out


def _section_classes(name: str) -> list[type]:
    return [TrainConfig] if name in TRAIN_SECTIONS else Section.declared.get(name, [])


def unkeyed_settings() -> dict[str, str]:
    """Every setting declared ``keyed=False``, by its dotted key (``dist_timeout_min``, ``hetdpt.x``), with why:
    at the top level, in the schedules and in every section class imported so far."""
    out: dict[str, str] = {}
    for name, why in unkeyed(RunSettings).items():   # an unkeyed section (the base's schedule): every field of it
        out.update({f"{name}.{f.name}": why for f in fields(TrainConfig) if f.name not in RUN_KEYS}
                   if name in TRAIN_SECTIONS else {name: why})
    for name in (*TRAIN_SECTIONS, *Section.declared):
        for cls in _section_classes(name):
            out.update({f"{name}.{k}": why for k, why in unkeyed(cls).items()})
    return out


def keyed(settings) -> dict:
    """``settings`` without what shapes no result (the fields declared ``keyed=False``: the collective timeout,
    at the top level or in a section), for a key made from the whole settings (a compare row's): a row keeps
    its key whatever such a setting is, as before it existed; renamed settings under their old names
    (`in_key_form`)."""
    settings = settings.as_settings() if carried(settings) else settings
    return in_key_form(by_section_class(settings, keyed_settings))


def in_key_form(settings: dict) -> dict:
    """``settings`` with each section as keys hash it (`Section.key_form`: a setting renamed since keys were
    made from it, under its old name), so results stored before the rename keep their keys."""
    return by_section_class(settings, lambda d, cls: getattr(cls, "key_form", lambda x: x)(d))


def by_section_class(settings: dict, change) -> dict:
    """``change(mapping, cls)`` made at the top level (``cls``: `RunSettings`) and in each section whose class
    is known (the schedules, `Section` subclasses imported so far): a new dict; ``settings`` is unchanged."""
    out = change(settings, RunSettings)
    for name, value in out.items():
        if isinstance(value, dict):
            for cls in _section_classes(name):
                value = change(value, cls)
            out[name] = value
    return out


def epochs_over_passes(settings: dict, given: dict, where: str) -> dict:
    """``settings`` after a layer ``given`` (a config file, the Python call's settings, ``--set``): a schedule's
    ``epochs`` given in a later layer than its ``image_passes`` replaces them (``--config small-folder --set
    finetune.epochs=20`` trains 20 epochs), and one layer that gives both is refused: neither would be ignored
    without a word."""
    for section in TRAIN_SECTIONS:
        layer = given.get(section)
        if not isinstance(layer, dict) or "epochs" not in layer:
            continue
        if layer.get("image_passes") is not None:
            raise HetpruneError(f"{where} gives {section}.epochs and {section}.image_passes: the passes set the "
                                "epochs from the data's size, so give one of them")
        settings[section]["image_passes"] = None
    return settings


def sized(settings: dict, train_size: int | None) -> dict:
    """A run's settings whose schedules that give ``image_passes`` have their ``epochs`` from the training set's
    size (`TrainConfig.sized`): once the data is known (`hetprune.pruning.run_start.RunStart.attach`, the base's
    stage). ``settings`` itself where no schedule gives them."""
    out = settings
    for section in TRAIN_SECTIONS:
        values = settings.get(section)
        if isinstance(values, dict) and values.get("image_passes") is not None:
            epochs = train_config(settings, section).sized(train_size, section).epochs
            if epochs != values.get("epochs"):
                out = copy.deepcopy(out) if out is settings else out
                out[section] = {**values, "epochs": epochs}
    return out


def per_gpu_resolved(settings: dict, world: int) -> dict:
    """``settings`` with every schedule's ``batch_per_gpu`` turned into its global ``batch_size`` for ``world``
    ranks (`TrainConfig.global_batch`): what the run's settings, report and keys hold from its start on.
    ``settings`` itself when no schedule has it."""
    if not any(isinstance(settings.get(s), dict) and settings[s].get("batch_per_gpu") for s in TRAIN_SECTIONS):
        return settings
    out = copy.deepcopy(settings)
    for section in TRAIN_SECTIONS:
        if isinstance(out.get(section), dict) and out[section].get("batch_per_gpu"):
            out[section]["batch_size"] = int(out[section]["batch_size"]) * int(world)
            del out[section]["batch_per_gpu"]   # off: absent, as every option of a schedule at its default
    return out


def changed_schedules(settings: dict, sections, **changes) -> dict:
    """A copy of a run's settings whose schedule ``sections`` (``finetune``, ``short_finetune``, ``base``) have
    fields replaced (the CLI's ``--subset``, ``--workers`` once the data's size is known): each checked as
    ``resolve`` checks it, so a bad value is the same error as from ``--set``. New ``epochs`` replace the
    schedule's ``image_passes``, as a later layer's do (`epochs_over_passes`)."""
    out = copy.deepcopy(settings)
    for section in sections:
        if section not in TRAIN_SECTIONS:
            raise HetpruneError(f"{section!r} is not a schedule; schedules: {', '.join(TRAIN_SECTIONS)}")
        refuse_unknown_keys(TrainConfig, changes, f"settings section {section!r}")
        held = out[section] if section in out else getattr(RunSettings(), section).as_settings()
        out[section] = {**held, **copy.deepcopy(changes)}
        epochs_over_passes(out, {section: changes}, "the change")
        train_config(out, section)
    return without_later_defaults(out)


def changed(settings: dict, **changes) -> dict:
    """A copy of a run's settings with top-level entries replaced (a compare row's ``seed``, an ablation
    row's ``scorer``, HetDPT+'s depth part's ``finetune``): the settings stay whole and checked."""
    out = copy.deepcopy(settings)
    known = set(out) | {f.name for f in fields(RunSettings)}   # those left out at their defaults too (tf32, ...)
    for key, value in changes.items():
        if key not in known:
            raise HetpruneError(f"unknown setting {key!r}; settings: {', '.join(sorted(known))}")
        out[key] = copy.deepcopy(value)
    out = without_later_defaults(out)   # a later setting given its default is left out, as the loader leaves it
    RunSettings.of(out)
    return out


def with_later_settings(settings: dict) -> dict:
    """``settings`` that also hold every setting added later (``since``) at its default, at the top level and
    in each section: what a file or ``--set`` may name (the defaults themselves leave them out)."""
    return by_section_class(copy.deepcopy(settings), lambda d, cls: {
        **d, **{k: copy.deepcopy(v) for k, v in later_defaults(cls).items() if k not in d}})


def without_later_defaults(settings: dict) -> dict:
    """``settings`` with every setting added later (``since``) that holds its default left out, at the top level
    and in each section, so a run that uses none of them has the settings, and the keys, it had before they
    existed. Sections first: a section that is itself a later setting (``base``) is left out only once what it
    holds is its default as the defaults hold it."""
    inner = by_section_class(copy.deepcopy(settings), lambda d, cls: d if cls is RunSettings else
                             drop_later_defaults(d, cls))
    return drop_later_defaults(inner, RunSettings)


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
