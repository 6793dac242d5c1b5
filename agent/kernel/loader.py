"""Compile bpf/limiter.c with bcc: the program's source as bcc must see it, and the compile.

bcc rewrites map calls (``m.lookup(k)``) into map-fd loads only in the source it is
handed, never in a header that source includes (the call would reach the verifier as
a load from address 0).  The program keeps one header per stage, katran- and
cilium-style, each with the map calls of its stage; :func:`program_source` hands bcc
limiter.c with those headers inlined, each once (as their ``#pragma once`` asks),
under ``#line`` so clang's messages and the verifier's source lines still name the
header and its line.  Kernel headers (``<...>``) stay includes.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from drl.agent import abi
from drl.agent.kernel.maps import DatapathError

try:
    from bcc import BPF
except ImportError:  # reported by Datapath() as a DatapathError
    BPF = None

# bpf/ beside agent/ in a checkout, drl/bpf/ beside drl/agent/ in an installed wheel
BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"
MAIN = "limiter.c"
_OURS = re.compile(r'\s*#\s*include\s+"([^"]+)"')
_ONCE = re.compile(r"\s*#\s*pragma\s+once\b")


def program_source(bpf_dir: Path | None = None) -> str:
    """limiter.c from ``bpf_dir`` (default BPF_DIR) with every ``#include "x.h"`` of a file
    there replaced by that file, recursively, each file once."""
    bpf_dir = BPF_DIR if bpf_dir is None else bpf_dir
    return _inline(bpf_dir, MAIN, set())


def _inline(bpf_dir: Path, name: str, seen: set[str]) -> str:
    seen.add(name)
    path = bpf_dir / name
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise DatapathError(f"cannot read {path}: {e.strerror}") from None
    out = [f'#line 1 "{name}"']
    for number, line in enumerate(lines, 1):
        included = _OURS.match(line)
        if _ONCE.match(line):
            out.append("")                           # inlined once already: in the main file clang would warn
        elif not included:
            out.append(line)
        elif "/" in included[1] or not (bpf_dir / included[1]).is_file():
            raise DatapathError(f"{path}:{number}: {included[1]!r} is not a file of {bpf_dir}")
        else:
            if included[1] not in seen:
                out += [_inline(bpf_dir, included[1], seen), f'#line {number + 1} "{name}"']
            else:
                out.append("")
    return "\n".join(out)


def compile_program(max_flows: int, max_classes: int, max_clients: int, drop_action: int,
                    bpf_dir: Path | None = None):
    """The loaded bcc module, the sizes checked first; DatapathError with clang's first line."""
    for name, value in (("max_flows", max_flows), ("max_classes", max_classes), ("max_clients", max_clients)):
        if not 1 <= value <= 1 << 24:
            raise DatapathError(f"{name} {value} is not in 1..{1 << 24}")
    bpf_dir = BPF_DIR if bpf_dir is None else bpf_dir
    cflags = abi.cflags(MAX_FLOWS=max_flows, MAX_CLASSES=max_classes, MAX_CLIENTS=max_clients,
                        DROP_ACTION=drop_action)
    text = program_source(bpf_dir)
    try:
        # text, not src_file: bcc reads a src_file into text all the same, and then resolves
        # "..." includes against the working directory, where a stray limiter.h could be
        return BPF(text=text.encode(), cflags=cflags)
    except Exception as e:  # bcc raises bare Exception; clang's messages went to stderr
        # bcc says "Failed to compile" when bpf() refused its first map too: not a header problem
        from drl.agent.kernel.caps import bpf_refused
        if refused := bpf_refused():
            raise DatapathError(refused) from None
        headers = f"/lib/modules/{os.uname().release}/build"
        raise DatapathError(f"cannot compile {bpf_dir / MAIN} ({str(e).splitlines()[0]}); "
                            f"kernel headers tried: {headers}") from None


def load(bpf, name: str):
    """One entry point of the compiled module as a tc classifier (its fd, for a filter)."""
    try:
        return bpf.load_func(name.encode(), BPF.SCHED_CLS)
    except Exception as e:  # bcc raises bare Exception with the verifier log on stderr
        raise DatapathError(f"kernel refused the BPF program: {str(e).splitlines()[0]}") from None


def prog_id(fd: int) -> int:
    """The kernel's id of a loaded program (what a tc filter dump reports as TCA_BPF_ID)."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("prog_id:"):
                return int(line.split()[1])
    raise DatapathError("cannot read the loaded program's id (kernel too old: no prog_id in fdinfo)")
