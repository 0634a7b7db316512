"""Live relays of a session's kernel to clients: the agent stream, Jupyter channels."""
