"""Newline-delimited JSON messages over a pair of pipes: how the harness and a runner talk.

The pipes are dedicated file descriptors, not stdin/stdout, so whatever the submission prints
goes to its log and can never be mistaken for a message.
"""
import json
import os
import select
import threading
import time

MAX_MESSAGE = 16 << 20  # bytes


class ChannelClosed(Exception):
    """The other side closed its end (or died)."""


class ReceiveTimeout(Exception):
    """Nothing arrived in time."""


class Channel:
    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd
        self._buffer = b""
        self._sending = threading.Lock()  # a runner's "compiling" event may come from any thread that launched a kernel

    def send(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._sending:  # one message's bytes never interleave with another's
            while data:
                data = data[os.write(self.write_fd, data):]

    def receive(self, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.read_fd], [], [], wait)
            if not ready:
                raise ReceiveTimeout()
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                raise ChannelClosed()
            self._buffer += chunk
            if len(self._buffer) > MAX_MESSAGE and b"\n" not in self._buffer:
                raise ValueError("a message longer than the channel allows")  # tensors go through files
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
