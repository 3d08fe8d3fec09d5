"""The web dashboard: `GET /` serves the page, `GET /static/{name}` its files (only those
present at start-up, by exact path). See docs/operations.md."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from core.errors import NotFound

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
# Everything from this origin, nothing from anywhere else; no inline script or style.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidate each time (ETag/Last-Modified make that cheap): a new release shows at once.
    "Cache-Control": "no-cache",
}


def _files() -> dict[str, Path]:
    """The servable files, by path relative to STATIC_DIR: plain files with a known type."""
    if not STATIC_DIR.is_dir():
        return {}
    return {
        p.relative_to(STATIC_DIR).as_posix(): p
        for p in STATIC_DIR.rglob("*")
        if p.is_file()
        and not p.is_symlink()
        and p.suffix in MEDIA_TYPES
        and p.resolve().is_relative_to(STATIC_DIR)  # a linked folder leads nowhere else
    }


FILES = _files()
router = APIRouter(include_in_schema=False)


def _serve(name: str) -> FileResponse:
    path = FILES.get(name)
    if path is None:
        raise NotFound("not found")
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=HEADERS)


@router.get("/")
def index() -> FileResponse:
    return _serve("index.html")


@router.get("/static/{name:path}")
def static(name: str) -> FileResponse:
    return _serve(name)
