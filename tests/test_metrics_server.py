"""The metrics endpoint under idle and excess connections: bounded threads, prompt answers."""
import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from prism.serve.metrics import Health, MetricsServer, parse_listen_address


def _connect(address):
    host, port = parse_listen_address(address)
    return socket.create_connection((host, port), timeout=30)


def test_idle_and_excess_connections_cannot_starve_scrapes():
    health = Health()
    health.ready = True
    server = MetricsServer(CollectorRegistry(), health, "127.0.0.1:0", max_connections=4, idle_timeout_s=1.0).start()
    try:
        idle = [_connect(server.address) for _ in range(4)]
        # each idle socket holds a slot once accepted; one more is answered 503 and closed, not queued
        over = _connect(server.address)
        reply = over.recv(200)
        assert reply.startswith(b"HTTP/1.0 503") and b"too many open connections" in over.recv(200) + reply
        assert server.httpd.refused >= 1
        # an idle socket that never sends a request is dropped after the idle timeout
        for s in idle:
            assert s.recv(100) == b""  # closed by the server (the 30 s socket timeout would raise instead)
            s.close()
        with urllib.request.urlopen(f"http://{server.address}/healthz", timeout=30) as r:
            assert r.status == 200
    finally:
        server.stop()


@pytest.mark.parametrize("address", ["127.0.0.1:65536", "127.0.0.1:port", "nohost"])
def test_bad_listen_addresses_are_value_errors(address):
    with pytest.raises(ValueError, match="--web.listen-address"):
        parse_listen_address(address)
