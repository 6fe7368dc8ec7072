"""truba.proto: the control-plane API (gRPC) of truba. Sources in truba/v1/*.proto."""
