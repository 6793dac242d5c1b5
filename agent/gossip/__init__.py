"""Gossip: the one wire schema and the peer-to-peer exchange over UDP.

Owns the protobuf schema (``drl.proto``, generated ``drl_pb2``), the codec
(``wire``), the cluster key file (``keys``), a sender's lives and their replay windows
(``lives``), batching and the send/receive
core (``core``), the UDP socket (``transport``), who is alive and what each
peer said (``membership``) and address parsing (``peers``); the interface the daemon
is typed against (``interface``) and an in-memory transport for tests and tools (``memory``).

May import: the standard library, protobuf, ``drl.agent.model``, ``units``,
``logs`` and ``clients`` (the reports it carries).  Never the kernel side,
cluster, config or service.
"""
