"""sandbox-gateway: one sandboxed Jupyter kernel per session, behind an HTTP API."""

__version__ = "0.1.0"
