"""The built-in workloads: ResNet-50 has torchvision's parameter layout (the shapes the fusion benchmark
reduces), the small CNN takes any image size, and both train a step on CPU."""

from __future__ import annotations

import pytest
import torch
from hpcdl.benchmarks.fusion import resnet50_gradient_shapes

from hpcdl.scaling.models import MODELS, ResNet50, SmallCNN
from hpcdl.scaling.study import MODEL_NAMES


def test_resnet50_is_torchvisions_layout() -> None:
    model = ResNet50()
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert sorted(shapes) == sorted(resnet50_gradient_shapes())
    assert len(shapes) == 161 and sum(p.numel() for p in model.parameters()) == 25_557_032


@pytest.mark.parametrize("side", [16, 32, 40])
def test_small_cnn_trains_on_any_image_size(side: int) -> None:
    torch.manual_seed(0)
    model = SmallCNN()
    assert sum(p.numel() for p in model.parameters()) * 4 == 5_180_200
    images, labels = torch.randn(4, 3, side, side), torch.randint(0, 10, (4,))
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_the_study_knows_every_model_by_name() -> None:
    assert set(MODEL_NAMES) == set(MODELS)


def test_resnet50_runs_a_step_on_small_images() -> None:
    build, side, classes = MODELS["resnet50"]
    assert (side, classes) == (224, 1000)
    model = build()
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 1000)
    out.sum().backward()
