"""The agent's configuration: one model that flags, the TOML file and etcd feed.

``build`` checks options and turns them into an ``AgentConfig`` and its
``ClassConf`` entries.

May import: allocators, classes, clients, cluster, gossip (addresses, keys),
the kernel side's constants and capability names, ``model``, ``units``.
Never ``service``, ``drl.cli`` or click.
"""
