"""What every layer shares: compiled kernels (union-find, stable orderings), memory settings, logging, argument types and exit codes.

Nothing here imports another Prism package, so any layer may import it.
"""
