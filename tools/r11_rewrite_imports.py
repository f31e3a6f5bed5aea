"""Rewrite imports of names issue 11 moved out of naming / discovery / fallback / registration.

    python tools/r11_rewrite_imports.py FILE...   # rewrites in place, prints what changed

For the merge of issue 11's branches: every ``from shmring.impl.<old> import
...`` statement is split into imports from the names' new homes
(`shmring.impl.names`, `shmring.impl.directory`, `shmring.impl.liveness`,
`shmring.spec.layout`), and a renamed name is renamed where the file uses it
bare. Module attribute uses (``naming.X``) are not touched: fix those by
hand. Run ``ruff check --fix --select I`` and ``ruff format`` afterwards.
Delete this file once the branches are merged.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

NAMES = "shmring.impl.names"
DIRECTORY = "shmring.impl.directory"
LIVENESS = "shmring.impl.liveness"
LAYOUT = "shmring.spec.layout"

_DIRECTORY_NAMES = (
    "DeploymentDirectory",
    "Directory",
    "PathDirectory",
    "as_directory",
    "check_private_directory",
    "check_private_directory_info",
    "check_private_file",
    "ensure_deployment_directory",
    "open_deployment_directory",
    "remove_deployment_directory_if_empty",
)
_LIVENESS_NAMES = ("Liveness", "is_holder_alive", "read_process_status")
_DISCOVERY_NAMES_MOVED = (
    "Edge",
    "LIVE_FILE_PREFIX",
    "MARKER_FILE_PREFIX",
    "MEMBERS_FILE_NAME",
    "STAMP_FILE_NAME",
    "file_owner",
    "live_file_name",
    "marker_file_name",
    "parse_live_file_name",
    "parse_marker_file_name",
)
_STAMP_LAYOUT = ("DOORBELL_OFFSET", "STAMP_FILE_LENGTH", "STAMP_OFFSET")

# (old module, old name) -> (new module, new name); a module alone maps every other name.
MOVES: dict[tuple[str, str], tuple[str, str]] = {
    **{("naming", n): (DIRECTORY, n) for n in _DIRECTORY_NAMES},
    ("naming", "SEGMENT_FILE_PREFIX"): (NAMES, "REGISTERED_SEGMENT_FILE_PREFIX"),
    ("naming", "parse_transfer_file_owner"): (NAMES, "file_owner"),
    **{("discovery", n): (LIVENESS, n) for n in _LIVENESS_NAMES},
    **{("discovery", n): (NAMES, n) for n in _DISCOVERY_NAMES_MOVED},
    **{("discovery", n): (LAYOUT, n) for n in _STAMP_LAYOUT},
    ("fallback", "Edge"): (NAMES, "Edge"),
    ("fallback", "KEY_DIGEST_SIZE"): (NAMES, "KEY_DIGEST_SIZE"),
    ("fallback", "SEGMENT_FILE_PREFIX"): (NAMES, "FALLBACK_SEGMENT_FILE_PREFIX"),
    ("fallback", "TEMP_FILE_PREFIX"): (NAMES, "FALLBACK_TEMP_FILE_PREFIX"),
    ("fallback", "SPARE_FILE_PREFIX"): (NAMES, "FALLBACK_SPARE_FILE_PREFIX"),
    ("fallback", "segment_file_name"): (NAMES, "fallback_segment_file_name"),
    ("fallback", "segment_path"): (NAMES, "fallback_segment_path"),
    ("fallback", "is_segment_file_name"): (NAMES, "is_fallback_segment_file_name"),
    ("fallback", "temp_file_name"): (NAMES, "fallback_temp_file_name"),
    ("fallback", "parse_temp_file_name"): (NAMES, "parse_fallback_temp_file_name"),
    ("fallback", "spare_file_name"): (NAMES, "fallback_spare_file_name"),
    ("fallback", "parse_spare_file_name"): (NAMES, "parse_fallback_spare_file_name"),
    ("registration", "segment_file_name"): (NAMES, "registered_segment_file_name"),
    ("registration", "arena_file_name"): (NAMES, "arena_file_name"),
    ("registration", "validate_transfer_file_name"): (NAMES, "validate_transfer_file_name"),
    ("registration", "SEGMENT_FILE_PREFIX"): (NAMES, "REGISTERED_SEGMENT_FILE_PREFIX"),
    ("registration", "ARENA_FILE_PREFIX"): (NAMES, "ARENA_FILE_PREFIX"),
}
_DEFAULT_HOME = {"naming": NAMES}  # naming's other names all live in names.py

_IMPORT = re.compile(
    r"^(?P<indent>[ \t]*)from shmring\.impl\.(?P<module>naming|discovery|fallback|registration)"
    r" import (?:\((?P<group>[^)]*)\)|(?P<line>[^\n(]+))\n",
    re.MULTILINE,
)


def _statement(indent: str, module: str, names: list[str]) -> str:
    one = f"{indent}from {module} import {', '.join(names)}\n"
    if len(one) <= 100:
        return one
    body = "".join(f"{indent}    {name},\n" for name in names)
    return f"{indent}from {module} import (\n{body}{indent})\n"


def rewrite(text: str) -> tuple[str, list[str]]:
    """`text` with its imports rewritten, and the renames it did."""
    renames: dict[str, str] = {}

    def replace(match: re.Match[str]) -> str:
        indent, old = match["indent"], match["module"]
        spec = match["group"] if match["group"] is not None else match["line"]
        spec = re.sub(r"#[^\n]*", "", spec)
        by_module: dict[str, list[str]] = {}
        moved = False
        for part in (p.strip() for p in spec.replace("\n", ",").split(",")):
            if not part:
                continue
            name, _, alias = part.partition(" as ")
            name = name.strip()
            home, new = MOVES.get(
                (old, name), (_DEFAULT_HOME.get(old, f"shmring.impl.{old}"), name)
            )
            if new != name and not alias:
                renames[name] = new
            moved = moved or (home, new) != (f"shmring.impl.{old}", name)
            entry = f"{new} as {alias.strip()}" if alias else new
            by_module.setdefault(home, []).append(entry)
        if not moved:
            return match.group(0)
        return "".join(
            _statement(indent, module, sorted(set(names), key=str.lower))
            for module, names in sorted(by_module.items())
        )

    text = _IMPORT.sub(replace, text)
    for name, new in renames.items():
        text = re.sub(rf"(?<![.\w]){re.escape(name)}\b", new, text)
    return text, [f"{name} -> {new}" for name, new in renames.items()]


def main(paths: list[str]) -> int:
    for path in map(Path, paths):
        before = path.read_text()
        after, renames = rewrite(before)
        if after != before:
            path.write_text(after)
            print(f"{path}: rewritten" + (f" ({', '.join(renames)})" if renames else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
