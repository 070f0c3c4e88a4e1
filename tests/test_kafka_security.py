"""Kafka TLS, mutual TLS and SASL against a real broker.

The broker is Tansu (as in the other daemon tests). The bundled Tansu 0.6
cannot serve TLS itself (its ``--cert`` and ``--key`` flags are declared as
conflicting, so neither works), so TLS is terminated by stunnel (OpenSSL) in
front of it, the way many sites put a TLS proxy before a broker: the
clients' TLS and certificate checks are real, and so is the broker behind.
The proxy requires a client certificate signed by the test CA (mutual TLS).

SASL: Tansu's ``--authentication`` is real SCRAM, but this build keeps no
users (``tansu user create`` succeeds and stores nothing in the memory and
S3 engines), so only the refusal side can be tested against it: bad
credentials end in a clear error, quickly, not a hang.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support import make_pki, stop_process, wait_for
from support import scrape_total as _scrape_total

from prism.serve.broker import LocalBroker, free_port
from prism.serve.kafkaconf import PASSWORD_ENV, KafkaConnectError, KafkaSecurity, check_connection
from prism.serve.live import stream_flows
from prism.serve.produce import FlowProducer
from prism.serve.sources import ensure_topic
from synthetic import preset

CONNECT_TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (make tools installs it)")
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_broker(pki):
    """Tansu behind a mutual-TLS listener; yields the TLS bootstrap address (the broker advertises it)."""
    if shutil.which("stunnel") is None:
        pytest.skip("stunnel is not installed (make tools installs it: apt-get install stunnel4)")
    tls_port = free_port()
    broker = LocalBroker(advertised=f"127.0.0.1:{tls_port}").start()
    conf = pki / "stunnel.conf"
    conf.write_text(f"foreground = yes\npid =\n[kafka]\naccept = 127.0.0.1:{tls_port}\nconnect = {broker.bootstrap}\n"
                    f"cert = {pki / 'server.pem'}\nkey = {pki / 'server.key'}\nCAfile = {pki / 'ca.pem'}\nverifyChain = yes\n")
    proxy = subprocess.Popen(["stunnel", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _listening(tls_port) or proxy.poll() is not None, 30, "stunnel to listen")
        assert proxy.poll() is None, "stunnel exited"
        yield f"127.0.0.1:{tls_port}", broker
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        broker.stop()


def _listening(port):
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False


def mtls(pki, ca="ca.pem", client=True):
    return KafkaSecurity("SSL", ca_file=str(pki / ca), cert_file=str(pki / "client.pem") if client else None,
                         key_file=str(pki / "client.key") if client else None)


def test_daemon_over_mutual_tls(tls_broker, pki, tmp_path):
    """`prism daemon` with --kafka.tls.* flags ingests every record a TLS producer sent."""
    bootstrap, _ = tls_broker
    security = mtls(pki)
    check_connection(bootstrap, security, CONNECT_TIMEOUT_S)
    topic = f"flows-{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, 2, security=security)
    cluster = preset("tiny", seed=1, duration_s=4.0).generate()
    topo_csv = tmp_path / "topology.csv"
    cluster.topology.to_csv(topo_csv, index=False)
    producer = FlowProducer(bootstrap, topic, fmt="arrow", security=security)
    stream_flows(producer, cluster.flows, speed=0)
    producer.flush()
    producer.close()
    port = free_port()
    cmd = [sys.executable, "-m", "prism", "daemon", "--topology", str(topo_csv), "--kafka.bootstrap-servers", bootstrap, "--kafka.topic", topic,
           "--kafka.group-id", f"g-{topic}", "--kafka.summary-topic", f"sum-{topic}", "--kafka.session-timeout", "3s",
           "--kafka.max-poll-interval", "3s", "--web.listen-address", f"127.0.0.1:{port}", "--window", "3s", "--window.step", "1s",
           "--kafka.security-protocol", "SSL", "--kafka.tls.ca-file", str(pki / "ca.pem"),
           "--kafka.tls.cert-file", str(pki / "client.pem"), "--kafka.tls.key-file", str(pki / "client.key"), "--log.level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: proc.poll() is not None or (_scrape_total(port, "prism_flows_ingested_total") or 0) >= len(cluster.flows), 60,
                 "the daemon to ingest over TLS", progress=lambda: _scrape_total(port, "prism_flows_ingested_total"))
        assert proc.poll() is None, proc.stderr.read()
        assert _scrape_total(port, "prism_flows_ingested_total") == len(cluster.flows)
    finally:
        stop_process(proc)
    assert proc.returncode == 0


@pytest.mark.parametrize("case, expect", [
    ("untrusted broker", "is --kafka.tls.ca-file the CA that signed it"),
    ("no client certificate", "requires a client certificate"),
    ("plaintext client", "does it require TLS or SASL"),
])
def test_tls_failures_are_clear_and_quick(tls_broker, pki, case, expect):
    bootstrap, _ = tls_broker
    security = {"untrusted broker": mtls(pki, ca="other-ca.pem"), "no client certificate": mtls(pki, client=False),
                "plaintext client": KafkaSecurity()}[case]
    t0 = time.monotonic()
    with pytest.raises(KafkaConnectError, match=expect) as info:
        check_connection(bootstrap, security, CONNECT_TIMEOUT_S)
    assert time.monotonic() - t0 < 4 * CONNECT_TIMEOUT_S  # bounded by the check's timeout, not kafka-python's 30 s retries
    assert bootstrap in str(info.value)


@pytest.mark.parametrize("when", ["during the handshake", "after the handshake"])
@pytest.mark.parametrize("client, expect", [(False, "most likely requires a client certificate"), (True, "may refuse our client certificate")])
def test_tls_close_without_alert_is_explained(pki, when, client, expect):
    """A broker that drops the connection without a TLS alert (what a loaded stunnel does when it refuses a
    client: its close can overtake its "certificate required" alert) gets a hint that fits our settings."""
    import socket
    import ssl
    import threading

    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(pki / "server.pem", pki / "server.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        if when == "during the handshake":
            conn.recv(1024)  # the ClientHello; no answer, no alert
            conn.close()
            return
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            tls.recv(4)  # the client's request arrives; the server closes without close_notify or an alert
            socket.socket(fileno=tls.detach()).close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(KafkaConnectError, match=expect) as info:
            check_connection(f"127.0.0.1:{port}", mtls(pki, client=client), CONNECT_TIMEOUT_S)
        assert "--kafka.tls" in str(info.value)
    finally:
        t.join(timeout=CONNECT_TIMEOUT_S)
        listener.close()


def test_tls_against_a_plaintext_port_does_not_hang(tls_broker, pki):
    """kafka-python's handshake has no timeout; the check's own does."""
    _, broker = tls_broker  # the broker's own (plaintext) port
    t0 = time.monotonic()
    with pytest.raises(KafkaConnectError, match="no answer to the TLS handshake"):
        check_connection(broker.bootstrap, mtls(pki), 2.0)
    assert time.monotonic() - t0 < 10


def test_cli_exits_with_the_reason(tls_broker, pki, tmp_path):
    """`prism daemon` and `prism collect --out kafka://` exit 1 with the reason on stderr."""
    bootstrap, _ = tls_broker
    topo = Path(__file__).parent / "data" / "topology.csv"
    tls = ["--kafka.security-protocol", "SSL", "--kafka.tls.ca-file", str(pki / "other-ca.pem")]
    for cmd in ([sys.executable, "-m", "prism", "daemon", "--topology", str(topo), "--kafka.bootstrap-servers", bootstrap,
                 "--web.listen-address", f"127.0.0.1:{free_port()}", *tls],
                [sys.executable, "-m", "prism", "collect", str(topo), "--out", f"kafka://{bootstrap}/flows", *tls]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stderr
        assert "certificate verify failed" in r.stderr and "--kafka.tls.ca-file" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_bad_security_flags_are_usage_errors(pki, tmp_path):
    topo = Path(__file__).parent / "data" / "topology.csv"
    base = [sys.executable, "-m", "prism", "daemon", "--topology", str(topo), "--kafka.bootstrap-servers", "127.0.0.1:1"]
    cases = {
        "use one of PLAINTEXT": ["--kafka.security-protocol", "TLS"],
        "needs --kafka.security-protocol SSL": ["--kafka.tls.ca-file", str(pki / "ca.pem")],
        "no such file": ["--kafka.security-protocol", "SSL", "--kafka.tls.ca-file", str(tmp_path / "nope.pem")],
        "must be PEM, match": ["--kafka.security-protocol", "SSL", "--kafka.tls.cert-file", str(pki / "client.pem"),
                               "--kafka.tls.key-file", str(pki / "server.key")],
        "needs a password": ["--kafka.security-protocol", "SASL_SSL", "--kafka.sasl.mechanism", "SCRAM-SHA-512", "--kafka.sasl.username", "prism"],
        "--kafka.sasl.mechanism 'GSSAPI'": ["--kafka.security-protocol", "SASL_SSL", "--kafka.sasl.mechanism", "GSSAPI"],
    }
    for expect, flags in cases.items():
        r = subprocess.run(base + flags, capture_output=True, text=True, timeout=60, env=_env_without_password())
        assert r.returncode == 2 and expect in r.stderr, (flags, r.stderr)


def _env_without_password():
    import os

    return {k: v for k, v in os.environ.items() if k != PASSWORD_ENV}


def test_password_from_file_or_environment_never_shown(tmp_path):
    f = tmp_path / "password"
    f.write_text("s3cret-from-file\n")
    s = KafkaSecurity.from_options("SASL_SSL", sasl_mechanism="scram-sha-512", username="prism", password_file=str(f), env={})
    assert s.client_options()["sasl_plain_password"] == "s3cret-from-file" and s.sasl_mechanism == "SCRAM-SHA-512"
    e = KafkaSecurity.from_options("SASL_SSL", sasl_mechanism="PLAIN", username="prism", env={PASSWORD_ENV: "s3cret-from-env"})
    assert e.client_options()["sasl_plain_password"] == "s3cret-from-env"
    for shown in (repr(s), s.describe(), repr(e), e.describe()):
        assert "s3cret" not in shown


def test_world_readable_password_file_is_warned(tmp_path, caplog):
    """As ssh does for a private key: a password file others may read is named, with its mode, in a warning."""
    secret = tmp_path / "password"
    secret.write_text("hunter2\n")
    for mode, warned in ((0o644, True), (0o604, True), (0o600, False), (0o640, False)):
        secret.chmod(mode)
        caplog.clear()
        with caplog.at_level("WARNING", logger="prism.kafka"):
            KafkaSecurity.from_options("SASL_SSL", sasl_mechanism="SCRAM-SHA-512", username="prism", password_file=str(secret), env={})
        lines = [r.getMessage() for r in caplog.records if "password-file" in r.getMessage()]
        assert bool(lines) == warned, (oct(mode), lines)
        if warned:
            assert str(secret) in lines[0] and f"{mode:04o}" in lines[0] and "hunter2" not in lines[0]


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SASL_PLAINTEXT"])
def test_refused_connection_is_reported_within_seconds(protocol):
    """Nothing listening: said at once, not after kafka-python's retries until its bootstrap timeout (10-24 s before)."""
    security = KafkaSecurity(protocol, sasl_mechanism="SCRAM-SHA-256", username="u", password="p") if protocol != "PLAINTEXT" else None
    for bootstrap in (f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()},localhost:{free_port()}"):
        t0 = time.monotonic()
        with pytest.raises(KafkaConnectError, match="nothing listens there"):
            check_connection(bootstrap, security, 10.0)
        assert time.monotonic() - t0 < 3.0


def test_the_daemon_reports_a_refused_broker_before_compiling(tmp_path, monkeypatch):
    """On a cold numba cache the warm-up compiles for 15-45 s: a refused broker was reported only after it."""
    from prism.serve import build
    from prism.serve.settings import resolve_settings

    topology = tmp_path / "topology.csv"
    topology.write_text("ip,server\n10.0.0.1,s0\n10.0.0.2,s1\n")
    warmed = []
    monkeypatch.setattr(build, "warm_up", lambda: warmed.append(1) or 0.0)
    settings = resolve_settings({"topology": str(topology), "kafka_bootstrap_servers": f"127.0.0.1:{free_port()}",
                                 "web_listen_address": "127.0.0.1:0"})
    with pytest.raises(build.StartupError, match="nothing listens there") as e:
        build.build_daemon(settings, warm=True)
    assert e.value.exit_code == 1 and not warmed


def test_scram_refusal_recognised_when_the_last_attempt_timed_out():
    """kafka-python retries a refused SCRAM exchange until the deadline; on a loaded machine its last attempt ends
    in a timeout. The refusal seen earlier is the reason (log lines recorded from kafka-python 3.0 against Tansu)."""
    from prism.serve.kafkaconf import _explain

    refused = ["Exchanging credentials in the clear during Sasl Authentication",
               "<KafkaConnection node_id=bootstrap-0 broker_version=(3, 9) (disconnected)>: Connection lost: 'v'",
               "Bootstrap connection to bootstrap-0 failed: 'v' (backoff 0.04 secs)"]
    timed_out = ["<KafkaConnection node_id=bootstrap-0 broker_version=(3, 9) (disconnected)>: Connection lost: SASL Authentication timed out",
                 "Bootstrap connection to bootstrap-0 failed: SASL Authentication timed out (backoff 0.97 secs)",
                 "Bootstrap failed: KafkaTimeoutError: Unable to bootstrap from 127.0.0.1:9092"]
    security = KafkaSecurity("SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512", username="nobody", password="wrong")
    error = TimeoutError("Unable to bootstrap from 127.0.0.1:9092")
    assert "SASL authentication failed" in _explain("127.0.0.1:9092", security, error, refused + timed_out)
    assert "SASL authentication failed" not in _explain("127.0.0.1:9092", security, error, timed_out)  # a timeout alone is no refusal


@pytest.fixture(scope="module")
def sasl_broker():
    b = LocalBroker(args=("--authentication",)).start()
    yield b
    b.stop()


@pytest.mark.parametrize("mechanism, expect", [
    ("SCRAM-SHA-512", "SASL authentication failed"),
    ("SCRAM-SHA-256", "SASL authentication failed"),
    ("PLAIN", "does it offer PLAIN"),  # Tansu offers SCRAM only
])
def test_sasl_refusal_is_clear_and_quick(sasl_broker, mechanism, expect):
    security = KafkaSecurity("SASL_PLAINTEXT", sasl_mechanism=mechanism, username="nobody", password="wrong")
    t0 = time.monotonic()
    with pytest.raises(KafkaConnectError, match=expect):
        check_connection(sasl_broker.bootstrap, security, CONNECT_TIMEOUT_S)
    assert time.monotonic() - t0 < 4 * CONNECT_TIMEOUT_S


def test_daemon_without_credentials_on_a_sasl_broker(sasl_broker, tmp_path):
    topo = Path(__file__).parent / "data" / "topology.csv"
    r = subprocess.run([sys.executable, "-m", "prism", "daemon", "--topology", str(topo), "--kafka.bootstrap-servers", sasl_broker.bootstrap,
                        "--web.listen-address", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "does it require TLS or SASL" in r.stderr, r.stderr


def test_one_reachable_bootstrap_server_is_enough(tls_broker, pki):
    bootstrap, _ = tls_broker
    check_connection(f"127.0.0.1:1,{bootstrap}", mtls(pki), CONNECT_TIMEOUT_S)  # the first is down: fine
    with pytest.raises(KafkaConnectError, match="nothing listens there"):
        check_connection("127.0.0.1:1,127.0.0.1:2", mtls(pki), CONNECT_TIMEOUT_S)
