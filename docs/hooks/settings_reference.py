"""MkDocs hook: write the settings reference from hetprune's typed settings sections.

The page docs/reference/settings.md holds the reference between two markers, committed, so the page reads whole
in the repository too; ``python docs/hooks/settings_reference.py`` rewrites it there, a test fails when it is
stale, and the site build writes it afresh. It is one table per section:
the core's (``RunSettings``, each fine-tune schedule's ``TrainConfig``, ``ScoringConfig``), every registered
strategy's own sections, and the options of every registered component that declares them (``Options``).
Each row is a field: its key, type, default and help, and how it enters the keys of stored results (``keyed``,
``since``), read from the dataclass, so the reference cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path

MARKER = "<!-- settings-reference -->"
END = "<!-- end settings-reference -->"
PAGE = Path(__file__).resolve().parents[1] / "reference" / "settings.md"
ROOT = Path(__file__).resolve().parents[2]


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _type(hint) -> str:
    args = typing.get_args(hint)
    if args:
        return " or ".join(_type(a) for a in args)
    return {type(None): "null"}.get(hint, getattr(hint, "__name__", str(hint)))


def _default(f) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return ""
    return f"`{'null' if value is None else value}`"


def what_it_does(f) -> str:
    """A field's help, and how it enters the keys of stored results where that is not plainly (its metadata,
    `hetprune.core.keys`)."""
    text = f.metadata.get("help", "")
    if f.metadata.get("keyed") is False:
        text += f" *Not in any result's key:* {f.metadata['why']}."
    if f.metadata.get("since"):
        text += f" *Since {f.metadata['since']}:* absent at its default, so older keys hold."
    return _cell(text)


def table(cls, prefix: str, skip=()) -> list[str]:
    hints = typing.get_type_hints(cls)
    lines = ["| setting | type | default | what it does |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        lines.append(f"| `{key}` | {_cell(_type(hints.get(f.name)))} | {_cell(_default(f))} | {what_it_does(f)} |")
    return lines


def schedules_table(config) -> list[str]:
    """The schedules side by side (the pruning run's two and the bases'), with the defaults a run has (not
    TrainConfig's bare ones)."""
    hints = typing.get_type_hints(config.TrainConfig)
    run = config.RunSettings()
    lines = ["| setting | type | " + " | ".join(f"`{s}` default" for s in config.TRAIN_SECTIONS) + " | what it does |",
             "|---|---|" + "---|" * len(config.TRAIN_SECTIONS) + "---|"]
    for f in dataclasses.fields(config.TrainConfig):
        if f.name in config.RUN_KEYS:
            continue
        shown = [getattr(getattr(run, section), f.name) for section in config.TRAIN_SECTIONS]
        lines.append(f"| `{f.name}` | {_cell(_type(hints.get(f.name)))} | "
                     + " | ".join(f"`{'null' if v is None else v}`" for v in shown)
                     + f" | {what_it_does(f)} |")
    return lines


def sections() -> list[tuple[str, str, type, str, tuple]]:
    """Every typed section: (heading, key prefix, class, where it comes from, fields to skip)."""
    if str(ROOT) not in sys.path:
        sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]
    from hetprune.core import config
    from hetprune import get_registry

    out = [("The run (top level)", "", config.RunSettings, "the core", (*config.TRAIN_SECTIONS, "scoring")),
           ("Schedules: `finetune`, `short_finetune` and the bases' `base_scratch` and `base_finetune`", "finetune",
            config.TrainConfig, "the core", config.RUN_KEYS),
           ("Scoring batches: `scoring`", "scoring", config.ScoringConfig, "the core", ())]
    registry = get_registry()
    seen = set()
    for name in registry.names("strategy"):
        factory = registry.component("strategy", name).factory
        for section, cls in (getattr(factory, "sections", None) or {}).items():
            if cls not in seen:
                seen.add(cls)
                out.append((f"`{section}`", section, cls, f"strategy {name}", ()))
    for kind in ("scorer", "predictor", "cost_model", "width_pruner"):
        for name in registry.names(kind):
            cls = getattr(registry.component(kind, name).factory, "Options", None)
            if cls is not None and cls not in seen:
                seen.add(cls)
                out.append((f"{kind.replace('_', ' ')} `{name}`", cls.section, cls, f"{kind} {name}", ()))
    return out


def render() -> str:
    lines = []
    for heading, prefix, cls, origin, skip in sections():
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        lines += [f"## {heading}", "", f"{' '.join(doc.split())} ({origin}: `{cls.__module__}.{cls.__qualname__}`)", ""]
        if prefix == "finetune":
            from hetprune.core import config

            lines += schedules_table(config) + [""]
        else:
            lines += table(cls, prefix, skip) + [""]
    return "\n".join(lines)


def filled(markdown: str) -> str:
    """``markdown`` with the reference between `MARKER` and `END` written afresh."""
    if MARKER not in markdown:
        return markdown
    head, rest = markdown.split(MARKER, 1)
    tail = rest.split(END, 1)[1] if END in rest else "\n"
    return f"{head}{MARKER}\n\n{render()}\n{END}{tail}"


def on_page_markdown(markdown, page, config, files):
    return filled(markdown)


if __name__ == "__main__":   # rewrite the committed page from the code
    PAGE.write_text(filled(PAGE.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {PAGE}")
