"""collectors: ERSPAN-mirrored (and host-side) RoCEv2 captures to flow records.

Data flows one way: capture file (:mod:`.pcapfile`, memory-mapped record
scan) -> packet fields (:mod:`.decode`, one compiled pass) -> RDMA messages
(:mod:`.assemble`, numpy over whole batches) -> flow records in the format
of :mod:`prism.ingest.records` -> a sink (:mod:`.collect`: file or Kafka).
``prism collect`` / ``python -m collectors`` is the front-end (:mod:`.cli`).
"""
