"""agent/units.py: the one place rates and sizes are parsed and printed."""
import pytest

from drl.agent.units import UnitError, format_rate, parse_rate


@pytest.mark.parametrize("Bps, text", [(6.25e6, "50 Mbit/s"), (1.5e9 / 8, "1.5 Gbit/s"), (1900 / 8, "1.9 kbit/s"),
                                       (100 / 8, "100 bit/s"), (1.8e-3, "0 bit/s"), (1.44e-6, "0 bit/s"), (0, "0 bit/s")])
def test_format_rate_reads_as_bits_per_second(Bps, text):
    assert format_rate(Bps) == text


def test_parse_rate_takes_bits_and_bytes_and_refuses_the_ambiguous():
    assert parse_rate("50mbit") == 6.25e6 and parse_rate("1MBps") == 1e6
    with pytest.raises(UnitError, match="ambiguous"):
        parse_rate("5mbps")
