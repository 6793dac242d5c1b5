"""A small client of etcd's v3 HTTP/JSON gateway (etcd >= 3.4, the ``/v3/`` paths), stdlib only.

    gw = Gateway(("127.0.0.1", 2379), ssl_context=None, timeout_s=1.0, mark=0x...)
    lease = gw.grant(5)
    gw.put("/drl/c/members/a", b'{"addr": "10.0.0.1:7470"}', lease)
    revision, kvs = gw.range_prefix("/drl/c/")
    watch = gw.watch_prefix("/drl/c/", revision + 1)
    for events in watch:                         # each: [(key, value or None for a delete), ...]
        ...                                      # watch.close() from another thread ends it

Only what agent/cluster/registry.py needs; docs/registry.md says why not a client
library.  Every failure (refused, timed out, TLS, an error reply, a watch
cancelled by the server) is one :class:`EtcdError`, so the caller has a single
thing to catch and retry.
"""
from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import sys
from typing import Iterator

from drl.agent.gossip.peers import HostPort, format_addr


class EtcdError(Exception):
    """etcd could not be reached or refused a request; one line."""


def make_ssl_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    """The client side of etcd's --trusted-ca-file / --client-cert-auth; raises EtcdError."""
    try:
        ctx = ssl.create_default_context(cafile=ca)
        if cert:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise EtcdError(f"cannot load the registry's TLS files: {e}") from None
    return ctx


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


def prefix_end(prefix: str) -> str:
    """The range_end that makes [prefix, end) every key starting with prefix."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class Gateway:
    """One etcd endpoint.  Each call opens its own connection: calls are rare (seconds apart),
    and a fresh connection never carries a half-read reply from a failed one into the next."""

    def __init__(self, endpoint: HostPort, ssl_context: ssl.SSLContext | None, timeout_s: float,
                 mark: int | None = None):
        self.endpoint, self.ssl_context, self.timeout_s = endpoint, ssl_context, timeout_s
        self.mark = mark          # SO_MARK: the agent's datapath lets its registry traffic pass unpoliced

    def __str__(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://{format_addr(self.endpoint)}"

    def connect(self, timeout_s: float | None) -> http.client.HTTPConnection:
        host, port = self.endpoint
        if self.ssl_context:
            conn = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=self.ssl_context)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
        if self.mark is not None:
            conn._create_connection = self._marked     # what connect() (and TLS's, under it) dials with
        return conn

    def _marked(self, address: HostPort, timeout: float | None = None, source_address=None) -> socket.socket:
        """socket.create_connection with SO_MARK set before the SYN, so that every packet of the
        connection carries it (bpf/classify.h exempt)."""
        error: OSError = OSError(f"cannot resolve {address[0]}")
        for family, kind, proto, _, sockaddr in socket.getaddrinfo(*address, type=socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.mark.to_bytes(4, sys.byteorder))
                sock.settimeout(timeout)
                sock.connect(sockaddr)
                return sock
            except OSError as e:
                sock.close()
                error = e
        raise error

    def call(self, path: str, body: dict) -> dict:
        """POST body to /v3/<path>; the JSON reply, or EtcdError."""
        conn = self.connect(self.timeout_s)
        try:
            conn.request("POST", "/v3/" + path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise EtcdError(f"{self}: {_reason(e)}") from None
        finally:
            conn.close()
        if resp.status != 200:
            raise EtcdError(f"{self}: /v3/{path}: HTTP {resp.status}: {_message(data)}")
        try:
            return json.loads(data)
        except ValueError:
            raise EtcdError(f"{self}: /v3/{path}: not a JSON reply") from None

    def grant(self, ttl_s: float) -> int:
        return int(self.call("lease/grant", {"TTL": max(1, round(ttl_s))})["ID"])

    def keepalive(self, lease: int) -> int:
        """The lease's new TTL in seconds; 0 when it has expired (its keys are gone)."""
        reply = self.call("lease/keepalive", {"ID": lease})
        return int(reply.get("result", {}).get("TTL", 0))

    def revoke(self, lease: int) -> None:
        self.call("kv/lease/revoke", {"ID": lease})

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        self.call("kv/put", {"key": _b64(key), "value": _b64(value), "lease": lease})

    def get(self, key: str) -> tuple[bytes, int] | None:
        """(value, mod_revision) of ``key``, or None when it does not exist."""
        kvs = self.call("kv/range", {"key": _b64(key)}).get("kvs", [])
        return (_unb64(kvs[0].get("value")), int(kvs[0].get("mod_revision", 0))) if kvs else None

    def put_if(self, key: str, value: bytes, mod_revision: int, lease: int = 0) -> bool:
        """Put ``key`` only if its mod_revision is still ``mod_revision`` (0: it does not exist):
        one transaction, so of two agents racing exactly one wins."""
        compare = {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": mod_revision}
        put = {"key": _b64(key), "value": _b64(value), "lease": lease}
        reply = self.call("kv/txn", {"compare": [compare], "success": [{"request_put": put}]})
        return bool(reply.get("succeeded"))

    def delete(self, key: str) -> int:
        """Delete ``key``; how many keys went (0 or 1)."""
        return int(self.call("kv/deleterange", {"key": _b64(key)}).get("deleted", 0))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix``; how many went."""
        return int(self.call("kv/deleterange", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})
                   .get("deleted", 0))

    def txn(self, absent: list[str], present: list[str], puts: dict[str, bytes], deletes: list[str]) -> bool:
        """One transaction: if every key of ``absent`` does not exist and every key of ``present``
        does, put ``puts`` and delete ``deletes``; whether it did."""
        compare = ([{"key": _b64(k), "target": "CREATE", "result": "EQUAL", "create_revision": 0} for k in absent]
                   + [{"key": _b64(k), "target": "CREATE", "result": "GREATER", "create_revision": 0}
                      for k in present])
        ops = ([{"request_put": {"key": _b64(k), "value": _b64(v)}} for k, v in puts.items()]
               + [{"request_delete_range": {"key": _b64(k)}} for k in deletes])
        return bool(self.call("kv/txn", {"compare": compare, "success": ops}).get("succeeded"))

    def range_prefix(self, prefix: str) -> tuple[int, dict[str, bytes]]:
        """(the store's revision at the read, {key: value}) for every key under prefix."""
        reply = self.call("kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})
        kvs = {_unb64(kv["key"]).decode(): _unb64(kv.get("value")) for kv in reply.get("kvs", [])}
        return int(reply["header"]["revision"]), kvs

    def watch_prefix(self, prefix: str, start_revision: int) -> "Watch":
        return Watch(self, prefix, start_revision)


class Watch:
    """A watch stream: iterate for batches of events; close() from any thread ends it.

    The stream has no timeout of its own (etcd sends nothing while nothing changes), so
    a hung server is noticed by the caller's lease keepalive, which then closes it."""

    def __init__(self, gw: Gateway, prefix: str, start_revision: int):
        self.gw = gw
        self.conn = gw.connect(gw.timeout_s)
        body = {"create_request": {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix)),
                                   "start_revision": start_revision}}
        try:
            self.conn.request("POST", "/v3/watch", json.dumps(body), {"Content-Type": "application/json"})
            self.resp = self.conn.getresponse()
            self.conn.sock.settimeout(None)      # connected and answered: from now on, wait for events
        except (OSError, http.client.HTTPException) as e:
            self.conn.close()
            raise EtcdError(f"{gw}: watch: {_reason(e)}") from None
        if self.resp.status != 200:
            self.conn.close()
            raise EtcdError(f"{gw}: watch: HTTP {self.resp.status}")

    def __iter__(self) -> Iterator[list[tuple[str, bytes | None]]]:
        """Until the stream fails (EtcdError); the reader drops the connection itself, as
        http.client's objects must not be closed under a thread reading them."""
        try:
            while True:
                try:
                    line = self.resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise EtcdError(f"{self.gw}: watch: {_reason(e)}") from None
                if not line:
                    raise EtcdError(f"{self.gw}: watch stream ended")
                if line.strip():
                    yield self._events(line)
        finally:
            self.conn.close()

    def _events(self, line: bytes) -> list[tuple[str, bytes | None]]:
        try:
            result = json.loads(line)["result"]
        except (ValueError, KeyError):
            raise EtcdError(f"{self.gw}: watch: {_message(line)}") from None
        if result.get("canceled") or result.get("compact_revision"):
            # compacted past our revision, or the server dropped the watch: the caller re-reads
            raise EtcdError(f"{self.gw}: watch cancelled: {result.get('cancel_reason') or 'compacted'}")
        return [(_unb64(e["kv"]["key"]).decode(), None if e.get("type") == "DELETE" else _unb64(e["kv"].get("value")))
                for e in result.get("events", [])]

    def close(self) -> None:
        """End the stream from any thread: the reader sees it end and drops the connection."""
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _reason(e: Exception) -> str:
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"TLS: {e.verify_message}"
    if isinstance(e, ssl.SSLEOFError):          # what a refused client certificate looks like from here
        return "TLS: the server ended the handshake (does it want a client certificate: --registry-cert?)"
    if isinstance(e, ssl.SSLError):
        return f"TLS: {e.reason or e}"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _message(data: bytes) -> str:
    """etcd's error text from an error reply ({"error": ..., "message": ...}), else the body."""
    try:
        body = json.loads(data)
        error = body.get("message") or body.get("error") or body
        if isinstance(error, dict):      # a watch's {"error": {"grpc_code": 14, "message": ...}}
            error = error.get("message") or error
        return str(error)
    except (ValueError, AttributeError):
        return data[:200].decode(errors="replace").strip()
