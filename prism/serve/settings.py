"""The daemon's settings in one place: its flags, their defaults, their checks, and ``--config.file``.

``prism daemon`` takes every setting as a flag or as a key of a YAML
``--config.file`` (``kafka.topic: flows``, or nested ``kafka: {topic:
flows}``); flags given on the command line win over the file, the file over
the defaults. Durations take ``ms``, ``s``, ``m``, ``h``. The command line
only turns :data:`DAEMON_FLAGS` into argparse arguments and hands what it
parsed to :func:`resolve_settings`; the Helm chart's config map is checked
against the same flags. The result, :class:`DaemonSettings`, is what
:func:`prism.serve.build.build_daemon` wires a daemon from (the live demo
and the tests make one directly).

This module is imported whenever the ``prism`` command builds its parser,
so it imports nothing heavy at the top: the monitor and the metrics server
are loaded when the settings are resolved.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prism.common.argtypes import MAX_DURATION_S  # one bound for every command's durations (7 days)
from prism.common.logs import LOG_FORMATS, LOG_LEVELS
from prism.common.yamlfile import read_yaml
from prism.serve.kafkaconf import SECURITY_FLAGS, KafkaSecurity, security_from_args

if TYPE_CHECKING:
    from prism.serve.monitor import MonitorSettings

__all__ = ["CONFIG_KEYS", "DAEMON_DEFAULTS", "DAEMON_FLAGS", "DaemonSettings", "KafkaSettings", "MAX_COUNTS", "ROLES",
           "check_settings", "load_config", "parse_bootstrap_servers", "parse_duration", "resolve_settings"]


# a setting's value when neither a flag nor the config file gives it (checked like the others, so durations are text)
DAEMON_DEFAULTS: dict[str, Any] = {
    "kafka_topic": "prism-flows", "kafka_group_id": "prism", "kafka_summary_topic": "prism-summaries",
    "kafka_max_message_bytes": 8 << 20, "kafka_max_poll_interval": "30s", "kafka_session_timeout": "6s",
    "role": "all", "kafka_job_topic": "prism-jobs", "kafka_job_topic_partitions": 12,
    "web_listen_address": "127.0.0.1:9464", "window": "120s", "window_step": "15s", "window_lateness": "2s",
    "window_max_flows": 20_000_000, "jobs_ttl": "10m", "switch_window": "60s", "log_level": "info", "log_format": "logfmt",
}


def _default(dest: str) -> str:
    """``(default: ...)`` for a flag's help, from :data:`DAEMON_DEFAULTS` (so the help cannot drift from it)."""
    return f"(default: {DAEMON_DEFAULTS[dest]})"


# flag -> argparse settings; no argparse defaults: a flag not given is None, so the config file's value stands
DAEMON_FLAGS: dict[str, dict[str, Any]] = {
    "--config.file": dict(dest="config_file", metavar="FILE", help="YAML file with any of these settings (flags win)"),
    "--topology": dict(metavar="CSV", help="CSV with ip,server (optional rail,leaf): one row per GPU NIC (required)"),
    "--source": dict(metavar="DIR", help="tail this directory of flow dumps instead of Kafka"),
    "--role": dict(dest="role", metavar="ROLE", help="all: one process does everything; ingest or analyse: one stage of a scaled-out "
                   f"daemon, the two joined by --kafka.job-topic (see docs/daemon.md, Scale-out) {_default('role')}"),
    "--kafka.bootstrap-servers": dict(dest="kafka_bootstrap_servers", metavar="HOST:PORT[,...]", help="Kafka brokers"),
    "--kafka.topic": dict(dest="kafka_topic", metavar="TOPIC", help=f"topic of flow records {_default('kafka_topic')}"),
    "--kafka.group-id": dict(dest="kafka_group_id", metavar="ID", help=f"consumer group; replicas share it {_default('kafka_group_id')}"),
    "--kafka.summary-topic": dict(dest="kafka_summary_topic", metavar="TOPIC",
                                  help=f"compacted topic for partition state and job membership, created if missing {_default('kafka_summary_topic')}"),
    "--kafka.job-topic": dict(dest="kafka_job_topic", metavar="TOPIC",
                              help=f"--role ingest|analyse: topic of GPU flows keyed by job, created if missing {_default('kafka_job_topic')}"),
    "--kafka.job-topic-partitions": dict(dest="kafka_job_topic_partitions", metavar="N",
                                         help=f"partitions of --kafka.job-topic when it is created: at most this many analyse replicas "
                                              f"{_default('kafka_job_topic_partitions')}"),
    "--kafka.replica-id": dict(dest="kafka_replica_id", metavar="NAME", help="this replica's stable name (default: the host name)"),
    "--kafka.max-message-bytes": dict(dest="kafka_max_message_bytes", metavar="BYTES",
                                      help=f"larger messages are rejected as oversized_message {_default('kafka_max_message_bytes')}"),
    "--kafka.max-poll-interval": dict(dest="kafka_max_poll_interval", metavar="DURATION",
                                      help=f"a window's analysis must finish within this {_default('kafka_max_poll_interval')}"),
    "--kafka.session-timeout": dict(dest="kafka_session_timeout", metavar="DURATION",
                                    help=f"a dead replica's partitions move after this {_default('kafka_session_timeout')}"),
    "--web.listen-address": dict(dest="web_listen_address", metavar="HOST:PORT", help=f"metrics, /healthz, /readyz {_default('web_listen_address')}"),
    "--web.config.file": dict(dest="web_config_file", metavar="YAML", help="TLS and basic auth for the web endpoint, in the Prometheus "
                              "exporter-toolkit format (as node_exporter); /healthz and /readyz need no password"),
    "--window": dict(dest="window", metavar="DURATION", help=f"flows analysed per window; hold several steps of the slowest job {_default('window')}"),
    "--window.step": dict(dest="window_step", metavar="DURATION", help=f"event time between analyses {_default('window_step')}"),
    "--window.lateness": dict(dest="window_lateness", metavar="DURATION",
                              help=f"wait at least this long for out-of-order records {_default('window_lateness')}; the wait grows to the "
                                   "disorder measured in the input, at most half a window"),
    "--window.max-flows": dict(dest="window_max_flows", metavar="N", help=f"memory bound, 32 bytes a flow; the oldest are shed beyond it {_default('window_max_flows')}"),
    "--jobs.names": dict(dest="jobs_names", metavar="CSV", help="an inventory of the scheduler's job names: CSV with job_name and server "
                         "(or ip, a GPU NIC of --topology); a job takes the name most of its servers carry, as the job_name label of "
                         "prism_job_info; read again when the file changes"),
    "--jobs.ttl": dict(dest="jobs_ttl", metavar="DURATION", help=f"forget GPU pairs and jobs unseen this long {_default('jobs_ttl')}"),
    "--switch.window": dict(dest="switch_window", metavar="DURATION", help=f"switch bandwidth comparison window {_default('switch_window')}"),
    "--log.level": dict(dest="log_level", metavar="LEVEL", help=f"debug, info, warning or error {_default('log_level')}"),
    "--log.format": dict(dest="log_format", metavar="FORMAT", help=f"logfmt or json, one record per line on stderr {_default('log_format')}"),
    **SECURITY_FLAGS,
}

#: The keys a ``--config.file`` may set: every flag without its dashes, but the config file itself.
CONFIG_KEYS: frozenset[str] = frozenset(f.lstrip("-") for f in DAEMON_FLAGS) - {"config.file"}


def _dest(flag: str) -> str:
    """The settings key of a flag: its argparse ``dest``."""
    return DAEMON_FLAGS[flag].get("dest", flag.lstrip("-"))


def _check_one_source(source_dir: object, bootstrap_servers: object) -> None:
    """A daemon reads one source: Kafka or a directory, not both, not neither."""
    if bool(source_dir) == bool(bootstrap_servers):
        raise ValueError("give exactly one of --kafka.bootstrap-servers or --source DIR")


def parse_duration(text: str | float) -> float:
    """Seconds from ``"90s"``, ``"2m"``, ``"500ms"``, ``"1h"`` or a number.

    >>> parse_duration("2m"), parse_duration("500ms"), parse_duration(3)
    (120.0, 0.5, 3.0)
    """
    import re

    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*", str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 500ms, 30s, 5m, 1h)")
    return float(m.group(1)) * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


#: upper bounds of the counts: --window.max-flows at 32 bytes a flow (2**32: 128 GiB), and
#: --kafka.max-message-bytes, which Kafka's protocol carries as an int32 (its own message.max.bytes cannot be more)
MAX_COUNTS = {"--window.max-flows": 1 << 32, "--kafka.max-message-bytes": (1 << 31) - 1, "--kafka.job-topic-partitions": 10_000}

#: ``--role``: the whole daemon in one process, or one stage of it (see :mod:`prism.serve.jobtopic`)
ROLES = ("all", "ingest", "analyse")

# a Kafka topic name, as the broker checks it (1-249 of these characters; "." and ".." are not names)
TOPIC_RE = r"[A-Za-z0-9._-]{1,249}"


def _count(value: Any, flag: str, most: int | None = None) -> int:
    """A whole number from 1 to ``most`` (config files may give ``1e6`` or ``"20_000_000"``)."""
    text = str(value).replace("_", "").strip()
    try:
        n = int(text)  # exact: a float would round a large count
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise ValueError(f"{flag}: expected a whole number >= 1, got {value!r}") from None
        if not f.is_integer() or f < 1:  # NaN and infinity are not integers
            raise ValueError(f"{flag}: expected a whole number >= 1, got {value!r}") from None
        n = int(f)
    if isinstance(value, bool) or n < 1:
        raise ValueError(f"{flag}: expected a whole number >= 1, got {value!r}")
    if most is not None and n > most:
        raise ValueError(f"{flag}: at most {most:,}, got {value!r}")
    return n


def parse_bootstrap_servers(text: object, flag: str = "--kafka.bootstrap-servers") -> list[tuple[str, int]]:
    """``HOST:PORT[,HOST:PORT...]`` as (host, port) pairs; a ValueError names the flag and the entry.

    IPv6 hosts are bracketed (``[::1]:9092``); a host alone takes Kafka's port, 9092, as the clients do.
    Checked before connecting: a client given ``::::`` failed deep inside with "invalid literal for int()".

    >>> parse_bootstrap_servers("k1:9092, [::1]:9093,k2")
    [('k1', 9092), ('::1', 9093), ('k2', 9092)]
    >>> parse_bootstrap_servers("::::")
    Traceback (most recent call last):
    ...
    ValueError: --kafka.bootstrap-servers: '::::' is not HOST:PORT (IPv6 addresses go in brackets: [::1]:9092)
    """
    import ipaddress

    out = []
    entries = [e.strip() for e in str(text).split(",")]
    if not any(entries):
        raise ValueError(f"{flag}: expected HOST:PORT[,HOST:PORT...], got {text!r}")
    for entry in entries:
        if not entry:
            raise ValueError(f"{flag}: an empty entry in {text!r}")
        host, port = entry, "9092"
        if entry.startswith("["):
            close = entry.find("]")
            host, rest = entry[1:close], entry[close + 1:]
            if close < 0 or (rest and not rest.startswith(":")):
                raise ValueError(f"{flag}: {entry!r} is not [IPV6]:PORT")
            port = rest[1:] if rest else port
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise ValueError(f"{flag}: {entry!r}: {host!r} is not an IPv6 address") from None
        elif entry.count(":") == 1:
            host, port = entry.split(":")
        elif ":" in entry:
            raise ValueError(f"{flag}: {entry!r} is not HOST:PORT (IPv6 addresses go in brackets: [::1]:9092)")
        if not host or any(c.isspace() for c in host):
            raise ValueError(f"{flag}: {entry!r} has no host")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"{flag}: {entry!r}: the port must be a number from 1 to 65535")
        out.append((host, int(port)))
    return out


def check_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The daemon's settings, checked and typed; a ValueError names the flag.

    Durations must be positive (``--window.lateness`` may be 0), counts
    whole and >= 1, the listen address a HOST:PORT with a port in range,
    the log level one of :data:`prism.common.logs.LOG_LEVELS`.

    >>> check_settings({"window": "2m", "log_level": "INFO"})["window"]
    120.0
    >>> check_settings({"window_max_flows": 0})
    Traceback (most recent call last):
    ...
    ValueError: --window.max-flows: expected a whole number >= 1, got 0
    """
    from prism.serve.metrics import parse_listen_address

    out = dict(settings)
    for key, flag, zero_ok in (
        ("window", "--window", False), ("window_step", "--window.step", False), ("window_lateness", "--window.lateness", True),
        ("jobs_ttl", "--jobs.ttl", False), ("switch_window", "--switch.window", False),
        ("kafka_max_poll_interval", "--kafka.max-poll-interval", False), ("kafka_session_timeout", "--kafka.session-timeout", False),
    ):
        if key in out:
            try:
                out[key] = parse_duration(out[key])
            except ValueError as e:
                raise ValueError(f"{flag}: {e}") from None
            if out[key] < 0 or (out[key] == 0 and not zero_ok):
                raise ValueError(f"{flag}: must be {'>= 0' if zero_ok else '> 0'}, got {settings[key]!r}")
            if out[key] > MAX_DURATION_S:
                raise ValueError(f"{flag}: at most 7 days (168h), got {settings[key]!r}")
    for key, flag in (("window_max_flows", "--window.max-flows"), ("kafka_max_message_bytes", "--kafka.max-message-bytes"),
                      ("kafka_job_topic_partitions", "--kafka.job-topic-partitions")):
        if key in out:
            out[key] = _count(out[key], flag, MAX_COUNTS[flag])
    for key, flag in (("kafka_topic", "--kafka.topic"), ("kafka_summary_topic", "--kafka.summary-topic"), ("kafka_job_topic", "--kafka.job-topic")):
        if key in out:
            import re

            topic = "" if out[key] is None else str(out[key])
            if not re.fullmatch(TOPIC_RE, topic) or topic in (".", ".."):
                raise ValueError(f"{flag}: {topic!r} is not a Kafka topic name (1-249 letters, digits, '.', '_', '-')")
            out[key] = topic
    # an empty group id is Kafka's deprecated "no group": nothing would be committed, and replicas would not share partitions
    if "kafka_group_id" in out and (out["kafka_group_id"] is None or not str(out["kafka_group_id"]).strip()):
        raise ValueError("--kafka.group-id: must not be empty")
    if out.get("kafka_bootstrap_servers"):
        parse_bootstrap_servers(out["kafka_bootstrap_servers"])
    if "role" in out:
        role = str(out["role"]).lower()
        if role not in ROLES:
            raise ValueError(f"--role: expected one of {', '.join(ROLES)}, got {out['role']!r}")
        out["role"] = role
    if "log_level" in out:
        level = str(out["log_level"]).lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"--log.level: expected one of {', '.join(LOG_LEVELS)}, got {out['log_level']!r}")
        out["log_level"] = level
    if "log_format" in out:
        fmt = str(out["log_format"]).lower()
        if fmt not in LOG_FORMATS:
            raise ValueError(f"--log.format: expected one of {', '.join(LOG_FORMATS)}, got {out['log_format']!r}")
        out["log_format"] = fmt
    if "web_listen_address" in out:
        parse_listen_address(out["web_listen_address"])
    return out


def load_config(path: str, known: set[str] | frozenset[str] = CONFIG_KEYS) -> dict[str, Any]:
    """Flat ``{dotted.key: value}`` from a YAML file; unknown keys are an error."""
    doc = read_yaml(path, "--config.file")
    if not isinstance(doc, dict):
        raise ValueError(f"--config.file {path}: expected a mapping of settings at the top level")
    flat: dict[str, Any] = {}

    def walk(prefix: str, d: dict) -> None:
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and key not in known:
                walk(key, v)
            else:
                flat[key] = v

    walk("", doc)
    unknown = sorted(set(flat) - known)
    if unknown:
        raise ValueError(f"--config.file {path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return flat


@dataclass(frozen=True)
class KafkaSettings:
    """Where and how the daemon consumes flow records from Kafka (the ``--kafka.*`` flags)."""

    bootstrap_servers: str
    topic: str = DAEMON_DEFAULTS["kafka_topic"]
    group_id: str = DAEMON_DEFAULTS["kafka_group_id"]
    summary_topic: str = DAEMON_DEFAULTS["kafka_summary_topic"]
    replica_id: str | None = None  # None: the host name
    max_message_bytes: int = DAEMON_DEFAULTS["kafka_max_message_bytes"]
    session_timeout_s: float = parse_duration(DAEMON_DEFAULTS["kafka_session_timeout"])
    security: KafkaSecurity | None = None  # None: plaintext
    job_topic: str = DAEMON_DEFAULTS["kafka_job_topic"]  # --role ingest|analyse: GPU flows keyed by job
    job_topic_partitions: int = DAEMON_DEFAULTS["kafka_job_topic_partitions"]


@dataclass(frozen=True)
class DaemonSettings:
    """A daemon's checked settings: what :func:`prism.serve.build.build_daemon` wires it from.

    Exactly one of ``kafka`` and ``source_dir`` says where the records come
    from. ``topology`` is the ``--topology`` CSV; the live demo and the
    tests hand the builder a :class:`~prism.ingest.topology.Topology`
    instead and leave it None.
    """

    monitor: MonitorSettings
    kafka: KafkaSettings | None = None
    source_dir: str | None = None
    topology: str | None = None
    job_names: str | None = None  # the --jobs.names CSV
    web_listen_address: str = DAEMON_DEFAULTS["web_listen_address"]
    web_config_file: str | None = None
    # a window's analysis must finish within this (a Kafka consumer's max.poll.interval); /healthz follows it too
    max_poll_interval_s: float = parse_duration(DAEMON_DEFAULTS["kafka_max_poll_interval"])
    log_level: str = DAEMON_DEFAULTS["log_level"]
    log_format: str = DAEMON_DEFAULTS["log_format"]
    role: str = DAEMON_DEFAULTS["role"]  # all, ingest or analyse (ROLES)

    def __post_init__(self) -> None:
        _check_one_source(self.source_dir, self.kafka)
        if self.role not in ROLES:
            raise ValueError(f"--role: expected one of {', '.join(ROLES)}, got {self.role!r}")
        if self.role != "all" and self.kafka is None:
            raise ValueError(f"--role {self.role}: the stages meet on a Kafka topic; give --kafka.bootstrap-servers, not --source")

    @property
    def health_stall_s(self) -> float:
        """/healthz fails after the loop has not turned for this long: twice a window's analysis budget, at least a minute."""
        return max(60.0, 2 * self.max_poll_interval_s)


def resolve_settings(given: Mapping[str, Any]) -> DaemonSettings:
    """The daemon's settings from parsed flags (``dest -> value``, None when not given); ValueError names the flag.

    Defaults, then ``--config.file``, then the flags given; then checked:
    a topology is required, and exactly one source (Kafka or a directory).

    >>> s = resolve_settings({"topology": "t.csv", "source": "in", "window": "1m"})
    >>> s.monitor.window_s, s.source_dir, s.kafka, s.health_stall_s
    (60.0, 'in', None, 60.0)
    """
    settings = dict(DAEMON_DEFAULTS)
    if given.get("config_file"):
        for key, value in load_config(given["config_file"], CONFIG_KEYS).items():
            settings[_dest("--" + key)] = value
    for flag in DAEMON_FLAGS:
        dest = _dest(flag)
        if dest != "config_file" and given.get(dest) is not None:
            settings[dest] = given[dest]
    if not settings.get("topology"):
        raise ValueError("--topology is required (CSV with ip,server: one row per GPU NIC)")
    _check_one_source(settings.get("source"), settings.get("kafka_bootstrap_servers"))  # before the other checks: the likelier mistake
    from prism.serve.monitor import MonitorSettings

    settings = check_settings(settings)
    security = security_from_args(settings)  # checked with --source too: a bad flag is an error either way
    monitor = MonitorSettings(
        window_s=settings["window"], step_s=settings["window_step"], lateness_s=settings["window_lateness"],
        pair_ttl_s=settings["jobs_ttl"], max_window_flows=settings["window_max_flows"], switch_window_s=settings["switch_window"],
    )
    kafka = None
    if not settings.get("source"):
        kafka = KafkaSettings(
            settings["kafka_bootstrap_servers"], settings["kafka_topic"], settings["kafka_group_id"], settings["kafka_summary_topic"],
            replica_id=settings.get("kafka_replica_id"), max_message_bytes=settings["kafka_max_message_bytes"],
            session_timeout_s=settings["kafka_session_timeout"], security=security, job_topic=settings["kafka_job_topic"],
            job_topic_partitions=settings["kafka_job_topic_partitions"],
        )
    return DaemonSettings(
        monitor=monitor, kafka=kafka, source_dir=settings.get("source"), topology=settings["topology"], job_names=settings.get("jobs_names"),
        web_listen_address=settings["web_listen_address"], web_config_file=settings.get("web_config_file"),
        max_poll_interval_s=settings["kafka_max_poll_interval"], log_level=settings["log_level"], log_format=settings["log_format"],
        role=settings["role"],
    )
