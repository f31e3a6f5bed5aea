"""Encode an RGB uint8 frame sequence (T x H x W x 3) to MP4 with PyAV.

Design rationale. The last step of the registered transfer path is the
encoder. PyAV can wrap a numpy array as a video frame without copying
(`VideoFrame.from_numpy_buffer`): the frame's AVBuffer holds a reference to
the array, so a borrowed view (see `views`) stays alive, and its lease
unreleased, until the encoder is done with the frame. That only works for
layouts libswscale can read in place: uint8, last axis 3, per-pixel strides
(3, 1); rows may be padded (the row stride becomes the line size). Any other
layout takes the copying conversion (`VideoFrame.from_ndarray` of a
contiguous copy). Both feed the same rgb24 pixels to the same encoder, so
for the same settings they produce the same MP4 bytes (a test checks it).

`FRAME_INPUT_PLANAR` reproduces the seed's baseline input (a copy split into
planar G, B, R planes); it exists for the A variant of the benchmark and
gives its own, different bytes.

The encoder defaults are libx264, preset ultrafast, CRF 18, 24 fps, yuv420p.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from ..errors import ConfigurationError
from ..extras import import_extra

if TYPE_CHECKING:
    import av
else:  # the `video` extra: a MissingExtraError naming it when absent
    av = import_extra("av", "the video encoder (shmring.impl.registered.video)")

FRAME_INPUT_BORROWED: Final = "borrowed"  # from_numpy_buffer when eligible, else the copy
FRAME_INPUT_COPY: Final = "copy"  # from_ndarray of a contiguous rgb24 copy
FRAME_INPUT_PLANAR: Final = "planar"  # the seed's baseline: a copy split into gbrp planes
FRAME_INPUTS: Final = (FRAME_INPUT_BORROWED, FRAME_INPUT_COPY, FRAME_INPUT_PLANAR)


@dataclass(frozen=True)
class VideoSettings:
    """Encoder settings; the defaults are the transport's."""

    fps: int = 24  # frames per second, > 0
    codec: str = "libx264"  # "libx264rgb" with pix_fmt "rgb24" and qp=0 is lossless
    preset: str = "ultrafast"
    crf: int | None = 18  # constant rate factor; ignored when qp is set
    qp: int | None = None  # constant quantizer (0 = lossless); overrides crf
    pix_fmt: str = "yuv420p"  # the encoder's pixel format
    # Further encoder options as (name, value) pairs, passed to the codec as given.
    options: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.fps, int) or isinstance(self.fps, bool) or self.fps <= 0:
            raise ConfigurationError(f"fps must be a positive int: fps={self.fps!r}")
        for name in ("codec", "preset", "pix_fmt"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigurationError(f"{name} must be a non-empty str: {name}={value!r}")
        for name in ("crf", "qp"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0
            ):
                raise ConfigurationError(f"{name} must be None or an int >= 0: {name}={value!r}")

    def codec_options(self) -> dict[str, str]:
        options = {"preset": self.preset}
        if self.qp is not None:
            options["qp"] = str(self.qp)
        elif self.crf is not None:
            options["crf"] = str(self.crf)
        options.update(dict(self.options))
        return options


def is_borrowable_frame(frame: np.ndarray) -> bool:
    """Whether PyAV can read `frame` (H x W x 3) in place as rgb24.

    uint8, last axis 3, per-pixel strides (3, 1), rows not overlapping
    (padding after a row is allowed).
    """
    return (
        frame.dtype == np.uint8
        and frame.ndim == 3
        and frame.shape[2] == 3
        and frame.strides[1:] == (3, 1)
        and frame.strides[0] >= 3 * frame.shape[1]
    )


def check_rgb_frames(frames: np.ndarray) -> None:
    """T x H x W x 3 uint8 with at least one frame, or ConfigurationError naming what is wrong."""
    if not isinstance(frames, np.ndarray):
        raise ConfigurationError(f"frames must be a numpy array: type={type(frames).__name__}")
    if frames.ndim != 4 or frames.shape[3] != 3 or frames.dtype != np.uint8:
        raise ConfigurationError(
            f"frames must be uint8 T x H x W x 3: shape={frames.shape} dtype={frames.dtype}"
        )
    if 0 in frames.shape:
        raise ConfigurationError(f"frames must not be empty: shape={frames.shape}")


def make_video_frame(frame: np.ndarray, frame_input: str) -> av.VideoFrame:
    """One H x W x 3 frame as a PyAV frame, borrowed when allowed and possible."""
    if frame_input == FRAME_INPUT_BORROWED and is_borrowable_frame(frame):
        return av.VideoFrame.from_numpy_buffer(frame, format="rgb24")
    if frame_input == FRAME_INPUT_PLANAR:
        return av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="gbrp")
    return av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")


def encode_rgb_to_mp4(
    frames: np.ndarray,
    settings: VideoSettings | None = None,
    frame_input: str = FRAME_INPUT_BORROWED,
) -> bytes:
    """Encode T x H x W x 3 uint8 frames into MP4 bytes.

    With FRAME_INPUT_BORROWED, frames with an eligible layout are handed to
    the encoder without a copy (the encoder may read `frames` until this
    returns; `frames` is never written). Otherwise each frame is copied.
    """
    settings = settings or VideoSettings()
    if frame_input not in FRAME_INPUTS:
        raise ConfigurationError(
            f"unknown frame input: frame_input={frame_input!r} (expected one of {FRAME_INPUTS})"
        )
    check_rgb_frames(frames)
    _, height, width, _ = frames.shape
    time_base = Fraction(1, settings.fps)
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream: Any = container.add_stream(
            settings.codec, rate=settings.fps, options=settings.codec_options()
        )
        stream.width = width
        stream.height = height
        stream.pix_fmt = settings.pix_fmt
        for index in range(frames.shape[0]):
            video_frame = make_video_frame(frames[index], frame_input)
            video_frame.pts = index
            video_frame.time_base = time_base
            for packet in stream.encode(video_frame):
                container.mux(packet)
            del video_frame
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def decode_mp4_to_rgb(data: bytes) -> np.ndarray:
    """Decode MP4 bytes into a T x H x W x 3 uint8 array (for checks and tools)."""
    decoded = []
    with av.open(io.BytesIO(data), mode="r") as container:
        for frame in container.decode(video=0):
            decoded.append(frame.to_ndarray(format="rgb24"))
    if not decoded:
        raise ValueError("no video frames in the MP4 data")
    return np.stack(decoded)


__all__ = [
    "FRAME_INPUTS",
    "FRAME_INPUT_BORROWED",
    "FRAME_INPUT_COPY",
    "FRAME_INPUT_PLANAR",
    "VideoSettings",
    "check_rgb_frames",
    "decode_mp4_to_rgb",
    "encode_rgb_to_mp4",
    "is_borrowable_frame",
    "make_video_frame",
]
