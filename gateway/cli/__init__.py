"""The `sbx` command line: serve the gateway, drive it as a client."""
