"""Per-client rules, windows and the decisions about which client to throttle or ban.

Pure (``table``): rules parsed from the class options, sliding windows, the
reports peers exchange and their sizes.  The service moves kernel counts in and
limits out (``service.client_rules``).

May import: the standard library and ``drl.agent.units``.
"""
