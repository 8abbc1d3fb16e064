"""Regenerate the Python stubs from ``service/vindex.proto``.

    python -m vindex.service.codegen            # rewrite service/vindex_pb2*.py
    python -m vindex.service.codegen --check    # exit 1 if the committed stubs are out of date

Needs ``grpcio-tools`` (the ``dev`` extra). The generated files are committed so that an
install needs no code generation; the import in the ``_grpc`` stub is made package-relative.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = "vindex.proto"
OUTPUTS = ("vindex_pb2.py", "vindex_pb2.pyi", "vindex_pb2_grpc.py")


def generate(out_dir: str) -> None:
    import importlib.resources

    from grpc_tools import protoc

    # the well-known types (google/protobuf/struct.proto) ship inside grpc_tools
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    args = ["grpc_tools.protoc", f"-I{HERE}", f"-I{well_known}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}", os.path.join(HERE, PROTO)]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    grpc_stub = os.path.join(out_dir, "vindex_pb2_grpc.py")
    with open(grpc_stub) as f:
        text = f.read()
    with open(grpc_stub, "w") as f:
        f.write(text.replace("import vindex_pb2 as vindex__pb2", "from . import vindex_pb2 as vindex__pb2"))


#: What the generator writes about its own version (grpcio-tools and protobuf): a fresh install
#: may bring a newer patch release, which is no reason to call the committed stubs stale.
_TOOL_VERSIONS = [
    (re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.M), "GRPC_GENERATED_VERSION = ?"),
    (re.compile(r"^# Protobuf Python Version: .*$", re.M), "# Protobuf Python Version: ?"),
    (re.compile(r"ValidateProtobufRuntimeVersion\([^)]*\)"), "ValidateProtobufRuntimeVersion(?)"),
]


def _without_tool_versions(text: str) -> str:
    for pattern, placeholder in _TOOL_VERSIONS:
        text = pattern.sub(placeholder, text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the committed stubs instead of writing")
    args = ap.parse_args(argv)
    if not args.check:
        generate(HERE)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp)
        stale = []
        for name in OUTPUTS:
            with open(os.path.join(tmp, name)) as a:
                fresh = a.read()
            path = os.path.join(HERE, name)
            if not os.path.exists(path) or _without_tool_versions(open(path).read()) != _without_tool_versions(fresh):
                stale.append(name)
    if stale:
        print(f"stale generated stubs: {', '.join(stale)}; run python -m vindex.service.codegen", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
