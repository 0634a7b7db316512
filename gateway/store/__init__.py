"""Persistence: sessions, executions and the audit log."""
