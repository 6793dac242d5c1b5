"""agent/kernel/caps.py bpf_refused: an EPERM from bpf(2) is named as such, not as a compile error."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

import pytest

from drl.agent.kernel.caps import BPF_REFUSED, bpf_refused


@pytest.mark.parametrize("err, said", [(errno.EPERM, BPF_REFUSED), (0, None), (errno.ENOMEM, None),
                                       (errno.EINVAL, None)])
def test_only_eperm_is_reported_as_refused(err, said):
    assert bpf_refused(lambda: err) == said


def test_the_line_names_both_causes_and_the_nspawn_flag():
    assert "\n" not in BPF_REFUSED
    for part in ("EPERM", "CAP_BPF", "seccomp", "--system-call-filter=bpf"):
        assert part in BPF_REFUSED


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_the_real_probe_as_root_and_as_root_without_capabilities():
    probe = "from drl.agent.kernel.caps import bpf_refused; print(bpf_refused())"
    as_root = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert as_root.stdout.strip() == "None"
    if open("/proc/sys/kernel/unprivileged_bpf_disabled").read().strip() == "0":
        pytest.skip("unprivileged bpf() is allowed on this kernel: nothing is refused")
    # still uid 0 (the checkout stays readable), but an empty bounding set: no CAP_BPF, no CAP_SYS_ADMIN
    capless = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-all", sys.executable, "-c", probe],
                             capture_output=True, text=True)
    assert capless.stdout.strip() == BPF_REFUSED, capless
