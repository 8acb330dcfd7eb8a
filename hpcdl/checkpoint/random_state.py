"""``RandomState``: a rank's random number generators, as a ``shard`` of a checkpoint, so that dropout,
augmentation and anything else drawn at random after a restart draws what it would have drawn."""

from __future__ import annotations

import random
import sys
from typing import Any


class RandomState:
    """This rank's generators: Python's ``random``, NumPy's global one, and PyTorch's (CPU, and every CUDA
    device once CUDA is initialized) where those libraries are imported. Nothing is imported here."""

    def state_dict(self) -> dict[str, Any]:
        saved: dict[str, Any] = {"python": random.getstate()}
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            saved["numpy"] = numpy.random.get_state()
        torch = sys.modules.get("torch")
        if torch is not None:
            saved["torch"] = torch.get_rng_state()
            if torch.cuda.is_initialized():
                saved["cuda"] = torch.cuda.get_rng_state_all()
        return saved

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        random.setstate(saved["python"])
        if "numpy" in saved:
            import numpy

            numpy.random.set_state(saved["numpy"])
        if "torch" in saved:
            import torch

            torch.set_rng_state(saved["torch"])
            if "cuda" in saved:
                torch.cuda.set_rng_state_all(saved["cuda"])
