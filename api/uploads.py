"""Reading a data set upload: an .npz, a zip of the four MNIST IDX files (both
api.upload_arrays), or a zip or tar of photos in class folders (api.photo_archives,
api.photo_sets), each into the arrays that core.datasets checks and stores in canonical
form. Nothing here trusts the upload. See docs/datasets.md."""

from __future__ import annotations

import io
import zipfile

from api.photo_archives import is_tar, tar_members, zip_members
from api.photo_sets import PhotoOptions, photo_set
from api.upload_arrays import from_idx, from_npz, idx_key
from core.datasets import (
    MAX_IMAGES,
    MAX_UPLOAD_BYTES,
    NPZ_KEYS,
    ParsedDataset,
    canonical,
    checked_members,
)
from core.errors import DatasetTooLarge, InvalidDataset


def parse_upload(
    data: bytes, *, max_images: int = MAX_IMAGES, options: PhotoOptions | None = None
) -> ParsedDataset:
    """Any of the upload forms -> the canonical data set, or InvalidDataset /
    DatasetTooLarge naming the problem. Past `max_images` images (Settings.upload_max_images,
    at most MAX_IMAGES) the upload is refused from its zip directory or its headers, before
    any image is read: the images are what an upload's work grows with. `options` shape an
    archive of photos (api.photo_sets); the array forms take none."""
    if len(data) > MAX_UPLOAD_BYTES:
        raise DatasetTooLarge(f"the upload is {len(data)} bytes: at most {MAX_UPLOAD_BYTES}")
    options = options or PhotoOptions()
    try:
        if zipfile.is_zipfile(io.BytesIO(data)):
            return _from_zip(data, max_images, options)
        if is_tar(data):
            members, skipped = tar_members(data)
            return photo_set(members, skipped, len(data), max_images, options)
    except (InvalidDataset, DatasetTooLarge, MemoryError):
        raise
    except Exception as e:  # BadZipFile, unsupported compression, encrypted members, zlib...
        raise InvalidDataset(f"the file could not be read: {type(e).__name__}: {e}") from e
    raise InvalidDataset(
        "not an .npz or .zip (or .tar.gz) file: upload an .npz (x_train, y_train, x_test, "
        "y_test), a zip or tar.gz of one folder of images per class, or a zip of the four "
        "MNIST IDX files"
    )


def _from_zip(data: bytes, max_images: int, options: PhotoOptions) -> ParsedDataset:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        members = checked_members(zf)
        names = {m.filename for m in members}
        if {f"{k}.npy" for k in NPZ_KEYS} & names:
            return canonical(*from_npz(zf, members, max_images))
        if any(idx_key(m.filename) for m in members):
            return canonical(*from_idx(zf, members, max_images))
        photo_members, skipped = zip_members(zf)
        return photo_set(photo_members, skipped, len(data), max_images, options)
