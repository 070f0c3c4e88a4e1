"""Produce flow records to Kafka in the daemon's format.

Records are grouped by unordered GPU pair into one message per pair and
call (key = the pair, see :mod:`prism.ingest.messages`), so Kafka's default
partitioner keeps each pair on one partition. Used by the demo, the tests
and the collectors.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

from prism.ingest.messages import ARROW_CONTENT_TYPE, JSONL_CONTENT_TYPE, arrow_ipc, encode_jsonl, pair_keys

if TYPE_CHECKING:
    from prism.serve.kafkaconf import KafkaSecurity

__all__ = ["FlowProducer"]


class FlowProducer:
    """Send flow frames to ``topic``.

    Parameters
    ----------
    bootstrap_servers : str
    topic : str
    fmt : {"arrow", "jsonl"}
        Message format (Arrow decodes faster; JSON Lines is readable).
    security : prism.serve.kafkaconf.KafkaSecurity, optional
        TLS and SASL settings (default: plaintext).
    """

    def __init__(self, bootstrap_servers: str, topic: str = "prism-flows", fmt: str = "arrow", security: KafkaSecurity | None = None,
                 **producer_options: Any) -> None:
        from kafka import KafkaProducer

        if fmt not in ("arrow", "jsonl"):
            raise ValueError("fmt must be 'arrow' or 'jsonl'")
        self.topic, self.fmt = topic, fmt
        opts = dict(bootstrap_servers=bootstrap_servers, acks="all", linger_ms=20, enable_idempotence=False, max_request_size=16 << 20,
                    delivery_timeout_ms=120_000, retries=2**31 - 1, reconnect_backoff_max_ms=1000)
        if security is not None:
            opts.update(security.client_options())
        opts.update(producer_options)
        self.producer = KafkaProducer(**opts)
        self.records_sent = 0
        self.messages_sent = 0

    def send(self, flows: pd.DataFrame) -> int:
        """Send a frame as one message per GPU pair; return messages sent."""
        if len(flows) == 0:
            return 0
        keys = pair_keys(flows["src"].astype(str), flows["dst"].astype(str))
        codes, uniq = pd.factorize(keys)
        order = np.argsort(codes, kind="stable")
        bounds = np.flatnonzero(np.r_[True, codes[order][1:] != codes[order][:-1], True])
        flows = flows.iloc[order].reset_index(drop=True)
        for c in ("src", "dst", "switches"):
            flows[c] = flows[c].astype(str)
        ctype = (ARROW_CONTENT_TYPE if self.fmt == "arrow" else JSONL_CONTENT_TYPE).encode()
        # convert once; each message is a zero-copy slice of the sorted table
        table = pa.Table.from_pandas(flows, preserve_index=False) if self.fmt == "arrow" else None
        for i in range(len(bounds) - 1):  # per message (pair), not per record
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            value = arrow_ipc(table.slice(lo, hi - lo)) if table is not None else encode_jsonl(flows.iloc[lo:hi])
            self.producer.send(self.topic, key=uniq[codes[order[lo]]], value=value, headers=[("content-type", ctype)])
        self.records_sent += len(flows)
        self.messages_sent += len(bounds) - 1
        return len(bounds) - 1

    def send_raw(self, value: bytes, key: bytes | None = None, headers: list[tuple[str, bytes]] | None = None) -> None:
        """Send one message as is (tests of bad input)."""
        self.producer.send(self.topic, key=key, value=value, headers=headers or [])
        self.messages_sent += 1

    def flush(self, timeout: float | None = None) -> None:
        self.producer.flush(timeout=timeout)

    def close(self) -> None:
        self.producer.close(timeout=10)
