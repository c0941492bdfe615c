"""The page a Hugging Face builder sees: it also *runs* the image it built for a Space, on a CPU, and expects
an answer on 7860.

There is no GPU and no reason to start vLLM there: `python -m runtime start` sees `SPACE_ID` and serves
this page instead of failing — the image's build facts (nothing secret) and how to use it.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from runtime.engine.recipes import load_recipe
from runtime.hubspace import SPACE_PORT
from runtime.image import public_facts, read_image_facts
from runtime.settings import Settings, recipe_names


def builder_page_app(facts: Mapping[str, Any] | None, space_id: str) -> Starlette:
    """The page (/), the facts as JSON (/facts) and a health route (/health)."""
    shown = public_facts(facts or {})
    page = _page(shown, space_id, prebaked=facts is not None)

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(page)

    async def facts_json(request: Request) -> JSONResponse:
        return JSONResponse({"space_id": space_id, "prebaked": facts is not None, "facts": shown})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "mode": "space"})

    return Starlette(
        routes=[Route("/", index, methods=["GET", "HEAD"]), Route("/facts", facts_json), Route("/health", health)]
    )


def _page(facts: Mapping[str, Any], space_id: str, prebaked: bool) -> str:
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts.items())
    models = "".join(
        f"<li><code>{name}</code>: {html.escape(load_recipe(name).description)}</li>" for name in recipe_names()
    )
    built = f"<table>{rows}</table>" if prebaked else "<p>This image carries no build facts (not prebaked).</p>"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>vllm-pod image: {html.escape(space_id)}</title></head>
<body>
<h1>vllm-pod image</h1>
<p>This Space builds a vLLM image with an Anthropic Messages endpoint for Claude Code. It runs on a GPU
pod (RunPod: ports <code>8080/http,22/tcp</code>, env <code>HF_TOKEN</code>, <code>VL_MODEL</code>); here, on the
Space's CPU, it only shows what it is.</p>
<h2>Build</h2>
{built}
<h2>Models (<code>VL_MODEL</code>)</h2>
<ul>{models}</ul>
</body></html>
"""


def builder_page_server(
    settings: Settings, environ: Mapping[str, str], host: str = "0.0.0.0", port: int = SPACE_PORT
) -> uvicorn.Server:
    """A server for the page, not yet started (`.run()` blocks until SIGTERM/SIGINT)."""
    app = builder_page_app(read_image_facts(Path(settings.prebaked_marker)), environ.get("SPACE_ID", ""))
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False))


def serve_builder_page(
    settings: Settings, environ: Mapping[str, str] = os.environ, host: str = "0.0.0.0", port: int = SPACE_PORT
) -> int:
    """Serves the page until the container is stopped; the start command's Space branch."""
    builder_page_server(settings, environ, host, port).run()
    return 0
