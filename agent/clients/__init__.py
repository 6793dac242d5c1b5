"""Per-client rules, windows and the decisions about which client to throttle or ban.

All pure: rules parsed from the class options (``rules``), sliding window
counters (``windows``), the reports peers exchange and their sizes
(``reports``), and the table that turns local counts and peers' reports into
throttles and bans (``table``, which also re-exports the others' names).  The
service moves kernel counts in and limits out (``service.client_rules``).

May import: the standard library and ``drl.agent.units``.
"""
