"""Flow records in: the schema and its validation, file readers, the Kafka message codec and the topology.

The only layer that knows how records are encoded; everything above it sees validated columns.
"""
