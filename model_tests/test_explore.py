"""The exhaustive bounded exploration of the model, with golden counts.

The counts are golden on purpose: a change to the model's behaviour changes
how many states are reachable, and a reviewer must look at that change and
update the numbers here knowingly.
"""

from __future__ import annotations

import pytest

from shmring.check import explore
from shmring.check.explore import ExplorationError, System
from shmring.spec import ring as ring_spec

# (system name, states, transitions, depth) for explore.ci_systems()
GOLDEN = {
    "ring": (30440, 571856, 15),
    # 21382 / 248278 before issue 12: a segment is now charged its file's pages
    # (compute_fallback_charge), so segments of 1024- and 1040-byte frames
    # charge the same 4 KiB and states that differed only in fallback_bytes
    # merge (the budget went from 2000 to 5000 to keep "one fits, two do not").
    "connector": (20404, 234586, 13),
    # 8736 / 48682 before issue 12: the state now also says which producers
    # still have files in the directory (`DirectoryState.files`), and a killed
    # producer keeps them until the next scan reclaims them, so "killed, not
    # yet reclaimed" and "killed, reclaimed" are distinct states.
    "deployment": (10861, 59274, 13),
    "registration": (11140, 52993, 13),
}

EVENTS = {
    "ring": {
        "wrap",
        "exact fit",
        "full",
        "not admitted",
        "stale descriptor",
        "cancel after wrap",
        "lease released out of order",
    },
    "connector": {
        "fallback",
        "back-pressure",
        "re-put across routes",
        "ring setup failed",
        "stale descriptor",
    },
    "deployment": {
        "pid reused",
        "producer killed",
        "ring setup failed",
        "rescan",
        "no rescan",
        "descriptor not served",
        "stale marker pruned",
        "dead producer's files reclaimed",
    },
    "registration": {
        "registry poisoned",
        "mapping retained",
        "refused while poisoned",
        "transfer published",
        "transfer failed",
    },
}


@pytest.fixture(scope="module")
def reports() -> dict[str, explore.ExplorationReport]:
    found = {}
    for system, depth in explore.ci_systems():
        report = explore.explore(system, max_depth=depth)
        found[report.system] = report
    return found


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_ci_bound_explores_the_golden_number_of_states(
    reports: dict[str, explore.ExplorationReport], name: str
) -> None:
    report = reports[name]
    assert report.complete
    assert (report.states, report.transitions, report.depth) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_every_interesting_step_is_reached(
    reports: dict[str, explore.ExplorationReport], name: str
) -> None:
    reached = {event for event, count in reports[name].events.items() if count > 0}
    assert EVENTS[name] <= reached, f"never reached: {sorted(EVENTS[name] - reached)}"


def test_exploration_reports_the_path_to_a_broken_invariant() -> None:
    """A model whose put forgets to retire the old version is caught, with the path."""
    base = explore.ring_system(frame_lengths=(1024,))

    def broken_actions(ring: ring_spec.RingState) -> list[explore.Action[ring_spec.RingState]]:
        def double_put(r: ring_spec.RingState) -> None:
            ring_spec.process_put(r, "j_1", 900, "x")
            # Publish a second deliverable frame for the same key behind the model's back
            frame = r.frames[-1]
            r.frames.append(
                ring_spec.Frame(
                    r.head, frame.length, frame.frame_type, frame.state, "j_1", 900, "y"
                )
            )
            r.head += frame.length

        return [("double put", double_put)]

    broken: System[ring_spec.RingState] = System(
        name="broken ring",
        bound="one action",
        initial=base.initial,
        actions=broken_actions,
        clone=base.clone,
        canonical=base.canonical,
        check=base.check,
        normalize=base.normalize,
    )
    with pytest.raises(ExplorationError, match="more than one deliverable version.*double put"):
        explore.explore(broken, max_depth=3)


def test_depth_bound_stops_the_search() -> None:
    shallow = explore.explore(explore.ring_system(frame_lengths=(768, 1024, 1040)), max_depth=2)
    assert shallow.depth == 2
    assert shallow.states < GOLDEN["ring"][0]
