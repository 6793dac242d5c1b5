"""agent/abi.py is the one source of the constants bpf/limiter.{h,c} use: no root, no compiler."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from drl.agent import abi

BPF_DIR = Path(__file__).resolve().parents[3] / "bpf"
PKT_CLS = Path("/usr/include/linux/pkt_cls.h")


def c_source() -> str:
    text = "\n".join((BPF_DIR / name).read_text() for name in ("limiter.h", "limiter.c"))
    return re.sub(r'/\*.*?\*/|"[^"\n]*"', "", text, flags=re.S)   # comments and strings


def guarded_names() -> set[str]:
    """Names limiter.h refuses to compile without (#ifndef X / #error, or !defined(X))."""
    text = c_source()
    return set(re.findall(r"#ifndef (\w+)\s*\n\s*#error", text)) | set(re.findall(r"!defined\((\w+)\)", text))


def test_limiter_h_defines_none_of_the_shared_constants_itself():
    defined = set(re.findall(r"#define (\w+)", c_source()))
    assert not defined & guarded_names(), defined & guarded_names()


def test_every_guarded_constant_comes_from_cflags():
    given = {flag[2:].split("=")[0] for flag in abi.cflags(DROP_ACTION=abi.DROP_ACTIONS["stolen"])}
    assert guarded_names() and guarded_names() <= given, guarded_names() - given


def test_every_upper_case_name_the_c_code_uses_is_known():
    """A constant used in C but neither defined there, nor from a kernel header, nor from abi."""
    text = c_source()
    used = set(re.findall(r"\b([A-Z][A-Z0-9_]{3,})\b", text))
    local = set(re.findall(r"#define (\w+)", text))
    kernel = {n for n in used if n.startswith(("TC_ACT_", "ETH_P_", "IPPROTO_", "BPF_"))} | {"NULL"}
    from_abi = {flag[2:].split("=")[0] for flag in abi.cflags(DROP_ACTION=0)}
    assert used - local - kernel - from_abi == set()


def test_a_free_prefix_length_slot_is_longer_than_any_key():
    """limiter.c longest_prefix skips lengths its family cannot have, free slots with them."""
    assert 8 + 128 < abi.NO_PREFIX_LENGTH <= 0xFF      # settings.dst_lengths is __u8


def test_cflags_override_sizes():
    assert "-DMAX_FLOWS=65536" in abi.cflags(MAX_FLOWS=65536)
    assert f"-DPROB_ONE={1 << 32}ULL" in abi.cflags()


def test_drop_actions_are_the_kernels():
    if not PKT_CLS.exists():
        pytest.skip(f"{PKT_CLS} not installed (linux-libc-dev): cannot compare TC_ACT_* values")
    values = dict(re.findall(r"#define (TC_ACT_\w+)\s+(\d+)", PKT_CLS.read_text()))
    assert abi.DROP_ACTIONS == {"shot": int(values["TC_ACT_SHOT"]), "stolen": int(values["TC_ACT_STOLEN"])}
