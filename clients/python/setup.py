"""Builds the package with stubs generated from the repository's proto/.

The stubs (`subagents/v1/*_pb2*.py`) are generated next to this file when the
package is built — `pip install clients/python` from a checkout compiles
`proto/subagents/v1/*.proto` with grpcio-tools — and are git-ignored, never
committed. Set SUBAGENTD_PROTO_DIR to build from elsewhere.
"""

import os
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def proto_dir() -> Path:
    explicit = os.environ.get("SUBAGENTD_PROTO_DIR")
    return Path(explicit) if explicit else HERE.parent.parent / "proto"


def generate(out: Path) -> None:
    from grpc_tools import protoc
    import grpc_tools

    src = proto_dir()
    protos = sorted(str(p.relative_to(src)) for p in (src / "subagents" / "v1").glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {src}/subagents/v1 (set SUBAGENTD_PROTO_DIR)")
    include = Path(grpc_tools.__file__).parent / "_proto"
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{src}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed: " + " ".join(args))
    for pkg in (out / "subagents", out / "subagents" / "v1"):
        (pkg / "__init__.py").touch()


generate(HERE)
setup()
