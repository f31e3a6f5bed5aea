"""The fallback writer's kept files (spares): which file is kept, taken back, let go.

A segment file of at least `spare_min` bytes stays mapped after its
publication, within the writer's spare budget (`_may_keep`). The reader that
claims it hands it back by renaming it to its spare name; a later put of the
same size takes it back by renaming it to its temporary (`_take_spare`: one
process wins) and writes into it again without a fresh page. A file another
process put at the spare name is never written into. The package docstring
has the whole story; `FallbackWriter` (writer.py) is the one class using this.
"""

from __future__ import annotations

import contextlib
import mmap

from ..directory import Directory
from ..os_seam import OsFacade
from .segment import MAX_SPARES


class Spare:
    """A segment file the producer keeps mapped for reuse once a reader hands it back."""

    __slots__ = ("fd", "file_length", "generation", "inode", "mapping", "path", "segment_path")

    def __init__(
        self, fd: int, mapping: mmap.mmap, file_length: int, inode: tuple[int, int]
    ) -> None:
        self.fd = fd
        self.mapping = mapping
        self.file_length = file_length
        self.inode = inode
        self.generation = 0  # of the segment it carries now
        self.path = ""  # its spare name for that generation
        self.segment_path = ""  # the segment name it was published under


class SpareStock:
    """The spare-keeping steps of `FallbackWriter` (which owns the state named here)."""

    _dir: Directory
    _os: OsFacade
    _spares: dict[int, Spare]  # generation -> file kept for reuse
    _spare_bytes: int  # == sum of their file lengths
    _reused: int
    _leftovers: set[str]  # temporaries whose unlink failed; retried at close
    spare_min: int
    spare_budget: int

    def _may_keep(self, file_length: int) -> bool:
        """Whether a new file of `file_length` bytes is kept for reuse (within the spare budget)."""
        return (
            file_length >= self.spare_min
            and len(self._spares) < MAX_SPARES
            and self._spare_bytes + file_length <= self.spare_budget
        )

    def _take_spare(self, file_length: int, temp: str) -> Spare | None:
        """A kept file of `file_length` bytes that a reader handed back, now linked at `temp`.

        A reader hands a claimed segment back by renaming it to its spare
        name; renaming it from there to `temp` takes it back (one process
        wins). Not handed back yet: skipped. Claimed and unlinked instead (a
        reader that could not rename): forgotten.
        """
        for generation, spare in list(self._spares.items()):
            if spare.file_length != file_length:
                continue
            try:
                self._take_back(spare, temp)
            except FileNotFoundError:
                continue  # still published, or claimed and unlinked (then forgotten)
            except OSError:
                continue  # try again at a later put
            del self._spares[generation]
            self._spare_bytes -= spare.file_length
            try:
                here = self._dir.stat(temp)
                ours = (here.st_dev, here.st_ino) == spare.inode
            except OSError:
                ours = False
            if not ours:  # something else was at the spare name: never write into it
                self._discard(spare)
                self._remove_temp(temp)
                continue
            self._reused += 1
            return spare
        return None

    def _take_back(self, spare: Spare, temp: str) -> None:
        """Rename the spare's handed-back file to `temp`; FileNotFoundError when it is not there.

        A reader's commit is one rename or one unlink, so once the segment
        name is gone the spare name either exists already or never will: one
        more try after seeing the segment gone settles it, and a file
        claimed and unlinked is forgotten.
        """
        try:
            self._dir.rename(spare.path, temp)
            return
        except FileNotFoundError:
            if self._still_out(spare):
                raise
        try:
            self._dir.rename(spare.path, temp)
        except FileNotFoundError:
            self._forget_spare(spare.generation)
            raise

    def _still_out(self, spare: Spare) -> bool:
        """Whether the spare's file is still published under its segment name (not yet claimed)."""
        try:
            info = self._dir.stat(spare.segment_path)
        except FileNotFoundError:
            return False
        except OSError:
            return True  # cannot tell: keep it rather than orphan a handed-back file
        return (info.st_dev, info.st_ino) == spare.inode

    def _forget_spare(self, generation: int) -> None:
        """Stop keeping the file of `generation` (its segment is gone for good)."""
        spare = self._spares.pop(generation, None)
        if spare is not None:
            self._spare_bytes -= spare.file_length
            self._discard(spare)

    def _discard_quietly(self, spare: Spare) -> None:
        """`_discard` while an exception propagates: a mapping a dying frame still exports is
        left to be unmapped when that frame goes (never a BufferError over the real error)."""
        with contextlib.suppress(BufferError, ValueError):
            spare.mapping.close()
        self._discard(spare) if spare.mapping.closed else self._close_fd(spare)

    def _close_fd(self, spare: Spare) -> None:
        fd, spare.fd = spare.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                self._os.close(fd)

    def _discard(self, spare: Spare) -> None:
        """Unmap and close a file we stop keeping (its names are the caller's business)."""
        mapping, fd = spare.mapping, spare.fd
        spare.fd = -1
        if not mapping.closed:
            mapping.close()
        if fd >= 0:
            with contextlib.suppress(OSError):
                self._os.close(fd)

    def _remove_temp(self, temp: str) -> None:
        """Remove a temporary (or a handed-back spare); one whose unlink fails is kept for close."""
        try:
            self._dir.unlink(temp)
        except FileNotFoundError:
            pass
        except OSError:
            self._leftovers.add(temp)
            return
        self._leftovers.discard(temp)
