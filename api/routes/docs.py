"""/docs (Swagger UI) and /redoc, their assets served from the fastapi-offline package:
nothing is loaded from another origin. See docs/api.md."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import FileResponse, HTMLResponse

from core.errors import NotFound

ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
ASSETS_URL = "/docs/assets"  # public: api.auth.PUBLIC_PREFIXES
OPENAPI_URL = "/openapi.json"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
MEDIA_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
}
ASSETS = {p.name: p for p in ASSETS_DIR.iterdir() if p.is_file() and p.suffix in MEDIA_TYPES}
TITLE = "trainq"
router = APIRouter(include_in_schema=False)


@router.get("/docs")
def swagger_ui() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=OPENAPI_URL,
        title=f"{TITLE} - Swagger UI",
        oauth2_redirect_url=OAUTH2_REDIRECT_URL,
        swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
        # No validator badge: Swagger UI would fetch it from validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get(OAUTH2_REDIRECT_URL)
def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
def redoc() -> HTMLResponse:
    return get_redoc_html(
        openapi_url=OPENAPI_URL,
        title=f"{TITLE} - ReDoc",
        redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
        redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
        with_google_fonts=False,
    )


@router.get(ASSETS_URL + "/{name}")
def asset(name: str) -> FileResponse:
    path = ASSETS.get(name)
    if path is None:
        raise NotFound("not found")
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix])
