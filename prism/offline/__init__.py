"""The batch path: ``prism replay`` over captured dumps, spilling to disk past a bound, and its outputs
(tables, the Perfetto timeline, plots).
"""
