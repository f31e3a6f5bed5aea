"""shmring.check: the `shmring check` runner, apart from the transport and the model.

- `sections`: the campaign's sections and the units each splits into;
- `schedule`: runs units on workers or as one shard of a fleet, and merges reports;
- `explore`: the bounded exhaustive explorer of the model (`shmring.spec`).

The checking toolkit (Hypothesis, CrossHair, rich, and pytest for the suite
that ships beside it) is the `check` extra, not a dependency of the transport:
`require_toolkit` says, before a check starts, which part of it is missing and
how to install it. This module imports none of it.
"""

from __future__ import annotations

import importlib.util

INSTALL = "pip install 'shmring[check]'"

# import name -> distribution, for the `check` extra of pyproject.toml.
TOOLKIT = {
    "hypothesis": "hypothesis",
    "pytest": "pytest",
    "crosshair": "crosshair-tool",
    "rich": "rich",
}


class ToolkitMissingError(ImportError):
    """A check-only command was run where the `check` extra is not installed."""

    def __init__(self, command: str, missing: list[str]) -> None:
        self.command = command
        self.missing = missing
        super().__init__(
            f"{command} needs the checking toolkit, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {INSTALL}"
        )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a half-imported module
        return False


def require_toolkit(command: str, modules: tuple[str, ...] = tuple(TOOLKIT)) -> None:
    """Raise `ToolkitMissingError` (naming the missing distributions) unless `modules` import."""
    missing = [TOOLKIT[module] for module in modules if not _installed(module)]
    if missing:
        raise ToolkitMissingError(command, missing)
