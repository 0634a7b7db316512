"""Code that runs inside a sandbox, not in the gateway."""
