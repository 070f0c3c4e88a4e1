"""The long-running service: the daemon's sources (Kafka, a directory), its sliding window and
incremental monitor, the Prometheus endpoint, Kafka and web configuration, and the local demo broker.
"""
