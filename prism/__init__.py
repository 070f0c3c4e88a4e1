"""Prism: black-box performance diagnosis of LLM training from network flows.

Data flows one way: source -> records -> windows -> analyzers -> sinks.

- :mod:`prism.records`: the flow-record schema and validation
- :mod:`prism.readers`: CSV / Parquet / JSON Lines readers (streaming)
- :mod:`prism.topology`: GPU NIC -> server map
- :mod:`prism.jobs`: job recognition (LLMPrism Algorithm 1)
- :mod:`prism.replay`: the offline pipeline behind ``prism replay``
"""
__version__ = "0.1.0"
