"""Discovery work after a stamp move covers only what changed (issue 25).

A marker change anywhere in the scope moves the stamp, and the next get of
every receiver rescans the directory. The connector then keeps the kept
candidates of every edge whose producers the scan found the same, and
looks only at the mapped rings of edges whose producers changed: a
departed producer's ring is unmapped, a new one is found, and the rings of
unchanged edges are not touched.
"""

from __future__ import annotations

from shmring.impl.connector import Connector


def test_a_stamp_move_keeps_the_candidates_of_unchanged_edges(scope: str) -> None:
    with Connector(scope) as receiver, Connector(scope) as first:
        first.put("a", "sink", "k0", b"a")
        first.put("b", "sink", "k0", b"b")
        assert receiver.get("a", "sink", "k0").value == b"a"
        assert receiver.get("b", "sink", "k0").value == b"b"
        route = receiver._ring_route
        kept_a = route._edge_readers[("a", "sink")]
        kept_b = route._edge_readers[("b", "sink")]
        with Connector(scope) as newcomer:
            newcomer.put("b", "sink", "k1", b"new")  # a marker on edge b: the stamp moves
            first.put("a", "sink", "k1", b"a1")
            assert receiver.get("a", "sink", "k1").value == b"a1"  # rescans, then gets
            assert route._edge_readers[("a", "sink")] is kept_a  # unchanged edge: kept
            assert ("b", "sink") not in route._edge_readers  # changed edge: dropped
            assert receiver.get("b", "sink", "k1").value == b"new"  # the newcomer is found
            assert route._edge_readers[("b", "sink")] is not kept_b
            newcomer_ring = (("b", "sink"), newcomer._ring_route.channels[("b", "sink")].producer)
            assert newcomer_ring in route.readers
        # The newcomer closed (its marker went: the stamp moved): its ring is unmapped,
        # the unchanged edge keeps its candidates.
        first.put("a", "sink", "k2", b"a2")
        assert receiver.get("a", "sink", "k2").value == b"a2"
        assert newcomer_ring not in route.readers
        assert route._edge_readers[("a", "sink")] is kept_a
