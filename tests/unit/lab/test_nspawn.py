"""lab/nspawn.py without booting anything: the cache key, nspawn's command line, stale overlays."""
from __future__ import annotations

import os

from drl.lab import nspawn


def test_the_rootfs_key_follows_the_package_list(monkeypatch):
    key = nspawn.rootfs_key()
    assert key == nspawn.rootfs_key() and nspawn.rootfs_path().name == key
    monkeypatch.setattr(nspawn, "PACKAGES", (*nspawn.PACKAGES, "strace"))
    assert nspawn.rootfs_key() != key


def test_nspawn_gets_what_the_agent_needs(tmp_path):
    ct = nspawn.Container(tmp_path, "sd0000-ct", "sd0000-h1", binds={tmp_path / "wh": "/wheelhouse"},
                          binds_ro=("/proc/self",))
    argv = ct.argv()
    for flag in ("--boot", "--register=no", "--keep-unit", "--capability=CAP_BPF,CAP_PERFMON,CAP_NET_ADMIN",
                 "--system-call-filter=bpf", "--network-namespace-path=/run/netns/sd0000-h1",
                 "--bind-ro=/proc/self", f"--bind-ro={tmp_path / 'wh'}:/wheelhouse"):
        assert flag in argv, flag


def test_clean_stale_removes_dead_owners_overlays_only(tmp_path, monkeypatch):
    monkeypatch.setattr(nspawn, "RUNS", tmp_path)
    for name, owner in (("dead", 2 ** 22 + 1), ("alive", os.getpid())):
        (tmp_path / name / "upper").mkdir(parents=True)
        (tmp_path / name / "owner").write_text(f"{owner}\n")
    (tmp_path / "new" / "upper").mkdir(parents=True)          # no owner yet: being made
    assert nspawn.clean_stale() == ["dead"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alive", "new"]
