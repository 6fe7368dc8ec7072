"""Generated protobuf and gRPC modules of truba.v1 (see truba.proto.generate)."""
