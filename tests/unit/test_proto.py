"""The committed gRPC code must be what the .proto sources generate."""

from __future__ import annotations

from pathlib import Path

from truba.proto import generate

REPO = Path(__file__).resolve().parents[2]


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    fresh = {p.name: p.read_text() for p in generate.generate(tmp_path)}
    committed_dir = REPO / "proto" / "v1"
    committed = {p.name: p.read_text() for p in committed_dir.iterdir() if p.is_file()}
    stale = sorted(name for name in fresh if committed.get(name) != fresh[name])
    extra = sorted(set(committed) - set(fresh))
    assert not stale and not extra, (
        f"proto/v1 is stale ({stale}) or has extra files ({extra}): run python proto/generate.py"
    )


def test_services_have_the_required_methods() -> None:
    from truba.proto.v1 import daemons_pb2, jobs_pb2

    jobs = jobs_pb2.DESCRIPTOR.services_by_name["JobService"]
    assert {"CreateJob", "CloseJob", "CancelJob", "GetJob", "ListJobs"} <= set(jobs.methods_by_name)
    connect = daemons_pb2.DESCRIPTOR.services_by_name["DaemonService"].methods_by_name["Connect"]
    assert connect.client_streaming and connect.server_streaming
