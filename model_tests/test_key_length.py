"""Issue 22: a key longer than `spec.layout.MAX_KEY_LENGTH` UTF-8 bytes is an InvalidKeyError.

The docs said an overlong key is an error, but any length was accepted (a
long key went to a per-key segment). The limit is the ring frame's key
length field's, so a key that passes is one a ring frame can carry.
"""

from __future__ import annotations

import pytest

from shmring.impl.connector import Connector, GetStatus
from shmring.impl.errors import InvalidKeyError
from shmring.spec.layout import MAX_KEY_LENGTH

EDGE = ("a", "b")

LONGEST_ASCII = "k" * MAX_KEY_LENGTH
LONGEST_UTF8 = "é" * (MAX_KEY_LENGTH // 2)  # two bytes each
OVERLONG = ["k" * (MAX_KEY_LENGTH + 1), "é" * (MAX_KEY_LENGTH // 2) + "kk"]


@pytest.mark.parametrize("key", OVERLONG, ids=["ascii", "utf8"])
def test_an_overlong_key_is_an_invalid_key_error_on_put_get_and_cleanup(
    scope: str, key: str
) -> None:
    assert len(key.encode("utf-8")) == MAX_KEY_LENGTH + 1 or len(key) == MAX_KEY_LENGTH + 1
    with Connector(scope, ring_capacity=4096) as connector:
        with pytest.raises(InvalidKeyError, match="too long"):
            connector.put(EDGE, key, {"v": 1})
        with pytest.raises(InvalidKeyError, match="too long"):
            connector.get(EDGE, key)
        with pytest.raises(InvalidKeyError, match="too long"):
            connector.get_with_deadline(EDGE, key, timeout=0.01)
        with pytest.raises(InvalidKeyError, match="too long"):
            connector.cleanup(key)
        with pytest.raises(InvalidKeyError, match="too long"):
            connector.cleanup_prefix(key)
        assert connector.health().puts == 0


@pytest.mark.parametrize("key", [LONGEST_ASCII, LONGEST_UTF8], ids=["ascii", "utf8"])
def test_the_longest_key_travels(scope: str, key: str) -> None:
    assert len(key.encode("utf-8")) <= MAX_KEY_LENGTH
    with Connector(scope, ring_capacity=1 << 20) as producer, Connector(scope) as reader:
        producer.put(EDGE, key, {"v": 1})
        got = reader.get(EDGE, key)
        assert got.status is GetStatus.DELIVERED and got.value == {"v": 1}
        assert producer.cleanup(key) == 0
