"""Cluster topology: which addresses are GPU NICs, and on which server.

The topology CSV has one row per GPU NIC with at least ``ip,server``
(optional ``rail``, ``leaf``). Its addresses are the GPU list: traffic to or
from any other address (storage, management) is not training traffic.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from prism.ingest.csvrows import read_csv_rows
from prism.ingest.records import FlowFormatError, normalise_address

__all__ = ["Topology"]

REQUIRED = ("ip", "server")
OPTIONAL = ("rail", "leaf")


@dataclass(frozen=True)
class Topology:
    """GPU NICs indexed 0..n-1.

    Attributes
    ----------
    nics : pandas.DataFrame
        One row per NIC: ``ip`` (canonical), ``server``, and ``rail``/``leaf``
        when given. Row position is the NIC index used everywhere else.
    """

    nics: pd.DataFrame

    @classmethod
    def from_csv(cls, path: str) -> "Topology":
        """Load and check a topology CSV.

        Raises
        ------
        FlowFormatError
            On a missing column, an empty or invalid address, a missing
            server name, or an address listed twice; the message names the
            file and line.
        """
        rows, header = read_csv_rows(path, "topology", "--topology takes a CSV file (ip,server[,rail,leaf])")
        if not rows:
            raise FlowFormatError(f"{path}: topology is empty (expected a header with {', '.join(REQUIRED)} and one row per GPU NIC)")
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise FlowFormatError(f"{path}: topology is missing column(s) {', '.join(map(repr, missing))} (found: {', '.join(h for h in header if h)})")
        seen: dict[str, int] = {}
        out: dict[str, list] = {c: [] for c in REQUIRED + tuple(c for c in OPTIONAL if c in header)}
        for i, row in enumerate(rows, start=2):
            raw_ip = (row.get("ip") or "").strip()
            ip = normalise_address(raw_ip) if raw_ip else None
            if ip is None:
                raise FlowFormatError(f"{path}:line {i}: field ip: {raw_ip!r} is not an IPv4/IPv6 address")
            server = (row.get("server") or "").strip()
            if not server:
                raise FlowFormatError(f"{path}:line {i}: field server is empty")
            if ip in seen:
                raise FlowFormatError(f"{path}:line {i}: ip {ip} already listed on line {seen[ip]}")
            seen[ip] = i
            out["ip"].append(ip)
            out["server"].append(server)
            for c in OPTIONAL:
                if c in out:
                    out[c].append((row.get(c) or "").strip())
        return cls(pd.DataFrame(out))

    @classmethod
    def from_frame(cls, df: pd.DataFrame) -> "Topology":
        missing = [c for c in REQUIRED if c not in df.columns]
        if missing:
            raise FlowFormatError(f"topology frame is missing column(s) {', '.join(missing)}")
        nics = df.copy()
        nics["ip"] = [normalise_address(x) for x in nics["ip"]]
        if nics["ip"].isna().any():
            raise FlowFormatError("topology frame has an invalid ip")
        return cls(nics.reset_index(drop=True))

    def __len__(self) -> int:
        return len(self.nics)

    @cached_property
    def ips(self) -> pd.Index:
        """The NICs' addresses (one Index, so its hash table is built once)."""
        return pd.Index(self.nics["ip"])

    @property
    def server_codes(self) -> np.ndarray:
        """Server index per NIC (positions in :attr:`servers`)."""
        return self._servers()[0]

    @property
    def servers(self) -> pd.Index:
        return self._servers()[1]

    def _servers(self):
        codes, uniques = pd.factorize(self.nics["server"], sort=True)
        return codes, pd.Index(uniques)

    def pair_addresses(self, a: ArrayLike, b: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """Addresses of NIC pairs as ``(src, dst)`` with ``src < dst`` as text.

        The unordered-pair convention of ``pairs.csv`` and the ground truth.
        """
        ips = self.nics["ip"].to_numpy()
        sa, sb = ips[np.asarray(a)], ips[np.asarray(b)]
        swap = sa > sb
        return np.where(swap, sb, sa), np.where(swap, sa, sb)

    def nic_index(self, addresses: pd.Series | pd.Categorical | np.ndarray | list[str]) -> np.ndarray:
        """NIC index of each canonical address, -1 where it is not a GPU NIC.

        A categorical is looked up per category, not per row.
        """
        if isinstance(addresses, pd.Categorical) or isinstance(getattr(addresses, "dtype", None), pd.CategoricalDtype):
            cat = pd.Categorical(addresses)
            per_cat = self.ips.get_indexer(cat.categories)
            codes = cat.codes
            return np.where(codes < 0, -1, per_cat[np.where(codes < 0, 0, codes)] if len(per_cat) else -1)
        return self.ips.get_indexer(pd.Index(addresses))
