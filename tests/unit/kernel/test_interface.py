"""The real datapath and transport and their in-memory stand-ins implement one interface each."""
from __future__ import annotations

import inspect

import pytest

from drl.agent.gossip.interface import TransportPort
from drl.agent.gossip.memory import MemoryTransport
from drl.agent.gossip.transport import Standalone, UdpTransport
from drl.agent.kernel.datapath import Datapath
from drl.agent.kernel.fake import FakeDatapath
from drl.agent.kernel.interface import ClientDatapathPort, DatapathPort


def methods(protocol) -> dict[str, inspect.Signature]:
    own = {}
    for klass in reversed(protocol.__mro__):
        if klass in (object,) or klass.__name__ == "Protocol" or klass.__name__ == "Generic":
            continue
        own |= {name: inspect.signature(f) for name, f in vars(klass).items()
                if inspect.isfunction(f) and not name.startswith("_")}
    return own


@pytest.mark.parametrize("impl,protocol", [(Datapath, ClientDatapathPort), (FakeDatapath, DatapathPort),
                                           (UdpTransport, TransportPort), (Standalone, TransportPort),
                                           (MemoryTransport, TransportPort)])
def test_each_implementation_has_every_method_of_its_interface(impl, protocol):
    for name, sig in methods(protocol).items():
        assert callable(getattr(impl, name, None)), f"{impl.__name__} lacks {name}"
        required = [p for p in sig.parameters.values() if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
        try:        # callable as the service calls it: the interface's positional arguments
            inspect.signature(getattr(impl, name)).bind(*[None] * len(required))
        except TypeError as e:
            pytest.fail(f"{impl.__name__}.{name} does not take {[p.name for p in required]}: {e}")
