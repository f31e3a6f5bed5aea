"""Discovery: how receivers find the producers of an edge (`shmring.spec.discovery`).

Design rationale. The model keeps a set of markers and a stamp that strictly
increases with every change of the set; a receiver rescans only when the
stamp moved, and records the stamp it read *before* scanning. This package
is that, over files in the deployment directory, one concept per module:

* `stamp`: the stamp (one mapped u64, bumped under a flock) and the
  deployment's doorbell (a futex word in the same file);
* `membership`: the shared lock every open connector holds on ``members``,
  the last member's teardown, and a producer's markers (`Registrar`);
* `cache`: a receiver's view of the markers, rescanned only when the stamp
  moved (`DiscoveryCache`);
* `gc`: what dead producers left (`reclaim_dead_files`, `collect_orphans`)
  and the removal of a directory nobody uses.

File names are `shmring.impl.names`', liveness is `shmring.impl.liveness`'.
The dependencies point one way: cache -> gc, stamp; membership -> gc, stamp;
gc -> `fallback.claim.remove_if_orphaned` (a dead producer's segment goes
only under the segment's lock rule); nothing in the fallback, in liveness
or in names imports discovery.
"""

from ...spec.layout import DOORBELL_OFFSET, STAMP_FILE_LENGTH, STAMP_OFFSET
from ..liveness import Liveness
from ..names import (
    LIVE_FILE_PREFIX,
    MARKER_FILE_PREFIX,
    MEMBERS_FILE_NAME,
    STAMP_FILE_NAME,
    Edge,
    file_owner,
    live_file_name,
    marker_file_name,
    parse_live_file_name,
    parse_marker_file_name,
)
from .cache import DiscoveryCache
from .gc import (
    collect_orphans,
    reclaim_dead_files,
    remove_dead_files,
    remove_unused_directory,
    teardown_if_empty,
)
from .membership import Membership, Registrar
from .stamp import Stamp

__all__ = [
    "DOORBELL_OFFSET",
    "LIVE_FILE_PREFIX",
    "MARKER_FILE_PREFIX",
    "MEMBERS_FILE_NAME",
    "STAMP_FILE_LENGTH",
    "STAMP_FILE_NAME",
    "STAMP_OFFSET",
    "DiscoveryCache",
    "Edge",
    "Liveness",
    "Membership",
    "Registrar",
    "Stamp",
    "collect_orphans",
    "file_owner",
    "live_file_name",
    "marker_file_name",
    "parse_live_file_name",
    "parse_marker_file_name",
    "reclaim_dead_files",
    "remove_dead_files",
    "remove_unused_directory",
    "teardown_if_empty",
]
