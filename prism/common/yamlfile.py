"""Read a YAML file given on the command line, with an error that names the flag and the file.

Several commands take YAML (the daemon's ``--config.file``, the collectors'
``--switch-map``, the what-if ``--meta``); each used to reach into the
daemon for this reader. It lives here so that any layer can read YAML
without importing the service.
"""
from __future__ import annotations

import os
from typing import Any

__all__ = ["read_yaml"]


def read_yaml(path: str | os.PathLike, flag: str) -> Any:
    """A YAML file's document (``{}`` for an empty file).

    An unreadable or invalid file raises ValueError naming ``flag`` and the
    file, which the commands print as a usage error (exit 2).

    >>> read_yaml("/nonexistent/prism.yaml", "--config.file")
    Traceback (most recent call last):
    ...
    ValueError: --config.file /nonexistent/prism.yaml: No such file or directory
    """
    import yaml  # on first use: most commands never read YAML

    try:
        with open(path) as f:
            return yaml.safe_load(f) or {}
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:  # a binary file given by mistake: the codec's message alone names no file
        raise ValueError(f"{flag} {path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); expected a YAML file") from e
    except yaml.YAMLError as e:
        raise ValueError(f"{flag} {path}: not valid YAML: {e}") from e
