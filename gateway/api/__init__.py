"""HTTP and WebSocket handlers: thin layers over the domain classes."""
