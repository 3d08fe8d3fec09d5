"""What a model's input is normalised by (core.train.normalization): a pretrained job feeds
the ImageNet weights their own preprocessing, not its set's mean and std, in its training
batches, its evaluation, every exported format, its metadata and run record; a job started
from another (init_from) keeps that job's, and so does its resume."""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import pytest
import torch

from core.errors import InvalidSpec
from core.spec import ExportFormat, JobSpec
from core.train import train
from core.train.archs import build_model
from core.train.data import epoch_seed, load_dataset
from core.train.normalization import split_weights
from core.train.pretrained import MEAN, STD
from core.train.run import Run
from core.train.verify_export import load_model
from tests.conftest import Recorder
from tests.photos import write_photo_set

JOB = "3f2c1e9a-0d4b-4c8e-9a57-2b1f0c6d7e88"
CPU = torch.device("cpu")


def pretrained_spec(dataset: str, **fields: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "dataset": dataset, "model": "efficientnet_lite0", "pretrained": True,
            "epochs": 1, "max_steps": 2, "batch_size": 8, "amp": "off", "ema_decay": None,
            "augment": "none", **fields,
        }
    )  # fmt: skip


def torchscript_metadata(blob: bytes) -> dict[str, str]:
    found = {"classes": "", "preprocessing": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # TorchScript is deprecated
        torch.jit.load(io.BytesIO(blob), _extra_files=found)
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in found.items()}


def test_a_pretrained_run_trains_and_evaluates_on_the_weights_preprocessing(
    tmp_path: Path,
) -> None:
    data = load_dataset(write_photo_set(tmp_path, side=16, per_class=8), tmp_path)
    run = Run(pretrained_spec(data.name), CPU, None, data)
    x, _ = next(run.batches.epoch(1))
    order = torch.randperm(len(data.train.labels), generator=torch.Generator().manual_seed(
        epoch_seed(run.spec.seed, 1)))  # fmt: skip
    pixels = data.train.images[order[:8]].float()
    torch.testing.assert_close(x, (pixels - 127) / 128)  # (x·255 − 127) / 128
    _, accuracy, _ = run.evaluate()
    model = run.eval_model.eval()
    with torch.no_grad():
        logits = model((data.test.images.float() - 127) / 128)
    labels = data.test.labels
    assert accuracy == pytest.approx((logits.argmax(1) == labels).float().mean().item())
    assert run.data.normalization.mean == MEAN and run.data.normalization.std == STD
    assert data.mean != MEAN  # the set's own, still what the set is said to be


def test_on_one_channel_the_mean_of_the_three(data_dir: Path) -> None:
    data = load_dataset("mnist-sample", data_dir)
    norm = Run(pretrained_spec("mnist-sample"), CPU, None, data).data.normalization
    assert norm.mean == (sum(MEAN) / 3,) and norm.std == (sum(STD) / 3,)


@pytest.mark.slow
def test_every_format_and_the_record_carry_the_weights_preprocessing(tmp_path: Path) -> None:
    """The exported model (what predict runs) gives the trained net's logits on
    (x·255 − 127) / 128; its metadata and the run record say so."""
    name = write_photo_set(tmp_path, side=16, per_class=8)
    result = train(pretrained_spec(name, export=list(ExportFormat)), data_dir=tmp_path)
    assert set(result.models) == set(ExportFormat), result.record["formats"]
    pre = result.record["preprocessing"]
    data = load_dataset(name, tmp_path)
    net = build_model(pretrained_spec(name), data.image_shape, data.num_classes)
    net.load_state_dict(weights_of(result.weights))
    x = data.test.images.float() / 255
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    with torch.no_grad():
        trained = net.eval()((x - mean) / std)
    for fmt, model in result.models.items():
        torch.testing.assert_close(load_model(fmt, model.data)(x), trained, atol=1e-4, rtol=1e-4)
    meta = json.loads(torchscript_metadata(result.models[ExportFormat.torchscript].data)[
        "preprocessing"])  # fmt: skip
    assert meta == pre
    assert (pre["mean"], pre["std"]) == (list(MEAN), list(STD))
    assert pre["normalized_by"] == "pretrained weights"
    assert result.record["dataset"]["mean"] != list(MEAN)  # the set's own


def weights_of(blob: bytes) -> dict[str, torch.Tensor]:
    """The net's own tensors in a job's weights, without what its input is normalised by."""
    net, norm = split_weights(torch.load(io.BytesIO(blob), weights_only=True))
    assert norm is not None and norm.mean == MEAN
    return net


@pytest.mark.slow
def test_a_job_started_from_a_pretrained_one_keeps_its_preprocessing(tmp_path: Path) -> None:
    """init_from on another set: the weights take what they were tuned on; a resume of that
    job (which starts from its checkpoint, not from the source) keeps it too."""
    source = train(pretrained_spec(write_photo_set(tmp_path, side=16)), data_dir=tmp_path)
    other = write_photo_set(tmp_path, side=16, per_class=4)
    tuned = JobSpec.model_validate(
        {**pretrained_spec(other).model_dump(), "pretrained": False, "init_from": JOB,
         "epochs": 2, "max_steps": None}
    )  # fmt: skip
    rec = Recorder()
    first = train(tuned, data_dir=tmp_path, start_weights=source.weights, callbacks=rec.callbacks())
    pre = first.record["preprocessing"]
    assert (pre["mean"], pre["std"]) == (list(MEAN), list(STD))
    assert pre["normalized_by"] == "pretrained weights"
    epoch, blob = rec.checkpoints[0]
    resumed = train(tuned, data_dir=tmp_path, resume=blob, history=first.epochs[:epoch])
    assert resumed.record["preprocessing"] == pre


def test_a_start_whose_weights_take_other_channels_says_so(tmp_path: Path, data_dir: Path) -> None:
    name = write_photo_set(tmp_path)
    source = Run(pretrained_spec(name), CPU, None, load_dataset(name, tmp_path))
    tuned = JobSpec(dataset="mnist-sample", model="efficientnet_lite0", init_from=JOB)
    with pytest.raises(InvalidSpec, match="take 3 channels, these images have 1"):
        train(tuned, data_dir=data_dir, start_weights=source.weights())
