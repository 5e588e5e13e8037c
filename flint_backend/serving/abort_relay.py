"""Aborts reach the flint_model instance whose engine runs the request.

flint_postprocess stops an engine request (a stop string, a cancelled client) with a control
request to flint_model, and Triton hands that to whichever instance is free: with several
instances it is often not the one that owns the request. So every request key starts with its
owner's address, `<instance name>@<pid>`, and every instance process listens on an abstract
Unix datagram socket of that name (Linux; the instances of one server share a host and a
network namespace). An instance that gets an abort for another's key forwards the key there.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Callable

log = logging.getLogger(__name__)
SOCKET_PREFIX = "flint-abort/"
MAX_NAME = 107  # bytes of an abstract socket name after its leading NUL
STOP = b""      # the datagram that ends the listener


def socket_name(owner: str) -> bytes:
    name = (SOCKET_PREFIX + owner).encode()
    if len(name) > MAX_NAME:
        raise ValueError(f"abort relay: instance address {owner!r} is too long for a socket name "
                         f"({len(name)} bytes, at most {MAX_NAME}); give flint_model a shorter name")
    return b"\0" + name


def owner_of(key: str) -> str | None:
    """`<instance>@<pid>/<uuid>` -> `<instance>@<pid>`; None for a key without an owner."""
    owner, sep, _ = key.partition("/")
    return owner if sep else None


class AbortRelay:
    def __init__(self, instance: str, on_abort: Callable[[str], None]):
        self.address = f"{instance}@{os.getpid()}"
        self.key_prefix = self.address + "/"  # the start of every key this instance hands out
        self._on_abort = on_abort
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._socket.bind(socket_name(self.address))
        except OSError as error:
            self._socket.close()
            raise OSError(f"abort relay: cannot listen on {socket_name(self.address)!r}: {error}") from None
        self._thread = threading.Thread(target=self._listen, name="flint-abort-relay", daemon=True)
        self._thread.start()

    def route(self, key: str) -> None:
        """Abort `key` here when this instance owns it, else at its owner."""
        owner = owner_of(key)
        if owner is None or owner == self.address:
            self._on_abort(key)
            return
        try:
            self._socket.sendto(key.encode(), socket_name(owner))
        except OSError as error:  # the owner is gone, and its requests with it
            log.warning("abort relay: abort of %s not delivered to %s: %s", key, owner, error)

    def close(self) -> None:
        self._socket.sendto(STOP, socket_name(self.address))
        self._thread.join()
        self._socket.close()

    def _listen(self) -> None:
        while True:
            data = self._socket.recv(4096)
            if data == STOP:
                return
            try:
                self._on_abort(data.decode())
            except Exception:
                log.exception("abort relay: abort of %r failed", data)
