"""collectors: ERSPAN-mirrored RoCEv2 captures to flow records.

Not built yet (issue 6). The output format it must produce is
:mod:`prism.records` (``start_ns, duration_ns, src, dst, size, switches``).
"""
