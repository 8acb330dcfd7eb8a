"""``ElasticSampler``: shards a dataset by rank and, after a reset, re-shards only what is left."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized

import torch.utils.data

from hpcdl.torch.basics import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Like ``DistributedSampler``, but remembers how many samples the job has processed this epoch
    (``record_batch``) so that a ``TorchState`` can re-partition the rest among the new set of ranks.

    Args:
        dataset: the dataset (of constant length).
        shuffle: shuffle the indices (identically on all ranks) each epoch.
        seed: the shuffle seed; must be the same on all ranks.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``: forget processed samples. Call it at the end of an epoch."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Record that every rank processed ``batch_size`` more samples."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Re-partition the samples not yet processed this epoch among the current ranks."""
        self.num_replicas = size()
        self.rank = rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num :]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = self.remaining_indices[:]
        indices += indices[: self.total_size - len(indices)]
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
