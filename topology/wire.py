"""The wire form of a coordinate: what rides in probe acks and in the node state.

``version:u8 dims:u8`` then ``dims + 3`` little-endian float64s (vector, error, adjustment,
height): 90 bytes at 8 dimensions.  Fixed layout, so decoding is one ``struct`` call and any
other length is refused before a float is read.
"""

from __future__ import annotations

import struct

from topology.config import MAX_DIMENSIONS
from topology.coordinate import Coordinate

VERSION = 1
_HEAD = struct.Struct("<BB")
_LAYOUTS = {d: struct.Struct(f"<{d + 3}d") for d in range(1, MAX_DIMENSIONS + 1)}


class CoordinateError(ValueError):
    """A coordinate from the network that cannot be used; ``reason`` is a metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


DECODE_REASONS = ("malformed", "unsupported_version", "invalid_coordinate")


def encode(coord: Coordinate) -> bytes:
    dims = len(coord.vec)
    return _HEAD.pack(VERSION, dims) + _LAYOUTS[dims].pack(
        *coord.vec, coord.error, coord.adjustment, coord.height)


def decode(data: bytes) -> Coordinate:
    """Parse and validate: the result is finite with non-negative error and height."""
    if len(data) < _HEAD.size:
        raise CoordinateError("malformed", f"{len(data)} bytes is too short")
    version, dims = _HEAD.unpack_from(data)
    if version != VERSION:
        raise CoordinateError("unsupported_version", f"version {version}, expected {VERSION}")
    layout = _LAYOUTS.get(dims)
    if layout is None:
        raise CoordinateError("malformed", f"{dims} dimensions, expected 1..{MAX_DIMENSIONS}")
    if len(data) != _HEAD.size + layout.size:
        raise CoordinateError("malformed", f"{len(data)} bytes for {dims} dimensions, "
                                           f"expected {_HEAD.size + layout.size}")
    values = layout.unpack_from(data, _HEAD.size)
    coord = Coordinate(values[:dims], values[dims], values[dims + 1], values[dims + 2])
    if not coord.is_valid():
        raise CoordinateError("invalid_coordinate", "non-finite component or negative "
                                                    "error/height")
    return coord
