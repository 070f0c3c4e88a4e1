"""``--web.config.file``: TLS, client certificates and basic auth on the metrics endpoint, checked with curl."""
from __future__ import annotations

import shutil
import subprocess
import sys

import bcrypt
import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter
from support import make_pki, stop_process, wait_for

from prism.serve.broker import free_port
from prism.serve.metrics import Health, MetricsServer

pytestmark = pytest.mark.skipif(shutil.which("curl") is None or shutil.which("openssl") is None, reason="needs curl and openssl")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def write_config(path, doc):
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def hashed(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()  # cost 4: fast tests; the format is the same


def serve(config_path):
    registry = CollectorRegistry()
    Counter("prism_test_events", "a metric to find in the scrape", registry=registry).inc(3)
    health = Health()
    health.ready = True
    return MetricsServer(registry, health, "127.0.0.1:0", web_config=config_path).start()


def curl(url, *args):
    """(HTTP status or None, curl's exit code, body): None when no HTTP answer came (TLS refused)."""
    r = subprocess.run(["curl", "-s", "-S", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}", *args, url], capture_output=True, text=True, timeout=60)
    body, _, code = r.stdout.rpartition("\n")
    return (int(code) if code.strip() not in ("", "000") else None), r.returncode, body


def test_tls_and_basic_auth(pki, tmp_path):
    cfg = write_config(tmp_path / "web.yml", {
        "tls_server_config": {"cert_file": str(pki / "server.pem"), "key_file": str(pki / "server.key")},
        "basic_auth_users": {"prometheus": hashed("right")},
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
    })
    server = serve(cfg)
    try:
        assert server.url.startswith("https://")
        url = f"https://{server.address}"
        ca = ["--cacert", str(pki / "ca.pem")]
        status, _, body = curl(url + "/metrics", *ca, "-u", "prometheus:right")
        assert status == 200 and "prism_test_events_total 3.0" in body
        assert curl(url + "/metrics", *ca, "-u", "prometheus:wrong")[0] == 401
        assert curl(url + "/metrics", *ca, "-u", "nobody:right")[0] == 401
        assert curl(url + "/metrics", *ca)[0] == 401
        assert curl(url + "/healthz", *ca)[0] == 200  # probes carry no password
        assert curl(url + "/readyz", *ca)[0] == 200
        # the broker's certificate is checked: another CA's trust store refuses it
        status, code, _ = curl(url + "/metrics", "--cacert", str(pki / "other-ca.pem"), "-u", "prometheus:right")
        assert status is None and code == 60  # curl: peer certificate cannot be authenticated
        # plain HTTP to the TLS port gets no metrics, and the server keeps serving
        assert curl(f"http://{server.address}/metrics", "-u", "prometheus:right")[0] in (None, 400)
        headers = subprocess.run(["curl", "-s", "-i", *ca, "-u", "prometheus:right", url + "/metrics"], capture_output=True, text=True, timeout=60).stdout
        assert "X-Content-Type-Options: nosniff" in headers
        assert curl(url + "/metrics", *ca, "-u", "prometheus:right")[0] == 200
    finally:
        server.stop()


def test_client_certificate_required(pki, tmp_path):
    cfg = write_config(tmp_path / "web.yml", {"tls_server_config": {
        "cert_file": str(pki / "server.pem"), "key_file": str(pki / "server.key"),
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki / "ca.pem")}})
    server = serve(cfg)
    try:
        url = f"https://{server.address}/metrics"
        ca = ["--cacert", str(pki / "ca.pem")]
        assert curl(url, *ca)[0] is None  # no client certificate: refused in the handshake
        assert curl(url, *ca, "--cert", str(pki / "stranger.pem"), "--key", str(pki / "stranger.key"))[0] is None  # not our CA's
        status, _, body = curl(url, *ca, "--cert", str(pki / "client.pem"), "--key", str(pki / "client.key"))
        assert status == 200 and "prism_test_events_total" in body
        assert server.httpd.connection_errors >= 2  # counted, no traceback
    finally:
        server.stop()


def test_config_is_reloaded_when_it_changes(pki, tmp_path):
    path = tmp_path / "web.yml"
    write_config(path, {"basic_auth_users": {"prometheus": hashed("old")}})
    server = serve(str(path))
    try:
        url = f"http://{server.address}/metrics"
        assert curl(url, "-u", "prometheus:old")[0] == 200
        write_config(path, {"basic_auth_users": {"prometheus": hashed("new")}})
        wait_for(lambda: curl(url, "-u", "prometheus:new")[0] == 200, 30, "the new password to apply")
        assert curl(url, "-u", "prometheus:old")[0] == 401
        path.write_text("basic_auth_users: [not, a, mapping]\n")  # a broken edit keeps the previous settings
        wait_for(lambda: server.web.reload_errors >= 1 or curl(url, "-u", "prometheus:new")[0] != 200, 30, "the broken edit to be seen")
        assert curl(url, "-u", "prometheus:new")[0] == 200 and server.web.reload_errors == 1
    finally:
        server.stop()


def _served_subject(address, ca):
    r = subprocess.run(["curl", "-s", "-v", "--cacert", ca, f"https://{address}/healthz"], capture_output=True, text=True, timeout=60)
    return next((line.split("subject:", 1)[1].strip() for line in r.stderr.splitlines() if "subject:" in line), None)


def test_rotated_certificate_applies_without_restart(pki, tmp_path):
    import shutil as sh

    for f in ("server.pem", "server.key"):
        sh.copy(pki / f, tmp_path / f)
    cfg = write_config(tmp_path / "web.yml", {"tls_server_config": {"cert_file": "server.pem", "key_file": "server.key"}})
    server = serve(cfg)
    try:
        assert "prism-server" in _served_subject(server.address, str(pki / "ca.pem"))
        subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "new.key", "-out", "new.csr", "-subj", "/CN=prism-rotated"],
                       cwd=tmp_path, check=True, capture_output=True)
        subprocess.run(["openssl", "x509", "-req", "-in", "new.csr", "-CA", str(pki / "ca.pem"), "-CAkey", str(pki / "ca.key"), "-CAcreateserial",
                        "-out", "new.pem", "-days", "2", "-extfile", str(pki / "san.cnf")], cwd=tmp_path, check=True, capture_output=True)
        # as a Kubernetes Secret update does: both files replaced
        (tmp_path / "new.key").replace(tmp_path / "server.key")
        (tmp_path / "new.pem").replace(tmp_path / "server.pem")
        wait_for(lambda: "prism-rotated" in (_served_subject(server.address, str(pki / "ca.pem")) or ""), 30, "the rotated certificate")
    finally:
        server.stop()


@pytest.mark.parametrize("doc, expect", [
    ({"tls_server_config": {"cert_file": "server.pem"}}, "cert_file and key_file go together"),
    ({"tls_server_config": {"cert_file": "server.pem", "key_file": "client.key"}}, "cannot load cert_file"),
    ({"tls_server_config": {"cert_file": "server.pem", "key_file": "server.key", "client_auth_type": "RequireAndVerifyClientCert"}}, "needs client_ca_file"),
    ({"tls_server_config": {"cert_file": "server.pem", "key_file": "server.key", "client_auth_type": "RequestClientCert"}}, "not supported by Prism"),
    ({"tls_server_config": {"cert_file": "server.pem", "key_file": "server.key", "cipher_suites": ["TLS_AES_128_GCM_SHA256"]}}, "cipher_suites is not supported"),
    ({"tls_server_config": {"cert_file": "server.pem", "key_file": "server.key", "min_version": "TLS14"}}, "min_version 'TLS14'"),
    ({"basic_auth_users": {"prometheus": "plaintext-password"}}, "basic_auth_users.prometheus: not a bcrypt hash"),
    ({"basic_auth_user": {}}, "unknown key 'basic_auth_user'"),
])
def test_bad_config_is_a_usage_error_naming_the_key(pki, tmp_path, doc, expect):
    import shutil as sh

    for f in ("server.pem", "server.key", "client.key"):  # relative names are relative to the config file
        sh.copy(pki / f, tmp_path / f)
    cfg = write_config(tmp_path / "web.yml", doc)
    topo = tmp_path / "topology.csv"
    topo.write_text("ip,server\n10.0.0.1,s1\n")
    r = subprocess.run([sys.executable, "-m", "prism", "daemon", "--topology", str(topo), "--source", str(tmp_path),
                        "--web.listen-address", "127.0.0.1:0", "--web.config.file", cfg], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and expect in r.stderr and "web.yml" in r.stderr, r.stderr


def test_daemon_serves_its_metrics_over_tls_with_auth(pki, tmp_path):
    """The real `prism daemon` (directory source) with --web.config.file, scraped by curl."""
    cfg = write_config(tmp_path / "web.yml", {"tls_server_config": {"cert_file": str(pki / "server.pem"), "key_file": str(pki / "server.key")},
                                              "basic_auth_users": {"prometheus": hashed("scrape")}})
    (tmp_path / "in").mkdir()
    topo = tmp_path / "topology.csv"
    topo.write_text("ip,server\n10.0.0.1,s1\n10.0.0.2,s2\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "prism", "daemon", "--topology", str(topo), "--source", str(tmp_path / "in"),
                             "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", cfg], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"https://127.0.0.1:{port}"
    ca = ["--cacert", str(pki / "ca.pem")]
    try:
        wait_for(lambda: proc.poll() is not None or curl(url + "/healthz", *ca)[0] == 200, 60, "the daemon's TLS endpoint")
        assert proc.poll() is None, proc.stderr.read()
        status, _, body = curl(url + "/metrics", *ca, "-u", "prometheus:scrape")
        assert status == 200 and "prism_window_flows" in body
        assert curl(url + "/metrics", *ca, "-u", "prometheus:nope")[0] == 401
    finally:
        stop_process(proc)
    assert proc.returncode == 0
    assert "https://" in proc.stderr.read()


def test_bcrypt_check_is_cached_not_repeated(monkeypatch):
    """A scrape every few seconds must not pay bcrypt (~50 ms) each time; exporter-toolkit caches too."""
    import base64

    from prism.serve.webconfig import WebAuth, WebConfig

    calls = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: calls.append(pw) or real(pw, h))
    auth = WebAuth(None)
    auth.config = WebConfig(users={"p": bcrypt.hashpw(b"pw", bcrypt.gensalt(4))})
    header = "Basic " + base64.b64encode(b"p:pw").decode()
    for _ in range(20):
        assert auth.check(header)
    assert len(calls) == 1
    assert not auth.check("Basic " + base64.b64encode(b"p:wrong").decode())
    assert not auth.check("Basic " + base64.b64encode(b"stranger:pw").decode())
    assert len(calls) == 3  # failures are never cached; an unknown user costs a bcrypt check too (no timing oracle)
    assert not auth.check("Basic !!notbase64")
    assert not auth.check("Bearer abc")
