#!/usr/bin/env python3
"""Regenerates the checked-in protobuf and gRPC stubs of the `oncekv`
package (src/oncekv/_proto/) from the repository's proto/oncekv.proto with
grpcio-tools' bundled compiler (no system protoc):

    pip install grpcio-tools==1.85.1 && python scripts/generate_stubs.py

The proto is compiled under the virtual path oncekv/_proto/oncekv.proto, so
that the generated gRPC module imports its messages from the package
(`from oncekv._proto import oncekv_pb2`). tests/test_stubs.py checks that
the checked-in stubs match the proto. After regenerating with another
grpcio-tools, update the `grpcio` and `protobuf` bounds in pyproject.toml
to the versions the new files name (GRPC_GENERATED_VERSION, and the
Protobuf Python Version line).
"""

import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)
REPO_ROOT = os.path.dirname(os.path.dirname(PACKAGE_ROOT))
PROTO = os.path.join(REPO_ROOT, "proto", "oncekv.proto")
VIRTUAL_PATH = "oncekv/_proto/oncekv.proto"
OUTPUTS = ("oncekv_pb2.py", "oncekv_pb2.pyi", "oncekv_pb2_grpc.py")


def generate(proto_path, out_dir, descriptor_set=None):
    """Compiles `proto_path` into `out_dir` (which receives
    oncekv/_proto/*.py); optionally writes a descriptor set too."""
    from grpc_tools import protoc
    import importlib.resources

    include = tempfile.mkdtemp(prefix="oncekv-proto-")
    try:
        target = os.path.join(include, VIRTUAL_PATH)
        os.makedirs(os.path.dirname(target))
        shutil.copyfile(proto_path, target)
        well_known = str(importlib.resources.files("grpc_tools") / "_proto")
        args = [
            "grpc_tools.protoc",
            "-I" + include,
            "-I" + well_known,
            "--python_out=" + out_dir,
            "--pyi_out=" + out_dir,
            "--grpc_python_out=" + out_dir,
        ]
        if descriptor_set:
            args.append("--descriptor_set_out=" + descriptor_set)
        args.append(VIRTUAL_PATH)
        code = protoc.main(args)
        if code != 0:
            raise RuntimeError("grpc_tools.protoc failed with exit code %d" % code)
    finally:
        shutil.rmtree(include, ignore_errors=True)


def main():
    out = tempfile.mkdtemp(prefix="oncekv-stubs-")
    try:
        generate(PROTO, out)
        destination = os.path.join(PACKAGE_ROOT, "src", "oncekv", "_proto")
        for name in OUTPUTS:
            shutil.copyfile(
                os.path.join(out, "oncekv", "_proto", name), os.path.join(destination, name)
            )
            print("wrote", os.path.relpath(os.path.join(destination, name), PACKAGE_ROOT))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
