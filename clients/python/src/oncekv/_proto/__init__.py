"""Generated protobuf and gRPC stubs of proto/oncekv.proto (scripts/generate_stubs.py); do not edit."""
