"""The gateway watching itself: how its own event loop keeps up."""
