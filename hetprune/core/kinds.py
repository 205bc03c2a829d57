"""The component kinds: one record per kind (`ComponentKind`) with everything hetprune knows of it: the hook
that registers its components, the Protocol they meet, the rules every call into one is checked against
(`hetprune.core.contract`) and the conformance kit's check.

Core keeps the table and reads nothing else about a kind; the layer that defines a kind hands its record in
(`hetprune.core.plugins.register_kind`). The built-in kinds are declared in `hetprune.harness.kinds`, which
``import hetprune`` loads, so core names no module above it and adding a kind is one record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Iterator, Protocol

from .errors import HetpruneError

Rules = Mapping[str, Callable]   # method name -> rule (see `hetprune.core.contract`)


@dataclass(frozen=True, eq=False)
class ComponentKind:
    """One kind of component (``"scorer"``): what registers it, what it has, how its calls are checked."""

    name: str                       # what ``registry.build(kind, name)``, settings and reports say
    hook: Callable                  # the hookspec plugins implement to register components (``register_scorers``)
    protocol: type                  # the `typing.Protocol` every component of the kind meets
    # method -> rule; or a function returning them, called when the first component is built (rules that need
    # torch: ``import hetprune`` stays cheap)
    rules: Rules | Callable[[], Rules]
    check: Callable[..., None] | None = None   # the conformance kit's check, ``check(cls, **options)``
    optional: tuple[type, ...] = ()  # protocols a component may meet besides (a predictor's ``fit_report``)
    instead: tuple[type, ...] = ()   # protocols a component may meet in place of ``protocol`` (a scorer that selects)

    @property
    def hook_name(self) -> str:
        return self.hook.__name__

    @cached_property
    def loaded_rules(self) -> Rules:
        """The rules, loaded the first time they are asked for."""
        return dict(self.rules() if callable(self.rules) else self.rules)

    def gaps(self, obj: Any) -> list[str]:
        """What ``obj`` lacks of the kind's protocol (empty: nothing, or it meets one it may be `instead`)."""
        if any(not lacks(obj, other) for other in self.instead):
            return []
        return lacks(obj, self.protocol)


# every kind registered, by name, in the order registered (write it with `hetprune.core.plugins.register_kind`)
RECORDS: dict[str, ComponentKind] = {}


def get(name: str) -> ComponentKind:
    """The record of kind ``name``; an unknown kind is an error listing the kinds."""
    try:
        return RECORDS[name]
    except KeyError:
        raise HetpruneError(f"unknown component kind {name!r}; kinds are: {', '.join(RECORDS)}") from None


class ByKind(Mapping):
    """One field of every registered kind's record, by kind name: a read-only view, always current, so the
    tables read from the records (``KINDS``, ``PROTOCOLS``, ``CHECKS``, ...) hold a kind registered later too.
    ``when`` leaves out the kinds it is false for (``CHECKS``: those without a check)."""

    def __init__(self, read: Callable[[ComponentKind], Any], when: Callable[[ComponentKind], Any] | None = None):
        self._read, self._when = read, when or (lambda record: True)

    def __getitem__(self, name: str) -> Any:
        record = RECORDS[name]
        if not self._when(record):
            raise KeyError(name)
        return self._read(record)

    def __iter__(self) -> Iterator[str]:
        return iter([name for name, record in RECORDS.items() if self._when(record)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return repr(dict(self))


# -- reading a Protocol: what a component has of it ------------------------------------------------------------

def members(protocol: type) -> dict[str, bool]:
    """A protocol's members, in the order it declares them: name -> whether it is a method (else an
    attribute)."""
    out: dict[str, bool] = {}
    for cls in reversed(protocol.__mro__):
        if cls in (object, Protocol) or not getattr(cls, "_is_protocol", False):
            continue
        for name in getattr(cls, "__annotations__", {}):
            out.setdefault(name, False)
        for name, value in vars(cls).items():
            if not name.startswith("_") and (callable(value) or isinstance(value, property)):
                out[name] = callable(value)
    return out


def lacks(obj: Any, protocol: type) -> list[str]:
    """What ``obj`` lacks of ``protocol``, as ``"score() method"`` or ``"'unit'"`` (empty: nothing)."""
    gaps = []
    for name, method in members(protocol).items():
        value = getattr(obj, name, None)
        if method and not callable(value):
            gaps.append(f"{name}() method")
        elif not method and not hasattr(obj, name):
            gaps.append(repr(name))
    return gaps


def home(protocol: type) -> str:
    """Where a plugin author imports ``protocol`` from: ``hetprune.plugin_api`` for hetprune's own kinds (it
    exports their Protocols), the defining module for a kind added from outside."""
    if protocol.__module__.split(".")[0] == "hetprune":
        return f"hetprune.plugin_api.{protocol.__name__}"
    return f"{protocol.__module__}.{protocol.__qualname__}"


def describe(protocol: type) -> str:
    """``name, score()``: a protocol's members as a sentence lists them."""
    return ", ".join(f"{n}()" if method else n for n, method in members(protocol).items())
