"""The agent's configuration: one model that flags, the TOML file and etcd feed.

``schema`` declares every option once (flag, TOML key, help, default, parser,
scope); cli/agent.py makes ``drl-agent up``'s flags from it.  ``toml`` reads
drl.toml and etcd's class tables by the schema's keys; ``load`` puts the
flags, the file and etcd together (and re-reads the file on a reload);
``build`` checks the options and turns them into a ``Config`` and its
``ClassConf`` entries.

May import: allocators, classes, clients, cluster, gossip (addresses, keys),
the kernel side's constants and capability names, ``model``, ``units``.
Never ``service``, ``drl.cli`` or click.
"""
