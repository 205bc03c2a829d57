"""The one markdown table renderer of the study scripts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence]) -> list[str]:
    """A markdown table's lines: ``| a | b |`` for the header, ``|---|---|``, then one line per row, each cell
    as its text (format numbers before: the table does not)."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)]
