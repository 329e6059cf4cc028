"""gpufleet.controllers: the kopf operators that enforce the desired state in a cluster
(the module list is in docs/controllers.md, "Where the code is")."""
