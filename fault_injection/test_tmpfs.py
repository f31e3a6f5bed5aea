"""Real ENOSPC: a 256 KiB tmpfs over /dev/shm in a private mount namespace (root only)."""

from __future__ import annotations

import errno

import pytest

from shmring.fault_injection import tmpfs

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def seen() -> dict[str, object]:
    usable, why = tmpfs.available()
    if not usable:
        pytest.skip(why)
    return tmpfs.run_in_tiny_tmpfs()


def test_real_enospc_at_ring_setup_disables_the_ring_and_the_fallback_carries(
    seen: dict[str, object],
) -> None:
    assert seen["ring_setup_error"] == "NoSpaceError" and seen["ring_setup_errno"] == errno.ENOSPC
    assert seen["ring_setup_route"] == "fallback" and seen["ring_setup_delivered"] is True


def test_real_enospc_at_a_segment_is_a_typed_refusal_with_nothing_half_written(
    seen: dict[str, object],
) -> None:
    assert seen["segment_error"] == "NoSpaceError" and seen["segment_errno"] == errno.ENOSPC
    assert seen["segment_left_files"] == []
    assert seen["segment_kept_delivered"] is True


def test_real_enospc_in_the_arena_disables_it_and_segments_carry(seen: dict[str, object]) -> None:
    assert isinstance(seen["arena_disabled"], str) and "No space left" in seen["arena_disabled"]
    assert seen["arena_fields_in_segments"] == 1 and seen["arena_transfer_delivered"] is True
    assert seen["arena_big_error"] == "NoSpaceError" and seen["arena_big_errno"] == errno.ENOSPC
    assert seen["arena_big_left_files"] == []
    assert seen["registrations_left"] == 0


def test_real_enospc_at_a_pool_slot_falls_back_with_no_slot_half_made(
    seen: dict[str, object],
) -> None:
    routes = seen["pool_routes"]
    assert isinstance(routes, list) and routes.count("pool") >= 2, seen
    assert seen["pool_create_failures"] >= 1, seen  # type: ignore[operator]
    assert "fallback" in routes or seen["pool_refused"], seen
    assert seen["pool_files_are_slots"] is True
    assert seen["pool_delivered"] is True


def test_nothing_is_left_on_the_tiny_tmpfs(seen: dict[str, object]) -> None:
    assert seen["dev_shm_after"] == []
