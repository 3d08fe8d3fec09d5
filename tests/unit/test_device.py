"""The mixed precision `amp: auto` picks on a GPU: bf16 only where the GPU computes it
(compute capability 8.0 and later, or ROCm), fp16 elsewhere. torch's `is_bf16_supported`
also says yes where bf16 is only emulated (a T4, a V100), where it is much slower."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from core.spec import Amp
from core.train.device import resolve_amp

GPU = torch.device("cuda", 0)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A machine whose GPU 0 has the compute capability the case sets (`gpu(7)`)."""

    def with_major(major: int) -> None:
        props = SimpleNamespace(major=major, minor=0, name=f"sm{major}0")
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _d=None: props)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _d=None: (major, 0))
        # What torch answers with its default, emulation included: yes on every GPU here.
        monkeypatch.setattr(
            torch.cuda,
            "is_bf16_supported",
            lambda including_emulation=True: True if including_emulation else major >= 8,
        )

    return with_major


@pytest.mark.parametrize(
    ("major", "want"), [(7, torch.float16), (8, torch.bfloat16), (9, torch.bfloat16)]
)
def test_auto_is_bf16_only_where_the_gpu_computes_it(gpu, major: int, want: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    gpu(major)
    assert resolve_amp(Amp.auto, GPU) is want


def test_bf16_asked_for_by_name_runs_where_torch_runs_it(gpu) -> None:  # type: ignore[no-untyped-def]
    """Emulated on an older GPU, as asked: the same result on every worker of a mixed fleet."""
    gpu(7)
    assert resolve_amp(Amp.bf16, GPU) is torch.bfloat16
    assert resolve_amp(Amp.fp16, GPU) is torch.float16


def test_rocm_gpus_compute_bf16(gpu, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    gpu(7)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert resolve_amp(Amp.auto, GPU) is torch.bfloat16
