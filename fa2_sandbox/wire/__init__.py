"""Shared by the harness and the runner: the message channel, the attention cases and the tensor exchange."""
