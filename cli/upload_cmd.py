"""`trainq data upload PATH`: a folder of class folders (archived on the fly) or a .zip,
.tar.gz or .npz sent to the API with a progress bar, then the set as the API made it: its
id, its classes with their counts per split, and what was done to the images. Light: no
torch. See docs/datasets.md ("From the CLI and the client")."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import httpx
from tqdm import tqdm

from cli.client_cmd import client
from cli.problems import INTERRUPTED, INVALID, UNREACHABLE, refused, shown, unreachable
from client.http import ApiError
from client.uploads import NotAnUpload

SPLITS = ("train", "val", "holdout")
LOST_ANSWER = (
    "trainq: the upload's answer was lost; a set the API had received whole may still be "
    "stored (`GET /datasets` lists them)"
)
STOPPED = (
    "trainq: upload stopped; a set the API had received whole may still be stored "
    "(`GET /datasets` lists them)"
)


def upload_command(args: argparse.Namespace) -> int:
    with (
        client(args) as c,
        tqdm(unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr, desc="upload") as bar,
    ):

        def progress(sent: int, size: int) -> None:
            bar.total = size
            bar.update(sent - bar.n)

        try:
            ds = c.upload_dataset(
                args.path,
                name=args.name,
                image_size=args.image_size,
                fit=args.fit,
                val_fraction=args.val_fraction,
                skip_bad=args.skip_bad,
                progress=progress,
            )
        except NotAnUpload as e:
            print(f"trainq: {shown(e)}", file=sys.stderr)
            return INVALID
        except ApiError as e:
            bar.close()
            return refused(e, "the upload")
        except httpx.TransportError as e:
            bar.close()
            print(f"trainq: {shown(unreachable(e))}", file=sys.stderr)
            if not isinstance(e, httpx.ConnectError | httpx.ConnectTimeout):
                print(LOST_ANSWER, file=sys.stderr)
            return UNREACHABLE
        except KeyboardInterrupt:
            bar.close()
            print(STOPPED, file=sys.stderr)
            return INTERRUPTED
    print("\n".join(summary(ds)))
    return 0


def summary(ds: dict[str, Any]) -> list[str]:
    """The set's id, then its classes and counts, its statistics and notes, and what was
    skipped: every text from the API shown escaped (cli.problems.shown)."""
    lines = [shown(ds["id"]), f"dataset  {shown(ds['dataset'])}  ({shown(ds['name'])})"]
    lines += _class_table(ds)
    if ds.get("mean"):
        mean = " ".join(f"{m:.3f}" for m in ds["mean"])
        std = " ".join(f"{s:.3f}" for s in ds["std"])
        lines.append(f"mean {mean}  std {std}")
    prep = ds.get("preprocessing") or {}
    if prep:
        shape = f"{prep['channels']}×{prep['image_size']}×{prep['image_size']}"
        lines.append(f"images   {shape}, fit {shown(prep['fit'])}")
        lines += [f"  {shown(note)}" for note in prep.get("notes", [])]
    skipped = ds.get("skipped") or []
    if skipped:
        lines.append(f"skipped  {len(skipped)}:")
        lines += [f"  {shown(s['file'])}: {shown(s['reason'])}" for s in skipped]
    return lines


def _class_table(ds: dict[str, Any]) -> list[str]:
    counts = ds.get("class_counts") or {}
    classes = ds.get("classes") or [str(k) for k in range(ds["num_classes"])]
    if not counts:
        return [f"classes  {ds['num_classes']}: train {ds['train_count']}, val {ds['test_count']}"]
    splits = [s for s in SPLITS if s in counts]
    width = max(len("class"), *(len(shown(c)) for c in classes))
    lines = [f"{'class':{width}}  " + "  ".join(f"{s:>7}" for s in splits)]
    for k, name in enumerate(classes):
        row = "  ".join(f"{counts[s][k]:>7}" for s in splits)
        lines.append(f"{shown(name):{width}}  {row}")
    return lines
