"""Prism: black-box performance diagnosis of LLM training from network flows.

Data flows one way, and the packages follow it, each importing only from
the ones before it:

- :mod:`prism.common`: what every layer shares (compiled kernels, logging, exit codes)
- :mod:`prism.ingest`: flow records in (schema and validation, file formats, Kafka messages, topology)
- :mod:`prism.analysis`: jobs, DP/PP pair types, step timelines and diagnoses
- :mod:`prism.whatif`: the dependency-driven what-if simulator
- :mod:`prism.offline`: ``prism replay`` over captured dumps
- :mod:`prism.serve`: ``prism daemon``: Kafka or a directory in, Prometheus out
- :mod:`prism.deploy`: alert rules and dashboards
- :mod:`prism.cli`: the ``prism`` command, one module per command

docs/design.md has the map, module by module.
"""
import os as _os

__version__ = "0.1.0"

#: why numba's cache is not where NUMBA_CACHE_DIR says (logged by the commands that compile), or None
NUMBA_CACHE_NOTE: str | None = None


def _numba_cache_fallback() -> None:
    """A NUMBA_CACHE_DIR that cannot be written (a volume owned by another user) is replaced by a temporary one.

    numba picks where each compiled function caches when its module is
    imported, and with no writable place it raises at import: the command
    would not start. This runs before any Prism module imports numba.
    """
    global NUMBA_CACHE_NOTE
    import tempfile

    wanted = _os.environ.get("NUMBA_CACHE_DIR")
    if not wanted:
        return
    try:
        _os.makedirs(wanted, exist_ok=True)
        tempfile.TemporaryFile(dir=wanted).close()
    except OSError as e:
        fallback = _os.path.join(tempfile.gettempdir(), f"prism-numba-{_os.getuid() if hasattr(_os, 'getuid') else 0}")
        _os.environ["NUMBA_CACHE_DIR"] = fallback
        NUMBA_CACHE_NOTE = f"NUMBA_CACHE_DIR {wanted} cannot be written ({e.strerror or e}): compiled kernels are cached in {fallback} instead"


_numba_cache_fallback()
