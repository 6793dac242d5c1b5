"""agent/abi.py is the one table of the constants bpf/ uses: no root, no compiler."""
from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

from drl.agent import abi
from drl.agent.kernel import loader

BPF_DIR = Path(__file__).resolve().parents[3] / "bpf"
ABI_PY = Path(abi.__file__)
PKT_CLS = Path("/usr/include/linux/pkt_cls.h")
KERNEL_PREFIXES = ("TC_ACT_", "ETH_P_", "IPPROTO_", "BPF_")


def c_source() -> str:
    """Every file of bpf/, comments and strings left out."""
    text = "\n".join(path.read_text() for path in sorted(BPF_DIR.glob("*.[ch]")))
    return re.sub(r'/\*.*?\*/|"[^"\n]*"', "", text, flags=re.S)


def c_defines() -> list[str]:
    return re.findall(r"#\s*define\s+(\w+)", c_source())


def given() -> list[str]:
    """The names cflags() hands the compiler, load-time choices included, in order."""
    return [flag[2:].split("=")[0] for flag in abi.cflags(DROP_ACTION=abi.DROP_ACTIONS["stolen"])]


def test_each_constant_is_declared_once_in_the_table():
    """One assignment per upper-case name in agent/abi.py: a second one would silently win."""
    names = [target.id for node in ast.parse(ABI_PY.read_text()).body if isinstance(node, (ast.Assign, ast.AnnAssign))
             for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
             if isinstance(target, ast.Name) and target.id.isupper()]
    assert [name for name, n in Counter(names).items() if n > 1] == []


def test_cflags_gives_each_name_once():
    assert [name for name, n in Counter(given()).items() if n > 1] == []


def test_c_defines_no_constant_of_the_table():
    """Declared in the table, never again in C (nor twice in C)."""
    defined = c_defines()
    assert set(defined) & set(given()) == set()
    assert [name for name, n in Counter(defined).items() if n > 1] == []


def test_every_upper_case_name_the_c_code_uses_is_known():
    """A constant used in C but neither defined there, nor from a kernel header, nor from abi: missing."""
    text = c_source()
    used = set(re.findall(r"\b([A-Z][A-Z0-9_]{3,})\b", text))
    kernel = {n for n in used if n.startswith(KERNEL_PREFIXES)} | {"NULL"}
    assert used - set(c_defines()) - kernel - set(given()) == set()


def test_the_c_side_refuses_to_compile_without_the_table():
    consts = (BPF_DIR / "consts.h").read_text()
    assert re.search(r"#ifndef DRL_ABI\s*\n\s*#error", consts)
    assert "-DDRL_ABI=1" in abi.cflags()


def test_cflags_refuses_a_name_the_table_does_not_declare():
    with pytest.raises(ValueError, match="MAX_FLOW"):
        abi.cflags(MAX_FLOW=1)


def test_a_free_prefix_length_slot_is_longer_than_any_key():
    """classify.h longest_prefix skips lengths its family cannot have, free slots with them."""
    assert 8 + 128 < abi.NO_PREFIX_LENGTH <= 0xFF      # settings.dst_lengths is __u8


def test_cflags_override_sizes():
    assert "-DMAX_FLOWS=65536" in abi.cflags(MAX_FLOWS=65536)
    assert "-DMAX_KEYS=512" in abi.cflags(MAX_CLASSES=256)
    assert f"-DPROB_ONE={1 << 32}ULL" in abi.cflags()


def test_drop_actions_are_the_kernels():
    if not PKT_CLS.exists():
        pytest.skip(f"{PKT_CLS} not installed (linux-libc-dev): cannot compare TC_ACT_* values")
    values = dict(re.findall(r"#define (TC_ACT_\w+)\s+(\d+)", PKT_CLS.read_text()))
    assert abi.DROP_ACTIONS == {"shot": int(values["TC_ACT_SHOT"]), "stolen": int(values["TC_ACT_STOLEN"])}


def test_the_program_source_inlines_each_header_of_bpf_once():
    """bcc rewrites map calls only in the text it is given (agent/kernel/loader.py)."""
    text = loader.program_source(BPF_DIR)
    assert not re.search(r'^\s*#\s*include\s+"', text, flags=re.M)       # none left for clang
    assert not re.search(r"^\s*#\s*pragma\s+once", text, flags=re.M)
    starts = Counter(re.findall(r'^#line 1 "([^"]+)"$', text, flags=re.M))
    assert starts == Counter({path.name: 1 for path in BPF_DIR.glob("*.[ch]")}), starts
    assert text.count("int drl_egress(") == 1 and text.count("int drl_ingress(") == 1


def test_the_program_source_names_each_line_of_its_file(tmp_path):
    (tmp_path / "limiter.c").write_text('#include <x.h>\n#include "a.h"\nint main_line;\n#include "a.h"\n')
    (tmp_path / "a.h").write_text("#pragma once\nint a_line;\n")
    assert loader.program_source(tmp_path).splitlines() == [
        '#line 1 "limiter.c"', "#include <x.h>", '#line 1 "a.h"', "", "int a_line;", '#line 3 "limiter.c"',
        "int main_line;"]


def test_the_program_source_refuses_an_include_from_elsewhere(tmp_path):
    (tmp_path / "limiter.c").write_text('#include "../limiter.h"\n')
    with pytest.raises(loader.DatapathError, match="not a file of"):
        loader.program_source(tmp_path)
