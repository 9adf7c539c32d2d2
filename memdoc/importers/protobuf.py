"""A tiny reader of the protobuf wire format: enough to walk pprof and XPlane messages."""

from __future__ import annotations

from collections.abc import Iterator

from memdoc.errors import InputError

VARINT = 0
FIXED64 = 1
LENGTH_DELIMITED = 2
FIXED32 = 5


class ProtobufError(InputError):
    """Bytes that are not a well-formed protobuf message."""


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it."""
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("varint longer than 10 bytes")


def fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) for each field of a message, in order. Varints and
    fixed-width values come as int, length-delimited ones as a memoryview (no copy)."""
    view = memoryview(data)
    pos = 0
    end = len(view)
    while pos < end:
        key, pos = read_varint(view, pos)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, pos = read_varint(view, pos)
            yield number, wire, value
        elif wire == LENGTH_DELIMITED:
            size, pos = read_varint(view, pos)
            if pos + size > end:
                raise ProtobufError("a field runs past the end of its message")
            yield number, wire, view[pos : pos + size]
            pos += size
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            if pos + width > end:
                raise ProtobufError("truncated fixed-width field")
            yield number, wire, int.from_bytes(view[pos : pos + width], "little")
            pos += width
        else:
            raise ProtobufError(f"unsupported wire type {wire}")


def packed_varints(data: memoryview) -> list[int]:
    """The values of a packed repeated varint field."""
    values = []
    pos = 0
    while pos < len(data):
        value, pos = read_varint(data, pos)
        values.append(value)
    return values


def signed(value: int) -> int:
    """An int64 read as a varint (two's complement over 64 bits)."""
    return value - (1 << 64) if value >= 1 << 63 else value
