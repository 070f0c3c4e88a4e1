"""What every layer shares: compiled kernels (union-find, stable orderings) and the registry that warms them up,
memory settings, logging, argument types, YAML files and exit codes.

Nothing here imports another Prism package, so any layer may import it.
"""
