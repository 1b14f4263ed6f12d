"""OTLP receivers (gRPC and HTTP), decoding and validation, convention normalization, spool."""
