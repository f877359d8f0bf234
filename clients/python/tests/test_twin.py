"""The proto3 twin is wire-identical to proto/fenced/v1 as the Go server compiles it."""

from __future__ import annotations

import importlib
import pathlib
import pkgutil
import subprocess
import sys

import pytest
from google.protobuf import descriptor_pb2

from conftest import PYCLIENT
import fenced.v1

sys.path.insert(0, str(PYCLIENT / "tools"))
import twin  # noqa: E402


def shape(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, object]:
    """Everything of a file that decides its wire format and its gRPC paths."""

    def msg(m: descriptor_pb2.DescriptorProto, prefix: str, out: dict[str, object]) -> None:
        name = prefix + m.name
        out[name] = sorted((f.name, f.number, f.type, f.label, f.type_name) for f in m.field)
        for n in m.nested_type:
            msg(n, name + ".", out)
        for e in m.enum_type:
            out[name + "." + e.name] = sorted((v.name, v.number) for v in e.value)

    out: dict[str, object] = {"package": fd.package, "name": fd.name}
    for m in fd.message_type:
        msg(m, "", out)
    for e in fd.enum_type:
        out[e.name] = sorted((v.name, v.number) for v in e.value)
    for s in fd.service:
        out[s.name] = sorted((m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming) for m in s.method)
    return out


def test_twin_matches_the_go_descriptors(go_interop: pathlib.Path) -> None:
    raw = subprocess.run([str(go_interop), "descriptors"], check=True, capture_output=True, timeout=60).stdout
    go_files = {f.name: f for f in descriptor_pb2.FileDescriptorSet.FromString(raw).file}
    modules = [importlib.import_module("fenced.v1." + m.name) for m in pkgutil.iter_modules(fenced.v1.__path__)
               if m.name.endswith("_pb2")]
    twins = {m.DESCRIPTOR.name: m for m in modules}
    assert sorted(go_files) == sorted(twins) == sorted(
        "fenced/v1/" + p.name for p in (PYCLIENT.parents[1] / "proto" / "fenced" / "v1").glob("*.proto"))
    for name, module in twins.items():
        py_file = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(py_file)
        assert shape(py_file) == shape(go_files[name]), name


def test_twin_refuses_features_proto3_cannot_mirror() -> None:
    src = 'edition = "2023";\npackage p;\noption features.field_presence = IMPLICIT;\n'
    assert 'syntax = "proto3";' in twin.twin(src, "x.proto")
    got = twin.twin('edition = "2023";\nmessage M {\n  int64 a = 1 [features.field_presence = EXPLICIT];\n}\n', "x.proto")
    assert "  optional int64 a = 1;" in got
    got = twin.twin('// header\nedition = "2023";\noption features.field_presence = IMPLICIT;\n\n// A message.\nmessage M {\n  // a field\n  string a = 1;  // trailing\n}\n'
                    'option go_package = "x//y";\n', "x.proto")
    assert got == 'syntax = "proto3";\n\nmessage M {\n  string a = 1;\n}\noption go_package = "x//y";\n', got
    # Edition 2023's default is explicit presence: singular fields become optional.
    got = twin.twin('edition = "2023";\nmessage M {\n  int64 a = 1;\n  repeated string b = 2;\n  map<string, M> c = 3;\n'
                    '  M d = 4;\n  enum E {\n    E_UNSPECIFIED = 0;\n  }\n}\n', "x.proto")
    assert got == ('syntax = "proto3";\nmessage M {\n  optional int64 a = 1;\n  repeated string b = 2;\n'
                   '  map<string, M> c = 3;\n  optional M d = 4;\n  enum E {\n    E_UNSPECIFIED = 0;\n  }\n}\n'), got
    with pytest.raises(ValueError, match="cannot mirror"):
        twin.twin('edition = "2023";\noption features.enum_type = CLOSED;\n', "x.proto")
