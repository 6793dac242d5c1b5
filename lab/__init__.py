"""drl lab: the paper's experiments on network namespaces, one command each.

    drl-lab list                       # the built-in experiments
    drl-lab run baseline --duration 20 --out results/baseline
    drl-lab run my-topology.toml       # a file of your own, same format

Layers, each usable alone: ``spec`` (the experiment as data) <- ``reader``
(the TOML format) -> ``preflight`` (what the run needs of this machine) ->
``topology`` (names, addresses, routes and the commands that build them; pure)
-> ``netns`` (execute and tear down; ``delay``: the delay line for link delay
and loss where the kernel has no netem) -> ``agents``/``traffic`` (processes in
the namespaces) -> ``faults`` (signals and nftables during a run) ->
``collector`` (samples) -> ``metrics`` -> ``results`` -> ``plots``;
``runner`` wires one run.  docs/lab.md documents the format and the naming.

The kernel tests and benchmarks use the same layers on topologies built in
code (``topology.pair``, ``topology.star``), with ``agents.Cluster``, the
iperf3 helpers of ``traffic`` and the readings of ``measure``.
"""
