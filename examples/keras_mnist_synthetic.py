"""Train a small convolutional network on MNIST-like digits with Keras 3, the way Horovod's Keras MNIST
example does, on synthetic data (no download).

Run it on 2 ranks with either launcher, or submit it to the cluster's scheduler:

    hpcdl run -np 2 python examples/keras_mnist_synthetic.py
    mpirun -np 2 python examples/keras_mnist_synthetic.py
    hpcdl submit -N 2 --ranks-per-node 4 -t 30 examples/keras_mnist_synthetic.py --epochs 10

A Horovod script differs only in its import (``import horovod.tensorflow.keras as hvd``). It also runs on
Keras' PyTorch backend (``KERAS_BACKEND=torch``), where hpcdl.keras works through hpcdl.torch. The steps
are marked below: (1) init, (2) pin the GPU to the local rank, (3) shard the data by rank, (4) scale the
learning rate by the number of ranks, (5) wrap the optimizer, (6) broadcast the initial state from rank 0,
average the metrics and warm the learning rate up, (7) checkpoint on rank 0 only, and (8) resume from
the last checkpoint, agreed on by all ranks, with the distributed optimizer restored.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import keras
import numpy as np

import hpcdl.keras as hvd


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--base-lr", type=float, default=0.001, help="learning rate of one rank")
    parser.add_argument("--warmup-epochs", type=int, default=1)
    parser.add_argument("--train-samples", type=int, default=8192)
    parser.add_argument("--val-samples", type=int, default=1024)
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16")
    parser.add_argument(
        "--batches-per-allreduce", type=int, default=1, help="sum this many batches locally per allreduce"
    )
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="save (and resume from) here")
    return parser.parse_args()


def synthetic_digits(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """28x28 grey images of 10 classes: a fixed random stroke pattern per class (the same on every rank)
    under noise, so the task is learnable but not trivial."""
    patterns = np.random.RandomState(0).rand(10, 28, 28) > 0.8
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 10, samples)
    images = 0.5 * patterns[labels] + rng.rand(samples, 28, 28)
    return images[..., None].astype("float32"), labels.astype("int32")


def last_checkpoint(directory: Path | None) -> int:
    """The last epoch checkpointed in ``directory`` (0 for none)."""
    if directory is None or not directory.is_dir():
        return 0
    epochs = [int(p.stem.split("-")[1]) for p in directory.glob("checkpoint-*.keras")]
    return max(epochs, default=0)


class EpochLine(keras.callbacks.Callback):
    """One line per epoch on rank 0, after MetricAverageCallback averaged the metrics over the ranks."""

    def __init__(self, epochs: int) -> None:
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        print(
            f"epoch {epoch + 1}/{self.epochs}: loss={logs['loss']:.4f} accuracy={logs['accuracy']:.4f} "
            f"val_loss={logs['val_loss']:.4f} val_accuracy={logs['val_accuracy']:.4f} "
            f"lr={logs['lr']:.5f} ranks={hvd.size()}",
            flush=True,
        )


def make_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.25),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def main() -> None:
    args = parse_args()
    hvd.init()  # (1)

    if keras.backend.backend() == "tensorflow":  # (2) one GPU per rank, where there are GPUs
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")

    x_train, y_train = synthetic_digits(args.train_samples, seed=1)
    x_val, y_val = synthetic_digits(args.val_samples, seed=2)
    x_train, y_train = x_train[hvd.rank() :: hvd.size()], y_train[hvd.rank() :: hvd.size()]  # (3)
    x_val, y_val = x_val[hvd.rank() :: hvd.size()], y_val[hvd.rank() :: hvd.size()]

    scaled_lr = args.base_lr * hvd.size()  # (4)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    resume_from = int(hvd.broadcast(np.array(last_checkpoint(args.checkpoint_dir)), root_rank=0))  # (8)
    if resume_from > 0:
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
        model = hvd.load_model(
            args.checkpoint_dir / f"checkpoint-{resume_from}.keras", compression=compression
        )
    else:
        optimizer = hvd.DistributedOptimizer(  # (5)
            keras.optimizers.Adam(scaled_lr),
            compression=compression,
            backward_passes_per_step=args.batches_per_allreduce,
            average_aggregated_gradients=True,
        )
        model = make_model()
        # XLA compiles no Python, and hpcdl's TensorFlow ops are Python: keep jit_compile off (Keras turns
        # it on by itself where there is a GPU).
        model.compile(
            optimizer=optimizer,
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            jit_compile=False,
        )

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # (6)
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs),
    ]
    if hvd.rank() == 0:
        callbacks.append(EpochLine(args.epochs))
        if args.checkpoint_dir is not None:  # (7)
            args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            path = str(args.checkpoint_dir / "checkpoint-{epoch}.keras")
            callbacks.append(keras.callbacks.ModelCheckpoint(path))

    model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        initial_epoch=resume_from,
        validation_data=(x_val, y_val),
        callbacks=callbacks,
        verbose=0,
    )


if __name__ == "__main__":
    main()
