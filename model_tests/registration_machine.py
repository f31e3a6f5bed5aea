"""Lockstep machines for `spec.registration`: the driver, and the registry over it.

Not a test file: `test_registration_lockstep.py` runs these machines with the
simulated driver, `test_cuda_real.py` runs the same machines with the real
one (where faults can only be made for real: a range unregistered out of
band). Each rule `note()`s what it does, applies it to the model and to the
implementation, and compares the outcomes (CUDA error names, errno names,
exception types); invariants compare the whole state after every step.

Settings come from the Hypothesis profile named by SHMRING_HYPOTHESIS_PROFILE
("ci", the default: derandomized and small; "long" for campaigns).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import uuid
from collections.abc import Callable

import torch
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ..fault_injection.kit.machines import register_profiles
from ..fault_injection.kit.seams import FaultyOs
from ..impl.errors import ClosedError, RegistrationError, RegistryPoisonedError
from ..impl.liveness import is_liveness_file_name
from ..impl.names import MEMBERS_FILE_NAME, STAMP_FILE_NAME, current_producer_identity
from ..impl.os_seam import SITE_FALLOCATE, SITE_FTRUNCATE, SITE_MMAP, SITE_OPEN
from ..impl.registered.cuda_driver import CudaDriver, SimulatedCudaDriver
from ..impl.registered.registration import RegisteredSegment, Registry
from ..impl.registered.views import copy_segment
from ..spec import invariants
from ..spec import registration as spec
from ..spec.registration import StepStatus, TransferStatus

# -- Hypothesis profiles -------------------------------------------------------------

register_profiles(
    "ci",
    "long",
    ci={"max_examples": 25, "stateful_step_count": 25, "print_blob": True},
    long={"max_examples": 1000, "stateful_step_count": 60},
    health_checks=(HealthCheck.too_slow, HealthCheck.filter_too_much),
)


def profile(**ci_sizes: object) -> settings:
    """The active shmring profile; `ci_sizes` size a machine under the "ci" profile only."""
    name = os.environ.get("SHMRING_HYPOTHESIS_PROFILE", "ci")
    if name != "ci":
        return settings.get_profile(name)
    return settings(settings.get_profile(name), **ci_sizes)  # type: ignore[arg-type]


# -- seams and helpers -----------------------------------------------------------------

ALLOCATION_SITES = (SITE_OPEN, SITE_FTRUNCATE, SITE_FALLOCATE, SITE_MMAP)
OS_ERRORS = (errno.ENOSPC, errno.EIO, errno.EMFILE)
CUDA_FAULT_ERRORS = (
    spec.CUDA_ERROR_UNKNOWN,
    spec.CUDA_ERROR_MEMORY_ALLOCATION,
    spec.CUDA_ERROR_INVALID_VALUE,
)
PAGE = mmap.PAGESIZE


def error_name(error: BaseException) -> str | None:
    """The CUDA error name or errno name an error carries (what the model answers)."""
    if isinstance(error, RegistrationError):
        if error.cuda_error is not None:
            return error.cuda_error
        return error_name(error.__cause__) if error.__cause__ is not None else None
    if isinstance(error, OSError) and error.errno is not None:
        return errno.errorcode.get(error.errno, str(error.errno))
    return None


def driver_outcome(call: Callable[[], None]) -> str:
    """Run one driver call; answer cudaSuccess or the error name it raised."""
    try:
        call()
    except RegistrationError as error:
        assert error.cuda_error is not None
        return error.cuda_error
    return spec.CUDA_SUCCESS


def source_tensor(length: int, seed: int, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (length,), dtype=torch.uint8, generator=generator)
    return data.to(device)


# -- the driver machine -----------------------------------------------------------------


class DriverMachine(RuleBasedStateMachine):
    """`spec.registration` driver part vs a CudaDriver, on a grid of page-aligned ranges."""

    driver_factory: Callable[[], CudaDriver] = SimulatedCudaDriver
    simulated = True
    device = "cpu"
    SLOTS = 12

    def __init__(self) -> None:
        super().__init__()
        self.model = spec.DriverState()
        self.driver = self.driver_factory()
        # Real memory behind the grid, so the real driver can register it.
        self.buffer = mmap.mmap(-1, (self.SLOTS + 4) * PAGE)
        self._anchor = ctypes.c_char.from_buffer(self.buffer)
        self.base = ctypes.addressof(self._anchor)

    def address(self, slot: int) -> int:
        return self.base + slot * PAGE

    @rule(slot=st.integers(0, 11), pages=st.integers(1, 4))
    def register(self, slot: int, pages: int) -> None:
        address, length = self.address(slot), pages * PAGE
        note(f"host_register(slot={slot}, pages={pages})")
        expected = spec.process_host_register(self.model, address, length)
        got = driver_outcome(lambda: self.driver.host_register(address, length))
        assert got == expected, (
            f"register slot={slot} pages={pages}: driver {got}, model {expected}"
        )

    @rule(data=st.data())
    def unregister(self, data: st.DataObject) -> None:
        if self.simulated:
            address = self.address(data.draw(st.integers(0, 11), label="slot"))
        else:
            # The real driver is asked only for bases and unregistered addresses
            # (what an interior address answers is not documented).
            inside = {a + k for a, n in self.model.ranges.items() for k in range(PAGE, n, PAGE)}
            choices = sorted(set(self.model.ranges) | {self.address(s) for s in range(12)} - inside)
            address = data.draw(st.sampled_from(choices), label="address")
        note(f"host_unregister(address=base+{address - self.base:#x})")
        expected = spec.process_host_unregister(self.model, address)
        got = driver_outcome(lambda: self.driver.host_unregister(address))
        assert got == expected, f"unregister: driver {got}, model {expected}"

    @rule(length=st.integers(1, 64))
    def copy_to_host(self, length: int) -> None:
        note(f"copy_to_host({length} bytes)")
        src = source_tensor(length, length, self.device)
        dst = torch.zeros(length, dtype=torch.uint8)
        expected = spec.process_copy_to_host(self.model)
        got = driver_outcome(lambda: self.driver.copy_to_host(dst, src))
        assert got == expected, f"copy: driver {got}, model {expected}"
        if got == spec.CUDA_SUCCESS:
            expected_sync = spec.process_synchronize(self.model)
            got_sync = driver_outcome(self.driver.synchronize)
            assert got_sync == expected_sync, (
                f"synchronize: driver {got_sync}, model {expected_sync}"
            )
            if got_sync == spec.CUDA_SUCCESS:
                assert torch.equal(dst, src.cpu()), "copy did not land"

    @rule()
    def synchronize(self) -> None:
        note("synchronize()")
        expected = spec.process_synchronize(self.model)
        got = driver_outcome(self.driver.synchronize)
        assert got == expected

    @precondition(lambda self: self.simulated)
    @rule(
        call=st.sampled_from((None, *spec.DRIVER_CALLS)),
        error=st.sampled_from(CUDA_FAULT_ERRORS),
        nth=st.integers(0, 3),
    )
    def arm_fault(self, call: str | None, error: str, nth: int) -> None:
        note(f"fail(call={call}, error={error}, nth={nth})")
        spec.process_arm_fault(self.model, call, error, nth)
        assert isinstance(self.driver, SimulatedCudaDriver)
        self.driver.fail(call, error, nth)

    @precondition(lambda self: self.simulated)
    @rule()
    def clear_faults(self) -> None:
        note("clear_faults()")
        spec.process_clear_faults(self.model)
        assert isinstance(self.driver, SimulatedCudaDriver)
        self.driver.clear_faults()

    @invariant()
    def agrees(self) -> None:
        invariants.check_registration_driver(self.model)
        if isinstance(self.driver, SimulatedCudaDriver):
            assert self.driver.registered_ranges() == self.model.ranges
            assert self.driver.statistics().calls == self.model.calls

    def teardown(self) -> None:
        if isinstance(self.driver, SimulatedCudaDriver):
            self.driver.clear_faults()
        for address in list(self.model.ranges):
            with contextlib.suppress(RegistrationError):
                self.driver.host_unregister(address)
        del self._anchor
        self.buffer.close()


# -- the registry machine ------------------------------------------------------------------


class TrackingRegistry(Registry):
    """A Registry that remembers every segment it allocated (tests only)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.every_segment: list[RegisteredSegment] = []

    def allocate(self, length: int) -> RegisteredSegment:
        segment = super().allocate(length)
        self.every_segment.append(segment)
        return segment


class RegistryMachine(RuleBasedStateMachine):
    """`spec.registration` registry part vs `impl.registered.registration.Registry`."""

    driver_factory: Callable[[], CudaDriver] = SimulatedCudaDriver
    simulated = True
    device = "cpu"

    def __init__(self) -> None:
        super().__init__()
        # The process's identity is read from /proc once per process (then
        # cached): read it now, so an armed `open` fault counts the registry's
        # own opens whichever test ran first in this process.
        current_producer_identity()
        self.scope = f"t{uuid.uuid4().hex[:12]}"
        self.os = FaultyOs()
        self.driver = self.driver_factory()
        self.registry = TrackingRegistry(self.scope, self.driver, os_facade=self.os)
        # Likewise the registry's verified directory descriptor, opened (one
        # `open`) by its first file: the model counts segment files only.
        # Opening it is tested where it is the subject (test_directory_fd,
        # the hostile-world and capture probes).
        _ = self.registry.files
        self.model = spec.initialize_registry()
        self.payloads: dict[int, bytes] = {}
        self.seed = 0

    # -- helpers --------------------------------------------------------------------

    def impl(self, segment_id: int) -> RegisteredSegment:
        segment = self.registry.every_segment[segment_id]
        assert segment.segment_id == segment_id
        return segment

    def ids_in(self, *states: str) -> list[int]:
        return sorted(s.segment_id for s in self.model.segments.values() if s.state in states)

    def source(self, length: int) -> torch.Tensor:
        self.seed += 1
        return source_tensor(length, self.seed, self.device)

    @staticmethod
    def step_outcome(
        call: Callable[[], object], poisoned: StepStatus
    ) -> tuple[StepStatus, str | None]:
        """Run an implementation step and classify it as the model answers.

        RegistryPoisonedError means REFUSED for a step that starts a
        registration, RETAINED (with the error) for an unregister.
        """
        try:
            call()
        except ClosedError:
            return StepStatus.CLOSED, None
        except RegistryPoisonedError as error:
            return poisoned, (error_name(error) if poisoned is StepStatus.RETAINED else None)
        except (RegistrationError, OSError) as error:
            return StepStatus.FAILED, error_name(error)
        return StepStatus.OK, None

    # -- rules --------------------------------------------------------------------------

    @rule(
        length=st.integers(1, 3 * PAGE),
        fault=st.none() | st.tuples(st.sampled_from(ALLOCATION_SITES), st.sampled_from(OS_ERRORS)),
    )
    def allocate(self, length: int, fault: tuple[str, int] | None) -> None:
        note(f"allocate(length={length}, os fault={fault})")
        os_error = None
        if fault is not None:
            self.os.fail_next(fault[0], fault[1])
            os_error = errno.errorcode[fault[1]]
        expected = spec.process_allocate(self.model, length, os_error)
        try:
            got = self.step_outcome(lambda: self.registry.allocate(length), StepStatus.REFUSED)
        finally:
            self.os.disarm()
        assert got == (expected.status, expected.error), f"allocate: impl {got}, model {expected}"

    @precondition(lambda self: bool(self.ids_in(spec.SEGMENT_ALLOCATED)))
    @rule(data=st.data())
    def register(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.ids_in(spec.SEGMENT_ALLOCATED)), label="segment")
        note(f"register(segment={sid})")
        expected = spec.process_register(self.model, sid)
        got = self.step_outcome(lambda: self.registry.register(self.impl(sid)), StepStatus.REFUSED)
        assert got == (expected.status, expected.error), f"register: impl {got}, model {expected}"

    @precondition(lambda self: bool(self.ids_in(spec.SEGMENT_REGISTERED)))
    @rule(data=st.data())
    def copy(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.ids_in(spec.SEGMENT_REGISTERED)), label="segment")
        note(f"copy(segment={sid})")
        src = self.source(self.model.segments[sid].length)
        expected = spec.process_copy(self.model, sid)
        got = self.step_outcome(lambda: self.registry.copy(self.impl(sid), src), StepStatus.REFUSED)
        assert got == (expected.status, expected.error), f"copy: impl {got}, model {expected}"
        if got[0] is StepStatus.OK:
            self.payloads[sid] = bytes(src.cpu().numpy())

    @precondition(lambda self: bool(self.ids_in(spec.SEGMENT_REGISTERED, spec.SEGMENT_COPIED)))
    @rule(data=st.data())
    def unregister(self, data: st.DataObject) -> None:
        ids = self.ids_in(spec.SEGMENT_REGISTERED, spec.SEGMENT_COPIED)
        sid = data.draw(st.sampled_from(ids), label="segment")
        note(f"unregister(segment={sid})")
        expected = spec.process_unregister(self.model, sid)
        got = self.step_outcome(
            lambda: self.registry.unregister(self.impl(sid)), StepStatus.RETAINED
        )
        assert got == (expected.status, expected.error), f"unregister: impl {got}, model {expected}"

    @precondition(lambda self: bool(self.ids_in(spec.SEGMENT_ALLOCATED, spec.SEGMENT_UNREGISTERED)))
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        ids = self.ids_in(spec.SEGMENT_ALLOCATED, spec.SEGMENT_UNREGISTERED)
        sid = data.draw(st.sampled_from(ids), label="segment")
        note(f"remove(segment={sid})")
        spec.process_remove(self.model, sid)
        self.registry.remove(self.impl(sid))

    def publishable(self) -> list[int]:
        return [
            sid for sid in self.ids_in(spec.SEGMENT_UNREGISTERED) if self.model.segments[sid].copied
        ]

    @precondition(lambda self: bool(self.publishable()))
    @rule(data=st.data())
    def publish(self, data: st.DataObject) -> None:
        ids = data.draw(
            st.lists(st.sampled_from(self.publishable()), min_size=1, unique=True), label="segments"
        )
        note(f"publish(segments={ids})")
        spec.process_publish(self.model, ids)
        published = self.registry.publish([self.impl(sid) for sid in ids])
        assert [p.name for p in published] == [self.impl(sid).name for sid in ids]

    def receivable(self) -> list[int]:
        return [
            s.segment_id
            for s in self.model.segments.values()
            if s.state == spec.SEGMENT_PUBLISHED and s.linked
        ]

    @precondition(lambda self: bool(self.receivable()))
    @rule(data=st.data())
    def receive(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.receivable()), label="segment")
        note(f"receive(segment={sid})")
        spec.process_receive(self.model, sid)
        segment = self.impl(sid)
        payload = self.payloads[sid]
        array = copy_segment(self.registry.directory, segment.name, "uint8", (len(payload),))
        assert bytes(array) == payload, f"segment={sid} delivered other bytes"

    def held_by_bookkeeping(self) -> list[int]:
        return self.ids_in(spec.SEGMENT_REGISTERED, spec.SEGMENT_COPIED, spec.SEGMENT_RETAINED)

    @precondition(lambda self: bool(self.held_by_bookkeeping()))
    @rule(data=st.data())
    def out_of_band_unregister(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.held_by_bookkeeping()), label="segment")
        note(f"out-of-band host_unregister(segment={sid})")
        expected = spec.process_out_of_band_unregister(self.model, sid)
        address = self.impl(sid).address
        got = driver_outcome(lambda: self.driver.host_unregister(address))
        assert got == expected, f"out-of-band unregister: driver {got}, model {expected}"

    @rule(
        lengths=st.lists(st.integers(1, 2 * PAGE), min_size=1, max_size=3),
        fault=st.none()
        | st.tuples(
            st.integers(0, 2), st.sampled_from(ALLOCATION_SITES), st.sampled_from(OS_ERRORS)
        ),
    )
    def transfer(self, lengths: list[int], fault: tuple[int, str, int] | None) -> None:
        note(f"transfer(lengths={lengths}, os fault={fault})")
        os_errors: dict[int, str] = {}
        if fault is not None:
            index, site, code = fault
            self.os.fail_next(site, code, index + 1)
            os_errors[index] = errno.errorcode[code]
        sources = [self.source(length) for length in lengths]
        expected = spec.process_transfer(self.model, lengths, os_errors)
        was_poisoned = self.registry.poisoned
        try:
            self.registry.transfer(sources)
        except ClosedError:
            got: tuple[TransferStatus, str | None] = (TransferStatus.CLOSED, None)
        except RegistryPoisonedError as error:
            status = TransferStatus.REFUSED if was_poisoned else TransferStatus.POISONED
            got = (status, None if was_poisoned else error_name(error))
        except (RegistrationError, OSError) as error:
            got = (TransferStatus.FAILED, error_name(error))
        else:
            got = (TransferStatus.PUBLISHED, None)
        finally:
            self.os.disarm()
        assert got == (expected.status, expected.error), f"transfer: impl {got}, model {expected}"
        if expected.status is TransferStatus.PUBLISHED:
            for sid, src in zip(expected.segment_ids, sources, strict=True):
                self.payloads[sid] = bytes(src.cpu().numpy())

    @precondition(lambda self: self.simulated)
    @rule(
        call=st.sampled_from((None, *spec.DRIVER_CALLS)),
        error=st.sampled_from(CUDA_FAULT_ERRORS),
        nth=st.integers(0, 4),
    )
    def arm_fault(self, call: str | None, error: str, nth: int) -> None:
        note(f"driver.fail(call={call}, error={error}, nth={nth})")
        spec.process_arm_fault(self.model.driver, call, error, nth)
        assert isinstance(self.driver, SimulatedCudaDriver)
        self.driver.fail(call, error, nth)

    @precondition(lambda self: self.simulated)
    @rule(
        call=st.sampled_from(spec.DRIVER_CALLS),
        nth=st.integers(1, 4),
        lengths=st.lists(st.integers(1, PAGE), min_size=1, max_size=3),
    )
    def transfer_with_fault(self, call: str, nth: int, lengths: list[int]) -> None:
        """One planned failure at the nth call of a kind, then a transfer: every call of it gets hit."""
        self.arm_fault(call, spec.CUDA_ERROR_UNKNOWN, nth)
        self.transfer(lengths, None)

    @precondition(lambda self: self.simulated)
    @rule()
    def clear_faults(self) -> None:
        note("driver.clear_faults()")
        spec.process_clear_faults(self.model.driver)
        assert isinstance(self.driver, SimulatedCudaDriver)
        self.driver.clear_faults()

    @rule()
    def close(self) -> None:
        note("close()")
        expected = spec.process_close(self.model)
        got = self.registry.close()
        assert got == expected, f"close: impl retains {got}, model {expected}"

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def model_invariants(self) -> None:
        invariants.check_registration(self.model)

    @invariant()
    def states_agree(self) -> None:
        assert self.registry.poisoned == self.model.poisoned
        assert self.registry.closed == self.model.closed
        assert len(self.registry.every_segment) == len(self.model.segments)
        # Every counter against the model's segments, so one that counts the
        # wrong way is seen at its first step, not only while it stays zero.
        states = [s.state for s in self.model.segments.values()]
        stats = self.registry.statistics()
        got_counts = (
            stats.segments_allocated,
            stats.segments_published,
            stats.segments_removed,
            stats.segments_retained,
            stats.poisoned,
        )
        expected_counts = (
            len(states),
            states.count(spec.SEGMENT_PUBLISHED),
            states.count(spec.SEGMENT_REMOVED),
            states.count(spec.SEGMENT_RETAINED),
            self.model.poisoned,
        )
        if not self.model.closed:  # close removes what is left without a failed step
            assert got_counts == expected_counts, f"statistics: impl {stats}, model {states}"
        for sid, model in self.model.segments.items():
            impl = self.impl(sid)
            got = (impl.state, impl.registered, impl.copied, impl.mapped, os.path.exists(impl.path))
            expected = (model.state, model.registered, model.copied, model.mapped, model.linked)
            assert got == expected, f"segment={sid}: impl {got}, model {expected}"
        if isinstance(self.driver, SimulatedCudaDriver):
            # Only mapped segments: an unmapped one's address may belong to a newer mapping.
            mapped = [sid for sid, s in self.model.segments.items() if s.mapped]
            held = {
                sid
                for sid in mapped
                if spec.is_driver_holding(self.model.driver, self.model.segments[sid].address)
            }
            impl_held = {
                sid for sid in mapped if self.impl(sid).address in self.driver.registered_ranges()
            }
            assert held == impl_held, f"driver holds segments {impl_held}, model {held}"

    def teardown(self) -> None:
        if isinstance(self.driver, SimulatedCudaDriver):
            self.driver.clear_faults()
        self.registry.close()
        # Test-only cleanup of what a poisoned registry keeps on purpose.
        for segment in self.registry.every_segment:
            if segment.state == spec.SEGMENT_RETAINED:
                with contextlib.suppress(RegistrationError):
                    self.driver.host_unregister(segment.address)
                segment.file.unmap()
                segment.file.unlink()
        self.registry._held.close()  # a poisoned registry stays a member: leave now
        with contextlib.suppress(OSError):
            os.rmdir(self.registry.directory)


def transfer_files(directory: str) -> list[str]:
    """The transfer files in `directory`: all but the scope's shared files and liveness files."""
    return sorted(
        name
        for name in os.listdir(directory)
        if name not in (MEMBERS_FILE_NAME, STAMP_FILE_NAME) and not is_liveness_file_name(name)
    )


__all__ = [
    "transfer_files",
    "DriverMachine",
    "RegistryMachine",
    "TrackingRegistry",
    "driver_outcome",
    "error_name",
    "profile",
]
