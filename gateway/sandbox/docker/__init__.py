"""Kernels in containers on this host's Docker engine."""
