"""GET /playground: the browser playground (edge/playground/: static HTML, CSS and JavaScript, no build
step, nothing loaded from elsewhere, so it works offline). The page needs no API key; its calls to the
API send the key typed into it."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, Response

router = APIRouter(include_in_schema=False)

FILES = Path(__file__).resolve().parent.parent / "playground"
TYPES = {"index.html": "text/html", "playground.js": "text/javascript", "playground.css": "text/css"}
PATHS = frozenset({"/playground", "/playground/", *(f"/playground/{name}" for name in TYPES)})


@cache
def _content(name: str) -> bytes:
    return (FILES / name).read_bytes()


def _file(name: str) -> Response:
    return Response(_content(name), media_type=f"{TYPES[name]}; charset=utf-8",
                    headers={"Cache-Control": "no-cache"})


@router.get("/playground")
@router.get("/playground/")
@router.get("/playground/index.html")
async def playground() -> Response:
    return _file("index.html")


@router.get("/playground/playground.js")
async def playground_script() -> Response:
    return _file("playground.js")


@router.get("/playground/playground.css")
async def playground_style() -> Response:
    return _file("playground.css")
