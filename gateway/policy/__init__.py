"""Policies that stand between an agent's code and its kernel: scan, decide, hold for approval."""
