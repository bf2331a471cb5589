"""The one table every benchmark prints: a Markdown table, so it pastes into notes as is."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *map(line, rows)])


def print_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    print(format_table(head, rows))
