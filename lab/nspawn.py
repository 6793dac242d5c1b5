"""A Debian bookworm booted with systemd as PID 1 (systemd-nspawn), for testing the units in systemd/.

    root = build_rootfs()                       # debootstrap once, cached by the package list
    wheels = build_wheelhouse(checkout, out)    # lab/wheels.py: drl and its dependencies (needs the index)
    with Container(root, "sd1234", netns="sd1234-h1", binds={wheels: "/wheelhouse"}) as ct:
        ct.run("systemctl", "start", "drl-agent.service")

    python -m drl.lab.nspawn build              # the rootfs alone (scripts/build-rootfs.sh)

The root filesystem is debootstrapped from Debian's packages once and kept
under ``/var/cache/drl-test/nspawn-rootfs/<key>``, the key a hash of the
suite, mirror and package list, so changing the list builds a new one.  Each
container boots on an overlay of it (upper layer in a directory of its own,
removed afterwards), so a run never changes the cache and the next run starts
from the same clean system.  The kernel headers bcc compiles against are the
host's, bind-mounted read-only: the container runs the host's kernel, so any
headers packaged in the image would be for another one.

The host need not run systemd: ``--register=no --keep-unit`` keep nspawn away
from machined and the host's cgroup manager.  The container gets exactly the
capabilities the agent needs on top of nspawn's default set, and bpf(2), which
nspawn's seccomp filter refuses otherwise.  Its network is a namespace the
caller made (``--network-namespace-path``), so traffic stays inside the lab.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .errors import LabError
from .netns import NETNS_DIR, poll

SUITE = "bookworm"
MIRROR = os.environ.get("DRL_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What docs/service.md's install needs (python3-venv for the venv, python3-bpfcc for bcc,
# iproute2 for tc) and systemd to boot; minbase brings passwd (useradd) and nothing else.
PACKAGES = ("systemd", "systemd-sysv", "python3", "python3-venv", "python3-bpfcc", "iproute2")
CACHE = Path(os.environ.get("DRL_TEST_CACHE", "/var/cache/drl-test"))
RUNS = Path("/var/tmp/drl-nspawn")   # overlay layers of running containers; not /tmp, which may be small
DONE = ".drl-rootfs-complete"
# the agent's three (docs/service.md), on top of nspawn's default set
CAPABILITIES = ("CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN")
BOOT_TIMEOUT_S = 90.0


def rootfs_key() -> str:
    recipe = "\n".join([SUITE, MIRROR, "minbase", *PACKAGES])
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def rootfs_path(cache: Path = CACHE) -> Path:
    return cache / "nspawn-rootfs" / rootfs_key()


def build_rootfs(cache: Path = CACHE, log=print) -> Path:
    """The cached root filesystem, debootstrapped first if there is none for this package list.
    Concurrent callers wait for one build; a half-built tree (a killed build) is started over."""
    root = rootfs_path(cache)
    if (root / DONE).exists():
        return root
    for tool in ("debootstrap", "systemd-nspawn"):
        if not shutil.which(tool):
            raise LabError(f"{tool} missing (apt install debootstrap systemd-container; scripts/setup.sh does)")
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / DONE).exists():
            return root
        tmp = root.with_name(root.name + ".partial")
        _remove_tree(tmp)
        started = time.monotonic()
        log(f"nspawn: debootstrap {SUITE} with {', '.join(PACKAGES)} into {tmp}")
        res = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
                              SUITE, str(tmp), MIRROR], capture_output=True, text=True)
        if res.returncode:
            tail = (res.stdout + res.stderr).strip().splitlines()[-5:]
            _remove_tree(tmp)
            raise LabError("debootstrap failed: " + " | ".join(tail))
        # the downloaded .debs are half the tree and never needed again
        for deb in (tmp / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        # no getty on a console nobody reads: the boot is done sooner and shutdown has less to stop
        (tmp / "etc/systemd/system/console-getty.service").symlink_to("/dev/null")
        (tmp / DONE).write_text(f"{rootfs_key()}\n")
        # older package lists' trees are dead weight
        for old in root.parent.iterdir():
            if old.is_dir() and old.name not in (root.name, tmp.name):
                _remove_tree(old)
        tmp.rename(root)
        log(f"nspawn: rootfs {root} built in {time.monotonic() - started:.0f} s")
    return root


class Container:
    """systemd-nspawn -b of ``rootfs`` (through an overlay) in network namespace ``netns``.

    ``run`` executes a command inside (nsenter into the container's namespaces, as root);
    leaving powers it off (SIGTERM to nspawn: an orderly shutdown), kills what is left,
    and removes the overlay."""

    def __init__(self, rootfs: Path, name: str, netns: str, binds: dict[Path, str] | None = None,
                 binds_ro: tuple[str, ...] = ("/lib/modules", "/usr/src"), log: Path | None = None):
        self.rootfs, self.name, self.netns = rootfs, name, netns
        self.binds = binds or {}
        self.binds_ro = [p for p in binds_ro if Path(p).exists()]
        self.dir = RUNS / name
        self.merged = self.dir / "root"
        self.log = log or self.dir / "console.log"     # nspawn's and the boot's output
        self.proc: subprocess.Popen | None = None
        self.leader: int | None = None
        self._mounted = False

    def argv(self) -> list[str]:
        binds = [f"--bind-ro={p}" for p in self.binds_ro]
        binds += [f"--bind-ro={host}:{inside}" for host, inside in self.binds.items()]
        return ["systemd-nspawn", "--quiet", "--boot", f"--directory={self.merged}", f"--machine={self.name}",
                "--register=no", "--keep-unit", f"--capability={','.join(CAPABILITIES)}",
                "--system-call-filter=bpf", f"--network-namespace-path={NETNS_DIR / self.netns}",
                "--console=read-only", *binds]

    def __enter__(self) -> "Container":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        clean_stale()
        _remove_tree(self.dir)
        for d in ("upper", "work", "root"):
            (self.dir / d).mkdir(parents=True)
        (self.dir / "owner").write_text(f"{os.getpid()}\n")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        _sh(["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={self.rootfs},upperdir={self.dir / 'upper'},workdir={self.dir / 'work'}", str(self.merged)])
        self._mounted = True
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        if not poll(lambda: self.proc.poll() is not None or self._find_leader() is not None, 20.0, 0.1) \
                or self.leader is None:
            raise LabError(f"systemd-nspawn did not start: {self.log_tail()}")
        # "offline" until PID 1 has made /run/systemd/system; then --wait waits for the boot
        # to finish; "degraded" (a unit failed) is booted all the same
        deadline, state = time.monotonic() + BOOT_TIMEOUT_S, ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            res = self.run("systemctl", "is-system-running", "--wait", check=False, timeout=BOOT_TIMEOUT_S)
            state = res.stdout.strip() or res.stderr.strip()
            if state in ("running", "degraded", "maintenance", "stopping"):
                break         # else offline, or the bus not yet up
            time.sleep(0.2)
        if state not in ("running", "degraded"):
            raise LabError(f"container {self.name} did not boot ({state}): {self.log_tail()}")

    def _find_leader(self) -> int | None:
        """The container's PID 1 as the host sees it: the process in nspawn's subtree whose own
        pid namespace numbers it 1."""
        todo = [self.proc.pid]
        while todo:
            pid = todo.pop()
            children = Path(f"/proc/{pid}/task/{pid}/children")
            try:
                todo += [int(c) for c in children.read_text().split()]
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
            if len(nspid) > 1 and nspid[-1] == "1":
                self.leader = pid
                return pid
        return None

    def run(self, *cmd: str, check: bool = True, timeout: float = 120.0,
            input: str | None = None) -> subprocess.CompletedProcess:
        """``cmd`` inside the container as root; check: a failure is a LabError with its stderr."""
        argv = ["nsenter", f"--target={self.leader}", "--all", "--", *cmd]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input,
                             env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                  "LANG": "C.UTF-8"})
        if check and res.returncode:
            raise LabError(f"`{' '.join(cmd)}` in {self.name} failed ({res.returncode}): "
                           f"{(res.stderr or res.stdout).strip()}")
        return res

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        """A file inside the container (through the overlay's merged tree, as root)."""
        self.run("install", "-D", "-m", f"{mode:o}", "/dev/stdin", path, input=text)

    def pid_of(self, unit: str) -> int:
        """The host pid of ``unit``'s main process (0: none)."""
        inner = int(self.run("systemctl", "show", "-P", "MainPID", unit).stdout.strip() or 0)
        return self.host_pid(inner) if inner else 0

    def host_pid(self, inner: int) -> int:
        """The host's pid of the container's process ``inner``."""
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                text = status.read_text()
            except OSError:
                continue
            nspid = next((line.split()[1:] for line in text.splitlines() if line.startswith("NSpid:")), [])
            if len(nspid) > 1 and nspid[-1] == str(inner) and self._in_container(int(status.parent.name)):
                return int(status.parent.name)
        raise LabError(f"no host pid for {self.name}'s pid {inner}")

    def _in_container(self, pid: int) -> bool:
        try:
            return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink(f"/proc/{self.leader}/ns/pid")
        except OSError:
            return False

    def log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:]) or "no output"
        except OSError:
            return "no output"

    def close(self) -> None:
        """Power off, then make sure: SIGKILL to PID 1 takes the whole pid namespace along."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)    # nspawn turns it into SIGRTMIN+3: poweroff
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                if self.leader:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.leader, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(10)
                if self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait()
        if self._mounted:
            if subprocess.run(["umount", str(self.merged)], capture_output=True).returncode:
                subprocess.run(["umount", "--lazy", str(self.merged)], capture_output=True)
            self._mounted = False
        _remove_tree(self.dir)


def clean_stale() -> list[str]:
    """Remove the overlays of containers whose owner process died (a killed test run); their
    containers died with their network namespace (drl-lab clean).  Returns their names."""
    gone = []
    for d in RUNS.iterdir() if RUNS.is_dir() else ():
        try:
            owner = int((d / "owner").read_text())
        except (OSError, ValueError):
            owner = 0
            if time.time() - d.stat().st_mtime < 60:
                continue                     # being made: the owner file comes next
        if owner and Path(f"/proc/{owner}").exists():
            continue
        with contextlib.suppress(LabError):
            _remove_tree(d)
            gone.append(d.name)
    return gone


def _remove_tree(path: Path) -> None:
    """rm -r, after unmounting whatever a killed debootstrap left mounted inside (its /proc,
    /sys, /dev): removing through a mount would reach the host's files."""
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True).returncode:
            subprocess.run(["umount", "--lazy", point], capture_output=True)
    with open("/proc/self/mounts") as f:
        if any(line.split()[1].startswith(prefix) for line in f):
            raise LabError(f"cannot unmount everything under {path}: not removing it")
    shutil.rmtree(path, ignore_errors=True)


def _sh(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise LabError(f"`{' '.join(cmd)}` failed: {res.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m drl.lab.nspawn", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="debootstrap the container's rootfs (cached; prints its path)")
    b.add_argument("--cache", type=Path, default=CACHE)
    sub.add_parser("path", help="where the rootfs for this package list is (built or not)")
    args = ap.parse_args(argv)
    if args.cmd == "path":
        print(rootfs_path())
        return 0
    try:
        print(build_rootfs(args.cache, log=lambda m: print(m, file=sys.stderr)))
    except LabError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
