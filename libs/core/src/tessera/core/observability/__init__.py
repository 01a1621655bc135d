"""Tracing, metrics and structured logs."""
