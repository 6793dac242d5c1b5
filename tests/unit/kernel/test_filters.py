"""Where drl's egress filter must go to run before another tool's (agent/kernel/filters.py), and
the bytes the interface sent that drl's program never counted (agent/kernel/unseen.py)."""
from drl.agent.kernel import unseen
from drl.agent.kernel.filters import Filter, ahead, place
from drl.agent.kernel.unseen import UnseenMeter

ALL = 0x0300                      # ETH_P_ALL as tcm_info holds it
OURS = 0xD1


def tp(prio, kind, *handles, protocol=ALL, prog=None):
    """One classifier as dumped: its handle-0 entry, then its filters in run order."""
    return [Filter(prio, 0, protocol, kind, None, "")] + [Filter(prio, h, protocol, kind, prog, "") for h in handles]


def test_nothing_ahead_stays_where_it_is():
    filters = tp(OURS, "bpf", OURS) + tp(300, "u32", 0x800)
    assert ahead(filters, OURS, OURS) == () and place(filters, OURS, OURS) == OURS


def test_ours_goes_one_pref_below_the_first_foreign_one():
    filters = tp(5, "u32", 0x800) + tp(20, "flower", 1) + tp(OURS, "bpf", OURS)
    assert ahead(filters, OURS, OURS) == (5, 20) and place(filters, OURS, OURS) == 4


def test_a_newer_bpf_program_at_our_pref_runs_first_and_is_ahead():
    filters = tp(OURS, "bpf", 7, OURS)
    assert ahead(filters, OURS, OURS) == (OURS,) and place(filters, OURS, OURS) == OURS - 1


def test_at_pref_1_ours_joins_a_bpf_classifier_of_its_protocol_and_nothing_else():
    assert place(tp(1, "bpf", 7) + tp(OURS, "bpf", OURS), OURS, OURS) == 1
    assert place(tp(1, "bpf", 7, protocol=0x0008) + tp(OURS, "bpf", OURS), OURS, OURS) is None
    assert place(tp(1, "u32", 0x800) + tp(OURS, "bpf", OURS), OURS, OURS) is None
    assert place(tp(1, "bpf", 7, OURS), 1, OURS) == 1          # a newer one ahead of ours at pref 1


def test_unseen_is_what_the_interface_sent_beyond_the_counts():
    m = UnseenMeter()
    assert m.observe(0.0, 2, 1_000, {0: 500, "bypass": 100}) is False and m.bps == 0
    assert m.observe(1.0, 2, 1_001_000, {0: 400_500, "bypass": 100_100}) is True     # 500 kB/s unseen
    assert m.on and m.bps == 500_000 * 8
    assert m.observe(2.0, 2, 2_001_000, {0: 1_380_500, "bypass": 100_100}) is True   # 20 kB of 1 MB: tolerated
    assert not m.on and m.bps == 20_000 * 8


def test_unseen_is_never_a_false_alarm():
    m = UnseenMeter()
    m.observe(0.0, 2, 0, {0: 1_000_000})
    assert m.observe(1.0, 2, 5_000, {0: 5_000}) is False and m.bps == 0   # a class reset: counted since
    assert m.observe(1.5, 2, 6_000, {0: 5_200, 1: 800}) is False and m.bps == 0   # a new class: all it counted
    assert m.observe(3.0, 3, 10, {0: 5_200, 1: 800}) is False             # a new interface's counter
    assert m.observe(4.0, 3, 10 + unseen.FLOOR_Bps, {0: 5_200, 1: 800}) is False and m.bps == unseen.FLOOR_Bps * 8
    assert not m.due(4.5) and m.due(5.0)
