"""gpufleet.controllers: the kopf operators that enforce the desired state in a cluster.

Not built yet (see the controllers issue); the package exists so the import name is reserved.
"""
