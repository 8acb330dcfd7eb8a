"""Keras training throughput: hpcdl.tensorflow against TensorFlow's MultiWorkerMirroredStrategy.

The same Keras model (a small CNN, 1.2 M parameters) with the same Keras SGD-momentum optimizer trains on
the same synthetic data, in the same job, four ways that take turns: ``model.train_on_batch`` with
``hvd.DistributedOptimizer`` (Keras' own compiled train step), a ``tf.function`` custom step with
``hvd.DistributedGradientTape``, the same custom step run by ``tf.distribute.MultiWorkerMirroredStrategy``
(its collectives over gRPC, as TensorFlow ships it for CPUs), and the same step without any communication.
Run the comparison and the scaling efficiency in one go::

    python benchmarks/keras_train.py --launch 1,2      (or: hpcdl bench keras_train --launch 1,2)

which starts ``hpcdl run -np 1`` and ``hpcdl run -np 2`` of this script and prints one table: samples/s of
each way, hpcdl's over the strategy's, each one's scaling efficiency (samples/s on N ranks / (N ×
samples/s on 1 rank)) and each one against the no-communication step in the same job (an efficiency a
busy shared machine distorts less: both sides of that ratio see the same load).

Each rank gets its own share of the cores as TensorFlow threads: ``cores / largest rank count`` with
``--launch`` (so 1 rank is measured with the share each of N ranks has); ``--threads`` overrides it.
Benchmarks do not assert.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Callable, Optional

try:
    from . import _training
    from ._launch import free_port
except ImportError:  # run as a script: python benchmarks/keras_train.py
    import _training  # type: ignore[no-redef]
    from _launch import free_port  # type: ignore[no-redef]

VARIANTS = ("hpcdl_fit", "hpcdl_tape", "mwms", "local")


def _small_cnn(keras: Any) -> Any:
    """The CNN of benchmarks/train.py, in Keras: four convolutions and two dense layers."""
    keras.utils.set_random_seed(0)
    conv = keras.layers.Conv2D
    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            conv(32, 3, padding="same", activation="relu"),
            conv(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            conv(128, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            conv(128, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def worker(args: argparse.Namespace) -> Optional[dict]:
    import hpcdl.tensorflow as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    # MultiWorkerMirroredStrategy must exist before TensorFlow runs its first op; hpcdl's object broadcast
    # runs none, so it can hand every worker the cluster's ports.
    ports = hvd.broadcast_object([free_port() for _ in range(size)] if rank == 0 else None, root_rank=0)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}})
    import tensorflow as tf

    threads = _training.threads_per_rank(args, hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import keras

    import hpcdl.keras as hvd_keras

    rng = tf.random.Generator.from_seed(rank)
    images = rng.normal([args.batch_size, 32, 32, 3])
    labels = rng.uniform([args.batch_size], 0, 10, dtype=tf.int64)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def sgd() -> Any:
        return keras.optimizers.SGD(0.01, momentum=0.9)

    # Keras' own train step with hpcdl's DistributedOptimizer (what model.fit runs).
    fit_model = _small_cnn(keras)
    fit_model.compile(optimizer=hvd_keras.DistributedOptimizer(sgd()), loss=loss_fn, jit_compile=False)

    def fit_step() -> None:
        fit_model.train_on_batch(images, labels)

    def custom_step(model: Any, optimizer: Any, distributed: bool) -> Callable:
        def step(x: tf.Tensor, y: tf.Tensor, replicas: int = 1) -> None:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True)) / replicas
            if distributed:
                tape = hvd.DistributedGradientTape(tape)
            optimizer.apply_gradients(
                zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
            )

        return step

    tape_model, tape_optimizer = _small_cnn(keras), sgd()
    tape_step = tf.function(custom_step(tape_model, tape_optimizer, distributed=True))
    local_model, local_optimizer = _small_cnn(keras), sgd()
    local_step = tf.function(custom_step(local_model, local_optimizer, distributed=False))
    with strategy.scope():
        mwms_model, mwms_optimizer = _small_cnn(keras), sgd()
    replica_step = custom_step(mwms_model, mwms_optimizer, distributed=False)

    @tf.function
    def mwms_step(x: tf.Tensor, y: tf.Tensor) -> None:
        # The strategy averages by summing gradients: each replica's loss is divided by their number.
        strategy.run(replica_step, args=(x, y, strategy.num_replicas_in_sync))

    step_s = _training.interleaved(
        {
            "hpcdl_fit": fit_step,
            "hpcdl_tape": lambda: tape_step(images, labels),
            "mwms": lambda: mwms_step(images, labels),
            "local": lambda: local_step(images, labels),
        },
        args,
        hvd.barrier,
        args.report_progress and rank == 0,
    )
    hvd.shutdown()
    if rank != 0:
        return None
    global_batch = args.batch_size * size
    result: dict[str, Any] = {
        "ranks": size,
        "threads_per_rank": threads,
        "batch_per_rank": args.batch_size,
        "parameters": int(sum(v.numpy().size for v in tape_model.trainable_variables)),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }
    for name in VARIANTS:
        result[f"{name}_samples_per_s"] = round(global_batch / step_s[name], 1)
    return result


def table(args: argparse.Namespace, results: dict[int, dict]) -> None:
    """The table of every run (one per rank count)."""
    first = results[next(iter(results))]
    print(
        f"Keras SmallCNN ({first['parameters']:,} parameters), synthetic 3x32x32 images, batch "
        f"{args.batch_size} per rank, {first['threads_per_rank']} thread(s) per rank, TensorFlow "
        f"{first['tensorflow']}, Keras {first['keras']}"
    )
    header = ["ranks", "fit+DistributedOptimizer", "tape+DistributedGradientTape", "MWMS", "no-comm"]
    header += [
        "tape / MWMS",
        "fit scaling",
        "tape scaling",
        "MWMS scaling",
        "tape vs no-comm",
        "MWMS vs no-comm",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---:|" * len(header))
    for ranks, r in results.items():
        cells = [str(ranks)] + [f"{r[f'{name}_samples_per_s']:.1f}" for name in VARIANTS]
        cells.append(f"{r['hpcdl_tape_samples_per_s'] / r['mwms_samples_per_s']:.3f}")
        cells += [
            _training.efficiency(results, ranks, f"{key}_samples_per_s")
            for key in ("hpcdl_fit", "hpcdl_tape", "mwms")
        ]
        for key in ("hpcdl_tape", "mwms"):
            cells.append(f"{100 * r[f'{key}_samples_per_s'] / r['local_samples_per_s']:.1f}%")
        print("| " + " | ".join(cells) + " |")


def main(argv: Optional[list[str]] = None) -> None:
    options = _training.parser(__doc__.split("\n\n")[0], steps=5, repeats=10, framework="TensorFlow")
    _training.main(argv, options, __file__, worker, table)


if __name__ == "__main__":
    main()
