"""`gpufleet preflight`: before `pulumi up` or a merge, check that the cloud can deliver the GPU
pools the GitOps folder declares — quotas, instance or accelerator availability in the chosen
zones, capacity reservations. `checks.py` decides from facts; `aws.py` and `gcp.py` gather them."""
