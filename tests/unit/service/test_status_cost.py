"""drlctl status with many classes: built in one pass, never asking the shaper for its rates
per class (Shaper.rates is a copy: 20,000 classes took ~25 s of the loop, 1.3 ms each)."""
from __future__ import annotations

import time

from daemon_harness import FakeDatapath, FakeShaper, file_agent

HEAD = ('[agent]\niface = "lo"\nnode_id = "a"\nlisten = "10.0.0.1:7470"\ninsecure = true\ninterval = "1s"\n'
        'allocator = "static"\nenforce = "police"\n')


class CountingShaper(FakeShaper):
    asked = 0

    @property
    def rates(self):
        CountingShaper.asked += 1
        return self._rates

    @rates.setter
    def rates(self, value):
        self._rates = value


def test_status_of_2000_classes_asks_the_shaper_once_and_takes_well_under_a_second(tmp_path, monkeypatch):
    monkeypatch.setattr("daemon_harness.FakeShaper", CountingShaper)
    classes = "".join(f'[[class]]\nname = "c{i}"\nmatch = "dst=10.0.{i // 256}.{i % 256}/32"\nglobal = "10mbit"\n'
                      for i in range(2000))
    agent, _ = file_agent(tmp_path, HEAD + classes, FakeDatapath())
    agent.tick(1.0)
    agent.tick(2.0)
    CountingShaper.asked = 0
    t = time.perf_counter()
    status = agent.status()
    took = time.perf_counter() - t
    assert len(status["classes"]) == 2000 and CountingShaper.asked == 1
    assert took < 1.0, took          # ~0.15 s here: linear in the classes
