"""A run's settings as one typed object: [`Settings`][hetprune.core.settings.Settings], what a job carries.

The loader (`hetprune.core.loader.resolve`: defaults, a YAML file, ``--set``) is the one place settings are dicts;
it checks them whole and returns this object. Below it, code reads the parsed
parts (``settings.run``: the core's `RunSettings`; ``settings.section(HetDPTOptions)``: a strategy's own), each
parsed once per object, not again on every read; a change is a new object (`replace`, `replace_in`),
checked as the loader checks. A key hashes the object as the dict it was made from (`as_settings`), so no
stored result's key depends on whether the settings were carried as a dict or as this object.
"""

from __future__ import annotations

import copy
from typing import TypeVar

from . import config
from .config import ReadsLikeItsDict, RunSettings, Section
from .errors import HetpruneError

S = TypeVar("S", bound=Section)


class Settings(ReadsLikeItsDict):
    """A run's checked settings: the core part typed (`run`), every section typed on first use (`section`).

    Immutable: `replace` and `replace_in` give a changed copy (what a strategy hands a sub-job, with
    ``dataclasses.replace(job, settings=...)``). Reading it like the dict it once was (``job.settings["seed"]``)
    works with a `DeprecationWarning` until hetprune 1.0."""

    __slots__ = ("_values", "_parsed")

    def __init__(self, values: "dict | Settings"):
        if isinstance(values, Settings):   # a copy of another: its checked values
            values = values._values
        if not isinstance(values, dict):
            raise HetpruneError(f"settings must be a mapping of setting names to values, got {type(values).__name__}")
        self._values = copy.deepcopy(values)
        self._parsed: dict[type, Section] = {}
        self.run   # checked now: a bad core setting is an error when the object is made, not when first read

    @classmethod
    def of(cls, settings: "Settings | dict") -> "Settings":
        """``settings`` as this object (itself if it is one already)."""
        return settings if isinstance(settings, Settings) else cls(settings)

    @property
    def run(self) -> RunSettings:
        """The settings every strategy shares (the top level), typed."""
        return self.section(RunSettings)

    def section(self, cls: type[S]) -> S:
        """Section class ``cls`` of these settings, typed and checked, parsed once per object."""
        if cls not in self._parsed:
            self._parsed[cls] = cls.of(self._values)
        return self._parsed[cls]

    def replace(self, **changes) -> "Settings":
        """A copy with top-level entries replaced (a section as a whole: ``finetune=schedule.as_settings()``),
        checked as the loader checks (`hetprune.core.config.changed`)."""
        return Settings(config.changed(self._values, **changes))

    def replace_in(self, section: str, **changes) -> "Settings":
        """A copy whose section ``section`` has fields replaced (``replace_in("finetune", lr=1e-4)``), checked
        as the loader checks: a schedule as a `TrainConfig`, a strategy's section by the class that declares it."""
        if section in config.TRAIN_SECTIONS:
            return Settings(config.changed_schedules(self._values, [section], **changes))
        if not isinstance(self._values.get(section), dict):
            held = ", ".join(k for k, v in self._values.items() if isinstance(v, dict))
            raise HetpruneError(f"these settings have no section {section!r}; sections: {held}")
        out = Settings({**self._values, section: {**self._values[section], **copy.deepcopy(changes)}})
        for cls in Section.declared.get(section, []):
            out.section(cls)
        return out

    def per_gpu_resolved(self, world: int) -> "Settings":
        """These settings with every schedule's ``batch_per_gpu`` made its global batch for ``world`` ranks
        (`hetprune.core.config.per_gpu_resolved`); itself where no schedule has one."""
        resolved = config.per_gpu_resolved(self._values, world)
        return self if resolved is self._values else Settings(resolved)

    def sized(self, train_size: int | None) -> "Settings":
        """These settings with the schedules that give ``image_passes`` sized by the training set
        (`hetprune.core.config.sized`); itself where none gives them."""
        resolved = config.sized(self._values, train_size)
        return self if resolved is self._values else Settings(resolved)

    def with_sections(self, defaults: dict) -> "Settings":
        """A copy that also holds each section of ``defaults`` these settings lack (a sub-strategy's own
        section at its defaults); the sections already here are kept as they are."""
        missing = {k: v for k, v in defaults.items() if k not in self._values}
        return self if not missing else Settings({**self._values, **copy.deepcopy(missing)})

    def as_settings(self) -> dict:
        """The settings as the loader made them (a copy): for reports, records and keys (`hetprune.core.keys`
        hashes this object as this dict)."""
        return copy.deepcopy(self._values)

    def __eq__(self, other) -> bool:
        if isinstance(other, Settings):
            return self._values == other._values
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"Settings({self._values!r})"

    # -- read like a dict, until 1.0 (ReadsLikeItsDict: [key], get, keys; and these) ----------------------------
    def _read_instead(self, what: str) -> str:
        return ("a job's settings are a typed Settings object now: read job.config (the core settings) or "
                "job.options(YourSection), or settings.as_settings() for the dict (reading it like a dict works "
                "until hetprune 1.0)")

    def __contains__(self, key) -> bool:
        return key in self._dict_read(repr(key))

    def __iter__(self):
        return iter(self._dict_read("each entry"))
