"""Prism: black-box performance diagnosis of LLM training from network flows.

Data flows one way: source -> records -> windows -> analyses -> sinks.

- :mod:`prism.ingest.records`: the flow-record schema and validation
- :mod:`prism.ingest.readers`: CSV / Parquet / JSON Lines readers (streaming)
- :mod:`prism.ingest.topology`: GPU NIC -> server map
- :mod:`prism.analysis.jobs`: job recognition (LLMPrism Algorithm 1)
- :mod:`prism.offline.replay`: the offline pipeline behind ``prism replay``
"""
__version__ = "0.1.0"
