"""``ModelStatistics`` of a model across its replicas.

Triton's statistics are cumulative counters and durations since each server started, so the
sum over a model's replicas is what one server serving all of the router's traffic would
report: counts and nanoseconds add up, ``last_inference`` is the latest, batch statistics add
up per batch size, response statistics per response index, memory usage per kind of memory
and device.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import Message
from tritonclient.grpc import service_pb2

_LATEST = {"last_inference"}
_KEYS = {"batch_stats": ("batch_size",), "memory_usage": ("type", "id")}


def merge(into: Message, other: Message) -> None:
    """Add ``other``'s counters into ``into`` (two messages of one type)."""
    for fd, value in other.ListFields():
        name = fd.name
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            mine = getattr(into, name)
            for key, item in value.items():
                merge(mine[key], item)
        elif fd.is_repeated:
            keys = _KEYS.get(name)
            mine = getattr(into, name)
            if keys is None:
                continue  # nothing else repeats in these messages
            index = {tuple(getattr(m, k) for k in keys): m for m in mine}
            for item in value:
                match = index.get(tuple(getattr(item, k) for k in keys))
                if match is None:
                    mine.add().CopyFrom(item)
                else:
                    merge(match, item)
        elif fd.message_type is not None:
            merge(getattr(into, name), value)
        elif fd.type == fd.TYPE_STRING:
            if not getattr(into, name):
                setattr(into, name, value)
        elif name in _LATEST:
            setattr(into, name, max(getattr(into, name), value))
        else:
            setattr(into, name, getattr(into, name) + value)


def combine(replies: Iterable[service_pb2.ModelStatisticsResponse]
            ) -> service_pb2.ModelStatisticsResponse:
    """One response whose entries are the per (model, version) sums of ``replies``', in the
    order Triton lists them (by name, then version)."""
    by_model: dict[tuple[str, str], service_pb2.ModelStatistics] = {}
    for reply in replies:
        for stats in reply.model_stats:
            key = (stats.name, stats.version)
            mine = by_model.get(key)
            if mine is None:
                by_model[key] = mine = service_pb2.ModelStatistics()
            merge(mine, stats)
    out = service_pb2.ModelStatisticsResponse()
    for key in sorted(by_model):
        out.model_stats.add().CopyFrom(by_model[key])
    return out
