"""The cluster key file: ``load_key(path)``; every problem is one :class:`KeyFileError`
with a one-line message.  The key signs every datagram (agent/gossip/wire.py).
"""
from __future__ import annotations

import os
import stat

from drl.agent import logs

MIN_KEY_BYTES = 16
MAX_KEY_FILE = 4096       # bytes a key file may hold (a key is 32 random bytes in base64)

log = logs.get_logger("drl.keys")


class KeyFileError(Exception):
    """The cluster key file cannot be used; the message is one line for the CLI."""


def load_key(path: str | os.PathLike) -> bytes:
    """The cluster key: the file's bytes without surrounding whitespace.

    Make one with ``head -c 32 /dev/urandom | base64 > drl.key && chmod 600 drl.key``
    and give every node the same file.
    """
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; only a regular file is read,
        # and only so much of it (/dev/zero would be read until memory ran out)
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise KeyFileError(f"key file {path} is not a regular file")
            key = f.read(MAX_KEY_FILE + 1).strip()
    except FileNotFoundError:
        raise KeyFileError(f"key file {path} does not exist (make one: "
                           f"head -c 32 /dev/urandom | base64 > {path})") from None
    except OSError as e:
        raise KeyFileError(f"key file {path} is not readable: {e.strerror}") from None
    if len(key) > MAX_KEY_FILE:
        raise KeyFileError(f"key file {path} is larger than {MAX_KEY_FILE} bytes: not a key")
    if not key:
        raise KeyFileError(f"key file {path} is empty")
    if len(key) < MIN_KEY_BYTES:
        raise KeyFileError(f"key file {path} holds {len(key)} bytes; need at least {MIN_KEY_BYTES}")
    if mode & 0o004:
        log.warning("key_file_readable", file=path, reason="readable by every user", fix="chmod 600")
    return key
