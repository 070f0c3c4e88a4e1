"""Helpers shared by the tests that run a broker and daemons (imported as ``support``: pytest puts tests/ on sys.path)."""
from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["DAEMON_SETTINGS", "wait_for", "scrape_total", "make_pki", "stop_process", "produce_as_ordered", "pair_by_pair"]

#: the daemon tests' windows (MonitorSettings): short, so the 8-s tiny cluster spans several
DAEMON_SETTINGS = dict(window_s=3, step_s=1, switch_window_s=2, lateness_s=0.1, idle_flush_s=3)


def wait_for(cond, timeout=60.0, what="condition", progress=None):
    """Wait until ``cond()``; with ``progress``, the timeout counts from the last change of ``progress()``.

    A loaded machine slows everything down, so a fixed deadline fails runs
    that are only slow. With a progress measure (records ingested, say) the
    test fails only when nothing moves for ``timeout`` seconds: a stall, not
    a slow machine.
    """
    deadline = time.monotonic() + timeout
    last = progress() if progress else None
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
        if progress:
            now = progress()
            if now != last:
                last, deadline = now, time.monotonic() + timeout
    raise AssertionError(f"timed out waiting for {what}: no progress for {timeout} s" if progress else f"timed out after {timeout} s waiting for {what}")


def produce_as_ordered(broker, topic, flows, chunk=2000):
    """Send ``flows`` in the order given, ``chunk`` rows a call (one message per GPU pair and call)."""
    from prism.serve.produce import FlowProducer

    p = FlowProducer(broker.bootstrap, topic, fmt="arrow")
    for i in range(0, len(flows), chunk):
        p.send(flows.iloc[i : i + chunk])
    p.flush()
    p.close()
    return len(flows)


def pair_by_pair(flows):
    """A dump re-imported in key order: each pair's whole capture, pair after pair (each partition out of time order by the capture)."""
    import pandas as pd

    from prism.ingest.messages import pair_keys

    key = pd.Series(pair_keys(flows["src"].astype(str), flows["dst"].astype(str)), index=flows.index)
    return flows.assign(_key=key).sort_values(["_key", "start_ns"], kind="stable").drop(columns="_key").reset_index(drop=True)


def scrape_total(port, name):
    """Sum of metric ``name`` over its samples on 127.0.0.1:port/metrics; None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
            text = r.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def make_pki(d):
    """A test CA, a server certificate for 127.0.0.1/localhost, a client certificate, and an unrelated CA (openssl CLI) in ``d``."""

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN=prism test {ca}")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ca, ext in (("server", "ca", ["-extfile", "san.cnf"]), ("client", "ca", []), ("stranger", "other-ca", [])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=prism-{name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *ext)
    return d


def stop_process(proc, timeout=20.0) -> int:
    """SIGTERM (a daemon's clean stop), then SIGKILL if it has not exited within ``timeout``; its exit code."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
