"""``meshd``: run the agent."""

from __future__ import annotations

import sys

from meshd import logs
from meshd.agent import main as run_agent
from meshd.settings import SettingsError, load


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load(argv)
    except SettingsError as exc:
        print(f"meshd: {exc}", file=sys.stderr)
        return 2
    logs.setup(settings.node, settings.log_level)
    try:
        return run_agent(settings)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
