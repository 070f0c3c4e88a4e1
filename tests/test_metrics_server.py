"""The metrics endpoint under idle, slow and excess connections (real sockets, real TLS): scrapes and probes still answer."""
from __future__ import annotations

import http.client
import shutil
import socket
import ssl
import threading
import time
import urllib.request

import bcrypt
import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter
from support import make_pki, wait_for

from prism.serve.metrics import Health, MetricsServer, parse_listen_address

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _connect(address):
    host, port = parse_listen_address(address)
    return socket.create_connection((host, port), timeout=30)


def _closed_by_server(sock, within_s):
    """True if the server closes ``sock`` (EOF or reset) within ``within_s``."""
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionResetError, ssl.SSLError):
        return True
    except (TimeoutError, socket.timeout):
        return False


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_server(pki, tmp_path, **kwargs):
    cfg = tmp_path / "web.yml"
    cfg.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": str(pki / "server.pem"), "key_file": str(pki / "server.key")},
        "basic_auth_users": {"prometheus": bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()},
    }))
    registry = CollectorRegistry()
    Counter("prism_test_events", "a metric to find in the scrape", registry=registry).inc(3)
    health = Health()
    health.ready = True
    return MetricsServer(registry, health, "127.0.0.1:0", web_config=str(cfg), **kwargs).start()


def _timed_get(address, path, ca, auth=None):
    """(seconds from connect to the whole answer, status, body) of one HTTPS request."""
    host, port = parse_listen_address(address)
    ctx = ssl.create_default_context(cafile=str(ca))
    headers = {"Authorization": "Basic " + __import__("base64").b64encode(auth.encode()).decode()} if auth else {}
    t0 = time.monotonic()
    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=30)
    try:
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        body = r.read()
        return time.monotonic() - t0, r.status, body
    finally:
        conn.close()


class _Slowloris:
    """Connections that finish the TLS handshake, then send one header line every ``every_s`` and never end the request."""

    def __init__(self, address, ca, n, every_s=1.0):
        host, port = parse_listen_address(address)
        ctx = ssl.create_default_context(cafile=str(ca))
        self.socks = []
        for _ in range(n):
            s = ctx.wrap_socket(socket.create_connection((host, port), timeout=30), server_hostname=host)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            self.socks.append(s)
        self.every_s = every_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._drip, daemon=True)
        self.thread.start()

    def _drip(self):
        i = 0
        while not self.stop.wait(self.every_s):
            i += 1
            for s in self.socks:
                try:
                    s.sendall(f"X-Drip-{i}: {i}\r\n".encode())
                except OSError:
                    pass

    def close(self):
        self.stop.set()
        self.thread.join()
        for s in self.socks:
            s.close()


@needs_openssl
def test_scrape_and_probe_answer_while_idle_and_slowloris_sockets_are_open(pki, tmp_path):
    """200 TCP connections that never start a TLS handshake and 64 that trickle a request never finished:
    a scrape and /healthz each still answer within 2 s (measured from connect to the whole answer)."""
    server = _tls_server(pki, tmp_path)
    ca = pki / "ca.pem"
    slow = idle = None
    try:
        slow = _Slowloris(server.address, ca, 64)  # first: 64 handshakes take a while on a loaded machine
        idle = [_connect(server.address) for _ in range(200)]
        took, status, body = _timed_get(server.address, "/metrics", ca, "prometheus:secret")
        assert status == 200 and b"prism_test_events_total 3.0" in body
        assert took < 2.0, f"a scrape took {took:.2f} s with 200 idle and 64 slowloris connections open"
        took, status, body = _timed_get(server.address, "/healthz", ca)
        assert status == 200 and body == b"ok\n"
        assert took < 2.0, f"/healthz took {took:.2f} s with 200 idle and 64 slowloris connections open"
        # the idle sockets were still open meanwhile: the answers did not come because they had been dropped
        still_open = 0
        for s in idle:
            s.setblocking(False)
            try:
                s.recv(1)
            except BlockingIOError:
                still_open += 1
            except OSError:
                pass
        assert still_open >= 150, f"only {still_open} of the 200 idle connections were still open"
    finally:
        if slow is not None:
            slow.close()
        for s in idle or ():
            s.close()
        server.stop()


@needs_openssl
def test_handshake_and_request_deadlines_cut_off_idle_and_slow_clients(pki, tmp_path):
    """A connection that never starts its TLS handshake is closed at the handshake deadline; one that trickles
    header lines is closed at the request deadline, however steadily it sends (the sweep saw them open past 21 s)."""
    server = _tls_server(pki, tmp_path, handshake_timeout_s=1.0, request_timeout_s=2.0)
    ca = pki / "ca.pem"
    slow = None
    try:
        idle = _connect(server.address)
        t0 = time.monotonic()
        assert _closed_by_server(idle, 20), "an idle connection was not closed at the handshake deadline"
        assert time.monotonic() - t0 < 10
        slow = _Slowloris(server.address, ca, 1, every_s=0.3)
        t0 = time.monotonic()
        wait_for(lambda: server.httpd.timed_out >= 1, 20, "the slowloris connection to reach its request deadline")
        assert time.monotonic() - t0 < 10
        assert _closed_by_server(slow.socks[0], 5)
        took, status, _ = _timed_get(server.address, "/healthz", ca)
        assert status == 200
    finally:
        if slow is not None:
            slow.close()
        server.stop()


def test_idle_connections_at_the_cap_make_room_for_a_scrape():
    """At the connection cap, a new connection closes the oldest one that has sent no request: idle sockets cannot lock a scraper out."""
    health = Health()
    health.ready = True
    server = MetricsServer(CollectorRegistry(), health, "127.0.0.1:0", max_connections=4).start()
    try:
        idle = [_connect(server.address) for _ in range(4)]  # accepted in order, before the requests below
        for _ in range(3):
            with urllib.request.urlopen(f"http://{server.address}/healthz", timeout=30) as r:
                assert r.status == 200
        with urllib.request.urlopen(f"http://{server.address}/metrics", timeout=30) as r:
            assert r.status == 200
        assert server.httpd.evicted == 1  # room for one at a time: the oldest idle connection went
        assert _closed_by_server(idle[0], 10)
        assert not _closed_by_server(idle[1], 0.2)
        for s in idle:
            s.close()
    finally:
        server.stop()


@needs_openssl
def test_clients_that_never_read_their_answer_cannot_hold_the_cap(pki, tmp_path):
    """Over TLS, a client that sends a request and never reads the answer (nor our close_notify) keeps its
    connection open until the deadline; at the cap such connections make room for a new one too."""
    server = _tls_server(pki, tmp_path, max_connections=4, request_timeout_s=30.0)
    ca = pki / "ca.pem"
    host, port = parse_listen_address(server.address)
    ctx = ssl.create_default_context(cafile=str(ca))
    mute = []
    try:
        for _ in range(4):
            s = ctx.wrap_socket(socket.create_connection((host, port), timeout=30), server_hostname=host)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            mute.append(s)
        wait_for(lambda: all(c.answered for c in list(server.httpd.conns)) and len(server.httpd.conns) == 4, 20, "the four answers")
        took, status, _ = _timed_get(server.address, "/metrics", ca, "prometheus:secret")
        assert status == 200 and server.httpd.evicted >= 1 and server.httpd.refused == 0
    finally:
        for s in mute:
            s.close()
        server.stop()


def test_requests_malformed_or_too_large_are_refused_and_the_server_keeps_serving():
    health = Health()
    health.ready = True
    server = MetricsServer(CollectorRegistry(), health, "127.0.0.1:0").start()
    try:
        for request, status in ((b"GARBAGE\r\n\r\n", b"400"), (b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"a" * 20000 + b"\r\n\r\n", b"431"),
                                (b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", b"400"), (b"GET /healthz HTTP/1.0\r\n\r\n", b"200")):
            s = _connect(server.address)
            s.sendall(request)
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
            s.close()
            assert reply.startswith(b"HTTP/1.1 " + status), (request[:30], reply[:80])
        with urllib.request.urlopen(f"http://{server.address}/readyz", timeout=30) as r:
            assert r.status == 200 and r.read() == b"ready\n"
    finally:
        server.stop()


def test_readyz_says_degraded_and_names_unreadable_dumps_in_safe_text(tmp_path):
    """Dumps the directory source skipped leave /readyz 200 but "degraded", naming them; their names and errors
    (bytes from the file, a name that is not UTF-8, terminal escapes) are escaped and bounded, in the body and the labels."""
    import pandas as pd
    from prometheus_client.parser import text_string_to_metric_families

    from prism.ingest.topology import Topology
    from prism.serve.daemon import Daemon
    from prism.serve.metrics import PrismCollector
    from prism.serve.monitor import Monitor
    from prism.serve.sources import DirectorySource

    odd = b"dump\xff\x1b[31m.jsonl"  # not UTF-8, and an escape sequence that would recolour a terminal
    (tmp_path / "src").mkdir()
    with open(bytes(tmp_path / "src") + b"/" + odd, "wb") as f:
        f.write(b'{"src": "\x00\x01\xfe\x1b[2J junk"}\n' * 3)
    (tmp_path / "src" / ("x" * 240 + ".csv")).write_bytes(b"\x00\x01\x1b[2J,\x7f\n" + bytes(range(256)))
    topo = Topology.from_frame(pd.DataFrame({"ip": ["10.0.0.1", "10.0.1.1"], "server": ["s0", "s1"]}))
    monitor = Monitor(topo)
    health = Health()
    registry = CollectorRegistry()
    registry.register(PrismCollector(monitor, health))
    source = DirectorySource(tmp_path / "src")
    Daemon(source, monitor, health).run(max_seconds=3)  # two polls a file: the first notes its size
    assert len(source.bad_files) == 2
    server = MetricsServer(registry, health, "127.0.0.1:0").start()
    try:
        with urllib.request.urlopen(f"http://{server.address}/readyz", timeout=30) as r:
            assert r.status == 200
            body = r.read()
        text = body.decode("utf-8")
        assert text.startswith("ready, degraded: 2 dump files skipped as unreadable")
        assert "dump\\xff\\x1b[31m.jsonl" in text and "x" * 150 in text
        assert all(c.isprintable() for line in text.splitlines() for c in line)
        assert all(len(line) <= 2 + 200 + 2 + 200 for line in text.splitlines()[1:])
        with urllib.request.urlopen(f"http://{server.address}/metrics", timeout=30) as r:
            assert r.status == 200
            exposition = r.read().decode("utf-8")
        bad = [sample.labels for fam in text_string_to_metric_families(exposition) for sample in fam.samples if sample.name == "prism_source_bad_file_info"]
        assert {labels["file"][:4] for labels in bad} == {"dump", "xxxx"}
        assert "dump\\xff\\x1b[31m.jsonl" in {labels["file"] for labels in bad}
        for labels in bad:
            for value in labels.values():
                assert len(value) <= 200 and all(c.isprintable() for c in value), value
    finally:
        server.stop()


@pytest.mark.parametrize("address", ["127.0.0.1:65536", "127.0.0.1:port", "nohost"])
def test_bad_listen_addresses_are_value_errors(address):
    with pytest.raises(ValueError, match="--web.listen-address"):
        parse_listen_address(address)
