"""Sessions as notebooks: export, replay, and comparing outputs."""
