"""Where kernels run. ``docker``: one locked-down container per kernel."""
