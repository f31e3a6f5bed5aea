"""Another uid racing for a victim's deployment directory (issue 12, part 1; root only)."""

from __future__ import annotations

import uuid

import pytest

from shmring.fault_injection import capture

pytestmark = pytest.mark.root

PROBE_SECONDS = 8.0


@pytest.fixture(scope="module")
def probe() -> dict[str, object]:
    usable, why = capture.available()
    if not usable:
        pytest.skip(why)
    return capture.run_probe(f"cap{uuid.uuid4().hex[:8]}", PROBE_SECONDS)


def test_capture_race_no_join_lands_in_a_directory_another_uid_made(probe: dict) -> None:
    assert probe["joins"] > 0, probe  # the victims did work
    assert probe["pool_puts"] == probe["joins"], probe  # a pool slot in every join
    assert probe["attacker_won"] > 0, probe  # and the attacker did own the path at times
    assert probe["foreign_joins"] == 0, probe


def test_capture_race_the_attacker_never_sees_a_victim_file(probe: dict) -> None:
    assert probe["attacker_saw"] == [], probe


def test_capture_race_victims_get_only_typed_errors(probe: dict) -> None:
    assert probe["bare"] == {}, probe


def test_capture_race_every_key_put_in_a_join_comes_back_unchanged(probe: dict) -> None:
    assert probe["wrong"] == {}, probe
    assert "CorruptFrameError" not in probe["typed"], probe  # our own frames, never garbled
