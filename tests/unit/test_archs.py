"""The architectures (core.train.archs): built to the images and classes, sized by arithmetic
as built, bounded by memory, started from another run's weights; each trains, exports in
every format, resumes after a kill and after a preemption exactly as if never stopped, and
starts another run. Each model is trained once for those checks (`trained`)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from core.errors import InvalidSpec, TrainingPreempted
from core.model_sizes import WORKER_MEMORY_BYTES, model_too_large, parameter_count, step_memory
from core.spec import Architecture, ExportFormat, JobSpec
from core.store import spec_hash
from core.train import TrainResult, train
from core.train.archs import build_model, classifier_parameters, freeze_backbone, start_from
from core.train.data import load_dataset
from core.train.normalization import split_weights
from core.train.pretrained import WEIGHTS_SHA256, imagenet_efficientnet_lite0
from core.train.run import Run, read_saved
from core.train.verify_export import read_metadata
from tests.conftest import Recorder
from tests.photos import write_photo_set
from tests.preemption import epoch_figures, preempted_at, steps, weights

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


def test_pretrained_weights_are_a_start_of_their_own() -> None:
    with pytest.raises(ValidationError, match=r"offered for resnet18, .*lite0, not cnn"):
        JobSpec(pretrained=True)
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
        run.start_from(read_saved(other.weights(), torch.device("cpu")))
    weights, _ = split_weights(torch.load(io.BytesIO(run.weights()), weights_only=True))
    assert all(t.device.type == "cpu" for t in weights.values())


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread here, and in the processes that check the exports: on models this
    small, a second thread saves nothing, and on a busy machine the threads' spinning at
    each op's barrier makes every step many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield
    torch.set_num_threads(threads)


@dataclass(frozen=True)
class Trained:
    """One architecture's uninterrupted run on a tiny photo set, with everything it
    reported: what each resume of the same spec is held to, bit for bit (CPU kernels are
    deterministic)."""

    spec: JobSpec
    data_dir: Path
    result: TrainResult
    rec: Recorder


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """16 real photo patches of 8 px, 4 classes (8 to test on): the data folder, the set."""
    data_dir = tmp_path_factory.mktemp("photos")
    return data_dir, write_photo_set(data_dir, side=8, per_class=4)


@pytest.fixture(scope="module", params=TORCHVISION, ids=str)
def trained(request: pytest.FixtureRequest, photos: tuple[Path, str]) -> Trained:
    """Each model trained once for the checks below: 2 epochs of 2 steps, photo augmentation
    as a photo job would, every format exported and checked in a fresh process. In fp32:
    on CPUs with AMX, bf16's depthwise convolutions on maps smaller than their kernels
    (mobilenet_v3_large, efficientnet_b0 at 8 px) gave weights that differed between two
    runs of the same steps, and once logits that were not finite; the resume checks below
    ask for the same bits, which fp32's kernels give (the cnn's resumes in bf16, amp auto:
    tests/unit/test_preemption.py)."""
    arch, (data_dir, name) = request.param, photos
    spec = JobSpec(
        dataset=name, model=arch, epochs=2, batch_size=8, augment="photo", amp="off",
        pretrained=arch is Architecture.efficientnet_lite0,  # the one with ImageNet weights
    )  # fmt: skip
    rec = Recorder()
    result = train(spec, data_dir=data_dir, device="cpu", callbacks=rec.callbacks())
    return Trained(spec, data_dir, result, rec)


def resumed(t: Trained, checkpoint: bytes, rec: Recorder) -> TrainResult:
    """The run of `t` resumed from `checkpoint`. Its model is checked in TorchScript alone:
    its weights must be the uninterrupted run's, whose every format was checked."""
    spec = t.spec.model_copy(update={"export": (ExportFormat.torchscript,)})
    return train(
        spec, data_dir=t.data_dir, device="cpu", callbacks=rec.callbacks(), resume=checkpoint,
        history=t.result.epochs,
    )  # fmt: skip


def assert_as_uninterrupted(t: Trained, before: Recorder, after: Recorder) -> None:
    """The steps, epoch figures and final weights (their moving average too) of a run
    stopped and resumed are the uninterrupted run's (as tests/unit/test_preemption.py asks
    of the cnn)."""
    assert steps(before) + steps(after) == steps(t.rec)
    assert epoch_figures(before) + epoch_figures(after) == epoch_figures(t.rec)
    final, expected = weights(after.checkpoints[-1][1]), weights(t.rec.checkpoints[-1][1])
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[k], expected[k]) for k in expected)


@pytest.mark.slow
def test_each_model_trains_and_exports_every_format_with_its_metadata(trained: Trained) -> None:
    first = trained.result
    assert set(first.models) == set(ExportFormat), first.record["formats"]
    assert first.steps == 4 and [e.epoch for e in first.epochs] == [1, 2]
    weights = first.record["pretrained_weights"]
    assert (weights and weights["sha256"]) == (WEIGHTS_SHA256 if trained.spec.pretrained else None)
    for fmt, model in first.models.items():  # each file says what it takes and what it outputs
        meta = read_metadata(fmt, model.data)
        assert json.loads(meta["classes"]) == first.record["dataset"]["classes"]
        assert json.loads(meta["preprocessing"]) == json.loads(
            json.dumps(first.record["preprocessing"])
        )


@pytest.mark.slow
def test_each_model_resumes_from_its_epoch_checkpoint_after_a_kill(trained: Trained) -> None:
    """A worker killed (kill -9) in epoch 2: the job resumes from epoch 1's checkpoint."""
    epoch, blob = trained.rec.checkpoints[0]
    before = Recorder()
    before.steps, before.epochs = trained.rec.steps[:2], trained.rec.epochs[:epoch]
    after = Recorder()
    result = resumed(trained, blob, after)
    assert result.steps == trained.result.steps and list(result.models) == ["torchscript"]
    assert_as_uninterrupted(trained, before, after)


@pytest.mark.slow
def test_each_model_preempted_mid_epoch_resumes_as_if_never_stopped(trained: Trained) -> None:
    before = Recorder()
    with pytest.raises(TrainingPreempted) as stop:
        train(
            trained.spec, data_dir=trained.data_dir, device="cpu",
            callbacks=preempted_at(3, before),
        )  # fmt: skip
    assert (stop.value.step, stop.value.epoch) == (3, 2)  # after the first step of epoch 2
    after = Recorder()
    resumed(trained, stop.value.checkpoint, after)
    assert_as_uninterrupted(trained, before, after)


@pytest.mark.slow
def test_each_model_starts_another_run(trained: Trained) -> None:
    data_dir = trained.data_dir
    tuned = JobSpec(
        dataset=write_photo_set(data_dir, side=8, per_class=2), model=trained.spec.model,
        epochs=1, batch_size=8, init_from="3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88",
        freeze_backbone=True, export=["torchscript"],
    )  # fmt: skip
    result = train(tuned, data_dir=data_dir, device="cpu", start_weights=trained.result.weights)
    assert result.steps == 1


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
