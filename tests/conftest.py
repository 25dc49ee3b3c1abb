"""Shared test set-up: the mutant zoo is importable as `mutant_zoo`; oracle math runs single-threaded."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)  # small tensors: threads only add contention on 2 cores
