"""Application types on the wire: a registry of encode / decode functions, never pickle.

Design rationale. The codec carries trees of plain values and tensors; a
pipeline also moves its own objects (vLLM's ``RequestOutput``, PIL images).
Pickle would carry them and would also run whatever a forged frame names, so
instead a type joins the wire through `register_type`: its `encode` turns an
object into a tree the codec carries (which may hold tensors and other
registered objects), its `decode` builds the object back from that tree. On
the wire the object is a two-item array ``[tag, state]`` whose tag is an
``Ext`` with the message's leaf code (which no user ``Ext`` uses) and the
registered name, so a user's own lists can never be mistaken for one. A
receiver that does not know the name gets `CorruptFrameError` naming it,
exactly as for any other frame it cannot read.

Built in: ``PIL.Image.Image`` (mode, size, raw pixels and palette; pillow is
imported only when an image is put or received, and a receiver without it
gets `UnsupportedPayloadError` saying so). `register_vllm_types` adds vLLM's
``RequestOutput`` and ``CompletionOutput`` when ``vllm`` is importable; the
compat facade calls it.

A registered class wins over everything else the codec would make of its
instances (issue 27): a registered dataclass, enum, attrs class, msgspec
Struct or dict subclass travels through its own functions and comes back
as itself (`shmring.impl.codec.scan`).

vllm-omni's serializer also rebuilds *dicts* shaped like vLLM's outputs
(the keys of a ``RequestOutput`` or a ``CompletionOutput``, as
``dataclasses.asdict`` makes them) into those classes on receipt; the
compat facade does the same (`restore_vllm_outputs`), with vllm present or
absent alike: the classes are those of ``vllm.outputs`` when it imports,
and the dict stays a dict when there is no ``vllm.outputs`` to build from.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from .errors import ConfigurationError, UnsupportedPayloadError

PIL_IMAGE_NAME: Final = "PIL.Image.Image"
MAX_NAME_LENGTH: Final = 200


@dataclass(frozen=True)
class TypeCodec:
    """How one registered class travels."""

    cls: type  # the registered class
    name: str  # its name on the wire (module-qualified by default)
    encode: Callable[[Any], Any]  # object -> tree the codec carries
    decode: Callable[[Any], Any]  # that tree (as decoded) -> object
    subclasses: bool  # instances of subclasses travel too (and come back as `cls`)


_lock: Final = threading.Lock()
_by_type: dict[type, TypeCodec] = {}
_by_name: dict[str, TypeCodec] = {}
_subclass_codecs: tuple[TypeCodec, ...] = ()


def _default_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_type(
    cls: type,
    encode: Callable[[Any], Any],
    decode: Callable[[Any], Any],
    *,
    name: str | None = None,
    subclasses: bool = False,
) -> TypeCodec:
    """Let instances of `cls` travel: ``encode(obj)`` gives a carried tree, ``decode(tree)`` the object.

    Both ends must register the same `name` (default ``module.qualname``).
    Registering a class again replaces its functions. ConfigurationError for
    a class the codec already carries itself, or a name taken by another class.
    """
    global _subclass_codecs
    if not isinstance(cls, type):
        raise ConfigurationError(f"register_type needs a class: cls={cls!r}")
    if not callable(encode) or not callable(decode):
        raise ConfigurationError(f"encode and decode must be callable: cls={cls!r}")
    if cls in (dict, list, tuple, str, bytes, bytearray, int, float, bool, type(None)):
        raise ConfigurationError(f"the codec carries {cls.__qualname__} itself: cls={cls!r}")
    wire_name = _default_name(cls) if name is None else name
    if not isinstance(wire_name, str) or not 0 < len(wire_name.encode()) <= MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"type name must be 1..{MAX_NAME_LENGTH} bytes of text: name={wire_name!r}"
        )
    codec = TypeCodec(cls, wire_name, encode, decode, subclasses)
    with _lock:
        taken = _by_name.get(wire_name)
        if taken is not None and taken.cls is not cls:
            raise ConfigurationError(
                f"type name {wire_name!r} is registered for {taken.cls!r}, not {cls!r}"
            )
        old = _by_type.pop(cls, None)
        if old is not None:
            _by_name.pop(old.name, None)
        _by_type[cls] = codec
        _by_name[wire_name] = codec
        _subclass_codecs = tuple(c for c in _by_type.values() if c.subclasses)
    return codec


def unregister_type(cls: type) -> bool:
    """Forget `cls`; answer whether it was registered."""
    global _subclass_codecs
    with _lock:
        codec = _by_type.pop(cls, None)
        if codec is None:
            return False
        _by_name.pop(codec.name, None)
        _subclass_codecs = tuple(c for c in _by_type.values() if c.subclasses)
    return True


def registered_types() -> list[TypeCodec]:
    """Every registered type, by name (the fuzz campaign encodes one of each)."""
    with _lock:
        return sorted(_by_type.values(), key=lambda codec: codec.name)


def codec_for_object(obj: object) -> TypeCodec | None:
    """The codec that carries `obj`, or None (the codec then refuses it)."""
    cls = type(obj)
    codec = _by_type.get(cls)
    if codec is not None:
        return codec
    for candidate in _subclass_codecs:
        if isinstance(obj, candidate.cls):
            return candidate
    image = sys.modules.get("PIL.Image")  # an image exists only once pillow is imported
    if image is not None and isinstance(obj, image.Image):
        return _register_pil()
    return None


def codec_for_name(name: str) -> TypeCodec | None:
    """The codec registered under `name`; None when there is none (a corrupt or foreign frame).

    UnsupportedPayloadError for a PIL image when pillow is not installed.
    """
    codec = _by_name.get(name)
    if codec is None and name == PIL_IMAGE_NAME:
        try:
            return _register_pil()
        except ImportError as error:
            raise UnsupportedPayloadError(
                "the payload holds a PIL.Image.Image; install pillow to receive it"
            ) from error
    return codec


# -- PIL images ---------------------------------------------------------------------


# Bits per pixel of the image modes that travel; the decoder checks the pixel
# bytes against them before pillow allocates anything (a forged size cannot
# make it allocate more than the frame holds).
_IMAGE_MODE_BITS: Final = {
    "1": 1,
    "L": 8,
    "P": 8,
    "LA": 16,
    "La": 16,
    "PA": 16,
    "I;16": 16,
    "I;16L": 16,
    "I;16B": 16,
    "I;16N": 16,
    "RGB": 24,
    "YCbCr": 24,
    "LAB": 24,
    "HSV": 24,
    "RGBA": 32,
    "RGBa": 32,
    "RGBX": 32,
    "CMYK": 32,
    "I": 32,
    "F": 32,
}


def _image_bytes(mode: str, width: int, height: int) -> int:
    bits = _IMAGE_MODE_BITS[mode]
    if bits == 1:
        return (width + 7) // 8 * height  # rows are packed to whole bytes
    return width * height * (bits // 8)


def _encode_image(image: Any) -> dict[str, Any]:
    if image.mode not in _IMAGE_MODE_BITS:
        raise UnsupportedPayloadError(f"PIL image mode does not travel: mode={image.mode!r}")
    state: dict[str, Any] = {
        "mode": image.mode,
        "size": list(image.size),
        "data": image.tobytes(),
    }
    palette = image.getpalette() if image.mode in ("P", "PA") else None
    if palette is not None:
        state["palette"] = palette
    return state


def _decode_image(state: Any) -> Any:
    from PIL import Image

    mode, (width, height), data = state["mode"], state["size"], state["data"]
    if (
        mode not in _IMAGE_MODE_BITS
        or not isinstance(width, int)
        or not isinstance(height, int)
        or width < 0
        or height < 0
        or not isinstance(data, bytes)
        or len(data) != _image_bytes(mode, width, height)
    ):
        raise ValueError(f"bad image: mode={mode!r} size={(width, height)} bytes={len(data)}")
    image = Image.frombytes(mode, (width, height), data)
    palette = state.get("palette")
    if palette is not None:
        image.putpalette(palette)
    return image


def _register_pil() -> TypeCodec:
    """Register PIL.Image.Image (any subclass: PNG, JPEG, ... files come back as plain images)."""
    codec = _by_name.get(PIL_IMAGE_NAME)
    if codec is not None:
        return codec
    from PIL import Image

    return register_type(
        Image.Image, _encode_image, _decode_image, name=PIL_IMAGE_NAME, subclasses=True
    )


# -- vLLM's output types ------------------------------------------------------------


def _attributes(obj: Any) -> dict[str, Any]:
    return dict(vars(obj))


def _rebuilder(cls: type) -> Callable[[Any], Any]:
    def rebuild(state: Any) -> Any:
        if not isinstance(state, dict) or not all(isinstance(key, str) for key in state):
            raise TypeError(f"{cls.__qualname__} state must be a dict of attributes")
        obj = cls.__new__(cls)
        obj.__dict__.update(state)
        return obj

    return rebuild


VLLM_OUTPUT_TYPES: Final = ("RequestOutput", "CompletionOutput")


def register_vllm_types() -> list[str]:
    """Register vLLM's output types if ``vllm.outputs`` imports; answer the names registered.

    Each travels as its attribute dict (nested outputs, token ids, logprobs
    trees) and comes back as an instance of the same class with the same
    attributes; an attribute the codec does not carry makes the put fail
    with UnsupportedPayloadError naming its type.
    """
    try:
        from vllm import outputs  # type: ignore[import-not-found]
    except ImportError:
        return []
    names = []
    for attribute in VLLM_OUTPUT_TYPES:
        cls = getattr(outputs, attribute, None)
        if isinstance(cls, type):
            names.append(register_type(cls, _attributes, _rebuilder(cls)).name)
    return names


# -- vllm-omni's output reconstruction --------------------------------------------

# The keys whose presence makes a dict a RequestOutput / CompletionOutput on
# vllm-omni's wire (its serializer's rule, bottom-up).
REQUEST_OUTPUT_KEYS: Final = frozenset(
    {"request_id", "prompt", "prompt_token_ids", "outputs", "finished"}
)
COMPLETION_OUTPUT_KEYS: Final = frozenset({"index", "text", "token_ids", "finish_reason"})
_MAX_RESTORE_DEPTH: Final = 512


class _VllmOutputs:
    """``vllm.outputs`` once it was looked for (None: not importable here)."""

    missing = False  # an import was tried and failed (a stand-in in sys.modules still counts)


def vllm_output_classes() -> tuple[type, type] | None:
    """(RequestOutput, CompletionOutput) of ``vllm.outputs``, or None when it does not import."""
    module = sys.modules.get("vllm.outputs")
    if module is None:
        if _VllmOutputs.missing:
            return None
        try:
            from vllm import outputs as module  # type: ignore[import-not-found,no-redef]
        except ImportError:
            _VllmOutputs.missing = True
            return None
    request, completion = (getattr(module, name, None) for name in VLLM_OUTPUT_TYPES)
    if not isinstance(request, type) or not isinstance(completion, type):
        return None
    return request, completion


def restore_vllm_outputs(tree: Any) -> Any:
    """`tree` with every dict shaped like a vLLM output rebuilt as one (vllm-omni's receive rule).

    Bottom-up: a dict holding `REQUEST_OUTPUT_KEYS` becomes a
    ``RequestOutput``, one holding `COMPLETION_OUTPUT_KEYS` a
    ``CompletionOutput``; keys the class does not take (``multimodal_output``)
    become attributes. Without ``vllm.outputs`` the tree is returned as is.
    """
    classes = vllm_output_classes()
    if classes is None or type(tree) not in (dict, list):
        return tree
    return _restore(tree, classes, 0)


def _restore(obj: Any, classes: tuple[type, type], depth: int) -> Any:
    if depth > _MAX_RESTORE_DEPTH:
        return obj
    cls = type(obj)
    if cls is list:
        for index, value in enumerate(obj):
            if type(value) is dict or type(value) is list:
                obj[index] = _restore(value, classes, depth + 1)
        return obj
    if cls is not dict:
        return obj
    for key, value in obj.items():
        if type(value) is dict or type(value) is list:
            obj[key] = _restore(value, classes, depth + 1)
    if not all(type(key) is str for key in obj):
        return obj
    keys = obj.keys()
    if keys >= REQUEST_OUTPUT_KEYS:
        return _build(classes[0], obj)
    if keys >= COMPLETION_OUTPUT_KEYS:
        return _build(classes[1], obj)
    return obj


_parameters: dict[type, frozenset[str]] = {}


def _init_names(cls: type) -> frozenset[str]:
    """The keyword arguments `cls` takes (its dataclass init fields, or its signature's names)."""
    names = _parameters.get(cls)
    if names is None:
        if dataclasses.is_dataclass(cls):
            names = frozenset(field.name for field in dataclasses.fields(cls) if field.init)
        else:
            try:
                parameters = inspect.signature(cls).parameters.values()
            except (TypeError, ValueError):
                parameters = ()  # type: ignore[assignment]
            names = frozenset(
                p.name
                for p in parameters
                if p.kind
                in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            )
        _parameters[cls] = names
    return names


def _build(cls: type, state: dict[str, Any]) -> Any:
    """An instance of `cls` from a dict of its attributes (vllm-omni's reconstruction)."""
    names = _init_names(cls)
    arguments = {key: value for key, value in state.items() if key in names}
    try:
        obj = cls(**arguments)
    except Exception:  # noqa: BLE001 - a shape the class does not take: attributes alone
        obj = cls.__new__(cls)
        obj.__dict__.update(state)
        return obj
    for key, value in state.items():
        if key not in names:
            setattr(obj, key, value)
    return obj


__all__ = [
    "COMPLETION_OUTPUT_KEYS",
    "REQUEST_OUTPUT_KEYS",
    "restore_vllm_outputs",
    "vllm_output_classes",
    "PIL_IMAGE_NAME",
    "VLLM_OUTPUT_TYPES",
    "TypeCodec",
    "codec_for_name",
    "codec_for_object",
    "register_type",
    "register_vllm_types",
    "registered_types",
    "unregister_type",
]
