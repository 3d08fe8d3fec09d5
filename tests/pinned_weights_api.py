"""`python -m tests.pinned_weights_api serve`: trainq's CLI with resnet18's weights file
pinned as the environment's TEST_RESNET18_WEIGHTS names it: a file a test made, named with
the first digits of its own sha256, so that the API can be seen accepting a file that
verifies (torchvision's own cannot be downloaded here). For tests only: trainq itself reads
no table but its own."""

from __future__ import annotations

import dataclasses
import os
import sys

from cli.main import main
from core.spec import Architecture
from core.torchvision_weights import TORCHVISION_WEIGHTS

entry = TORCHVISION_WEIGHTS[Architecture.resnet18]
url = entry.url.rsplit("/", 1)[0] + "/" + os.environ["TEST_RESNET18_WEIGHTS"]
TORCHVISION_WEIGHTS[entry.arch] = dataclasses.replace(entry, url=url)
sys.exit(main())
