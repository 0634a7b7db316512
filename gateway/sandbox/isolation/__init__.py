"""What walls a sandbox: container runtimes, seccomp, and the choice per session."""
