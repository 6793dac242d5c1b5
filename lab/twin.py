"""The Vagrant twin kept up, to enter: ``drl-lab up NAME --on vagrant`` boots an
experiment's VMs and leaves them running, ``drl-lab ssh HOST -- CMD`` runs a command on
one of them, ``drl-lab down`` destroys them.

    drl-lab up baseline --on vagrant --allocator fps     # l1 l2 sw sink, every agent answering
    drl-lab ssh l1 -- sudo drlctl status
    drl-lab ssh sink                                     # a shell
    drl-lab down

The VMs are those of ``drl-lab run --on vagrant`` (lab/vagrant.py: the box of
scripts/build-box.sh, drl's wheel and units installed by provisioning, the shipped
drl-agent.service), on a libvirtd of the twin's own that keeps running after ``up``
returns.  One twin per directory (``--twin-dir``): ``twin.json`` there says what is up,
so ``down`` also removes a twin whose ``up`` was killed half-way.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .errors import LabError
from .registry import resolve
from .vagrant import PrivateLibvirt, boot, build_box, dumps, export, vagrant_missing

STATE = "twin.json"


def topology_of(source: str) -> dict:
    """The twin's topology: a built-in experiment's name or an experiment file (exported as
    vagrant/topologies/*.json are), or such a JSON file itself."""
    if source.endswith(".json"):
        try:
            return json.loads(Path(source).read_text())
        except (OSError, ValueError) as e:
            raise LabError(f"{source}: {e}") from None
    return export(resolve(source))


def state(twin_dir: Path) -> dict | None:
    try:
        return json.loads((twin_dir / STATE).read_text())
    except (OSError, ValueError):
        return None


def _libvirt(twin_dir: Path) -> PrivateLibvirt:
    # one namespace per twin directory, so a test's twin and a user's never meet
    tag = hashlib.sha256(str(twin_dir.resolve()).encode()).hexdigest()[:8]
    return PrivateLibvirt(twin_dir / "libvirt", netns=f"drltw{tag}")


def up(source: str, twin_dir: Path, allocator: str | None, tcg: bool, memory_mib: int, progress) -> dict:
    """Boot the twin of ``source`` and return its state (also in ``twin_dir/twin.json``);
    on any failure or interrupt everything it started is removed again."""
    reason = vagrant_missing()
    if reason:
        raise LabError(f"--on vagrant {reason}")
    doc = topology_of(source)
    alloc = allocator or doc["allocators"][0]
    if alloc not in doc["agents"]:
        raise LabError(f"{doc['experiment']} has no allocator {alloc!r} ({', '.join(doc['allocators'])})")
    _clear(twin_dir, progress)
    twin_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    progress("== box (scripts/build-box.sh; cached after the first build)")
    with open(twin_dir / "build-box.log", "w") as log:
        box = build_box(log)
    progress(f"   {box} ({time.monotonic() - t0:.0f} s)")
    topo = twin_dir / "topology.json"
    topo.write_text(dumps(doc))
    lv = _libvirt(twin_dir)
    agents = list(doc["agents"][alloc])
    st = {"experiment": doc["experiment"], "allocator": alloc, "hosts": [h["name"] for h in doc["hosts"]],
          "agents": agents, "netns": lv.netns, "tcg": tcg, "memory_mib": memory_mib, "box": box.name}
    progress(f"== {doc['experiment']}: {alloc} on {len(st['hosts'])} VMs ({'TCG' if tcg else 'KVM'})")
    log_path = twin_dir / "vagrant.log"
    try:
        with open(log_path, "w") as log:
            lv.start()
            _write(twin_dir, st)       # from here on, `drl-lab down` can remove what is there
            boot(lv, twin_dir, box, topo, alloc, agents, tcg, memory_mib, log, progress)
    except BaseException as e:
        tail = log_path.read_text(errors="replace").splitlines()[-15:] if log_path.exists() else []
        _remove(twin_dir, lv)
        if isinstance(e, (subprocess.CalledProcessError, subprocess.TimeoutExpired, TimeoutError)):
            raise LabError(f"the twin did not come up ({e}); removed it. vagrant's last lines:\n"
                           + "\n".join(tail)) from None
        raise
    st["up_s"] = round(time.monotonic() - t0)
    _write(twin_dir, st)
    return st


def ssh(twin_dir: Path, host: str, command: list[str]) -> int:
    """Run ``command`` on ``host`` (a shell without one) and return its exit status."""
    st = _need(twin_dir)
    if host not in st["hosts"]:
        raise LabError(f"the twin ({st['experiment']}) has no host {host!r}: {', '.join(st['hosts'])}")
    tty = ["-t"] if not command and sys.stdin.isatty() else []
    argv = ["ip", "netns", "exec", st["netns"], "ssh", "-F", str(twin_dir / "ssh.cfg"), "-o", "LogLevel=ERROR",
            *tty, host, *([" ".join(command)] if command else [])]
    return subprocess.call(argv)


def down(twin_dir: Path) -> dict | None:
    """Destroy the twin in ``twin_dir``; its state, or None if none was up."""
    st = state(twin_dir)
    if st is not None:
        _require_root()
        _remove(twin_dir, _libvirt(twin_dir))
    return st


def _need(twin_dir: Path) -> dict:
    _require_root()
    st = state(twin_dir)
    if st is None:
        raise LabError(f"no twin is up in {twin_dir}: drl-lab up NAME --on vagrant first")
    return st


def _require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the twin needs root (its VMs live in a network namespace): run it with sudo")


def _clear(twin_dir: Path, progress) -> None:
    """Refuse a twin that runs; remove one that died with its host (a reboot ends libvirtd)."""
    st = state(twin_dir)
    if st is None:
        return
    lv = _libvirt(twin_dir)
    if lv.running():
        raise LabError(f"a twin is up in {twin_dir} ({st['experiment']}, {st['allocator']}): "
                       f"drl-lab down first")
    progress(f"   removing the leftovers of a twin that no longer runs ({st['experiment']})")
    _remove(twin_dir, lv)


def _remove(twin_dir: Path, lv: PrivateLibvirt) -> None:
    lv.stop()
    shutil.rmtree(twin_dir, ignore_errors=True)


def _write(twin_dir: Path, st: dict) -> None:
    tmp = twin_dir / f".{STATE}.{os.getpid()}"
    tmp.write_text(json.dumps(st, indent=1) + "\n")
    tmp.replace(twin_dir / STATE)
