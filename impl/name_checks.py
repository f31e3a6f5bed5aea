"""Validation of the names a user gives: a deployment's scope and its stage names.

Every file name of a deployment (`shmring.impl.names`) is built only from
parts checked here: a scope or stage name can never smuggle in a path
separator, ``..``, a NUL byte, or a dot that would make a name ambiguous
(stage names may not contain ``.``, so every name parses back
unambiguously). This module sits below `names` and imports only the error
vocabulary, so anything may check a name without importing the file-name
table.
"""

from __future__ import annotations

import re
from typing import Final

from .errors import ConfigurationError, InvalidKeyError

MAX_SCOPE_LENGTH: Final = 64
MAX_STAGE_NAME_LENGTH: Final = 64

# A scope is the last part of the directory name, so "-" is harmless there.
_SCOPE_PATTERN: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# Stage names sit between dots in a file name: no dot allowed.
_STAGE: Final = r"[A-Za-z0-9_-]+"
_STAGE_PATTERN: Final = re.compile(_STAGE)


def validate_scope(scope: object) -> str:
    """Answer `scope` if it can name a deployment directory; ConfigurationError otherwise."""
    if not isinstance(scope, str):
        raise ConfigurationError(f"scope must be a str: scope={scope!r}")
    if not scope or len(scope) > MAX_SCOPE_LENGTH:
        raise ConfigurationError(f"scope must be 1..{MAX_SCOPE_LENGTH} characters: scope={scope!r}")
    if ".." in scope or _SCOPE_PATTERN.fullmatch(scope) is None:
        raise ConfigurationError(
            "scope may hold only ASCII letters, digits, '_', '-' and single '.', "
            f"and may not start with '.' or '-': scope={scope!r}"
        )
    return scope


def validate_stage_name(name: object) -> str:
    """Answer `name` if it can name a stage in a ring file name; InvalidKeyError otherwise."""
    if not isinstance(name, str):
        raise InvalidKeyError(f"stage name must be a str: name={name!r}")
    if not name or len(name) > MAX_STAGE_NAME_LENGTH:
        raise InvalidKeyError(
            f"stage name must be 1..{MAX_STAGE_NAME_LENGTH} characters: name={name!r}"
        )
    if _STAGE_PATTERN.fullmatch(name) is None:
        raise InvalidKeyError(
            f"stage name may hold only ASCII letters, digits, '_' and '-': name={name!r}"
        )
    return name


def _validate_edge(edge: tuple[str, str]) -> tuple[str, str]:
    """Answer `edge` (an `Edge` of `names`) if both its stage names are valid."""
    source, destination = edge
    validate_stage_name(source)
    validate_stage_name(destination)
    return edge


__all__ = ["MAX_SCOPE_LENGTH", "MAX_STAGE_NAME_LENGTH", "validate_scope", "validate_stage_name"]
