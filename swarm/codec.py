"""The decoding rules every wire record and control message follows: msgpack without extensions, and strict field
readers (``3.0`` is not an int, ``True`` is not an int, every size bounded), each failure one :class:`WireError`
naming the field. `swarm.wire` builds its records on them; `swarm.control` its messages and certificates.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack

from swarm.constants import (
    MAX_ID_CHARS,
    MAX_PLAIN_DEPTH,
    MAX_PLAIN_ITEMS,
    MAX_RECORD_BYTES,
    MAX_STRING_CHARS,
    WIRE_VERSION,
)

_MAX_INT = 1 << 62


class WireError(ValueError):
    """A message or record from the network that is malformed, out of range or too large."""


# ---- msgpack ----------------------------------------------------------------------------------------------------
def pack(obj: Any) -> bytes:
    """msgpack with bin/str kept apart; the only serializer on the wire."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes, *, max_bytes: int = MAX_RECORD_BYTES) -> Any:
    """Unpack untrusted msgpack; raises :class:`WireError` on anything but plain maps, arrays and scalars."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise WireError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_refuse_ext)
    except WireError:
        raise
    except Exception as e:  # msgpack raises several unrelated types on malformed input
        raise WireError(f"malformed msgpack: {type(e).__name__}: {e}") from None


def _refuse_ext(code: int, data: bytes) -> Any:
    raise WireError(f"msgpack extension type {code} is not allowed")


# ---- strict field readers (wire records and swarm.control.messages) ------------------------------------------------
def read_map(value: Any, name: str) -> dict:
    if type(value) is not dict:
        raise WireError(f"{name}: expected a map, got {type(value).__name__}")
    return value


def read_int(value: Any, name: str, lo: int = -_MAX_INT, hi: int = _MAX_INT) -> int:
    if type(value) is not int:
        raise WireError(f"{name}: expected an integer, got {type(value).__name__} {value!r:.40}")
    if not lo <= value <= hi:
        raise WireError(f"{name}: {value} outside {lo}..{hi}")
    return value


def read_float(value: Any, name: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise WireError(f"{name}: expected a finite number, got {type(value).__name__} {value!r:.40}")
    if not lo <= value <= hi:
        raise WireError(f"{name}: {value} outside {lo}..{hi}")
    return float(value)


def read_str(value: Any, name: str, max_chars: int = MAX_ID_CHARS, allow_empty: bool = False) -> str:
    if type(value) is not str:
        raise WireError(f"{name}: expected a string, got {type(value).__name__}")
    if len(value) > max_chars or (not value and not allow_empty):
        raise WireError(f"{name}: expected {'a' if allow_empty else 'a non-empty'} string of at most {max_chars} "
                        f"characters, got {len(value)}")
    return value


def read_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise WireError(f"{name}: expected one of {', '.join(choices)}, got {str(value)[:40]!r}")
    return value


def read_bytes(value: Any, name: str, max_bytes: int) -> bytes:
    if type(value) is not bytes or len(value) > max_bytes:
        raise WireError(f"{name}: expected at most {max_bytes} bytes, got {type(value).__name__}")
    return value


def read_list(value: Any, name: str, max_items: int) -> list:
    if type(value) is not list:
        raise WireError(f"{name}: expected an array, got {type(value).__name__}")
    if len(value) > max_items:
        raise WireError(f"{name}: {len(value)} items exceed the limit of {max_items}")
    return value


def read_version(d: dict, name: str) -> int:
    version = read_int(d.get("version"), f"{name}.version")
    if version != WIRE_VERSION:
        raise WireError(f"{name}: wire version {version} is not supported (this build speaks {WIRE_VERSION})")
    return version


def read_plain(value: Any, name: str) -> dict:
    """Check a free-form dict (model config, hyperparameters): str keys, plain scalars, bounded size and depth."""
    budget = [MAX_PLAIN_ITEMS]

    def walk(v: Any, path: str, depth: int) -> None:
        if depth > MAX_PLAIN_DEPTH:
            raise WireError(f"{path}: nested deeper than {MAX_PLAIN_DEPTH}")
        if type(v) is dict:
            items = v.items()
        elif type(v) is list:
            items = enumerate(v)
        elif v is None or type(v) in (bool, int):
            return
        elif type(v) is float:
            if not math.isfinite(v):
                raise WireError(f"{path}: non-finite number")
            return
        elif type(v) is str:
            read_str(v, path, MAX_STRING_CHARS, allow_empty=True)
            return
        else:
            raise WireError(f"{path}: {type(v).__name__} is not allowed in plain data")
        for k, item in items:
            budget[0] -= 1
            if budget[0] < 0:
                raise WireError(f"{name}: more than {MAX_PLAIN_ITEMS} items")
            if type(v) is dict:
                read_str(k, f"{path} key", MAX_ID_CHARS)
            walk(item, f"{path}.{k}", depth + 1)

    walk(read_map(value, name), name, 0)
    return value
