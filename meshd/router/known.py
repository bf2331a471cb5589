"""Requests the router has validated before, recognised by their bytes.

A client sends the same request over and over with new tensor data: the same model, inputs,
datatypes, shapes and outputs.  Whether a request is valid, and its payload size, depend on
exactly those and on the length of each tensor's bytes, never on the bytes themselves.  So a
request whose every byte but the tensor data matches one validated before against the same
model config needs no parsing and no validation: measured in place (``bench/router_overhead``)
those cost the router about 20 us a request, most of its own work on the gRPC path.

For gRPC the tensor data is ``raw_input_contents`` (field 7 of ``ModelInferRequest``), which
serializers write last (fields go in number order).  :func:`grpc_key` walks the message's
top-level records - tag and length, no decoding - and keys the request by the bytes before
its first tensor and the tensors' lengths.  A message in any other shape (tensors not at the
end, typed ``contents`` carrying the data, a field it does not know) has no key and takes the
full path, as does anything the cache has not seen: recognition only ever skips work whose
outcome is already known.

Only requests whose outcome is the same every time are kept: admitted, not part of a
sequence, no shared memory.  A request id or a sequence id makes every request's bytes new;
those miss, and the table's bound keeps them from crowding it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshd.router.validate import ModelSchema

RAW_FIELD = 7
"""``ModelInferRequest.raw_input_contents``."""
MAX_HEADER = 4096
"""Bytes of header a key may hold: larger requests (long parameter lists) are not kept."""


@dataclass(frozen=True, slots=True)
class Known:
    """What validating a request found, and the config it was validated against."""

    model: str
    version: str
    payload: int
    """The request's payload bytes (what :func:`meshd.router.validate.validate` returned)."""
    schema: ModelSchema
    timeout: float | None = None
    """Seconds the request allows (the HTTP header's ``timeout`` parameter; gRPC carries its
    deadline outside the message)."""


def grpc_key(raw: bytes) -> tuple[bytes, tuple[int, ...]] | None:
    """``(header bytes, tensor lengths)`` of a serialized ``ModelInferRequest`` whose
    ``raw_input_contents`` come last, or None."""
    n = len(raw)
    i = 0
    start = -1
    lengths: list[int] = []
    try:
        while i < n:
            tag = raw[i]
            # Fields 1-7, all length-delimited (wire type 2): one-byte tags 0x0a..0x3a.
            if tag & 0x87 != 0x02 or not 0x08 <= tag <= 0x3f:
                return None
            at = i
            i += 1
            b = raw[i]
            i += 1
            size = b & 0x7F
            shift = 7
            while b & 0x80:
                if shift > 35:
                    return None
                b = raw[i]
                i += 1
                size |= (b & 0x7F) << shift
                shift += 7
            i += size
            if i > n:
                return None
            if tag >> 3 == RAW_FIELD:
                if start < 0:
                    start = at
                lengths.append(size)
            elif start >= 0:
                return None  # a header field after the tensors: not the usual shape
    except IndexError:  # a truncated length
        return None
    if start < 0 or start > MAX_HEADER:
        return None
    return raw[:start], tuple(lengths)


def tensors_at(raw: bytes, start: int, lengths: tuple[int, ...]) -> bool:
    """Whether ``raw`` from ``start`` on is exactly ``raw_input_contents`` records of
    ``lengths``: the check of a guessed key (:meth:`KnownRequests.key`)."""
    i = start
    n = len(raw)
    for length in lengths:
        if i >= n or raw[i] != 0x3A:
            return False
        i += 1
        size = shift = 0
        while True:
            if i >= n or shift > 35:
                return False
            b = raw[i]
            i += 1
            size |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
        if size != length:
            return False
        i += size
    return i == n


class KnownRequests:
    """Keys (:func:`grpc_key`, or an ingress's own) of requests validated before -> what
    validation found; at most ``size`` of them, the oldest dropped first.  A hit counts only
    while its :attr:`Known.schema` is the model's config in force (a reloaded model's new
    config validates its requests afresh): the caller checks that, it holds the configs."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._known: dict[object, Known] = {}
        self.get: Callable[[object], Known | None] = self._known.get
        """What is known under a key (the table's own ``get``: no call of ours on the
        request path)."""
        self._shapes: dict[int, tuple[int, tuple[int, ...]]] = {}
        """Message length -> where the tensors began and their lengths, in the last request
        of that length seen with a key: the same client's next request is most likely laid
        out the same."""

    def key(self, raw: bytes) -> tuple[tuple[bytes, tuple[int, ...]] | None, Known | None]:
        """:func:`grpc_key` of a serialized ``ModelInferRequest`` and what is known under it.
        The layout of the last request of the same length is tried first: when ``raw`` ends
        in tensors of those lengths there and the bytes before are a header validated before
        (a whole header, walked: only walked keys are stored), that is its key - found
        without walking the header.  Otherwise the walk decides."""
        n = len(raw)
        shape = self._shapes.get(n)
        if shape is not None and tensors_at(raw, shape[0], shape[1]):
            key = (raw[:shape[0]], shape[1])
            known = self._known.get(key)
            if known is not None:
                return key, known
        walked = grpc_key(raw)
        if walked is None:
            return None, None
        if len(self._shapes) >= 4096:
            self._shapes.clear()
        self._shapes[n] = (len(walked[0]), walked[1])
        return walked, self._known.get(walked)

    def __len__(self) -> int:
        return len(self._known)


    def put(self, key: object, known: Known) -> None:
        table = self._known
        if key not in table and len(table) >= self.size:
            del table[next(iter(table))]
        table[key] = known
