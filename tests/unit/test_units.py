"""agent/units.py: the one place rates and sizes are parsed and printed."""
import pytest

from drl.agent import units
from drl.agent.units import UnitError, format_rate, parse_rate


@pytest.mark.parametrize("Bps, text", [(6.25e6, "50 Mbit/s"), (1.5e9 / 8, "1.5 Gbit/s"), (1900 / 8, "1.9 kbit/s"),
                                       (100 / 8, "100 bit/s"), (1.8e-3, "0 bit/s"), (1.44e-6, "0 bit/s"), (0, "0 bit/s")])
def test_format_rate_reads_as_bits_per_second(Bps, text):
    assert format_rate(Bps) == text


def test_parse_rate_takes_bits_and_bytes_and_refuses_the_ambiguous():
    assert parse_rate("50mbit") == 6.25e6 and parse_rate("1MBps") == 1e6
    with pytest.raises(UnitError, match="ambiguous"):
        parse_rate("5mbps")


# -- bounds: every value from outside, whichever way it came ---------------------------------

@pytest.mark.parametrize("text, why", [
    ("0bit", "below the floor of 8 kbit/s"), ("7kbit", "below the floor"),
    ("1000tbit", "above the ceiling of 1 Tbit/s"), ("1e300mbit", "above the ceiling"),
    ("1e400mbit", "above the ceiling"),        # inf: crashed the datapath's write
])
def test_a_rate_outside_its_bounds_is_refused_in_one_line(text, why):
    with pytest.raises(UnitError, match=why) as err:
        parse_rate(text)
    assert "\n" not in str(err.value) and repr(text) in str(err.value)


def test_the_bounds_themselves_are_rates():
    assert parse_rate("8kbit") == units.MIN_RATE_Bps and parse_rate("1tbit") == units.MAX_RATE_Bps


def test_the_ceiling_fits_the_datapath_and_the_wire():
    from drl.agent import abi
    from drl.agent.kernel.bucket import bucket_times, ns_per_byte
    per_byte = ns_per_byte(units.MAX_RATE_Bps)
    assert per_byte > 1 and (1e9 * 2**abi.NS_FRAC_BITS / units.MAX_RATE_Bps) / per_byte > 0.998
    assert ns_per_byte(units.MIN_RATE_Bps) < abi.MAX_NS_PER_BYTE
    assert bucket_times(units.MAX_RATE_Bps, units.MAX_AMOUNT)[1] <= abi.MAX_DEPTH_NS
    assert units.MAX_RATE_Bps / 1000 < 2**32          # wire.py: a local limit in kB/s, uint32


@pytest.mark.parametrize("text", ["1e400", "1e20", "10EB"])
def test_a_size_outside_its_bounds_is_refused(text):
    with pytest.raises(UnitError):
        units.parse_size(text)


@pytest.mark.parametrize("text", ["1e400s", "1e300d", "3651d"])
def test_a_duration_outside_its_bounds_is_refused(text):
    with pytest.raises(UnitError, match="ceiling"):
        units.parse_duration(text)
    assert units.parse_quota("10TB/3650d") == (10**13, 3650 * 86400.0)


@pytest.mark.parametrize("text", ["1us", "9ms", "0s", "11s", "1e400s"])
def test_an_interval_outside_10ms_to_10s_is_refused(text):
    with pytest.raises(UnitError):
        units.parse_interval(text)
    assert units.parse_interval("10ms") == 0.01 and units.parse_interval("100ms") == 0.1


@pytest.mark.parametrize("text", ["nan", "-0.1", "1.5", "inf", "x"])
def test_a_probability_outside_0_to_1_is_refused(text):
    with pytest.raises(UnitError):
        units.parse_probability(text)


@pytest.mark.parametrize("check, value", [
    (units.check_rate, float("nan")), (units.check_rate, float("inf")), (units.check_rate, -1.0),
    (units.check_rate, 0.0), (units.check_rate, 1e300), (units.check_rate, "1e6"), (units.check_rate, True),
    (units.check_amount, -1), (units.check_amount, float("nan")), (units.check_amount, 1e300),
    (units.check_duration, -1.0), (units.check_duration, 1e12),
    (units.check_version, -1), (units.check_version, 2**63 - 1), (units.check_version, 2**64 - 1),
    (units.check_version, 1.0),
])
def test_checked_numbers_outside_their_bounds_are_refused(check, value):
    with pytest.raises(UnitError):
        check(value)


def test_checked_numbers_inside_their_bounds_come_back():
    assert units.check_rate(6.25e6) == 6.25e6 and units.check_amount(0) == 0
    assert units.check_version(2**63 - 2) == 2**63 - 2 and units.check_duration(30.0) == 30.0
