"""A custom TensorFlow 2 training loop with ``DistributedGradientTape``, the way Horovod's TensorFlow 2
examples write it, on synthetic data (no download).

Run it on 2 ranks with either launcher, or submit it to the cluster's scheduler:

    hpcdl run -np 2 python examples/tensorflow_gradient_tape_synthetic.py
    mpirun -np 2 python examples/tensorflow_gradient_tape_synthetic.py
    hpcdl submit -N 2 --ranks-per-node 4 -t 30 examples/tensorflow_gradient_tape_synthetic.py

A Horovod script differs only in its import (``import horovod.tensorflow as hvd``). The steps are marked
below: (1) init, (2) pin the GPU to the local rank, (3) shard the data by rank, (4) scale the learning
rate by the number of ranks, (5) wrap the tape (the step is a ``tf.function``), (6) broadcast the
variables from rank 0 after the first step, when the optimizer's exist, (7) average the metrics over the
ranks, and (8) checkpoint on rank 0 only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import hpcdl.tensorflow as hvd


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--base-lr", type=float, default=0.01, help="learning rate of one rank")
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="save a checkpoint per epoch here")
    return parser.parse_args()


def synthetic_classes(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """32 features, 10 classes: a fixed random centre per class (the same on every rank) plus noise."""
    centres = np.random.RandomState(0).randn(10, 32)
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 10, samples)
    return (centres[labels] + 1.5 * rng.randn(samples, 32)).astype("float32"), labels.astype("int64")


def main() -> None:
    args = parse_args()
    hvd.init()  # (1)
    gpus = tf.config.list_physical_devices("GPU")  # (2)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")

    features, labels = synthetic_classes(args.samples, seed=1)
    shard = tf.data.Dataset.from_tensor_slices((features, labels)).shard(hvd.size(), hvd.rank())  # (3)
    dataset = shard.shuffle(4096, seed=hvd.rank()).batch(args.batch_size, drop_remainder=True)

    model = keras.Sequential(
        [keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
    )
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.SGD(args.base_lr * hvd.size(), momentum=0.9)  # (4)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    @tf.function
    def training_step(x: tf.Tensor, y: tf.Tensor, first_batch: bool) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        tape = hvd.DistributedGradientTape(tape, compression=compression)  # (5)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:  # (6)
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables, root_rank=0)
        correct = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
        return loss, correct

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    first = True
    for epoch in range(args.epochs):
        losses, accuracies = [], []
        for x, y in dataset:
            loss, accuracy = training_step(x, y, first)
            first = False
            losses.append(float(loss))
            accuracies.append(float(accuracy))
        metrics = tf.constant([np.mean(losses), np.mean(accuracies)])
        averaged = hvd.allreduce(metrics, name="epoch.metrics")  # (7)
        if hvd.rank() == 0:
            print(
                f"epoch {epoch + 1}/{args.epochs}: loss={float(averaged[0]):.4f} "
                f"accuracy={float(averaged[1]):.4f} ranks={hvd.size()}",
                flush=True,
            )
            if args.checkpoint_dir is not None:  # (8)
                checkpoint.save(str(args.checkpoint_dir / "checkpoint"))


if __name__ == "__main__":
    main()
