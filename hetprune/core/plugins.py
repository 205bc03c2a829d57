"""Plugin loading and the registry of named components.

Plugins come from three places, and from nowhere else:

* entry points in group ``hetprune`` (built-ins are declared this way too),
  optionally restricted by the environment variable ``HETPRUNE_PLUGINS``
  (a comma-separated allow-list of entry-point names);
* ``--plugin pkg.module`` on the command line (`load_module`);
* objects registered in code with [`register_plugin`][hetprune.core.plugins.register_plugin] (tests, notebooks).

The kinds of component come from their records (`hetprune.core.kinds`), handed in with `register_kind` by the
layer that defines them (`hetprune.harness.kinds` for the built-in ones): this module names none.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from . import hookspecs, kinds
from .contract import Checked, Origin, code_home, plugin_fault, rules_for
from .errors import HetpruneError, PluginError
from .kinds import ComponentKind, describe

# kind -> the hook that registers its components ("scorer" -> "register_scorers"), read from the records
KINDS = kinds.ByKind(lambda record: record.hook_name)


@dataclass
class Component:
    kind: str
    name: str
    factory: Any
    plugin: str

    @property
    def description(self) -> str:
        text = getattr(self.factory, "description", None) or (self.factory.__doc__ or "")
        return text.strip().splitlines()[0] if text.strip() else ""

    def build(self, **options):
        """Build the component; options it does not take are an error naming the ones it does."""
        import inspect

        try:
            params = inspect.signature(self.factory).parameters
        except (TypeError, ValueError):
            params = None
        if params is not None and options and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            unknown = sorted(set(options) - set(params))
            if unknown:
                allowed = ", ".join(sorted(params)) or "none"
                raise HetpruneError(f"{self.kind} {self.name!r} takes no option(s) {', '.join(unknown)}; "
                                    f"its options: {allowed}")
        return self.factory(**options)


class Gaps(list):
    """What a component lacks of its kind's protocol, and a sentence naming what the kind has."""

    needs = ""


def protocol_gaps(kind: str, obj: Any) -> Gaps:
    """What ``obj`` lacks of the `typing.Protocol` of ``kind`` (its record's, e.g. ``Scorer``), empty when it
    has every member or meets what it may be instead (a scorer that only selects)."""
    record = kinds.get(kind)
    gaps = Gaps(record.gaps(obj))
    if gaps:
        gaps.needs = (f"a {kind.replace('_', ' ')} has {describe(record.protocol)} "
                      f"({kinds.home(record.protocol)})")
    return gaps


def register_kind(kind: ComponentKind) -> None:
    """Add a kind of component: plugins register components of it through its hook, the registry builds and
    checks them (its protocol, its rules) and the conformance kit runs its check. Registering the same
    record again does nothing; another record under a taken name or hook is an error."""
    for known in kinds.RECORDS.values():
        if known is kind:
            return
        if kind.name == known.name or kind.hook_name == known.hook_name:
            raise HetpruneError(f"component kind {kind.name!r} (hook {kind.hook_name}) clashes with the kind "
                                f"{known.name!r} (hook {known.hook_name}) already registered")
    if getattr(kind.hook, f"{hookspecs.PROJECT}_spec", None) is None:
        raise HetpruneError(f"the hook of component kind {kind.name!r}, {kind.hook_name}, is not a hookspec; "
                            "decorate it with hetprune.hookspec")
    kinds.RECORDS[kind.name] = kind
    reset()


def unregister_kind(name: str) -> None:
    """Take a kind away again (tests)."""
    kinds.RECORDS.pop(name, None)
    reset()


@dataclass
class PluginInfo:
    name: str
    version: str
    source: str
    components: dict[str, list[str]] = field(default_factory=dict)


class Registry:
    """Every component every loaded plugin registered, keyed by kind and name."""

    def __init__(self, pm: pluggy.PluginManager, versions: dict[str, tuple[str, str]],
                 dists: dict[str, str] | None = None):
        self.pm = pm
        self._versions = versions
        self._dists = dists or {}
        self._by_kind: dict[str, dict[str, Component]] = {k: {} for k in KINDS}
        self._adapters: list | None = None
        self._collect()

    def _collect(self) -> None:
        for kind, hook_name in KINDS.items():
            hook = getattr(self.pm.hook, hook_name)
            for impl in hook.get_hookimpls():
                plugin_name = self.pm.get_name(impl.plugin) or repr(impl.plugin)

                def register(component, _kind=kind, _plugin=plugin_name):
                    self._add(_kind, component, _plugin)

                impl.function(register=register)

    def _add(self, kind: str, factory: Any, plugin: str) -> None:
        name = getattr(factory, "name", None)
        if not isinstance(name, str) or not name:
            raise HetpruneError(
                f"plugin {plugin!r} registered a {kind} without a string 'name' attribute: {factory!r}"
            )
        known = self._by_kind[kind].get(name)
        if known is not None and (known.plugin != plugin or known.factory is not factory):
            by = (f"by plugin {known.plugin!r} and by plugin {plugin!r}" if known.plugin != plugin
                  else f"twice by plugin {plugin!r} ({known.factory!r} and {factory!r})")
            raise HetpruneError(
                f"{kind} name {name!r} is registered twice: {by}; "
                "uninstall one or restrict with HETPRUNE_PLUGINS"
            )
        self._by_kind[kind][name] = Component(kind, name, factory, plugin)

    def adapters(self) -> list:
        """One instance of every registered architecture adapter, in registration order, each checked against
        the plugin contract like every other component (`build`)."""
        if self._adapters is None:
            self._adapters = [self.build("architecture", name) for name in self._by_kind["architecture"]]
        return self._adapters

    def names(self, kind: str) -> list[str]:
        return sorted(self._by_kind[kind])

    def component(self, kind: str, name: str) -> Component:
        if kind not in self._by_kind:
            raise HetpruneError(f"unknown component kind {kind!r}; kinds are: {', '.join(KINDS)}")
        try:
            return self._by_kind[kind][name]
        except KeyError:
            known = ", ".join(self.names(kind)) or "(none)"
            kinds = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
            raise HetpruneError(f"no {kind} named {name!r} is registered; registered {kinds}: {known}") from None

    def build(self, kind: str, name: str, **options):
        """Build a component by name, wrapped so that every call is checked against the plugin contract
        (`hetprune.core.contract`); its faults are errors naming the plugin."""
        comp = self.component(kind, name)
        rules_for(kind)   # the kind's rules, loaded now: a component never runs unchecked
        origin = lambda: self.origin(comp.plugin, comp.factory)  # noqa: E731 - only needed for a message
        try:
            obj = comp.build(**options)
        except HetpruneError:
            raise
        except Exception as exc:
            o = origin()
            if not plugin_fault(exc, o, [str(Path(__file__).resolve().parent.parent), *builtin_homes()], skip=0):
                raise  # hetprune's own bug: keep the traceback
            raise PluginError(f"{o.describe()}: {kind} {name!r} could not be built with options {options}: "
                              f"{type(exc).__name__}: {exc}", plugin=o.plugin, kind=kind, component=name,
                              stage="build") from exc
        gaps = protocol_gaps(kind, obj)
        if gaps:   # refused when built, before any work: not at the first call of what it lacks, hours in
            o = origin()
            raise PluginError(f"{o.describe()}: {kind} {name!r} lacks {', '.join(gaps)}; {gaps.needs}",
                              plugin=o.plugin, kind=kind, component=name, stage="build")
        return Checked(obj, kind, name, origin, ours=builtin_homes)

    def origin(self, plugin: str, factory: Any = None) -> Origin:
        """Who a plugin is (distribution, version, how it was loaded) and where its code lives."""
        version, source = self._versions.get(plugin, ("", "registered in code"))
        dist = self._dists.get(plugin, "")
        obj = self.pm.get_plugin(plugin)
        module = obj.__name__ if isinstance(obj, types.ModuleType) else type(obj).__module__
        if not dist and source == "--plugin":
            dist, version = _distribution_of(module) or ("", version)
        homes = code_home(module) + code_home(getattr(factory, "__module__", None))
        return Origin(plugin, version, dist, source, builtin=_is_builtin(dist), homes=tuple(homes))

    def plugins(self) -> list[PluginInfo]:
        infos: dict[str, PluginInfo] = {}
        for plugin_name, plugin in self.pm.list_name_plugin():
            if plugin is hookspecs or plugin_name == "hetprune.core.hookspecs":
                continue
            version, source = self._versions.get(plugin_name, ("", "code"))
            infos[plugin_name] = PluginInfo(plugin_name, version, source)
        for kind, comps in self._by_kind.items():
            for comp in comps.values():
                info = infos.setdefault(comp.plugin, PluginInfo(comp.plugin, "", "code"))
                info.components.setdefault(kind, []).append(comp.name)
        for info in infos.values():
            for names in info.components.values():
                names.sort()
        return sorted(infos.values(), key=lambda i: i.name)

    @property
    def hook(self):
        """Call event hooks: ``registry.hook.on_stage_start(stage=..., info=...)``."""
        return self.pm.hook


_extra_modules: list[str] = []
_extra_objects: list[tuple[str, Any]] = []
_registry: Registry | None = None


def _allow_list() -> set[str] | None:
    raw = os.environ.get("HETPRUNE_PLUGINS")
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _register(pm: pluggy.PluginManager, plugin: Any, name: str, where: str) -> bool:
    """Register one plugin; False when that very object is already registered."""
    if pm.is_registered(plugin):
        return False
    if pm.get_plugin(name) is not None:
        raise HetpruneError(f"two different plugins are named {name!r} ({where} and "
                            f"{pm.get_plugin(name)!r}); rename one")
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise HetpruneError(f"plugin {name!r} ({where}) does not fit the hetprune plugin contract: {exc}") from exc
    return True


def _is_builtin(distribution: str) -> bool:
    """Plugins shipped inside hetprune's own distribution: their bugs are hetprune's."""
    return distribution.lower().replace("_", "-") == hookspecs.PROJECT


def _distribution_of(module: str) -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed package a module belongs to, if any."""
    names = md.packages_distributions().get(module.split(".")[0]) or []
    return (names[0], md.version(names[0])) if names else None


def builtin_homes() -> list[str]:
    """Where the built-in plugins' code lives (entry points of hetprune's own distribution)."""
    homes = []
    for ep in md.entry_points(group=hookspecs.PROJECT):
        dist = getattr(ep, "dist", None)
        if dist is not None and _is_builtin(dist.metadata["Name"] or ""):
            homes += code_home(ep.module)
    return homes


def _new_manager() -> tuple[pluggy.PluginManager, dict[str, tuple[str, str]], dict[str, str]]:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    here = set(_hook_names())
    declared_elsewhere = {k.hook_name: k.hook for k in kinds.RECORDS.values() if k.hook_name not in here}
    if declared_elsewhere:   # a kind added outside hetprune brings its own hookspec in its record
        pm.add_hookspecs(types.SimpleNamespace(**declared_elsewhere))
    versions: dict[str, tuple[str, str]] = {}
    dists: dict[str, str] = {}
    allow = _allow_list()
    seen: dict[str, str] = {}
    for ep in md.entry_points(group=hookspecs.PROJECT):
        if ep.name in seen:
            # the same distribution found twice on sys.path is harmless; two different ones are not
            if seen[ep.name] != ep.value:
                raise HetpruneError(
                    f"two installed packages declare the hetprune plugin {ep.name!r}: {seen[ep.name]} and "
                    f"{ep.value}; uninstall one"
                )
            continue
        seen[ep.name] = ep.value
        if allow is not None and ep.name not in allow:
            continue
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken outside plugin must not hide the others' names
            raise HetpruneError(f"plugin entry point {ep.name!r} ({ep.value}) failed to load: {exc}") from exc
        if not _register(pm, plugin, ep.name, f"entry point {ep.value}"):
            continue
        dist = getattr(ep, "dist", None)
        versions[ep.name] = (dist.version if dist else "", f"entry point {ep.value}")
        if dist is not None:
            dists[ep.name] = dist.metadata["Name"] or ""
    if allow is not None:
        missing = allow - set(seen)
        if missing:
            raise HetpruneError(
                f"HETPRUNE_PLUGINS names {', '.join(sorted(missing))}, which no installed package provides; "
                f"installed entry points: {', '.join(sorted(seen)) or '(none)'}"
            )
    for module_name in _extra_modules:
        module = importlib.import_module(module_name)
        # a module already loaded from its entry point keeps that registration
        if _register(pm, module, module_name, "--plugin"):
            versions[module_name] = (str(getattr(module, "__version__", "")), "--plugin")
    for name, obj in _extra_objects:
        _register(pm, obj, name, "registered in code")
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise HetpruneError(
            f"plugin {pm.get_name(exc.plugin)!r} implements a hook hetprune does not define: {exc}; "
            f"the hooks are: {', '.join(sorted({*_hook_names(), *KINDS.values()}))}"
        ) from exc
    return pm, versions, dists


def _hook_names() -> list[str]:
    return [n for n in dir(hookspecs) if getattr(getattr(hookspecs, n), "hetprune_spec", None) is not None]


def load_module(module_name: str) -> None:
    """Load one more plugin module by import path (the ``--plugin`` flag)."""
    try:
        importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or an error in the module's own code
        raise HetpruneError(f"--plugin {module_name!r} cannot be imported: {type(exc).__name__}: {exc}") from exc
    if module_name not in _extra_modules:
        _extra_modules.append(module_name)
    reset()


def extra_modules() -> list[str]:
    """Modules loaded with ``--plugin`` in this process (handed on to worker processes)."""
    return list(_extra_modules)


def register_plugin(obj: Any, name: str | None = None) -> str:
    """Register a plugin object in code (tests, notebooks). Returns its name."""
    name = name or getattr(obj, "__name__", None) or f"plugin-{id(obj)}"
    for known_name, known in _extra_objects:
        if known_name == name:
            if known is obj:
                return name
            raise HetpruneError(f"a different plugin object is already registered as {name!r}; "
                                "unregister it first or pick another name")
    _extra_objects.append((name, obj))
    reset()
    return name


def unregister_plugin(name: str) -> None:
    _extra_objects[:] = [(n, o) for n, o in _extra_objects if n != name]
    reset()


def reset() -> None:
    """Forget the loaded registry; the next [`get_registry`][hetprune.core.plugins.get_registry] reloads."""
    global _registry
    _registry = None


def get_registry() -> Registry:
    global _registry
    if _registry is None:
        pm, versions, dists = _new_manager()
        _registry = Registry(pm, versions, dists)
    return _registry
