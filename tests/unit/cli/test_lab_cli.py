"""drl-lab's commands: names, help, and one-line errors (nothing here needs root)."""
import os
import signal
import time

from click.testing import CliRunner

from drl.cli.lab import _guarded, main, render
from drl.lab.registry import builtin


def test_list_shows_every_builtin():
    res = CliRunner().invoke(main, ["list"])
    assert res.exit_code == 0
    for name in ("baseline", "flow-join", "bottleneck", "web", "demand-shift"):
        assert name in res.output


def test_help_names_the_commands():
    res = CliRunner().invoke(main, ["--help"])
    assert res.exit_code == 0
    assert all(cmd in res.output for cmd in ("run", "list", "clean", "demo"))


def test_bad_file_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[experiment]\nduration = "5s"\nglobal = "10mbps"\n')
    res = CliRunner().invoke(main, ["run", str(bad)])
    assert res.exit_code == 1
    assert res.output.startswith("Error: ") and "bad.toml:3: [experiment]: field 'global'" in res.output
    assert "Traceback" not in res.output


def test_unknown_experiment():
    res = CliRunner().invoke(main, ["run", "nosuch"])
    assert res.exit_code == 1 and "no experiment 'nosuch'" in res.output


def test_bad_duration_is_a_usage_error():
    res = CliRunner().invoke(main, ["run", "baseline", "--duration", "-5s"])
    assert res.exit_code == 2 and "duration" in res.output


def test_repeat_on_vagrant_is_refused_before_anything_boots(tmp_path):
    res = CliRunner().invoke(main, ["run", "baseline", "--on", "vagrant", "--repeat", "2"])
    assert res.exit_code == 2 and "runs each allocator once" in res.output and "not 2 times" in res.output
    # A file's own repeat too, and --repeat 1 is the way out of it.
    mine = tmp_path / "mine.toml"
    mine.write_text(builtin()["baseline"].read_text()
                    .replace("\nrepeat = ", "\nrepeat = 3 #", 1))
    res = CliRunner().invoke(main, ["run", str(mine), "--on", "vagrant"])
    assert res.exit_code == 2 and "not 3 times" in res.output


def _run(alloc, jain, shares):
    return {"experiment": "baseline", "allocator": alloc, "repeat": 1, "global_limit_bps": 10e6,
            "aggregate_bps": 9.8e6, "utilization": 0.98, "jain_index": jain,
            "limiters": [{"name": n, "flows": f, "share": s} for n, f, s in shares]}


def test_render_puts_allocators_side_by_side():
    runs = [_run("fps", 0.95, [("l1", 3, 0.3), ("l2", 7, 0.7)]), _run("ctb", 0.97, [("l1", 3, 0.31), ("l2", 7, 0.69)])]
    text = render({"experiment": "baseline", "runs": runs,
                   "comparison": [{"allocator": "fps", "runs": 1, "jain_index": 0.95},
                                  {"allocator": "ctb", "runs": 1, "jain_index": 0.97}]})
    lines = text.splitlines()
    assert lines[0].split() == ["baseline", "fps", "ctb"]
    assert any(l.split()[:2] == ["l2", "share"] and "0.700" in l and "0.690" in l for l in lines)
    assert any(l.startswith("Jain's index") and "0.950" in l and "0.970" in l for l in lines)


def test_render_of_repeated_runs_heads_the_columns_with_the_run_shown():
    runs = [_run("fps", 0.95, [("l1", 3, 0.3)]), _run("ctb", 0.97, [("l1", 3, 0.31)])]
    text = render({"experiment": "baseline", "runs": runs,
                   "comparison": [{"allocator": "fps", "runs": 2, "jain_index": 0.963},
                                  {"allocator": "ctb", "runs": 2, "jain_index": 0.982}]})
    lines = text.splitlines()
    assert lines[0].split() == ["baseline", "fps", "run", "1", "ctb", "run", "1"]
    assert "  0.963 mean of 2   0.982 mean of 2" in lines[-1]


def test_a_fork_of_the_lab_dies_of_sigterm_instead_of_tearing_the_run_down():
    """pyroute2's NetNS forks a helper from the lab and stops it with SIGTERM; with the
    lab's handler the helper would raise KeyboardInterrupt and tear down the live run."""
    old = signal.getsignal(signal.SIGTERM)
    ready_r, ready_w = os.pipe()

    def fork_a_helper() -> int:
        pid = os.fork()
        if pid == 0:                              # the helper: never return into pytest
            try:
                os.write(ready_w, b"x")
                time.sleep(10)
            except BaseException:
                os._exit(130)                     # what the lab's handler would make of it
            os._exit(0)
        return pid

    try:
        pid = _guarded(fork_a_helper)
        os.read(ready_r, 1)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    finally:
        signal.signal(signal.SIGTERM, old)
        os.close(ready_r)
        os.close(ready_w)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
