"""torchvision's ImageNet weights, as files an operator installs: which file each architecture
takes (the one `weights="DEFAULT"` would download), where torchvision keeps it
($TORCH_HOME/hub/checkpoints), and whether it is there and is that file. Nothing is ever
downloaded. Torch-free: the API checks a submission with it, the worker before it loads the
file (core.train.torchvision_pretrained). How to install the files: docs/models.md."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from core.errors import PretrainedWeightsInvalid
from core.spec_enums import Architecture

# torch.hub's: a file name carries the first hex digits of the file's sha256 after its last
# "-" (torch.hub.HASH_REGEX, which check_hash reads).
HASH_IN_NAME = re.compile(r"-([a-f0-9]*)\.")


@dataclass(frozen=True)
class WeightsFile:
    """One architecture's torchvision weights: the enum member torchvision names them by and
    the URL it downloads them from, whose last part is the file's name in the cache."""

    arch: Architecture
    weights: str  # e.g. "ResNet18_Weights.IMAGENET1K_V1"
    url: str

    @property
    def file_name(self) -> str:
        return self.url.rsplit("/", 1)[1]

    @property
    def sha256_prefix(self) -> str:
        found = HASH_IN_NAME.search(self.file_name)
        assert found and found[1], f"{self.file_name} carries no sha256 prefix"
        return found[1]

    def how_to_get(self) -> str:
        member = self.weights.split(".")[1]
        return (
            f'on a machine with internet, run `python -c "import torchvision; '
            f"torchvision.models.{self.arch.value}(weights='{member}')\"` (torchvision "
            f"downloads {self.url} into its hub/checkpoints folder), then copy "
            f"{self.file_name} into $TORCH_HOME/hub/checkpoints on the trainq API and every "
            "worker (docs/models.md)"
        )


def _entry(arch: Architecture, weights: str, file_name: str) -> tuple[Architecture, WeightsFile]:
    return arch, WeightsFile(arch, weights, f"https://download.pytorch.org/models/{file_name}")


# Each architecture's default weights in torchvision 0.29 (its models' Weights enums);
# tests/unit/test_torchvision_weights.py checks them against the installed torchvision.
TORCHVISION_WEIGHTS: dict[Architecture, WeightsFile] = dict(
    [
        _entry(Architecture.resnet18, "ResNet18_Weights.IMAGENET1K_V1", "resnet18-f37072fd.pth"),
        _entry(Architecture.resnet34, "ResNet34_Weights.IMAGENET1K_V1", "resnet34-b627a593.pth"),
        _entry(
            Architecture.mobilenet_v3_small,
            "MobileNet_V3_Small_Weights.IMAGENET1K_V1",
            "mobilenet_v3_small-047dcff4.pth",
        ),
        _entry(
            Architecture.mobilenet_v3_large,
            "MobileNet_V3_Large_Weights.IMAGENET1K_V2",
            "mobilenet_v3_large-5c1a4163.pth",
        ),
        _entry(
            Architecture.efficientnet_b0,
            "EfficientNet_B0_Weights.IMAGENET1K_V1",
            "efficientnet_b0_rwightman-7f5810bc.pth",
        ),
    ]
)


def hub_dir() -> Path:
    """torch.hub.get_dir(), without importing torch: $TORCH_HOME/hub, TORCH_HOME defaulting
    to $XDG_CACHE_HOME/torch, XDG_CACHE_HOME to ~/.cache."""
    cache = os.getenv("XDG_CACHE_HOME", os.path.join("~", ".cache"))
    return Path(os.path.expanduser(os.getenv("TORCH_HOME", os.path.join(cache, "torch")))) / "hub"


def weights_path(arch: Architecture) -> Path:
    """Where torchvision keeps `arch`'s weights, and the only place trainq reads them from."""
    return hub_dir() / "checkpoints" / TORCHVISION_WEIGHTS[arch].file_name


def verified_bytes(arch: Architecture) -> tuple[Path, bytes]:
    """The file's path and bytes, if it is there and its sha256 starts with the prefix in
    its name; PretrainedWeightsInvalid, saying where it goes and how to get it, otherwise."""
    entry, path = TORCHVISION_WEIGHTS[arch], weights_path(arch)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise invalid(arch, f"{path} is not there") from None
    except OSError as e:
        raise invalid(arch, f"cannot read {path}: {e}") from None
    digest = hashlib.sha256(data).hexdigest()
    if not digest.startswith(entry.sha256_prefix):
        raise invalid(
            arch,
            f"{path} has sha256 {digest}, which does not start with {entry.sha256_prefix} "
            "(the prefix in its name): it is another file, or damaged",
        )
    return path, data


def invalid(arch: Architecture, why: str) -> PretrainedWeightsInvalid:
    """The error of a weights file that cannot be used, with how to install the right one."""
    entry = TORCHVISION_WEIGHTS[arch]
    return PretrainedWeightsInvalid(
        f"pretrained weights for {arch.value} ({entry.weights}): {why}. Nothing is downloaded "
        f"during a job: {entry.how_to_get()}"
    )


_verified: set[tuple[str, int, int, int]] = set()
_verified_lock = threading.Lock()


def check_weights_file(arch: Architecture) -> None:
    """At submission: the file is there and verifies (PretrainedWeightsInvalid otherwise).
    Hashed once per (path, inode, size, modification time): the files are tens of MB, and a
    file replaced since differs in one of them. The worker verifies the bytes it loads."""
    path = weights_path(arch)
    try:
        stat = path.stat()
    except OSError:
        stat = None
    key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns) if stat else None
    with _verified_lock:
        if key in _verified:
            return
    verified_bytes(arch)
    if key is not None:
        with _verified_lock:
            _verified.add(key)
