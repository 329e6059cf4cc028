"""A PyTorch-layout project: requirements.txt, train.py, .python-version."""

import os
import sys

import tinyutil
import torch

print(
    f"train.py ran: torch {torch.__version__}, tinyutil {tinyutil.answer()}, "
    f"python {sys.version_info[0]}.{sys.version_info[1]}, "
    f"EPOCHS={os.environ.get('EPOCHS')}, args={sys.argv[1:]}"
)
