"""The architectures (core.train.archs): built to the images and classes, sized by arithmetic
as built, bounded by memory, started from another run's weights; each trains, resumes and
exports in every format."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from core.errors import InvalidSpec
from core.model_sizes import WORKER_MEMORY_BYTES, model_too_large, parameter_count, step_memory
from core.spec import Architecture, ExportFormat, JobSpec
from core.store import spec_hash
from core.train import train
from core.train.archs import build_model, classifier_parameters, freeze_backbone, start_from
from core.train.data import load_dataset
from core.train.pretrained import WEIGHTS_SHA256, imagenet_efficientnet_lite0
from core.train.run import Run
from tests.conftest import Recorder
from tests.photos import write_photo_set

TORCHVISION = [a for a in Architecture if a is not Architecture.cnn]


@pytest.mark.parametrize("arch", list(Architecture))
@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32), (3, 96, 96)])
def test_each_model_fits_its_images_and_classes_and_is_sized_as_built(
    arch: Architecture, shape: tuple[int, int, int]
) -> None:
    spec = JobSpec(model=arch, batch_size=4)
    net = build_model(spec, shape, 7).eval()
    assert parameter_count(spec, shape, 7) == sum(p.numel() for p in net.parameters())
    with torch.inference_mode():
        assert net(torch.rand(2, *shape)).shape == (2, 7)


def test_small_images_keep_their_resolution_through_the_stem() -> None:
    small = build_model(JobSpec(model="resnet18"), (3, 32, 32), 10)
    large = build_model(JobSpec(model="resnet18"), (3, 96, 96), 10)
    assert small.conv1.kernel_size == (3, 3) and small.conv1.stride == (1, 1)
    assert isinstance(small.maxpool, torch.nn.Identity)
    assert large.conv1.kernel_size == (7, 7) and large.conv1.stride == (2, 2)
    for arch in ("mobilenet_v3_small", "efficientnet_b0"):
        conv = build_model(JobSpec(model=arch), (1, 32, 32), 10).features[0][0]
        assert conv.stride == (1, 1) and conv.in_channels == 1


def test_cnn_only_fields_are_refused_with_another_model() -> None:
    with pytest.raises(ValidationError, match="conv1_channels, hidden: for model cnn only"):
        JobSpec(model="resnet18", conv1_channels=16, hidden=64)
    with pytest.raises(ValidationError, match="gradient_checkpointing: for model cnn only"):
        JobSpec(model="mobilenet_v3_small", gradient_checkpointing=True)
    JobSpec(model="cnn", conv1_channels=16, gradient_checkpointing=True)


def test_backbone_options_need_a_job_to_start_from() -> None:
    for extra in ({"freeze_backbone": True}, {"backbone_lr_scale": 0.1}):
        with pytest.raises(ValidationError, match="need init_from"):
            JobSpec(**extra)
    with pytest.raises(ValidationError, match="init_from must be a job id"):
        JobSpec(init_from="../etc")
    job = "3F2C1E9A-0D4B-4C8E-9A57-2B1F0C6D7E88"
    assert JobSpec(init_from=job, freeze_backbone=True).init_from == job.lower()


def test_pretrained_weights_are_for_lite0_and_a_start_of_their_own() -> None:
    with pytest.raises(ValidationError, match="offered for efficientnet_lite0, not resnet18"):
        JobSpec(model="resnet18", pretrained=True)
    job = "3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88"
    with pytest.raises(ValidationError, match=r"pretrained and init_from .*: pick one"):
        JobSpec(model="efficientnet_lite0", pretrained=True, init_from=job)
    spec = JobSpec(model="efficientnet_lite0", pretrained=True, freeze_backbone=True)
    assert spec.freeze_backbone and not JobSpec(model="efficientnet_lite0").pretrained
    assert JobSpec(model="efficientnet_lite0", pretrained=True, backbone_lr_scale=0.1)


@pytest.mark.parametrize("shape", [(1, 16, 16), (3, 96, 96)])  # small stem and gray; standard
def test_a_pretrained_lite0_starts_from_the_imagenet_weights(shape: tuple[int, int, int]) -> None:
    imagenet = imagenet_efficientnet_lite0().state_dict()
    spec = JobSpec(dataset="mnist-sample", model="efficientnet_lite0", pretrained=True)
    own = build_model(spec, shape, 5).state_dict()
    stem = imagenet["stem.0.weight"]
    assert torch.equal(own["stem.0.weight"], stem if shape[0] == 3 else stem.sum(1, keepdim=True))
    body = [k for k in own if not k.startswith(("stem.0.", "classifier."))]
    assert len(body) > 200 and all(torch.equal(own[k], imagenet[k]) for k in body)
    fresh = build_model(JobSpec(model="efficientnet_lite0"), shape, 5).state_dict()
    assert not torch.equal(fresh["blocks.3.depthwise.0.weight"], own["blocks.3.depthwise.0.weight"])


def test_a_step_that_needs_more_memory_than_a_worker_is_refused_with_what_fits() -> None:
    shape, own = (3, 64, 64), "ds:3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88"  # not the built-in size
    problem = model_too_large(JobSpec(dataset=own, model="resnet34", batch_size=8192), shape, 10)
    assert problem is not None and "more than a worker holds" in problem
    fits = int(problem.split("use batch_size ")[1].split()[0])
    spec = JobSpec(dataset=own, model="resnet34", batch_size=fits)
    assert (
        step_memory(spec, shape, 10)
        <= WORKER_MEMORY_BYTES
        < step_memory(spec.model_copy(update={"batch_size": fits + 1}), shape, 10)
    )
    assert model_too_large(spec, shape, 10) is None
    with pytest.raises(ValidationError, match="needs about"):  # the built-in sets: 1×28×28
        JobSpec(model="efficientnet_b0", batch_size=65536)


def test_images_outside_a_models_range_are_refused() -> None:
    problem = model_too_large(JobSpec(model="resnet18"), (3, 4, 4), 10)
    assert problem is not None and "8 to 512 px" in problem
    assert model_too_large(JobSpec(), (3, 4, 4), 10) is None  # the cnn takes them


def test_fine_tuning_keeps_all_but_a_class_layer_of_other_classes() -> None:
    spec = JobSpec(model="mobilenet_v3_small")
    source = build_model(spec, (3, 16, 16), 4).state_dict()
    model = build_model(spec, (3, 16, 16), 7)
    fresh = start_from(model, Architecture.mobilenet_v3_small, source)
    assert fresh == ["classifier.3.weight", "classifier.3.bias"]
    mine = model.state_dict()
    assert all(torch.equal(mine[k], v) for k, v in source.items() if k not in fresh)
    assert mine["classifier.3.weight"].shape == (7, 1024)
    other = build_model(JobSpec(model="resnet18"), (3, 16, 16), 4).state_dict()
    with pytest.raises(ValueError, match="not a mobilenet_v3_small"):
        start_from(model, Architecture.mobilenet_v3_small, other)


def test_a_frozen_backbone_leaves_only_the_classifier_learning() -> None:
    model = build_model(JobSpec(model="resnet18"), (3, 16, 16), 4)
    freeze_backbone(model, Architecture.resnet18)
    learning = {n for n, p in model.named_parameters() if p.requires_grad}
    assert learning == {"fc.weight", "fc.bias"}
    assert learning == classifier_parameters(model, Architecture.resnet18)


def test_the_backbone_learns_at_its_own_rate(tmp_path: Path) -> None:
    name = write_photo_set(tmp_path, side=8, per_class=4)
    data = load_dataset(name, tmp_path)
    job = "3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88"
    spec = JobSpec(dataset=name, model="resnet18", init_from=job, backbone_lr_scale=0.1, lr=0.01)
    run = Run(spec, torch.device("cpu"), None, data)
    backbone, head = run.optimizer.param_groups
    assert backbone["lr"] == pytest.approx(0.001) and head["lr"] == pytest.approx(0.01)
    assert {id(p) for p in head["params"]} == {id(run.model.fc.weight), id(run.model.fc.bias)}


def test_weights_of_another_architecture_are_a_named_error(tmp_path: Path) -> None:
    name = write_photo_set(tmp_path, side=8, per_class=4)
    data = load_dataset(name, tmp_path)
    job = "3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88"
    run = Run(
        JobSpec(dataset=name, model="resnet18", init_from=job), torch.device("cpu"), None, data
    )
    other = Run(JobSpec(dataset=name), torch.device("cpu"), None, data)
    with pytest.raises(InvalidSpec, match=f"init_from: job {job}: its weights are not a resnet18"):
        run.start_from(other.weights())
    weights = torch.load(io.BytesIO(run.weights()), weights_only=True)
    assert all(t.device.type == "cpu" for t in weights.values())


@pytest.mark.slow  # each model: two short runs and three exports checked in fresh processes
@pytest.mark.parametrize("arch", TORCHVISION)
def test_each_model_trains_resumes_exports_and_starts_another(
    arch: Architecture, tmp_path: Path
) -> None:
    name = write_photo_set(tmp_path, side=16, per_class=8)
    pretrained = arch is Architecture.efficientnet_lite0  # the one with ImageNet weights
    spec = JobSpec(
        dataset=name, model=arch, epochs=2, batch_size=8, max_steps=6, augment="photo",
        amp="bf16", pretrained=pretrained,
    )  # fmt: skip
    rec = Recorder()
    first = train(spec, data_dir=tmp_path, callbacks=rec.callbacks())
    assert set(first.models) == set(ExportFormat), first.record["formats"]
    weights = first.record["pretrained_weights"]
    assert (weights and weights["sha256"]) == (WEIGHTS_SHA256 if pretrained else None)
    epoch, blob = rec.checkpoints[0]
    resumed = train(spec, data_dir=tmp_path, resume=blob, history=first.epochs[:epoch])
    assert resumed.steps == first.steps and set(resumed.models) == set(ExportFormat)
    tuned = JobSpec(
        dataset=write_photo_set(tmp_path, side=16, per_class=4), model=arch, epochs=1,
        batch_size=8, max_steps=2, init_from="3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88",
        freeze_backbone=True, export=["torchscript"],
    )  # fmt: skip
    assert train(tuned, data_dir=tmp_path, start_weights=first.weights).steps == 2


def test_the_job_started_from_is_part_of_the_request_hash() -> None:
    a, b = "3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88", "0f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88"
    hashes = {spec_hash(JobSpec(init_from=job)) for job in (a, b, None)}
    assert len(hashes) == 3  # an Idempotency-Key reused with another start is a conflict
    assert spec_hash(JobSpec(init_from=a.upper())) == spec_hash(JobSpec(init_from=a))


def saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """What autograd keeps for the backward of one training forward, weights aside."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.train()(x)
    return sum(kept.values())


@pytest.mark.parametrize("arch", TORCHVISION)
@pytest.mark.parametrize("side", [12, 72])  # a small-input stem, then the standard one
def test_the_memory_estimate_covers_what_autograd_keeps(arch: Architecture, side: int) -> None:
    spec = JobSpec(dataset="ds:3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88", model=arch, batch_size=2)
    shape = (3, side, side)
    model = build_model(spec, shape, 10)
    kept = saved_bytes(model, torch.rand(2, *shape))
    estimate = step_memory(spec, shape, 10) - 16 * parameter_count(spec, shape, 10)
    assert kept <= estimate / 2 <= 2 * kept  # the estimate is twice what is kept, not far off


@pytest.mark.parametrize(
    "widths", [(32, 64, 0, 128), (512, 64, 0, 128), (32, 512, 0, 128), (64, 64, 256, 64)]
)
@pytest.mark.parametrize("side", [28, 96])
def test_the_cnn_memory_estimate_covers_what_autograd_keeps(
    widths: tuple[int, int, int, int], side: int
) -> None:
    c1, c2, c3, hidden = widths
    spec = JobSpec(conv1_channels=c1, conv2_channels=c2, conv3_channels=c3, hidden=hidden,
                   batch_size=2)  # fmt: skip
    shape = (3, side, side)
    model = build_model(spec, shape, 10)
    kept = saved_bytes(model, torch.rand(2, *shape))
    estimate = step_memory(spec, shape, 10) - 16 * parameter_count(spec, shape, 10)
    assert 0.8 * kept <= estimate / 2 <= 1.5 * kept


def test_a_cnn_too_wide_for_its_images_and_batch_is_refused() -> None:
    """The cnn's parameters fit (25.7M), but its first block alone holds half a TiB."""
    spec = JobSpec(dataset="ds:3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88", conv1_channels=512,
                   conv2_channels=1024, conv3_channels=2048, hidden=1, batch_size=4096)  # fmt: skip
    problem = model_too_large(spec, (3, 256, 256), 10)
    assert problem is not None and "GiB a step" in problem
    fits = int(problem.split("use batch_size ")[1].split()[0])
    assert model_too_large(spec.model_copy(update={"batch_size": fits}), (3, 256, 256), 10) is None
    assert model_too_large(spec.model_copy(update={"batch_size": fits + 1}), (3, 256, 256), 10)


@pytest.mark.parametrize("side", [8, 9, 11])  # the deepest 5×5 convs meet 1 px, padded to 5
def test_lite0s_estimate_covers_the_padding_of_tiny_images(side: int) -> None:
    own = "ds:3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88"
    spec = JobSpec(dataset=own, model="efficientnet_lite0", batch_size=2)
    shape = (3, side, side)
    kept = saved_bytes(build_model(spec, shape, 10), torch.rand(2, *shape))
    assert kept <= (step_memory(spec, shape, 10) - 16 * parameter_count(spec, shape, 10)) / 2
