"""One agent per interface and network namespace: an flock that dies with its process.

    held = InterfaceLock.take("eth0", ifindex)     # LockError: another agent holds it
    ...
    held.release()                                  # or the process exits, however it exits

Two agents on one interface would fight over its egress filter (the
second replaced the first's filter and its ``down`` removed it, while the first
kept reporting a limit it no longer enforced).  agent/kernel/datapath.py takes this
lock (``Datapath(exclusive=True)``, what ``drl-agent up`` uses) right after it
has found the interface and before it compiles or attaches anything.  When the
interface is deleted and made again under its name (a new index), the datapath
takes the new index's lock, then lets the old one go (Datapath._relock).

The lock is ``flock(LOCK_EX | LOCK_NB)`` on ``/run/drl/iface-<netns>-<ifindex>.lock``:

* named by the network namespace's inode and the interface's index, the two
  things that identify an interface on a machine (/run is shared by every
  namespace that ``ip netns exec`` runs in, and eth0 is a name every
  namespace has);
* released by the kernel when the holder's file is closed, so by any exit,
  SIGKILL included: a stale file never blocks a restart (it is left in
  place; locking an existing file is the normal case);
* in a root-owned directory, the file mode 0600: a process without root cannot
  open it, so it cannot take the lock to keep an agent from starting.  An
  abstract Unix socket named the same would also be scoped and released by
  the kernel, but any local user may bind any abstract name first;
* the holder writes its pid into the file, for the refusal's message.

What it does not cover: agents whose /run are different directories (mount
namespaces, e.g. containers that share the host's network but not its /run):
mount the same /run/drl into them.
"""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_DIR = "/run/drl"


class LockError(RuntimeError):
    """Another agent holds the interface, or the lock cannot be made; one line."""


def netns_inode(netns: str | None = None) -> int:
    """The inode of the network namespace: ours, or the named one (ip netns add)."""
    path = f"/var/run/netns/{netns}" if netns else "/proc/self/ns/net"
    return os.stat(path).st_ino


def lock_path(ifindex: int, netns_ino: int, directory: str | os.PathLike = LOCK_DIR) -> Path:
    """The lock file of interface ``ifindex`` in the namespace with inode ``netns_ino``."""
    if ifindex <= 0 or netns_ino <= 0:
        raise ValueError(f"ifindex {ifindex} and namespace inode {netns_ino} must be positive")
    return Path(directory) / f"iface-{netns_ino}-{ifindex}.lock"


class InterfaceLock:
    """A held lock; :meth:`take` makes one, :meth:`release` (or exit) ends it."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    @classmethod
    def take(cls, iface: str, ifindex: int, netns: str | None = None,
             directory: str | os.PathLike = LOCK_DIR) -> "InterfaceLock":
        """Hold ``iface``'s lock now, or raise LockError naming the holder's pid."""
        path = lock_path(ifindex, netns_inode(netns), directory)
        try:
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            raise LockError(f"cannot create the interface lock {path}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_pid(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                where = f" in network namespace {netns}" if netns else ""
                stop = "drl-agent down with its --socket" + (f", or kill {holder}" if holder else "")
                raise LockError(f"another drl-agent{f' (pid {holder})' if holder else ''} already runs on "
                                f"{iface}{where}: one agent per interface (stop it with {stop})") from None
            raise LockError(f"cannot lock {path}: {e.strerror}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        """Give the lock up (the file stays: removing it could race a starting agent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "InterfaceLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).split()[0])
    except (OSError, ValueError, IndexError):
        return None
