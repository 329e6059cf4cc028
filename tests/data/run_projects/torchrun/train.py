"""Distributed PyTorch: started by torchrun on every node."""

import torch.distributed as dist

dist.init_process_group("nccl")
