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
__version__ = "0.1.0"
