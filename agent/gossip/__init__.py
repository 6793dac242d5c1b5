"""Gossip: the one wire schema and the peer-to-peer exchange over UDP.

Owns the protobuf schema (``drl.proto``, generated ``drl_pb2``), the codec,
keys and replay windows (``wire``, ``lives``), batching and the send/receive
core (``core``), the UDP socket (``transport``), who is alive and what each
peer said (``membership``) and address parsing (``peers``).

May import: the standard library, protobuf, ``drl.agent.model``, ``units``,
``logs`` and ``clients`` (the reports it carries).  Never the kernel side,
cluster, config or service.
"""
