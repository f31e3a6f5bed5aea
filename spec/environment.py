"""What a neighbour can do to our files, and what the transport answers (issue 22).

The environment is part of the model (docs/threat-model.md): a process of our
own uid may unlink or truncate any file of a deployment. These are the
actions and the promised outcome of each; the docs' threat table lists every
action by its name here (a test checks it), and the implementation's
answers are tested with real second processes (model_tests/test_hostile_files.py).

The one window that stays open, and why: a file is checked (fstat / a stat
of its name) immediately before its mapping is touched, and a truncation
landing between that check and the access still raises SIGBUS. Closing it
needs either a SIGBUS handler that can resume a faulting load (CPython
cannot: its handler runs after the faulting instruction, which re-faults)
or a sealed file (F_SEAL_SHRINK, which Linux offers only for memfd files,
never for a file opened by name on /dev/shm). A borrowed view is the same
window held open for as long as the view lives.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final


class NeighbourAction(enum.Enum):
    """An action of a same-uid process on one of our files."""

    TRUNCATE_RING = "truncate a ring file"
    TRUNCATE_POOL_SLOT = "truncate a pool slot file"
    UNLINK_RING = "unlink a live ring file"
    RECREATE_DIRECTORY = (
        "remove the scope directory while a sender lives, another uid re-creates it 0777"
    )
    CLOSE_UNDER_IDLE_READER = "close a producer while an idle reader maps its pool slots"
    REPLACE_TRANSFER_FILE = "replace a published transfer segment or arena file"


@dataclass(frozen=True)
class Outcome:
    """What the transport promises after an action."""

    reader: str  # what a reader of the file sees
    producer: str  # what the file's producer does
    lost: str  # what, if anything, is lost (only what the neighbour destroyed)


# Verify: every action has exactly one promised outcome.
OUTCOMES: Final[dict[NeighbourAction, Outcome]] = {
    NeighbourAction.TRUNCATE_RING: Outcome(
        reader="CorruptFrameError for that ring (mapping dropped, never touched again); "
        "a ring shorter than its header is refused at attach; other edges are served",
        producer="notices at its next put (one fstat), re-creates and re-announces the ring",
        lost="the unclaimed frames whose bytes the truncation destroyed (health: ring_frames_lost)",
    ),
    NeighbourAction.TRUNCATE_POOL_SLOT: Outcome(
        reader="CorruptFrameError for that key (slot unmapped); other keys are served",
        producer="removes the slot at its next acquire (one stat of the name) and makes another",
        lost="the payload in that slot",
    ),
    NeighbourAction.UNLINK_RING: Outcome(
        reader="readers still mapping the old file see it CLOSED and re-attach by path",
        producer="notices at its next put (st_nlink == 0), moves the unclaimed frames to a "
        "re-created, re-announced ring (health: rings_replaced)",
        lost="nothing: a frame is moved, or was claimed from the old mapping, exactly once",
    ),
    NeighbourAction.RECREATE_DIRECTORY: Outcome(
        reader="never reads a file from a directory the sender did not verify",
        producer="the sender's next send is a ConfigurationError; it re-creates a private "
        "directory once the stranger's is gone",
        lost="the refused send (typed)",
    ),
    NeighbourAction.CLOSE_UNDER_IDLE_READER: Outcome(
        reader="its cached mapping pins no pages (the slot was emptied); cached mappings are "
        "bounded in bytes",
        producer="empties every FREE or DONE slot (ftruncate 0) before unlinking it",
        lost="nothing",
    ),
    NeighbourAction.REPLACE_TRANSFER_FILE: Outcome(
        reader="CorruptFrameError: the file is not the one the descriptor names (owner uid, "
        "st_dev/st_ino); none of its bytes is delivered",
        producer="unchanged",
        lost="that transfer (typed)",
    ),
}


def is_survivable(action: NeighbourAction) -> bool:
    """Every action is answered without a crash, outside the window in the module docstring."""
    return action in OUTCOMES
