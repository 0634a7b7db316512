"""Kernels as one-task services across a Docker Swarm."""
