"""Regenerate the Python protobuf/gRPC code for every .proto under proto/, in place.

    python -m proto.generate           # write *_pb2.py, *_pb2.pyi, *_pb2_grpc.py beside each .proto
    python -m proto.generate --check   # exit 1 if the committed generated files are stale

protoc runs with the repository root as the include path, so `proto/mesh/v1/admin.proto`
generates imports like `from proto.mesh.v1 import admin_pb2` and `proto` is a top-level package.
grpc_tools' bundled well-known types (google/protobuf/*.proto) are on the include path too.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.resources
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[str]:
    """Every .proto under proto/, as sorted repo-relative POSIX paths."""
    return sorted(p.relative_to(ROOT).as_posix() for p in PROTO_DIR.rglob("*.proto"))


def expected_outputs(protos: list[str]) -> list[str]:
    out: list[str] = []
    for rel in protos:
        stem = rel[: -len(".proto")]
        out.extend(stem + suffix for suffix in GENERATED_SUFFIXES)
    return sorted(out)


def existing_outputs() -> list[str]:
    found = set()
    for suffix in GENERATED_SUFFIXES:
        for p in PROTO_DIR.rglob("*" + suffix):
            found.add(p.relative_to(ROOT).as_posix())
    return sorted(found)


def run_protoc(protos: list[str], out_dir: Path) -> None:
    wkt = importlib.resources.files("grpc_tools") / "_proto"
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{wkt}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"protoc failed (exit {result.returncode})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proto.generate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temp dir and exit 1 if the in-tree files differ",
    )
    args = parser.parse_args(argv)

    protos = proto_files()
    if not protos:
        print("no .proto files under proto/", file=sys.stderr)
        return 1
    wanted = expected_outputs(protos)
    stale = sorted(set(existing_outputs()) - set(wanted))

    with tempfile.TemporaryDirectory(prefix="meshd-proto-") as tmp:
        tmp_dir = Path(tmp)
        run_protoc(protos, tmp_dir)
        changed = []
        for rel in wanted:
            new = tmp_dir / rel
            if not new.is_file():
                raise SystemExit(f"protoc did not produce {rel}")
            cur = ROOT / rel
            if not cur.is_file() or not filecmp.cmp(new, cur, shallow=False):
                changed.append(rel)
                if not args.check:
                    shutil.copyfile(new, cur)

    if args.check:
        for rel in changed:
            print(f"out of date: {rel}")
        for rel in stale:
            print(f"no .proto for generated file: {rel}")
        if changed or stale:
            print(
                "run `./dev proto` (python -m proto.generate) and commit the result",
                file=sys.stderr,
            )
            return 1
        print(f"generated code up to date ({len(protos)} .proto files)")
        return 0

    for rel in stale:
        (ROOT / rel).unlink()
        print(f"removed {rel}")
    for rel in changed:
        print(f"wrote {rel}")
    print(f"{len(protos)} .proto files, {len(changed)} generated files updated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
