"""Key files: the cluster key (``load_key(path)``) and, for agent/gossip/signing.py, any other
key file (``read_key_file``); every problem is one :class:`KeyFileError` with a one-line
message.  The cluster key authenticates every datagram (agent/gossip/wire.py).
"""
from __future__ import annotations

import os
import stat

from drl.agent import logs

MIN_KEY_BYTES = 16
MAX_KEY_FILE = 4096       # bytes a key file may hold (a key is 32 random bytes in base64)

log = logs.get_logger("drl.keys")


class KeyFileError(Exception):
    """A key file cannot be used; the message is one line for the CLI."""


def read_key_file(path: str | os.PathLike, what: str, make: str, secret: bool = True,
                  most: int = MAX_KEY_FILE) -> bytes:
    """The bytes of the ``what`` file at ``path``, stripped, not empty; ``make``: how to make one
    (for the message when it is missing).  A ``secret`` one readable by every user is
    warned about (logged, not refused: the operator may mean it, for a while)."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; only a regular file is read,
        # and only so much of it (/dev/zero would be read until memory ran out)
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise KeyFileError(f"{what} {path} is not a regular file")
            data = f.read(most + 1).strip()
    except FileNotFoundError:
        raise KeyFileError(f"{what} {path} does not exist (make one: {make})") from None
    except OSError as e:
        raise KeyFileError(f"{what} {path} is not readable: {e.strerror}") from None
    if len(data) > most:
        raise KeyFileError(f"{what} {path} is larger than {most} bytes: not a key file")
    if not data:
        raise KeyFileError(f"{what} {path} is empty")
    if secret and mode & 0o004:
        log.warning("key_file_readable", file=str(path), reason="readable by every user", fix="chmod 600")
    return data


def load_key(path: str | os.PathLike) -> bytes:
    """The cluster key: the file's bytes without surrounding whitespace.

    Make one with ``head -c 32 /dev/urandom | base64 > drl.key && chmod 600 drl.key``
    and give every node the same file.
    """
    key = read_key_file(path, "key file", f"head -c 32 /dev/urandom | base64 > {path}")
    if len(key) < MIN_KEY_BYTES:
        raise KeyFileError(f"key file {path} holds {len(key)} bytes; need at least {MIN_KEY_BYTES}")
    return key
