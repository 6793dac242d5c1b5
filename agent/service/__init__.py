"""The service: the tick loop wiring every layer, and the operator's ways in.

Owns the daemon, its loop and tick (``daemon``; what one class or datagram throws is
caught and counted there: ``tick_errors``) and what the agent holds
beside it: the control commands (``commands``), the status tree (``status``),
following etcd's members and classes (``registry_sync``), limits between
peers (``limit_gossip``), drops by reason (``drops``), the change log lines
(``change_log``), signals (``signals``), what a host may send (``rates``);
the per-class run table (``class_table``), per-client rules at run time
(``client_rules``), the control socket (``control``), Prometheus metrics
(``metrics``), the systemd notify protocol (``notify``) and the hint for a class
that matches nothing (``unmatched``).

May import: every other part of ``drl.agent``.  Never ``drl.cli``: the CLI
calls into the service, not the reverse.
"""
