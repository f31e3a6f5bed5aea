"""Video: borrowed and copying frame input give the same MP4, and it decodes to the input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("av", reason="the video tests need PyAV")

from shmring.impl.errors import ConfigurationError
from shmring.impl.registered.cuda_driver import SimulatedCudaDriver
from shmring.impl.registered.registration import Registry
from shmring.impl.registered.transfer import (
    CARRIER_ARENA,
    CARRIER_SEGMENT,
    TransferOptions,
    TransferReceiver,
    TransferSender,
)
from shmring.impl.registered.video import (
    FRAME_INPUT_BORROWED,
    FRAME_INPUT_COPY,
    VideoSettings,
    decode_mp4_to_rgb,
    encode_rgb_to_mp4,
    is_borrowable_frame,
)
from shmring.impl.registered.views import borrow_segment, lease_statistics

LOSSLESS = VideoSettings(codec="libx264rgb", pix_fmt="rgb24", qp=0)


def smooth_frames(t: int = 4, h: int = 48, w: int = 64) -> np.ndarray:
    """Gradients with a moving square: what a lossy codec keeps close to the input."""
    y, x = np.mgrid[0:h, 0:w]
    frames = np.empty((t, h, w, 3), np.uint8)
    for i in range(t):
        frames[i, ..., 0] = (x * 4 + i * 8) % 256
        frames[i, ..., 1] = y * 5
        frames[i, ..., 2] = 128
        frames[i, 10 + i : 20 + i, 10 + 2 * i : 22 + 2 * i] = (250, 30, 30)
    return frames


def noise_frames(t: int = 4, h: int = 48, w: int = 64) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


def test_borrowed_and_copying_paths_give_identical_mp4() -> None:
    frames = smooth_frames()
    borrowed = encode_rgb_to_mp4(frames, frame_input=FRAME_INPUT_BORROWED)
    copied = encode_rgb_to_mp4(frames, frame_input=FRAME_INPUT_COPY)
    assert borrowed == copied
    assert borrowed[4:8] == b"ftyp"
    decoded = decode_mp4_to_rgb(borrowed)
    assert decoded.shape == frames.shape
    # CRF 18 is lossy (and yuv420p subsamples colour): close, not exact.
    assert np.abs(decoded.astype(np.int16) - frames).mean() < 4.0


def test_lossless_settings_decode_bit_exact_on_both_paths() -> None:
    frames = noise_frames()
    borrowed = encode_rgb_to_mp4(frames, LOSSLESS, FRAME_INPUT_BORROWED)
    copied = encode_rgb_to_mp4(frames, LOSSLESS, FRAME_INPUT_COPY)
    assert borrowed == copied
    assert np.array_equal(decode_mp4_to_rgb(borrowed), frames)


def test_padded_rows_are_borrowed_and_encode_the_same() -> None:
    frames = noise_frames()
    padded = np.zeros((4, 48, 80, 3), np.uint8)
    padded[:, :, :64] = frames
    view = padded[:, :, :64]
    assert is_borrowable_frame(view[0]) and not view.flags.c_contiguous
    assert encode_rgb_to_mp4(view, LOSSLESS) == encode_rgb_to_mp4(frames, LOSSLESS)


@pytest.mark.parametrize(
    "make",
    [
        lambda f: f[:, :, ::-1],  # negative column stride
        lambda f: np.ascontiguousarray(f.transpose(0, 3, 1, 2)).transpose(
            0, 2, 3, 1
        ),  # planar memory
        lambda f: f[..., ::-1],  # BGR view of the channels
    ],
    ids=["reversed-columns", "channel-planar", "reversed-channels"],
)
def test_ineligible_layouts_take_the_copying_conversion(make) -> None:  # type: ignore[no-untyped-def]
    frames = noise_frames()
    odd = make(frames)
    assert not is_borrowable_frame(odd[0])
    expected = encode_rgb_to_mp4(np.ascontiguousarray(odd), LOSSLESS, FRAME_INPUT_COPY)
    assert encode_rgb_to_mp4(odd, LOSSLESS, FRAME_INPUT_BORROWED) == expected


def test_encoding_a_borrowed_segment_releases_it_afterwards(scope: str) -> None:
    frames = smooth_frames()
    with Registry(scope, SimulatedCudaDriver()) as registry:
        (segment,) = registry.transfer([torch.from_numpy(frames)])
        before = lease_statistics().live
        view = borrow_segment(registry.directory, segment.name, "uint8", frames.shape)
        data = encode_rgb_to_mp4(view)
        assert lease_statistics().live == before + 1
        del view
        assert lease_statistics().live == before  # the encoder kept no frame of it
        assert data == encode_rgb_to_mp4(frames)


@pytest.mark.parametrize(
    ("arena_capacity", "carrier"), [(0, CARRIER_SEGMENT), (1 << 20, CARRIER_ARENA)]
)
def test_frames_reach_the_encoder_through_the_registered_route(
    scope: str, arena_capacity: int, carrier: str
) -> None:
    """Issue 21: the route the benchmark checks for B-E, here through the simulated driver:
    registered (not the copying fallback), one copy into wholly registered memory, the
    expected carrier, and a borrowed view the encoder reads without a copy-out."""
    frames = smooth_frames()
    driver = SimulatedCudaDriver()
    options = TransferOptions(
        enable_registered_shm=True, enable_borrowed_frames=True, arena_capacity=arena_capacity
    )
    with (
        TransferSender(scope, options, driver=driver) as sender,
        TransferReceiver(scope, options) as receiver,
    ):
        descriptor = sender.send({"frames": torch.from_numpy(frames)})
        assert descriptor.registered and descriptor.fields[0].carrier == carrier
        stats = sender.statistics()
        assert (stats.transfers_registered, stats.transfers_fell_back) == (1, 0)
        copies = driver.copy_statistics()
        assert copies.copies_started == 1 == copies.copies_into_page_locked
        before = lease_statistics().live
        view = receiver.receive(descriptor)["frames"]
        assert lease_statistics().live == before + 1  # borrowed, not copied out
        assert encode_rgb_to_mp4(view, frame_input=FRAME_INPUT_BORROWED) == encode_rgb_to_mp4(
            frames
        )
        del view


def test_settings_are_configurable_and_type_checked() -> None:
    frames = smooth_frames(t=2)
    fast = encode_rgb_to_mp4(frames, VideoSettings(fps=30, crf=30, preset="veryfast"))
    assert fast != encode_rgb_to_mp4(frames)
    with pytest.raises(ConfigurationError, match="fps=0"):
        VideoSettings(fps=0)
    with pytest.raises(ConfigurationError, match="crf='18'"):
        VideoSettings(crf="18")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="dtype=float32"):
        encode_rgb_to_mp4(frames.astype(np.float32))
    with pytest.raises(ConfigurationError, match="frame_input"):
        encode_rgb_to_mp4(frames, frame_input="zero-copy")
