"""What every admin call that writes does: name its caller, bound its wait, and commit through
the control plane, mapping each failure to the gRPC code that says whether a retry is safe."""

from __future__ import annotations

from typing import Any

import grpc

from consensus.group import ConsensusError
from meshd.admin.authz import CALLER, CREDENTIAL
from meshd.control.plane import ControlPlane, Credential

DEFAULT_TIMEOUT = 5.0
MAX_TIMEOUT = 60.0

CONSENSUS_CODES = {"no_quorum": grpc.StatusCode.UNAVAILABLE,
                    "no_leader": grpc.StatusCode.UNAVAILABLE,
                    "not_applied": grpc.StatusCode.UNAVAILABLE,
                    "closed": grpc.StatusCode.UNAVAILABLE,
                    "refused": grpc.StatusCode.PERMISSION_DENIED,
                    "version": grpc.StatusCode.FAILED_PRECONDITION,
                    "unknown": grpc.StatusCode.DEADLINE_EXCEEDED}
RESULT_CODES = {"invalid": grpc.StatusCode.INVALID_ARGUMENT,
                 "wrong_group": grpc.StatusCode.INVALID_ARGUMENT,
                 "conflict": grpc.StatusCode.ABORTED,
                 "not_found": grpc.StatusCode.NOT_FOUND,
                 "internal": grpc.StatusCode.INTERNAL}


def caller() -> str:
    """The principal making the current admin call, as audit logs and documents name it."""
    caller = CALLER.get()
    return caller.label if caller is not None else ""


async def timeout(value: float, context: grpc.aio.ServicerContext) -> float:
    """A call's ``timeout_seconds``: the default for 0, INVALID_ARGUMENT when out of range."""
    if value < 0 or value > MAX_TIMEOUT or value != value:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"timeout_seconds: must be 0 (default {DEFAULT_TIMEOUT:g}) .. "
                            f"{MAX_TIMEOUT:g}, got {value}")
    return value or DEFAULT_TIMEOUT


def credential(command: dict[str, Any]) -> Credential | None:
    """What the caller presented, for a coordinator to check again if the write is forwarded.
    Reads (``PolicyGet --consistent``) change nothing and are judged as the node's own: their
    caller's credential stays here."""
    return None if command.get("op") == "read" else CREDENTIAL.get()


async def commit(control: ControlPlane, context: grpc.aio.ServicerContext, group: str,
                 command: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Commit ``command`` or abort the call with the code that says what happened."""
    try:
        result = await control.write(group, command, timeout, caller(), credential(command))
    except ConsensusError as exc:
        await context.abort(CONSENSUS_CODES.get(exc.code, grpc.StatusCode.UNAVAILABLE),
                            str(exc))
        raise AssertionError("unreachable") from None
    if not result.get("ok"):
        error = str(result.get("error", "internal"))
        message = str(result.get("message", error))
        if error == "conflict":
            message += f" (current version {result.get('current', 0)})"
        await context.abort(RESULT_CODES.get(error, grpc.StatusCode.INTERNAL), message)
    return result
