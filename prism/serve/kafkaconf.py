"""How Prism's Kafka clients connect: TLS, mutual TLS and SASL, and a check that says why a connection fails.

Every Kafka client Prism opens (the daemon's consumers and producer, the
topic admin, the collector's ``kafka://`` sink, the demo's producer) takes
its connection settings from one :class:`KafkaSecurity`, built from the
same flags on every command:

=================================  ==========================================
``--kafka.security-protocol``      PLAINTEXT (default), SSL, SASL_PLAINTEXT, SASL_SSL
``--kafka.tls.ca-file``            CA bundle that signed the brokers' certificates
                                   (default: the system's trust store)
``--kafka.tls.cert-file``          client certificate (mutual TLS), PEM
``--kafka.tls.key-file``           its private key, PEM (or inside the cert file)
``--kafka.sasl.mechanism``         PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
``--kafka.sasl.username``          SASL user
``--kafka.sasl.password-file``     file holding the password (one line)
=================================  ==========================================

The password is never a flag value (it would show in ``ps`` and in shell
history): it comes from ``--kafka.sasl.password-file`` or from the
environment variable ``PRISM_KAFKA_SASL_PASSWORD``, and ``repr``/``describe``
never show it.

kafka-python answers a wrong CA, a missing client certificate or bad
credentials by retrying until a 30 s bootstrap timeout, with the reason only
in its log. :func:`check_connection` connects once, with a short timeout,
and raises :class:`KafkaConnectError` naming the reason and the flag to look
at; commands call it before they start.

>>> s = KafkaSecurity("SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512", username="prism", password="hunter2")
>>> s.describe()
'SASL_PLAINTEXT, SCRAM-SHA-512 as prism'
>>> "hunter2" in repr(s)
False
>>> sorted(s.client_options())
['sasl_mechanism', 'sasl_plain_password', 'sasl_plain_username', 'security_protocol']
"""
from __future__ import annotations

import argparse
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ssl

__all__ = ["KafkaSecurity", "KafkaConnectError", "check_connection", "add_security_flags", "security_from_args",
           "PROTOCOLS", "MECHANISMS", "PASSWORD_ENV"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PASSWORD_ENV = "PRISM_KAFKA_SASL_PASSWORD"

log = logging.getLogger("prism.kafka")


@dataclass(frozen=True)
class KafkaSecurity:
    """Connection security shared by all of a command's Kafka clients.

    Raises ValueError, naming the flag, for a combination that cannot work
    (TLS files without TLS, SASL without a mechanism or password, a file
    that cannot be read).
    """

    protocol: str = "PLAINTEXT"
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        protocol = str(self.protocol).upper()
        object.__setattr__(self, "protocol", protocol)
        if protocol not in PROTOCOLS:
            raise ValueError(f"--kafka.security-protocol {self.protocol!r}: use one of {', '.join(PROTOCOLS)}")
        tls, sasl = protocol in ("SSL", "SASL_SSL"), protocol.startswith("SASL_")
        for flag, path in (("--kafka.tls.ca-file", self.ca_file), ("--kafka.tls.cert-file", self.cert_file), ("--kafka.tls.key-file", self.key_file)):
            if path is None:
                continue
            if not tls:
                raise ValueError(f"{flag} needs --kafka.security-protocol SSL or SASL_SSL (it is {protocol})")
            _check_readable(flag, path)
        if self.key_file and not self.cert_file:
            raise ValueError("--kafka.tls.key-file needs --kafka.tls.cert-file (the client certificate it belongs to)")
        if tls:
            self.ssl_context()  # unreadable PEM, or a key that is not the certificate's: say so now, not at the first connection
        given = [f for f, v in (("--kafka.sasl.mechanism", self.sasl_mechanism), ("--kafka.sasl.username", self.username)) if v]
        if not sasl:
            if given or self.password is not None:
                raise ValueError(f"{(given or ['a SASL password'])[0]} needs --kafka.security-protocol SASL_PLAINTEXT or SASL_SSL (it is {protocol})")
            return
        mechanism = str(self.sasl_mechanism or "").upper()
        if mechanism not in MECHANISMS:
            what = f"{self.sasl_mechanism!r}" if self.sasl_mechanism else "missing"
            raise ValueError(f"--kafka.sasl.mechanism {what}: {protocol} needs one of {', '.join(MECHANISMS)}")
        object.__setattr__(self, "sasl_mechanism", mechanism)
        if not self.username:
            raise ValueError(f"--kafka.sasl.username is required with {protocol}")
        if not self.password:
            raise ValueError(f"{protocol} needs a password: --kafka.sasl.password-file FILE or the environment variable {PASSWORD_ENV}")
        if protocol == "SASL_PLAINTEXT" and mechanism == "PLAIN":
            log.warning("SASL PLAIN over SASL_PLAINTEXT sends the password in clear text; prefer SASL_SSL or a SCRAM mechanism")

    @classmethod
    def from_options(cls, protocol: str | None = None, ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
                     sasl_mechanism: str | None = None, username: str | None = None, password_file: str | None = None,
                     env: Mapping[str, str] | None = None) -> "KafkaSecurity":
        """Build from flag values; the password from ``password_file`` or ``$PRISM_KAFKA_SASL_PASSWORD``.

        >>> KafkaSecurity.from_options(env={}).protocol
        'PLAINTEXT'
        >>> KafkaSecurity.from_options("SASL_SSL", sasl_mechanism="PLAIN", username="u", env={})
        Traceback (most recent call last):
        ...
        ValueError: SASL_SSL needs a password: --kafka.sasl.password-file FILE or the environment variable PRISM_KAFKA_SASL_PASSWORD
        """
        env = os.environ if env is None else env
        password = None
        if password_file:
            _check_readable("--kafka.sasl.password-file", password_file)
            _warn_if_others_can_read(password_file)
            with open(password_file, encoding="utf-8") as f:
                password = f.read().rstrip("\r\n")
            if not password:
                raise ValueError(f"--kafka.sasl.password-file {password_file}: the file is empty")
        elif env.get(PASSWORD_ENV):
            password = env[PASSWORD_ENV]
        return cls(protocol or "PLAINTEXT", ca_file, cert_file, key_file, sasl_mechanism, username, password)

    def ssl_context(self) -> ssl.SSLContext:
        """The client TLS context these settings describe (ValueError naming the flag if the files do not load)."""
        import ssl

        try:
            ctx = ssl.create_default_context(cafile=self.ca_file)
        except (ssl.SSLError, OSError) as e:
            raise ValueError(f"--kafka.tls.ca-file {self.ca_file}: not a PEM CA bundle ({e})") from None
        if self.cert_file:
            try:
                # an encrypted key would make OpenSSL prompt on the terminal; refuse it instead
                ctx.load_cert_chain(self.cert_file, self.key_file, password=lambda: b"")
            except (ssl.SSLError, OSError) as e:
                raise ValueError(f"--kafka.tls.cert-file {self.cert_file} / --kafka.tls.key-file {self.key_file}: cannot load the client "
                                 f"certificate and key ({e}); they must be PEM, match, and the key must not be encrypted") from None
        return ctx

    def client_options(self) -> dict:
        """Keyword arguments for kafka-python's clients (KafkaConsumer, KafkaProducer, KafkaAdminClient)."""
        opts: dict = {"security_protocol": self.protocol}
        if self.protocol in ("SSL", "SASL_SSL"):
            opts["ssl_check_hostname"] = True
            if self.ca_file:
                opts["ssl_cafile"] = self.ca_file
            if self.cert_file:
                opts["ssl_certfile"] = self.cert_file
            if self.key_file:
                opts["ssl_keyfile"] = self.key_file
        if self.protocol.startswith("SASL_"):
            opts.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.username, sasl_plain_password=self.password)
        return opts

    def describe(self) -> str:
        """One line for logs and the startup line; never the password."""
        parts = [self.protocol]
        if self.protocol.startswith("SASL_"):
            parts.append(f"{self.sasl_mechanism} as {self.username}")
        if self.ca_file:
            parts.append(f"CA {self.ca_file}")
        if self.cert_file:
            parts.append(f"client certificate {self.cert_file}")
        return ", ".join(parts)


def _check_readable(flag: str, path: str) -> None:
    if not os.path.isfile(path):
        raise ValueError(f"{flag} {path}: no such file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{flag} {path}: not readable (permissions)")


def _warn_if_others_can_read(path: str) -> None:
    """Log a warning, as ssh does for a private key, when users other than the owner (and its group) may read a secret file."""
    try:
        mode = os.stat(path).st_mode  # a symlink's target: Kubernetes mounts secrets as links into ..data/
    except OSError:
        return
    if mode & 0o007:
        log.warning("--kafka.sasl.password-file %s is accessible by other users (mode %04o): it holds a password; "
                    "make it readable by its owner only (chmod 600 %s; in Kubernetes, the secret volume's defaultMode: 0400)",
                    path, mode & 0o7777, path)


class KafkaConnectError(RuntimeError):
    """A Kafka client could not connect; the message says why and which flag to check."""


# what kafka-python logs -> what to tell the operator (first match wins)
_HINTS = (
    ("CERTIFICATE_VERIFY_FAILED", "the broker's certificate is not trusted: is --kafka.tls.ca-file the CA that signed it?"),
    ("certificate verify failed", "the broker's certificate is not trusted: is --kafka.tls.ca-file the CA that signed it?"),
    ("CERTIFICATE_REQUIRED", "the broker requires a client certificate: give --kafka.tls.cert-file and --kafka.tls.key-file"),
    ("certificate required", "the broker requires a client certificate: give --kafka.tls.cert-file and --kafka.tls.key-file"),
    ("UNKNOWN_CA", "the broker does not trust our client certificate: is it signed by the broker's client CA?"),
    ("BAD_CERTIFICATE", "the broker refused our client certificate"),
    ("WRONG_VERSION_NUMBER", "the broker does not speak TLS there: check --kafka.security-protocol and the port"),
    ("Authentication failed", "SASL authentication failed: check --kafka.sasl.username, the password and --kafka.sasl.mechanism"),
    ("SaslAuthenticationFailed", "SASL authentication failed: check --kafka.sasl.username, the password and --kafka.sasl.mechanism"),
    ("UnsupportedSaslMechanism", "the broker does not offer this --kafka.sasl.mechanism"),
    ("IllegalSaslState", "the broker does not expect SASL there: check --kafka.security-protocol"),
    ("Connection refused", "nothing listens there: check --kafka.bootstrap-servers"),
    ("ECONNREFUSED", "nothing listens there: check --kafka.bootstrap-servers"),
    ("Name or service not known", "the host name does not resolve: check --kafka.bootstrap-servers"),
    ("nodename nor servname", "the host name does not resolve: check --kafka.bootstrap-servers"),
)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.messages.append(record.getMessage())
        except Exception:  # noqa: BLE001 - a log line we cannot format is no reason to fail the check
            pass


def check_connection(bootstrap_servers: str, security: KafkaSecurity | None = None, timeout_s: float = 10.0) -> None:
    """Connect to ``bootstrap_servers`` once; raise :class:`KafkaConnectError` with the reason if that fails.

    Handles a refused or unresolvable address, TLS trouble (untrusted broker
    certificate, a client certificate required or refused, TLS against a
    plaintext port) and SASL failures, each in at most about ``timeout_s``; nothing
    listening (a refused TCP connect) at once.
    """
    from kafka import KafkaAdminClient

    security = security or KafkaSecurity()
    servers = [x.strip() for x in bootstrap_servers.split(",") if x.strip()]
    if security.protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
        # kafka-python retries a refused connection until its bootstrap timeout: a TCP connect says it at once.
        # One reachable bootstrap server is enough (as for the clients); all failing is an error, with the first reason.
        tcp_failures = []
        for server in servers:
            try:
                _tcp_probe(server, security, min(timeout_s, _TCP_PROBE_TIMEOUT_S), bootstrap_servers)
                break
            except KafkaConnectError as e:
                tcp_failures.append(e)
        else:
            if tcp_failures:
                raise tcp_failures[0]
    if security.protocol in ("SSL", "SASL_SSL"):
        # kafka-python's TLS handshake has no timeout of its own: TLS against a plaintext port would hang.
        # One reachable bootstrap server is enough (as for the clients); all failing is an error, with the first reason.
        failures = []
        for server in [x.strip() for x in bootstrap_servers.split(",") if x.strip()]:
            try:
                _tls_probe(server, security, timeout_s, bootstrap_servers)
                break
            except KafkaConnectError as e:
                failures.append(e)
        else:
            if failures:
                raise failures[0]
    capture = _Capture()
    kafka_log = logging.getLogger("kafka")
    kafka_log.addHandler(capture)
    old_level = kafka_log.level
    if kafka_log.getEffectiveLevel() > logging.WARNING:
        kafka_log.setLevel(logging.WARNING)
    propagate = kafka_log.propagate
    kafka_log.propagate = False  # the reason goes into our error, not as tracebacks on stderr
    admin = None
    try:
        ms = max(int(timeout_s * 1000), 1000)
        admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, client_id="prism-check", request_timeout_ms=ms,
                                 bootstrap_timeout_ms=ms, reconnect_backoff_max_ms=1000, **security.client_options())
    except Exception as e:  # noqa: BLE001 - kafka-python raises several types here; all mean "cannot connect"
        raise KafkaConnectError(_explain(bootstrap_servers, security, e, capture.messages)) from None
    finally:
        if admin is not None:
            admin.close()
        kafka_log.removeHandler(capture)
        kafka_log.setLevel(old_level)
        kafka_log.propagate = propagate


#: the TCP connect of the check: a refusal comes at once; a host that does not answer is given this long
_TCP_PROBE_TIMEOUT_S = 5.0


def _tcp_probe(server: str, security: KafkaSecurity, timeout_s: float, bootstrap: str) -> None:
    """A TCP connect to ``server`` with a timeout; KafkaConnectError naming the reason if it fails."""
    import socket

    host, _, port = server.rpartition(":")
    host = host.strip("[]")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as e:
        reason = f"no answer within {timeout_s:g} s" if isinstance(e, (TimeoutError, socket.timeout)) else f"{type(e).__name__}: {e}"
        hint = next((h for key, h in _HINTS if key in reason), None)
        if hint is None and isinstance(e, (TimeoutError, socket.timeout)):
            hint = "the host does not answer (down, or a firewall drops the packets): check --kafka.bootstrap-servers"
        msg = f"cannot connect to Kafka at {bootstrap} ({security.describe()}): {server}: {reason}"
        raise KafkaConnectError(f"{msg}; {hint}" if hint else msg) from None


def _tls_probe(server: str, security: KafkaSecurity, timeout_s: float, bootstrap: str) -> None:
    """A TLS handshake and one ApiVersions round trip to ``server`` with a timeout; KafkaConnectError if that fails."""
    import socket
    import ssl
    import struct

    host, _, port = server.rpartition(":")
    host = host.strip("[]")
    ctx = security.ssl_context()

    def fail(reason: str, hint: str | None = None):
        hint = hint or next((h for key, h in _HINTS if key in reason), None)
        msg = f"cannot connect to Kafka at {bootstrap} ({security.describe()}): {server}: {reason}"
        raise KafkaConnectError(f"{msg}; {hint}" if hint else msg)

    try:
        raw = socket.create_connection((host, int(port)), timeout=timeout_s)
    except (OSError, ValueError) as e:
        fail(f"{type(e).__name__}: {e}")
    try:
        with ctx.wrap_socket(raw, server_hostname=host) as tls:
            client_id = b"prism-check"
            header = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id  # ApiVersions v0, correlation id 1
            tls.sendall(struct.pack(">i", len(header)) + header)
            # TLS 1.3 servers check the client certificate after the handshake: a refusal arrives on this read
            if len(tls.recv(4)) < 4:
                fail("the connection closed after the TLS handshake", _closed_hint(security))
    except socket.timeout:
        fail(f"no answer to the TLS handshake within {timeout_s:g} s", "is this a TLS listener? check the port and --kafka.security-protocol")
    except ssl.SSLError as e:
        # The server's "certificate required" alert and its close race: under load the close can arrive first, as a bare EOF
        fail(f"{type(e).__name__}: {e}", _closed_hint(security) if isinstance(e, ssl.SSLEOFError) else None)
    except OSError as e:
        fail(f"{type(e).__name__}: {e}", _closed_hint(security))
    finally:
        raw.close()


def _closed_hint(security: KafkaSecurity) -> str:
    """What a TLS connection the broker closed without a reason most likely means, given our own settings."""
    if security.cert_file is None:
        return ("the broker closed the TLS connection without a reason; it most likely requires a client certificate: "
                "give --kafka.tls.cert-file and --kafka.tls.key-file")
    return "the broker closed the TLS connection without a reason; it may refuse our client certificate (--kafka.tls.cert-file): is it signed by the broker's client CA?"


_REASON = re.compile(r"(?:Connection (?:lost|failed)|Bootstrap (?:connection|attempt) to \S+ failed): (.*?)(?: \(backoff [^)]*\))?$")


def _explain(bootstrap: str, security: KafkaSecurity, error: Exception, messages: list[str]) -> str:
    # the most specific thing kafka-python said: its last "Connection lost: <reason>" or "... failed: <reason>"
    reasons = [m.group(1) for m in map(_REASON.search, messages) if m]
    reason = reasons[-1] if reasons else f"{type(error).__name__}: {error}"
    text = "\n".join(messages + [reason])
    hint = next((h for key, h in _HINTS if key in text), None)
    sasl = security.protocol.startswith("SASL_")
    if hint is None and sasl and (security.sasl_mechanism or "").startswith("SCRAM") and {"'v'", "KeyError: 'v'"} & {*reasons, reason}:
        # kafka-python's SCRAM client fails on the server's "e=<error>" final message (no "v=" signature). It retries
        # until the deadline, so on a loaded machine its last attempt may end in a timeout instead: any refusal counts.
        reason, hint = "the broker ended the SCRAM exchange with an error", "SASL authentication failed: check --kafka.sasl.username and the password"
    if hint is None and ("disconnected" in reason or "reset by peer" in reason or "EOF" in reason):
        hint = (f"the broker closed the connection during SASL: does it offer {security.sasl_mechanism} (--kafka.sasl.mechanism)?" if sasl else
                "the broker closed the connection: does it require TLS or SASL (--kafka.security-protocol)?")
    msg = f"cannot connect to Kafka at {bootstrap} ({security.describe()}): {reason}"
    return f"{msg}; {hint}" if hint else msg


def add_security_flags(parser: argparse.ArgumentParser) -> None:
    """Add the ``--kafka.security-protocol``, ``--kafka.tls.*`` and ``--kafka.sasl.*`` flags to an argparse parser."""
    g = parser.add_argument_group("Kafka connection security",
                                  f"TLS, mutual TLS and SASL for every Kafka client; the SASL password comes from --kafka.sasl.password-file "
                                  f"or ${PASSWORD_ENV}, never from a flag")
    for flag, kw in SECURITY_FLAGS.items():
        g.add_argument(flag, **kw)


SECURITY_FLAGS: dict[str, dict[str, Any]] = {
    "--kafka.security-protocol": dict(dest="kafka_security_protocol", metavar="PROTOCOL", help=f"{', '.join(PROTOCOLS)} (default: PLAINTEXT)"),
    "--kafka.tls.ca-file": dict(dest="kafka_tls_ca_file", metavar="PEM", help="CA that signed the brokers' certificates (default: system trust store)"),
    "--kafka.tls.cert-file": dict(dest="kafka_tls_cert_file", metavar="PEM", help="client certificate for mutual TLS"),
    "--kafka.tls.key-file": dict(dest="kafka_tls_key_file", metavar="PEM", help="the client certificate's private key"),
    "--kafka.sasl.mechanism": dict(dest="kafka_sasl_mechanism", metavar="NAME", help=f"{', '.join(MECHANISMS)}"),
    "--kafka.sasl.username": dict(dest="kafka_sasl_username", metavar="USER", help="SASL user name"),
    "--kafka.sasl.password-file": dict(dest="kafka_sasl_password_file", metavar="FILE", help=f"file with the SASL password (or set ${PASSWORD_ENV})"),
}


def security_from_args(values: argparse.Namespace | dict) -> KafkaSecurity:
    """:class:`KafkaSecurity` from parsed flags (an argparse namespace or a settings dict)."""
    get = values.get if isinstance(values, dict) else (lambda k: getattr(values, k, None))
    return KafkaSecurity.from_options(get("kafka_security_protocol"), get("kafka_tls_ca_file"), get("kafka_tls_cert_file"),
                                      get("kafka_tls_key_file"), get("kafka_sasl_mechanism"), get("kafka_sasl_username"),
                                      get("kafka_sasl_password_file"))
