"""The two shipped units differ only where the instance names something: the kernel test
(tests/kernel/test_systemd.py) puts drl-agent.service through SIGKILL and the watchdog and
trusts this file for the template's restart, watchdog, capability and sandbox lines."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# the lines that name the instance's files, interface or device
PER_INSTANCE = ("ExecStart=", "ExecReload=", "StateDirectory=", "Description=", "Wants=", "After=sys-subsystem")


def directives(name: str) -> list[str]:
    lines = (ROOT / "systemd" / name).read_text().splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")
            and not line.startswith(PER_INSTANCE)]


def test_the_template_unit_is_the_plain_unit_but_for_its_instance():
    assert directives("drl-agent@.service") == directives("drl-agent.service")


def test_both_units_restart_on_failure_under_a_watchdog():
    for name in ("drl-agent.service", "drl-agent@.service"):
        got = directives(name)
        assert "Restart=on-failure" in got and any(d.startswith("WatchdogSec=") for d in got), name
