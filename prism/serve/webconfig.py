"""``--web.config.file``: TLS and basic auth for the metrics endpoint, in the Prometheus exporter-toolkit format.

The same YAML file node_exporter and Prometheus take::

    tls_server_config:
      cert_file: /etc/prism/tls/tls.crt
      key_file: /etc/prism/tls/tls.key
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default), VerifyClientCertIfGiven
      client_ca_file: /etc/prism/tls/ca.crt
      min_version: TLS12                             # TLS10..TLS13 (default TLS12)
      max_version: TLS13
    http_server_config:
      headers:                                       # added to every response
        Strict-Transport-Security: max-age=31536000
    basic_auth_users:
      prometheus: $2y$10$...                         # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

What differs from exporter-toolkit, on purpose:

* ``/healthz`` and ``/readyz`` need no password (kubelet probes carry none);
  they are served over TLS like everything else. ``/metrics`` and every other
  path need a password when ``basic_auth_users`` is set.
* Keys Prism cannot honour (``cipher_suites``, ``curve_preferences``,
  ``client_allowed_sans``, ``RequestClientCert``, ``RequireAnyClientCert``)
  are an error, not silently ignored; ``http2`` and
  ``prefer_server_cipher_suites`` are accepted and have no effect (the server
  speaks HTTP/1.1; OpenSSL picks ciphers).
* The file, and the certificate files it names, are re-read when they change
  (certificate rotation needs no restart); a change that does not load is
  logged and the previous settings stay.

>>> cfg = WebConfig.parse({"basic_auth_users": {"prom": "$2b$04$UIoCxmi6RwcNvYrYOkqqLOZ.eAs7cbAKdP0oVC3qakwsl6MFEBvye"}})
>>> cfg.tls, sorted(cfg.users)
(None, ['prom'])
>>> WebConfig.parse({"tls_server_config": {"cert_file": "c.pem"}})
Traceback (most recent call last):
...
ValueError: tls_server_config: cert_file and key_file go together (got only cert_file)
"""
from __future__ import annotations

import base64
import hashlib
import logging
import os
import ssl
import threading
from dataclasses import dataclass, field

__all__ = ["WebConfig", "TlsServerConfig", "WebAuth", "load_web_config", "OPEN_PATHS"]

log = logging.getLogger("prism.web")

#: paths served without a password (probes); TLS still applies
OPEN_PATHS = frozenset({"/healthz", "/readyz"})

_TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version", "prefer_server_cipher_suites"}
_TLS_REFUSED = {"cipher_suites": "OpenSSL chooses the ciphers", "curve_preferences": "OpenSSL chooses the curves",
                "client_allowed_sans": "restrict clients by their CA (client_ca_file) instead"}
_HTTP_KEYS = {"headers", "http2"}
# a bcrypt hash checked against unknown users, so that a wrong name costs as long as a wrong password
_DUMMY_HASH = b"$2b$10$smKWb5gOCvlUtSGJXnqnfueonIxnDaVenQbPvCHTHjS5P.XzdOKRq"


@dataclass(frozen=True)
class TlsServerConfig:
    cert_file: str
    key_file: str
    client_auth_type: str = "NoClientCert"
    client_ca_file: str | None = None
    min_version: str = "TLS12"
    max_version: str | None = None

    def context(self) -> ssl.SSLContext:
        """The server's SSLContext (ValueError naming the key when a file does not load)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _TLS_VERSIONS[self.min_version]
        if self.max_version:
            ctx.maximum_version = _TLS_VERSIONS[self.max_version]
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file, password=lambda: b"")
        except (ssl.SSLError, OSError) as e:
            raise ValueError(f"tls_server_config: cannot load cert_file {self.cert_file} and key_file {self.key_file}: {e}") from None
        ctx.verify_mode = _CLIENT_AUTH[self.client_auth_type]
        if self.client_ca_file:
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            except (ssl.SSLError, OSError) as e:
                raise ValueError(f"tls_server_config: cannot load client_ca_file {self.client_ca_file}: {e}") from None
        return ctx


@dataclass(frozen=True)
class WebConfig:
    tls: TlsServerConfig | None = None
    users: dict = field(default_factory=dict)  # name -> bcrypt hash (bytes)
    headers: tuple = ()  # (name, value) added to every response

    @classmethod
    def parse(cls, doc: object, where: str = "web config") -> "WebConfig":
        """Validate a parsed YAML document; ValueError names the key."""
        if doc is None:
            return cls()
        if not isinstance(doc, dict):
            raise ValueError(f"{where}: expected a mapping at the top level, got {type(doc).__name__}")
        unknown = set(doc) - {"tls_server_config", "http_server_config", "basic_auth_users"}
        if unknown:
            raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r} (expected tls_server_config, http_server_config, basic_auth_users)")
        tls = _parse_tls(doc.get("tls_server_config"))
        users = {}
        for name, hashed in _mapping(doc.get("basic_auth_users"), "basic_auth_users").items():
            h = str(hashed).encode()
            if not h.startswith((b"$2a$", b"$2b$", b"$2y$")) or len(h) != 60:
                raise ValueError(f"basic_auth_users.{name}: not a bcrypt hash (make one with: htpasswd -nBC 10 '' | tr -d ':\\n')")
            users[str(name)] = h
        http = _mapping(doc.get("http_server_config"), "http_server_config")
        unknown = set(http) - _HTTP_KEYS
        if unknown:
            raise ValueError(f"http_server_config: unknown key {sorted(unknown)[0]!r} (expected headers, http2)")
        headers = tuple((str(k), str(v)) for k, v in _mapping(http.get("headers"), "http_server_config.headers").items())
        for k, v in headers:
            if "\n" in k + v or "\r" in k + v or not k.strip():
                raise ValueError(f"http_server_config.headers: {k!r} is not a valid header")
        return cls(tls, users, headers)


def _mapping(value, where):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _parse_tls(doc) -> TlsServerConfig | None:
    doc = _mapping(doc, "tls_server_config")
    if not doc:
        return None
    for key, why in _TLS_REFUSED.items():
        if key in doc:
            raise ValueError(f"tls_server_config.{key} is not supported by Prism ({why})")
    unknown = set(doc) - _TLS_KEYS
    if unknown:
        raise ValueError(f"tls_server_config: unknown key {sorted(unknown)[0]!r}")
    cert, key = doc.get("cert_file"), doc.get("key_file")
    if bool(cert) != bool(key):
        raise ValueError(f"tls_server_config: cert_file and key_file go together (got only {'cert_file' if cert else 'key_file'})")
    if not cert:
        raise ValueError("tls_server_config: cert_file and key_file are required")
    auth = doc.get("client_auth_type") or "NoClientCert"
    if auth in _UNSUPPORTED_CLIENT_AUTH:
        raise ValueError(f"tls_server_config.client_auth_type {auth} is not supported by Prism (a client certificate is either verified "
                         f"against client_ca_file or not asked for): use RequireAndVerifyClientCert or VerifyClientCertIfGiven")
    if auth not in _CLIENT_AUTH:
        raise ValueError(f"tls_server_config.client_auth_type {auth!r}: use one of {', '.join(_CLIENT_AUTH)}")
    ca = doc.get("client_ca_file")
    if auth != "NoClientCert" and not ca:
        raise ValueError(f"tls_server_config.client_auth_type {auth} needs client_ca_file")
    for k in ("min_version", "max_version"):
        if doc.get(k) is not None and doc[k] not in _TLS_VERSIONS:
            raise ValueError(f"tls_server_config.{k} {doc[k]!r}: use one of {', '.join(_TLS_VERSIONS)}")
    cfg = TlsServerConfig(str(cert), str(key), auth, str(ca) if ca else None, doc.get("min_version") or "TLS12", doc.get("max_version"))
    cfg.context()  # load the files now: a bad certificate is a startup error, not a failed scrape
    return cfg


def load_web_config(path: str) -> WebConfig:
    """Read and validate a web config file; relative file names in it are relative to the file (as in exporter-toolkit)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except FileNotFoundError:
        raise ValueError(f"--web.config.file {path}: no such file") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"--web.config.file {path}: {e}") from None
    base = os.path.dirname(os.path.abspath(path))
    tls = (doc or {}).get("tls_server_config") if isinstance(doc, dict) else None
    if isinstance(tls, dict):
        for k in ("cert_file", "key_file", "client_ca_file"):
            if tls.get(k):
                tls[k] = os.path.join(base, str(tls[k]))
    try:
        return WebConfig.parse(doc, f"--web.config.file {path}")
    except ValueError as e:
        msg = str(e)
        raise ValueError(msg if msg.startswith("--web.config.file") else f"--web.config.file {path}: {msg}") from None


class WebAuth:
    """The live web config of one server: re-read when the file or its certificates change.

    ``check(authorization_header)`` answers whether a request may pass;
    ``context`` is the current TLS context (None without TLS).
    """

    def __init__(self, path: str | None):
        self.path = path
        self.config = load_web_config(path) if path else WebConfig()
        self.context = self.config.tls.context() if self.config.tls else None
        self._stamp = self._files_stamp()
        self._lock = threading.Lock()
        self._ok_cache: dict = {}  # (user, sha256(password)) -> True: bcrypt costs ~50 ms, scrapes come every 15 s
        self.reload_errors = 0

    def _files_stamp(self):
        if not self.path:
            return None
        files = [self.path]
        if self.config.tls:
            files += [f for f in (self.config.tls.cert_file, self.config.tls.key_file, self.config.tls.client_ca_file) if f]
        out = []
        for f in files:
            try:
                st = os.stat(f)
                out.append((f, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((f, None, None))
        return tuple(out)

    def refresh(self) -> None:
        """Re-read the config if it or a certificate file changed; keep the old settings if the new ones do not load."""
        if not self.path:
            return
        stamp = self._files_stamp()
        if stamp == self._stamp:
            return
        with self._lock:
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                config = load_web_config(self.path)
                if (config.tls is None) != (self.config.tls is None):
                    raise ValueError("turning TLS on or off needs a restart")
                context = config.tls.context() if config.tls else None
            except ValueError as e:
                self.reload_errors += 1
                log.error("web config not reloaded, keeping the previous one: %s", e)
                return
            self.config, self.context, self._ok_cache = config, context, {}
            log.info("web config reloaded from %s", self.path)

    @property
    def auth_required(self) -> bool:
        return bool(self.config.users)

    def check(self, authorization: str | None) -> bool:
        """True if ``authorization`` (the HTTP header) carries a valid user and password, or none is needed."""
        users = self.config.users
        if not users:
            return True
        if not authorization or not authorization.startswith("Basic "):
            return False
        try:
            user, sep, password = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        if not sep:
            return False
        key = (user, hashlib.sha256(password.encode()).digest())
        if self._ok_cache.get(key):
            return True
        import bcrypt

        hashed = users.get(user)
        ok = bcrypt.checkpw(password.encode(), hashed or _DUMMY_HASH) and hashed is not None
        if ok:
            if len(self._ok_cache) > 1024:
                self._ok_cache.clear()
            self._ok_cache[key] = True
        return ok

