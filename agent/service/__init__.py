"""The service: the tick loop wiring every layer, and the operator's ways in.

Owns the daemon and its tick (``daemon``), the per-class run table
(``class_table``), per-client rules at run time (``client_rules``), the
control socket (``control``), Prometheus metrics (``metrics``) and the systemd
notify protocol (``notify``).

May import: every other part of ``drl.agent``.  Never ``drl.cli``: the CLI
calls into the service, not the reverse.
"""
