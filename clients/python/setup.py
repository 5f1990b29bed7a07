"""Builds the package; the gRPC modules are generated when it is BUILT.

`subagents/v1/*_pb2.py`, `*_pb2.pyi` and `*_pb2_grpc.py` are compiled from
the `.proto` files with grpcio-tools by the `build_py` step, straight into
the build directory: never at install or import time, never committed. So a
wheel holds them and installs with no compiler. The `.proto` files come
from, in this order: `SUBAGENTD_PROTO_DIR`; `proto/` next to this file (an
sdist carries a copy there, so it builds a wheel on its own); the
repository's `proto/` two levels up (a checkout).
"""

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.sdist import sdist as _sdist

HERE = Path(__file__).resolve().parent
PROTOS = "subagents/v1"


def proto_dir() -> Path:
    explicit = os.environ.get("SUBAGENTD_PROTO_DIR")
    if explicit:
        return Path(explicit)
    for candidate in (HERE / "proto", HERE.parent.parent / "proto"):
        if (candidate / PROTOS).is_dir():
            return candidate
    raise SystemExit(
        f"no {PROTOS}/*.proto next to {HERE} (an sdist's proto/) or in the repository's proto/;"
        " set SUBAGENTD_PROTO_DIR"
    )


def generate(out: Path) -> None:
    """Compiles the protos into `out` (a build directory)."""
    from grpc_tools import protoc
    import grpc_tools

    src = proto_dir()
    protos = sorted(str(p.relative_to(src)) for p in (src / PROTOS).glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {src}/{PROTOS} (set SUBAGENTD_PROTO_DIR)")
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
    # The stubs are typed (the .pyi files): a PEP 561 package.
    (out / "subagents" / "py.typed").touch()


class build_py(_build_py):
    """Copies the package, then generates the gRPC modules beside it."""

    def run(self) -> None:
        super().run()
        if not self.dry_run:
            generate(Path(self.build_lib))


class sdist(_sdist):
    """Puts the .proto files into the sdist (under proto/), so it builds
    a wheel without a checkout."""

    def make_release_tree(self, base_dir: str, files: list) -> None:
        super().make_release_tree(base_dir, files)
        src = proto_dir()
        dest = Path(base_dir) / "proto" / PROTOS
        dest.mkdir(parents=True, exist_ok=True)
        for proto in sorted((src / PROTOS).glob("*.proto")):
            shutil.copy2(proto, dest / proto.name)


setup(cmdclass={"build_py": build_py, "sdist": sdist})
