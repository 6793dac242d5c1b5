"""The agent's allocators, estimator and gossip rules over a simulated network.

    drl-sim list
    drl-sim run scale --limiters 490 --out out/scale

or from Python::

    from drl.sim.engine import Setup, Simulation
    from drl.sim.tcp import Flows, TcpFluid
    sim = Simulation(Setup(allocator="fps", n_nodes=100, global_Bps=6.25e6, loss=0.01),
                     TcpFluid(Flows.build(node=[0, 1, 1]), 100, rng))
    trace = sim.run(600)

Modules: engine (the tick loop), network (loss, delay, crashes, partitions),
views (what each node heard, as numpy arrays), wiretap (real datagram sizes
and SeqWindow loss detection), tcp / openloop / quota (demand models),
trace (what a run recorded), experiments + scale / gdrl_graphs / dqmp_runs / churn
(the reproductions), plots.  See docs/sim.md.
"""
