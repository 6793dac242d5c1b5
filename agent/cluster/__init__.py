"""The cluster beyond gossip: etcd membership and the versioned global limits.

Owns the etcd v3 JSON gateway client (``etcd``), the registry that turns etcd
keys into members and class tables (``registry``) and the limit book whose
newest version wins on every agent (``limits``).  Read once and then watched;
never on the per-interval path.

May import: the standard library, ``drl.agent.logs``, ``units`` and
``gossip.peers``.  Never the kernel side, config or service.
"""
