"""Train a small CNN the Horovod way, on synthetic data (no download).

Run it on 2 ranks with either launcher:

    hpcdl run -np 2 python examples/train_synthetic.py
    mpirun -np 2 python examples/train_synthetic.py

A Horovod script differs only in its import (``import horovod.torch as hvd``). The ten steps are marked
below: (1) init, (2) pin the GPU to the local rank, (3) scale the learning rate by the number of ranks,
(4) wrap the optimizer, (5) broadcast the initial state from rank 0, (6) shard the data by rank,
(7) average metrics over ranks, (8) checkpoint on rank 0 only, (9) warm the learning rate up, and
(10) resume from the last checkpoint, agreed on by all ranks.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hpcdl.torch as hvd


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--base-lr", type=float, default=0.02, help="learning rate of one rank")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--warmup-epochs", type=float, default=1.0)
    parser.add_argument("--train-samples", type=int, default=2048)
    parser.add_argument("--val-samples", type=int, default=512)
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16")
    parser.add_argument("--batches-per-allreduce", type=int, default=1, help="local gradient accumulation")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def synthetic_dataset(samples: int, seed: int) -> TensorDataset:
    """Noisy copies of 10 fixed random class prototypes: learnable, and the same on every rank."""
    prototypes = torch.randn(10, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (samples,), generator=gen)
    images = prototypes[labels] + 1.5 * torch.randn(samples, 3, 16, 16, generator=gen)
    return TensorDataset(images, labels)


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def latest_checkpoint(directory: Path) -> int:
    """The last epoch with a checkpoint in ``directory`` (0 when none)."""
    epochs = [
        int(p.stem.split("-")[1]) for p in directory.glob("checkpoint-*.pt") if p.stem.split("-")[1].isdigit()
    ]
    return max(epochs, default=0)


def main() -> None:
    args = parse_args()

    # (1) Initialize: the ranks find each other (hpcdl run, mpirun, srun, ... all work).
    hvd.init()
    torch.manual_seed(args.seed)

    # (2) Pin one GPU per process, chosen by the rank on this node; on CPU, share the cores.
    device = torch.device("cpu")
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
        device = torch.device("cuda", hvd.local_rank())
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))

    # (6) Shard the data: each rank sees its own 1/size of every epoch.
    train_set = synthetic_dataset(args.train_samples, args.seed)
    val_set = synthetic_dataset(args.val_samples, args.seed + 1)
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True)
    val_sampler = DistributedSampler(val_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=args.batch_size, sampler=val_sampler)

    model = SmallCNN().to(device)

    # (3) Scale the learning rate by the number of ranks (the global batch is size() times larger).
    lr_scaler = hvd.size() * args.batches_per_allreduce
    optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr * lr_scaler, momentum=args.momentum)

    # (4) Wrap the optimizer: gradients are averaged over the ranks, overlapped with backward.
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
        backward_passes_per_step=args.batches_per_allreduce,
    )

    # (10) Resume: rank 0 looks for checkpoints, tells everyone where to start, and loads the last one
    # (the broadcast below then hands its state to the other ranks).
    resume_epoch = latest_checkpoint(args.checkpoint_dir) if hvd.rank() == 0 else 0
    resume_epoch = hvd.broadcast_object(resume_epoch, root_rank=0, name="resume_epoch")
    if resume_epoch > 0 and hvd.rank() == 0:
        checkpoint = args.checkpoint_dir / f"checkpoint-{resume_epoch}.pt"
        state = torch.load(checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if resume_epoch >= args.epochs:
            print(
                f"{checkpoint} holds epoch {resume_epoch} of {args.epochs}: nothing left to train (train "
                "further with a larger --epochs, or start afresh with another --checkpoint-dir)",
                flush=True,
            )
        else:
            print(f"resuming from {checkpoint} (epoch {resume_epoch} of {args.epochs})", flush=True)

    # (5) Start every rank from rank 0's weights and optimizer state (fresh or resumed).
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # (9) Warm up: start at base_lr and reach base_lr * size() after warmup_epochs.
    warmup = hvd.LearningRateWarmup(
        optimizer, warmup_epochs=args.warmup_epochs, steps_per_epoch=len(train_loader)
    )

    for epoch in range(resume_epoch, args.epochs):
        model.train()
        train_sampler.set_epoch(epoch)
        train_loss = hvd.Metric("train_loss")
        for batch, (images, labels) in enumerate(train_loader):
            warmup.step(epoch, batch)
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            # Split the batch for local accumulation (batches_per_allreduce backward passes per step).
            for chunk_images, chunk_labels in zip(
                images.chunk(args.batches_per_allreduce), labels.chunk(args.batches_per_allreduce)
            ):
                loss = F.cross_entropy(model(chunk_images), chunk_labels)
                train_loss.update(loss.detach(), n=len(chunk_labels))
                (loss / args.batches_per_allreduce).backward()
            optimizer.step()

        # (7) Average the metrics over all ranks' samples.
        model.eval()
        val_loss, val_accuracy = hvd.Metric("val_loss"), hvd.Metric("val_accuracy")
        with torch.no_grad():
            for images, labels in val_loader:
                images, labels = images.to(device), labels.to(device)
                logits = model(images)
                val_loss.update(F.cross_entropy(logits, labels), n=len(labels))
                val_accuracy.update((logits.argmax(dim=1) == labels).float().mean(), n=len(labels))
        train_avg, val_loss_avg, val_acc_avg = train_loss.avg, val_loss.avg, val_accuracy.avg
        if hvd.rank() == 0:
            print(
                f"epoch {epoch + 1}/{args.epochs}: train_loss={train_avg:.4f} val_loss={val_loss_avg:.4f} "
                f"val_accuracy={val_acc_avg:.4f} lr={optimizer.param_groups[0]['lr']:.4f} ranks={hvd.size()}",
                flush=True,
            )

        # (8) Checkpoint on rank 0 only, so ranks do not overwrite each other.
        if hvd.rank() == 0:
            args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1},
                args.checkpoint_dir / f"checkpoint-{epoch + 1}.pt",
            )

    hvd.shutdown()


if __name__ == "__main__":
    main()
