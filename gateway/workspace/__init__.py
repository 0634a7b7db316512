"""A session's workspace: its path rules (``rules``, synchronous, also run inside Swarm
sandboxes) and the one async facade the gateway uses for it (``files``)."""
