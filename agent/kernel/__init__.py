"""The kernel side: everything that touches the tc-egress program and its maps.

Owns compiling and attaching bpf/limiter.c and talking to its maps (``datapath``,
made of ``loader``, ``attach``, ``class_maps``, ``rule_maps``, ``client_maps``,
``flows`` and ``maps``), laying out the classification maps (``classify``), the token-bucket arithmetic both sides share (``bucket``),
HTB shape mode (``shaper``), netlink and tc requests by hand (``rtnetlink``), the
one-agent-per-interface lock (``lock``) and the capability check (``caps``).
``interface`` is what the daemon is typed against; ``fake`` is an in-memory stand-in
with that interface, for tests and tools that run without a kernel.

May import: the standard library, bcc and pyroute2, ``drl.agent.abi``,
``model``, ``units``, ``logs``, and the pure specs of ``classes`` and
``clients``.  Never allocators, gossip, cluster, config or service: the
datapath sits below allocation and gossip.
"""
