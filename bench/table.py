"""What every benchmark shares: the one table it prints (Markdown, so it pastes into notes as
is) and the machine description it records next to its results."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def format_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *map(line, rows)])


def print_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    print(format_table(head, rows))


def machine_info() -> dict[str, Any]:
    """Python, OS and CPU of this run, for the JSON results."""
    model = ""
    try:
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                model = text.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"python": platform.python_version(), "implementation":
            platform.python_implementation(), "machine": platform.machine(),
            "system": platform.platform(), "cpu_count": os.cpu_count(), "cpu_model": model}
