"""A throw-away etcd server (Debian's ``etcd-server``) for tests and experiments.

    with Etcd() as etcd:                         # 127.0.0.1, free ports, a temporary data dir
        reg = Registry(RegistryConfig(etcd.endpoints, "t"), ...)
        etcd.stop(); etcd.start()                # an outage: same ports, same data
    with Etcd(host=lab.host("h1")) as etcd: ...  # inside a lab namespace, on h1's address
    tls = make_certs(tmp_path, "127.0.0.1")      # a CA, a server and a client certificate (openssl)
    with Etcd(tls=tls) as etcd: ...              # https, client certificates required

The server is always stopped and its directory removed on exit, even when the
body fails; stop() and start() keep the data dir, so members and classes
survive an outage as they would on a real cluster.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from drl.agent.gossip.peers import format_addr
from drl.lab.errors import LabError
from drl.lab.netns import Host, stop

ETCD = "etcd"                     # /usr/bin/etcd from Debian's etcd-server
CLIENT_PORT, PEER_PORT = 2379, 2380
READY = b"serving client traffic"     # logged once etcd answers clients (embed/serve.go)
START_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class TLSFiles:
    ca: str                           # the CA that signed both certificates
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Etcd:
    """One single-member etcd; ``host`` a lab Host to run it in that namespace."""

    def __init__(self, addr: str | None = None, *, host: Host | None = None, tls: TLSFiles | None = None):
        self.host, self.tls = host, tls
        self.addr = addr or (host.addr4 if host else "127.0.0.1")
        # in a fresh namespace the well-known ports are free; on the machine pick unused ones
        self.port = CLIENT_PORT if host else free_port(self.addr)
        self.peer_port = PEER_PORT if host else free_port(self.addr)
        self.dir = Path(tempfile.mkdtemp(prefix="drl-etcd-"))
        self.proc: subprocess.Popen | None = None

    @property
    def endpoints(self) -> tuple[tuple[str, int], ...]:
        return ((self.addr, self.port),)

    @property
    def url(self) -> str:
        """The --registry value that reaches this server."""
        return f"etcd://{format_addr((self.addr, self.port))}"

    def __enter__(self) -> "Etcd":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def argv(self) -> list[str]:
        scheme = "https" if self.tls else "http"
        client = f"{scheme}://{format_addr((self.addr, self.port))}"
        peer = f"http://{format_addr((self.addr, self.peer_port))}"
        argv = [ETCD, "--name", "drl", "--data-dir", str(self.dir / "data"), "--logger", "zap",
                "--log-outputs", "stderr", "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"drl={peer}"]
        if self.tls:
            argv += ["--cert-file", self.tls.server_cert, "--key-file", self.tls.server_key,
                     "--trusted-ca-file", self.tls.ca, "--client-cert-auth"]
        return argv

    def start(self) -> None:
        """Start (or restart after stop()) and wait until it serves clients; LabError otherwise."""
        if shutil.which(ETCD) is None:
            raise LabError("etcd not found: apt-get install --no-install-recommends etcd-server")
        log = self.dir / "etcd.log"
        log.write_bytes(b"")
        if self.host:
            self.proc = self.host.popen(*self.argv(), log=log)
        else:
            with open(log, "ab") as out:
                self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while READY not in log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_bytes()[-600:].decode(errors="replace")
                self.stop()
                raise LabError(f"etcd did not start on {self.url}: {tail}")
            time.sleep(0.05)

    def stop(self, kill: bool = False) -> None:
        """Stop the server, keeping its data (SIGTERM, or SIGKILL with ``kill``)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if kill and proc.poll() is None:
                proc.kill()
            stop(proc)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def make_certs(directory: Path, ip: str) -> TLSFiles:
    """A CA, a server certificate for ``ip`` and a client certificate, by openssl, in ``directory``."""
    d = Path(directory)
    files = TLSFiles(*(str(d / n) for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=drl-test-ca",
             "-keyout", str(d / "ca.key"), "-out", files.ca)
    # clientAuth too: etcd's HTTP gateway calls its own gRPC port presenting the server certificate
    _sign(d, "server", f"subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth,clientAuth", files.ca)
    _sign(d, "client", "extendedKeyUsage=clientAuth", files.ca)
    return files


def _sign(d: Path, name: str, extensions: str, ca: str) -> None:
    (d / f"{name}.ext").write_text(extensions + "\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=drl-test-{name}",
             "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))
    _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", ca, "-CAkey", str(d / "ca.key"),
             "-CAcreateserial", "-days", "2", "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.pem"))


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(f"openssl {args[0]}: {result.stderr.strip()[-300:]}")
