"""The checked-in stubs (src/oncekv/_proto) match proto/oncekv.proto: the
proto is compiled again with grpcio-tools and its descriptor compared with
the one the checked-in module carries (and, when the installed grpcio-tools
is the one that generated them, the files byte for byte)."""

import importlib.util
import os
import re
import sys
import tempfile

import pytest
from google.protobuf import descriptor_pb2

from oncekv._proto import oncekv_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)
PROTO = os.path.join(os.path.dirname(os.path.dirname(PACKAGE_ROOT)), "proto", "oncekv.proto")
STUBS = os.path.join(PACKAGE_ROOT, "src", "oncekv", "_proto")


def _generator():
    sys.path.insert(0, os.path.join(PACKAGE_ROOT, "scripts"))
    try:
        spec = importlib.util.spec_from_file_location(
            "generate_stubs", os.path.join(PACKAGE_ROOT, "scripts", "generate_stubs.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.pop(0)


@pytest.fixture(scope="module")
def regenerated():
    pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed")
    if not os.path.exists(PROTO):
        pytest.skip(f"{PROTO} not found (not run from the repository)")
    out = tempfile.mkdtemp(prefix="oncekv-stubs-test-")
    descriptor_set = os.path.join(out, "oncekv.desc")
    _generator().generate(PROTO, out, descriptor_set=descriptor_set)
    return out, descriptor_set


def test_checked_in_descriptor_matches_the_proto(regenerated):
    out, descriptor_set = regenerated
    fresh = descriptor_pb2.FileDescriptorSet.FromString(open(descriptor_set, "rb").read())
    assert len(fresh.file) == 1
    checked_in = descriptor_pb2.FileDescriptorProto.FromString(oncekv_pb2.DESCRIPTOR.serialized_pb)
    assert _without_json_names(fresh.file[0]) == _without_json_names(checked_in), (
        "src/oncekv/_proto is stale: run `python scripts/generate_stubs.py` in clients/python")


def _without_json_names(file):
    """The descriptor without `json_name`s, which a descriptor set carries
    and the generated module's embedded descriptor leaves out."""
    file = descriptor_pb2.FileDescriptorProto.FromString(file.SerializeToString())

    def strip(messages):
        for message in messages:
            for field in message.field:
                field.ClearField("json_name")
            strip(message.nested_type)

    strip(file.message_type)
    return file


def _generated_version(path):
    match = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", open(path).read())
    return match.group(1) if match else None


def test_checked_in_files_match_when_the_generator_is_the_same(regenerated):
    import grpc_tools

    out, _ = regenerated
    names = ("oncekv_pb2.py", "oncekv_pb2.pyi", "oncekv_pb2_grpc.py")
    fresh_dir = os.path.join(out, "oncekv", "_proto")
    if _generated_version(os.path.join(fresh_dir, "oncekv_pb2_grpc.py")) != _generated_version(
            os.path.join(STUBS, "oncekv_pb2_grpc.py")):
        pytest.skip("grpcio-tools differs from the generating one; the descriptor test covers it")
    for name in names:
        fresh = open(os.path.join(fresh_dir, name)).read()
        checked_in = open(os.path.join(STUBS, name)).read()
        assert fresh == checked_in, f"{name} is stale: run scripts/generate_stubs.py"


def test_every_rpc_of_the_client_service_has_a_stub_method():
    from oncekv._proto import oncekv_pb2_grpc

    service = oncekv_pb2.DESCRIPTOR.services_by_name["Client"]
    import grpc

    stub = oncekv_pb2_grpc.ClientStub(grpc.insecure_channel("127.0.0.1:1"))
    for method in service.methods:
        assert hasattr(stub, method.name), method.name
