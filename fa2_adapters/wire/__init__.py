"""Shared by the harness and the runner: the message channel and the attention cases."""
