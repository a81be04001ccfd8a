"""Audit: run records, hashed traces, encrypted diagnostics, a tamper-evident log, replay."""
