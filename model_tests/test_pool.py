"""The pooled large-payload path (issue 13): what the ring does not admit, in reused slot files.

Behaviour through the `Connector`: many large messages in flight with no
per-key segment and no file created after the first round, the fallbacks
(no slot, ring full, pool disabled), ENOSPC at slot creation (through the
seam and on a real tiny tmpfs), corrupt slot headers and forged references
as typed errors, a killed consumer's claim and a killed producer's slot
files, the checksum option and the options' checks.
"""

from __future__ import annotations

import errno
import os
import signal
import struct
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

from shmring.fault_injection.kit.payloads import payload_tag, tagged_payload
from shmring.fault_injection.kit.processes import watchdog
from shmring.fault_injection.kit.seams import FaultyOs
from shmring.impl import admin
from shmring.impl.connector import Connector, FallbackDescriptor, PoolDescriptor
from shmring.impl.errors import ConfigurationError, CorruptFrameError, NoSpaceError
from shmring.impl.frame_io import compute_checksum
from shmring.impl.names import parse_pool_slot_file_name, pool_slot_file_name
from shmring.impl.ring.reader import RingReader
from shmring.spec.connector import Route
from shmring.spec.layout import (
    FRAME_CHECKSUM_OFFSET,
    FRAME_KEY_LENGTH_OFFSET,
    FRAME_KEY_OFFSET,
    POOL_CAPACITY_OFFSET,
    POOL_GENERATION_OFFSET,
    POOL_MAGIC_OFFSET,
    POOL_PAYLOAD_LENGTH_OFFSET,
    POOL_PRODUCER_PID_OFFSET,
    POOL_REF_FLAGS_OFFSET,
    POOL_REF_GENERATION_OFFSET,
    POOL_REF_INDEX_OFFSET,
    POOL_REF_LENGTH,
    POOL_REF_PAYLOAD_LENGTH_OFFSET,
    POOL_SLOT_HEADER_LENGTH,
    POOL_STATE_OFFSET,
    RING_HEADER_LENGTH,
    U32_FORMAT,
    U64_FORMAT,
    compute_slot_capacity,
)
from shmring.spec.pool import compute_slot_charge

EDGE = ("enc", "dec")
CAPACITY = 4096  # admits frames up to 1 KiB: everything larger is a pool candidate
SMALL = {"ring_capacity": CAPACITY, "pool_min_bytes": 4096, "pool_max_bytes": 16384}


def _slots(connector: Connector) -> list[str]:
    return sorted(
        name
        for name in os.listdir(connector.directory)
        if parse_pool_slot_file_name(name) is not None
    )


def _segments(connector: Connector) -> list[str]:
    return sorted(name for name in os.listdir(connector.directory) if name.startswith("fb"))


def _poke(path: str, offset: int, fmt: str, value: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        file.write(struct.pack(fmt, value))


# -- the steady path ---------------------------------------------------------------------


def test_a_burst_of_many_large_messages_goes_through_the_pool_with_no_file_after_the_first_round(
    scope: str,
) -> None:
    """Issue 13: today's speed depended on a spare budget of 16 files; 40 in flight need none."""
    seam = FaultyOs()
    in_flight = 40
    with (
        Connector(scope, **SMALL, os_facade=seam) as producer,
        Connector(scope) as receiver,
    ):
        created_after_first_round = []
        for round_number in range(4):
            opened_before = len(seam.opened)
            sent = {
                f"r{round_number}_{i}": tagged_payload(i, 3000 + 100 * (i % 5))
                for i in range(in_flight)
            }
            descriptors = [producer.put(EDGE, key, value) for key, value in sent.items()]
            assert all(isinstance(d, PoolDescriptor) for d in descriptors)
            assert {d.route for d in descriptors} == {Route.POOL}
            for descriptor in descriptors:
                got = receiver.get(EDGE, descriptor.key, descriptor=descriptor)
                assert got.route is Route.POOL
                assert got.value == sent[descriptor.key]
            created = [n for n in seam.opened[opened_before:] if not n.startswith("ring.")]
            if round_number:
                created_after_first_round += created
            else:
                assert len([n for n in created if n.startswith("pool.")]) == in_flight
            assert _segments(producer) == []  # no per-key segment, ever
        assert (
            created_after_first_round == []
        )  # no file opened (so none created) on the steady path
        health = producer.health()
        assert health.pool_puts == 4 * in_flight and health.fallbacks == 0
        assert health.pool_slots_created == in_flight
        assert health.pool_slots_reused == 3 * in_flight
        assert receiver.health().pool_gets == 4 * in_flight
        assert receiver.health().pool_mapping_hits == 3 * in_flight  # each slot mapped once
    assert not os.path.exists(producer.directory)


def test_tensors_come_back_equal_and_owned_from_a_pool_slot(scope: str) -> None:
    value = {"x": np.arange(300_000, dtype=np.float32), "tag": "big"}
    with Connector(scope) as producer, Connector(scope) as receiver:
        descriptor = producer.put(EDGE, "t", value)  # 1.2 MB: over the default ring's quarter
        assert descriptor.route is Route.POOL
        got = receiver.get(EDGE, "t")
        assert got.route is Route.POOL and got.value["tag"] == "big"
        np.testing.assert_array_equal(got.value["x"], value["x"])
        producer.put(EDGE, "t2", {"x": np.zeros(300_000, dtype=np.float32)})  # reuses the slot
        assert producer.health().pool_slots_reused == 1
        np.testing.assert_array_equal(got.value["x"], value["x"])  # an owned copy: unchanged


def test_payloads_the_ring_admits_stay_on_the_ring(scope: str) -> None:
    with Connector(scope, **SMALL) as producer, Connector(scope) as receiver:
        assert producer.put(EDGE, "small", tagged_payload(1, 500)).route is Route.RING
        assert payload_tag(receiver.get(EDGE, "small").value) == 1
        assert producer.health().pool_puts == 0 and _slots(producer) == []


# -- the fallbacks -------------------------------------------------------------------------


def test_an_exhausted_pool_falls_back_to_per_key_segments_and_recovers(scope: str) -> None:
    with (
        Connector(scope, **SMALL, pool_budget_bytes=2 * compute_slot_charge(4096)) as producer,
        Connector(scope) as receiver,
    ):
        routes = [producer.put(EDGE, f"k{i}", tagged_payload(i, 3000)).route for i in range(3)]
        assert routes == [Route.POOL, Route.POOL, Route.FALLBACK]  # two slots fit the budget
        assert producer.health().pool_fallbacks == 1 and len(_slots(producer)) == 2
        for i in range(3):
            assert payload_tag(receiver.get(EDGE, f"k{i}").value) == i
        assert producer.put(EDGE, "again", tagged_payload(7, 3000)).route is Route.POOL
        assert producer.health().pool_slots_reused == 1


def test_a_payload_larger_than_the_largest_class_takes_the_fallback(scope: str) -> None:
    """`pool_max_bytes` bounds the class: the pool takes up to that class's capacity (+ headroom)."""
    largest = compute_slot_capacity(16384)  # pool_max_bytes + the headroom
    with Connector(scope, **SMALL) as producer, Connector(scope) as receiver:
        huge = tagged_payload(1, largest + 1)
        assert isinstance(producer.put(EDGE, "huge", huge), FallbackDescriptor)
        assert payload_tag(receiver.get(EDGE, "huge").value) == 1
        assert producer.health().pool_fallbacks == 1 and _slots(producer) == []
        fits = tagged_payload(2, largest - 64)  # with the codec's few bytes: just fits
        assert producer.put(EDGE, "fits", fits).route is Route.POOL
        assert payload_tag(receiver.get(EDGE, "fits").value) == 2


def test_a_disabled_pool_keeps_the_fallback_route(scope: str) -> None:
    with Connector(scope, **SMALL, pool_budget_bytes=0) as producer:
        assert producer.put(EDGE, "k", tagged_payload(1, 3000)).route is Route.FALLBACK
        assert producer.health().pool_fallbacks == 0 and _slots(producer) == []


def test_a_re_put_retires_the_pooled_version_and_frees_its_slot(scope: str) -> None:
    with Connector(scope, **SMALL) as producer, Connector(scope) as receiver:
        first = producer.put(EDGE, "k", tagged_payload(1, 3000))
        producer.put(EDGE, "k", tagged_payload(2, 3000))  # retires the first carrier
        assert receiver.get(EDGE, "k", descriptor=first).status.value == "stale"
        assert payload_tag(receiver.get(EDGE, "k").value) == 2
        producer.put(EDGE, "k2", tagged_payload(3, 3000))  # the first slot is free again
        assert producer.health().pool_slots_created == 2
        assert producer.cleanup("k2") == 1  # cancel: its slot is reusable too
        producer.put(EDGE, "k3", tagged_payload(4, 3000))
        assert producer.health().pool_slots_created == 2


# -- ENOSPC at slot creation ---------------------------------------------------------------


@pytest.mark.parametrize("where", ["open", "fallocate", "ftruncate", "mmap"])
def test_a_slot_the_os_cannot_create_sends_the_put_to_the_fallback_and_leaves_no_file(
    scope: str, where: str
) -> None:
    seam = FaultyOs()
    with Connector(scope, **SMALL, os_facade=seam) as producer, Connector(scope) as receiver:
        producer.put(EDGE, "warm", tagged_payload(0, 100))  # ring and marker made
        if where == "open":
            seam.fail_open("pool.", errno.ENOSPC)
        else:
            seam.fail_next(where, errno.ENOMEM if where == "mmap" else errno.ENOSPC)
        descriptor = producer.put(EDGE, "k", tagged_payload(1, 3000))
        seam.disarm()
        assert descriptor.route is Route.FALLBACK
        health = producer.health()
        assert health.pool_create_failures == 1 and health.pool_fallbacks == 1
        assert _slots(producer) == []
        if where in ("open", "fallocate"):
            assert isinstance(producer._pool_route.producer.last_error, NoSpaceError)
        assert payload_tag(receiver.get(EDGE, "k").value) == 1
        assert producer.put(EDGE, "k2", tagged_payload(2, 3000)).route is Route.POOL  # room again


@pytest.mark.root
def test_real_enospc_on_a_tiny_tmpfs_is_typed_and_leaves_nothing(scope: str, tmp_path: Any) -> None:
    root = tmp_path / "tiny"
    root.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(root)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        with Connector(scope, **SMALL, shm_root=str(root), pool_budget_bytes=1 << 20) as producer:
            assert producer.put(EDGE, "warm", b"x").route is Route.RING
            put = 0
            with pytest.raises(NoSpaceError):
                for put in range(64):  # nobody reads: slots pile up until the tmpfs is full
                    producer.put(EDGE, f"k{put}", tagged_payload(put, 60000))
            health = producer.health()
            assert health.pool_create_failures == 1 and health.pool_puts == put
            assert not [n for n in os.listdir(producer.directory) if n.startswith("fbtmp.")]
            with Connector(scope, shm_root=str(root)) as receiver:
                assert payload_tag(receiver.get(EDGE, "k0").value) == 0
        assert not os.listdir(root)
    finally:
        subprocess.run(["umount", str(root)], check=True)


# -- corruption ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "message"),
    [
        (POOL_MAGIC_OFFSET, U64_FORMAT, 0x1234, "magic"),
        (POOL_CAPACITY_OFFSET, U64_FORMAT, 1 << 40, "beyond its file"),
        (POOL_PRODUCER_PID_OFFSET, U64_FORMAT, 1, "names producer"),
        (POOL_GENERATION_OFFSET, U64_FORMAT, 999, "generation=999"),
        (POOL_STATE_OFFSET, U32_FORMAT, 77, r"invalid \(77\)"),
        (POOL_PAYLOAD_LENGTH_OFFSET, U64_FORMAT, 1 << 50, "payload length"),
    ],
)
def test_a_corrupt_slot_header_is_a_typed_error_and_the_reader_keeps_working(
    scope: str, offset: int, fmt: str, value: int, message: str
) -> None:
    with Connector(scope, **SMALL) as producer, Connector(scope) as receiver:
        producer.put(EDGE, "big", tagged_payload(1, 3000))
        producer.put(EDGE, "small", tagged_payload(2, 100))
        (slot,) = _slots(producer)
        _poke(os.path.join(producer.directory, slot), offset, fmt, value)
        with pytest.raises(CorruptFrameError, match=message):
            receiver.get(EDGE, "big")
        assert payload_tag(receiver.get(EDGE, "small").value) == 2


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "message"),
    [
        (POOL_REF_INDEX_OFFSET, U32_FORMAT, 7, "missing slot file"),
        (POOL_REF_GENERATION_OFFSET, U64_FORMAT, 999, "reference names generation=999"),
        # the whole message (anchored): its text is one literal (test_error_messages.py)
        (
            POOL_REF_GENERATION_OFFSET,
            U64_FORMAT,
            0,
            r"^pool reference names generation 0 \(no publish has it\)$",
        ),
        (POOL_REF_PAYLOAD_LENGTH_OFFSET, U64_FORMAT, 1 << 40, "payload length"),
        (POOL_REF_FLAGS_OFFSET, U32_FORMAT, 0x80, "unknown flags"),
    ],
)
def test_a_forged_reference_is_a_typed_error_and_reads_nothing_else(
    scope: str, offset: int, fmt: str, value: int, message: str
) -> None:
    """A reference rewritten with a valid frame checksum: the pool's own checks refuse it."""
    with Connector(scope, **SMALL) as producer, Connector(scope) as receiver:
        producer.put(EDGE, "big", tagged_payload(1, 3000))  # the ring's first frame
        ring = producer.ring(EDGE)
        assert ring is not None
        with open(ring.path, "r+b") as file:
            data = bytearray(file.read())
            frame = RING_HEADER_LENGTH
            key_length = struct.unpack_from(U32_FORMAT, data, frame + FRAME_KEY_LENGTH_OFFSET)[0]
            start = frame + FRAME_KEY_OFFSET + key_length
            struct.pack_into(fmt, data, start + offset, value)
            ref = bytes(data[start : start + POOL_REF_LENGTH])
            checksum = compute_checksum(b"big", ref)
            struct.pack_into(U32_FORMAT, data, frame + FRAME_CHECKSUM_OFFSET, checksum)
            file.seek(0)
            file.write(data)
        with pytest.raises(CorruptFrameError, match=message):
            receiver.get(EDGE, "big")
        producer.put(EDGE, "small", tagged_payload(2, 100))
        assert payload_tag(receiver.get(EDGE, "small").value) == 2  # the reader keeps working


def test_a_checksummed_pool_payload_detects_a_flipped_byte(scope: str) -> None:
    with (
        Connector(scope, **SMALL, pool_checksum=True) as producer,
        Connector(scope) as receiver,
    ):
        producer.put(EDGE, "ok", tagged_payload(1, 3000))
        assert payload_tag(receiver.get(EDGE, "ok").value) == 1
        producer.put(EDGE, "bad", tagged_payload(2, 3000))
        (slot,) = _slots(producer)  # the first slot was reused
        path = os.path.join(producer.directory, slot)
        with open(path, "r+b") as file:
            file.seek(POOL_SLOT_HEADER_LENGTH + 100)
            byte = file.read(1)
            file.seek(POOL_SLOT_HEADER_LENGTH + 100)
            file.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(CorruptFrameError, match="checksum mismatch"):
            receiver.get(EDGE, "bad")


# -- crashes -------------------------------------------------------------------------------

_CLAIMER = textwrap.dedent(
    """
    import sys, time
    from shmring.impl.directory import PathDirectory
    from shmring.impl.os_seam import DEFAULT_OS
    from shmring.impl.pool import PoolReader
    directory, pid, start, instance, ref = sys.argv[1:]
    reader = PoolReader(PathDirectory(directory, DEFAULT_OS), DEFAULT_OS)
    claim = reader.claim((int(pid), int(start), int(instance)), bytes.fromhex(ref))
    print("claimed", claim.nbytes, flush=True)
    time.sleep(120)  # killed while holding the claim (a borrowed view)
    """
)


def test_a_killed_consumer_holding_a_claimed_slot_does_not_keep_it(scope: str) -> None:
    with watchdog(120), Connector(scope, **SMALL) as producer:
        producer.put(EDGE, "big", tagged_payload(1, 3000))
        ring = producer.ring(EDGE)
        assert ring is not None
        reader = RingReader.attach(ring.path)
        try:
            got = reader.get("big", decode=lambda view: view.tobytes())  # the carrier: DONE
        finally:
            reader.close()
        claimer = subprocess.Popen(
            [sys.executable, "-c", _CLAIMER, producer.directory, *map(str, producer.identity)]
            + [got.payload.hex()],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert claimer.stdout is not None
            assert claimer.stdout.readline().split()[0] == "claimed"
            # A live holder keeps its slot: the next put needs a new one.
            producer.put(EDGE, "second", tagged_payload(2, 3000))
            assert producer.health().pool_slots_created == 2
            producer.cleanup("second")
            os.kill(claimer.pid, signal.SIGKILL)
            claimer.wait(timeout=30)
        finally:
            if claimer.poll() is None:
                claimer.kill()
                claimer.wait(timeout=30)
            if claimer.stdout is not None:
                claimer.stdout.close()
        producer.put(EDGE, "third", tagged_payload(3, 3000))
        producer.put(EDGE, "fourth", tagged_payload(4, 3000))
        health = producer.health()
        assert health.pool_slots_created == 2 and health.pool_slots_reused == 2


_PRODUCER = textwrap.dedent(
    """
    import sys
    from shmring.impl.connector import Connector
    connector = Connector(sys.argv[1], ring_capacity=4096, pool_min_bytes=4096)
    for i in range(3):
        connector.put("enc", "dec", f"k{i}", b"y" * 3000)
    print("ready", flush=True)
    sys.stdin.read()  # wait to be killed
    """
)


def test_a_killed_producers_slot_files_are_reaped_by_gc_and_listed_by_stat(scope: str) -> None:
    with watchdog(120):
        process = subprocess.Popen(
            [sys.executable, "-c", _PRODUCER, scope],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()
        status = admin.deployment_status(scope)
        assert status.pool_slots == 3 and status.pool_slot_bytes >= 3 * 4096
        assert "pool slots=3" in admin.format_status(status)
        slots = [name for name in status.orphans if parse_pool_slot_file_name(name)]
        assert len(slots) == 3
        gone = admin.collect(scope)
        assert set(slots) <= set(gone)
        assert not admin.deployment_status(scope).exists


# -- names and options ---------------------------------------------------------------------


def test_slot_names_carry_the_producer_and_never_repeat(scope: str) -> None:
    with (
        Connector(scope, **SMALL, pool_budget_bytes=2 * compute_slot_charge(4096)) as producer,
        Connector(scope) as receiver,
    ):
        producer.put(EDGE, "a", tagged_payload(1, 3000))
        assert payload_tag(receiver.get(EDGE, "a").value) == 1  # its slot is reusable now
        # Over the 4 KiB class's capacity: evicts the 4 KiB slot for an 8 KiB one.
        producer.put(EDGE, "b", tagged_payload(2, compute_slot_capacity(4096) + 1000))
        assert producer.health().pool_slots_evicted == 1
        assert _slots(producer) == [pool_slot_file_name(producer.identity, 1)]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("pool_min_bytes", 5000, "power of two"),
        ("pool_min_bytes", 1024, "between"),
        ("pool_max_bytes", True, "power of two"),
        ("pool_max_bytes", 1 << 41, "between"),
        ("pool_budget_bytes", -1, "pool_budget_bytes=-1"),
        ("pool_budget_bytes", 1.5, "pool_budget_bytes=1.5"),
        ("pool_checksum", 1, "pool_checksum=1"),
    ],
)
def test_bad_pool_options_are_configuration_errors_naming_them(
    scope: str, option: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Connector(scope, **{option: value})  # type: ignore[arg-type]


def test_min_class_above_max_class_is_a_configuration_error(scope: str) -> None:
    with pytest.raises(ConfigurationError, match="must not exceed"):
        Connector(scope, pool_min_bytes=1 << 21, pool_max_bytes=1 << 20)


def test_a_slot_file_not_mode_0600_is_never_delivered(scope: str) -> None:
    with Connector(scope, **SMALL) as producer, Connector(scope) as receiver:
        producer.put(EDGE, "big", tagged_payload(1, 3000))
        (slot,) = _slots(producer)
        os.chmod(os.path.join(producer.directory, slot), 0o644)
        with pytest.raises(CorruptFrameError, match="not trusted"):
            receiver.get(EDGE, "big")
