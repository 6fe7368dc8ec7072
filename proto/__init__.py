"""truba.proto: the control-plane API (gRPC) of truba. Sources in truba/v1/*.proto."""

__all__: list[str] = []
"""The generated modules are imported by path: ``from truba.proto.v1 import jobs_pb2``."""
