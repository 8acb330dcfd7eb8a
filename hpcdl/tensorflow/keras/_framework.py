"""``hpcdl.tensorflow`` as the Keras machinery (``hpcdl._keras``) uses it, for Keras 3 on TensorFlow and
for tf-keras alike: gradients reduced by named engine operations inside the compiled train step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

import numpy as np
import tensorflow as tf

import hpcdl.tensorflow as hvd
from hpcdl.common.reduce_ops import Average
from hpcdl.tensorflow.elastic import run as elastic_run
from hpcdl.tensorflow.gradients import GradientReducer, LocalGradientAggregation


class TensorFlowFramework:
    name = "tensorflow"
    hvd = hvd

    def reducer(self, name: str, options: dict[str, Any]) -> GradientReducer:
        return GradientReducer(name, **options)

    def aggregation(self, passes: int, average: bool, sparse_as_dense: bool) -> LocalGradientAggregation:
        return LocalGradientAggregation(passes, average, sparse_as_dense)

    def broadcast_variables(self, variables: Sequence[Any], root_rank: int) -> None:
        hvd.broadcast_variables(list(variables), root_rank)

    def tensor(self, value: Any) -> tf.Tensor:
        return tf.convert_to_tensor(value)

    def average(self, values: np.ndarray, name: str) -> np.ndarray:
        return hvd.allreduce(self.tensor(values), op=Average, name=name).numpy()

    def run(self, func: Callable[..., Any]) -> Callable[..., Any]:
        return elastic_run(func)


FRAMEWORK = TensorFlowFramework()
