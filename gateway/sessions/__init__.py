"""Sessions: the manager, the session model, the warm pool, recovery after a restart."""
