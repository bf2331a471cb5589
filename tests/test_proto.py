"""The generated mesh.v1 code is up to date and usable."""

import subprocess
import sys
from pathlib import Path

from proto.mesh.v1 import admin_pb2, admin_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proto.generate", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_members_response_round_trip() -> None:
    resp = admin_pb2.MembersResponse(
        local_node="a",
        health_score=2,
        members=[
            admin_pb2.Member(
                name="a",
                address="127.0.0.1:7946",
                status="alive",
                incarnation=7,
                roles=["runtime", "router"],
                zone="z1",
                region="r1",
                tags={"gpu": "a100"},
                ports={"admin": 7960, "score": 7961},
                status_age_seconds=12.5,
                is_local=True,
            ),
            admin_pb2.Member(name="b", address="127.0.0.2:7946", status="suspect"),
        ],
    )
    data = resp.SerializeToString()
    back = admin_pb2.MembersResponse.FromString(data)
    assert back == resp
    assert back.members[0].ports["admin"] == 7960
    assert back.members[0].tags["gpu"] == "a100"
    assert list(back.members[0].roles) == ["runtime", "router"]
    assert back.members[1].incarnation == 0 and not back.members[1].is_local
    assert hasattr(admin_pb2_grpc, "AdminStub")
    assert hasattr(admin_pb2_grpc, "add_AdminServicer_to_server")
