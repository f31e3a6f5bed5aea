"""Fuzz of the pool's validators: forged references and corrupt slot headers are typed errors.

`refs.decode_ref` on any bytes, and `PoolReader.claim` of a valid reference
after random header bytes or the file's size were corrupted, answer a
claim whose view lies inside the slot file or raise CorruptFrameError:
never another exception, never a read outside the mapping.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmring.impl.directory import PathDirectory
from shmring.impl.errors import CorruptFrameError
from shmring.impl.names import current_producer_identity
from shmring.impl.os_seam import DEFAULT_OS
from shmring.impl.pool import PoolProducer, PoolReader, decode_ref, encode_ref, is_pool_ref
from shmring.spec.layout import (
    POOL_HEADER_FIELDS_END,
    POOL_REF_LENGTH,
    POOL_SLOT_HEADER_LENGTH,
    compute_slot_capacity,
    compute_slot_file_length,
)

CLASS = 4096
FUZZ = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@given(st.binary(min_size=0, max_size=2 * POOL_REF_LENGTH))
@FUZZ
def test_decode_ref_answers_bounded_fields_or_a_typed_error(data: bytes) -> None:
    try:
        ref = decode_ref(data)
    except CorruptFrameError:
        return
    assert len(data) == POOL_REF_LENGTH and is_pool_ref(data)
    assert ref.generation > 0 and 0 <= ref.index < 1 << 32
    assert (
        encode_ref(ref.index, ref.generation, ref.payload_length, ref.checksum, ref.flags) == data
    )


@pytest.fixture
def slot_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="shmring-poolfuzz-", dir="/dev/shm")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@given(
    edits=st.lists(
        st.tuples(st.integers(0, POOL_HEADER_FIELDS_END - 1), st.integers(0, 255)),
        min_size=1,
        max_size=6,
    ),
    size=st.one_of(
        st.none(), st.integers(0, compute_slot_file_length(compute_slot_capacity(CLASS)) + 64)
    ),
    checksum=st.booleans(),
)
@FUZZ
def test_a_corrupt_slot_is_claimed_inside_its_file_or_refused_with_a_typed_error(
    slot_dir: str, edits: list[tuple[int, int]], size: int | None, checksum: bool
) -> None:
    directory = PathDirectory(slot_dir, DEFAULT_OS)
    identity = (*current_producer_identity(), 0)
    producer = PoolProducer(
        directory,
        identity,
        DEFAULT_OS,
        min_class=CLASS,
        max_class=CLASS,
        budget=1 << 20,
        checksum=checksum,
    )
    reader = PoolReader(directory, DEFAULT_OS)
    try:
        slot = producer.acquire(3000)
        assert slot is not None
        with slot.payload_view(3000) as view:
            view[:] = b"p" * 3000
        ref = producer.publish(slot, 3000)
        path = os.path.join(slot_dir, slot.name)
        with open(path, "r+b") as file:
            for offset, value in edits:
                file.seek(offset)
                file.write(bytes((value,)))
        if size is not None:
            os.truncate(path, size)
        try:
            claim = reader.claim(identity, ref)
        except CorruptFrameError:
            return
        assert POOL_SLOT_HEADER_LENGTH + claim.nbytes <= os.stat(path).st_size
        assert claim.view.tobytes() == b"p" * 3000 or not checksum
        claim.view.release()
        claim.release()
    finally:
        reader.close()
        producer.close()
