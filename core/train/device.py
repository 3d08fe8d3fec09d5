"""Choosing the device and the mixed-precision mode: the fastest correct choice by default."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from core.errors import InvalidSpec
from core.spec import Amp


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidSpec("device", "CUDA was asked for but this machine has no CUDA GPU")
    return device


@cache
def cpu_has_fast_bf16() -> bool:
    """bf16 autocast on a CPU pays only with AVX-512 BF16 or AMX; elsewhere fp32 is faster."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_amp(amp: Amp, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for this spec on this device, or None for full fp32."""
    if amp is Amp.off:
        return None
    if amp is Amp.fp16:
        if device.type != "cuda":
            raise InvalidSpec("amp", "fp16 needs a CUDA GPU; use 'bf16', 'off' or 'auto'")
        return torch.float16
    if amp is Amp.bf16:
        # Asked for by name: run where torch runs it at all, emulated on an older GPU too
        # (slower than fp16, but the same result on every worker of a mixed fleet).
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise InvalidSpec("amp", "this GPU has no bf16; use 'fp16', 'off' or 'auto'")
        return torch.bfloat16
    # auto
    if device.type == "cuda":
        return torch.bfloat16 if gpu_computes_bf16(device) else torch.float16
    return torch.bfloat16 if cpu_has_fast_bf16() else None


def gpu_computes_bf16(device: torch.device) -> bool:
    """Compute capability 8.0 and later (Ampere on), or ROCm. torch's `is_bf16_supported()`
    says yes by default where bf16 is only emulated (a T4, a V100): far slower than fp16."""
    if torch.version.hip:
        return True
    return torch.cuda.get_device_capability(device)[0] >= 8


def amp_name(amp_dtype: torch.dtype | None) -> str:
    """The resolved mixed precision as runs report it: "bfloat16", "float16" or "off"."""
    return str(amp_dtype).removeprefix("torch.") if amp_dtype else "off"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def is_out_of_memory(e: BaseException) -> bool:
    """Out of memory on the device or the host, whichever allocator said it."""
    if isinstance(e, torch.OutOfMemoryError | MemoryError):
        return True
    # The CPU allocator's out-of-memory is a plain RuntimeError.
    return isinstance(e, RuntimeError) and "can't allocate memory" in str(e)
