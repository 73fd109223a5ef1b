"""The endpoint as an ASGI app (FastAPI): routes, limits, the API key and the metrics around them.

Every answer is JSON with one plain ``error`` line when something is wrong: 400 an image that
is not one, 401 a missing or wrong key, 408 a body that arrives too slowly, 413 one too large,
415 a Content-Encoding it does not read (gzip), 501 what the runtime cannot do, 503 (with
Retry-After) a full queue or a server draining on SIGTERM, 504 a model that did not answer in time.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

from ..data.images import BadImageError
from ..extras import require
from .batcher import Batcher, QueueFull, Stopped
from .forms import FormError, read_upload
from .metrics import Metrics
from .model import ServedModel
from .page import example_png, favicon_png, page_html

try:  # the request type the routes are annotated with (FastAPI reads annotations); the serve extra
    from starlette.requests import Request
except ImportError:  # pragma: no cover - create_app says which extra installs it
    Request = Any  # type: ignore[misc,assignment]

#: the largest --max-batch: a server runs its largest batch on blank images before it takes requests (serve.model.warm)
MAX_BATCH = 1024
#: endpoints open without the API key (probes, the page and its example image, and the API's description: a
#: browser cannot send a key to open /docs, whose Authorize button then sends it with every call it tries)
OPEN_PATHS = ("/healthz", "/readyz", "/", "/example.png", "/favicon.ico", "/docs", "/redoc", "/openapi.json")
#: the docs' scripts and styles, open as the docs are
OPEN_PREFIX = "/docs-assets/"


@dataclass
class ServeOptions:
    """How the endpoint batches and what it accepts (``vitkit serve``'s flags)."""
    #: images per batched forward pass, at most
    max_batch: int = 32
    #: how long the first request of a batch waits for others, in milliseconds
    max_wait_ms: float = 5.0
    #: requests waiting for a batch before new ones are refused with 503
    max_queue: int = 256
    #: the largest request body, in bytes
    max_body_bytes: int = 20 * 1024 * 1024
    #: seconds a request may wait for its answer (504 after), and for its body to arrive (408 after)
    timeout_s: float = 30.0
    #: classes in an answer unless the request asks (?top_k=)
    top_k: int = 5
    #: required of every request but OPEN_PATHS' (the probes, the page, its images and the API's description) and
    #: the docs' assets (Authorization: Bearer KEY or X-API-Key)
    api_key: Optional[str] = None

    def problems(self) -> list:
        out = []
        for name in ("max_batch", "max_queue", "max_body_bytes", "top_k"):
            if getattr(self, name) < 1:
                out.append(f"--{name.replace('_', '-')} must be >= 1, not {getattr(self, name)}")
        if self.max_batch > MAX_BATCH:
            out.append(f"--max-batch must be at most {MAX_BATCH:,} (the server runs its largest batch once before it "
                       f"takes requests), not {self.max_batch:,}")
        if not 0 <= self.max_wait_ms <= 10_000:
            out.append(f"--max-wait-ms must be between 0 and 10000, not {self.max_wait_ms}")
        if not 0 < self.timeout_s <= 3600:
            out.append(f"--timeout must be more than 0 and at most 3600 seconds, not {self.timeout_s}")
        if self.api_key is not None and not header_safe(self.api_key):
            out.append("--api-key " + KEY_RULE)
        return out


#: what an API key must be, said after its name: HTTP header values are ASCII (a client's UTF-8 bytes never
#: equalled the key)
KEY_RULE = "must be printable ASCII without surrounding spaces (HTTP headers carry ASCII)"


def header_safe(key: str) -> bool:
    """Whether ``key`` can travel in an HTTP header as it is (see :data:`KEY_RULE`)."""
    return key.isascii() and key.isprintable() and key.strip() == key


class HttpError(Exception):
    """An answer in words. ``close``: the connection is closed after it, as for a body refused or not arrived (408,
    413: kept open, the rest of the body was read and thrown away, and a client trickling it held the connection,
    past the header deadline, for ever; RFC 9110 15.5.9)."""

    def __init__(self, status: int, message: str, retry_after: Optional[int] = None, close: bool = False):
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after
        self.close = close or status in (408, 413)


#: the request body the upload endpoints take, for the OpenAPI schema (read by hand: no form library)
UPLOAD = {"requestBody": {"required": True, "content": {
    "image/*": {"schema": {"type": "string", "format": "binary"}},
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    "multipart/form-data": {"schema": {"type": "object", "properties": {"file": {"type": "string",
                                                                                   "format": "binary"}}}}}}}


class Endpoint:
    """The routes over one served model: its two batchers, its metrics and whether it is draining."""

    def __init__(self, served: ServedModel, options: ServeOptions, title: str = "vitkit"):
        self.served, self.options, self.metrics, self.title = served, options, Metrics(), title
        batch = (options.max_batch, options.max_wait_ms, options.max_queue, self.metrics)
        self.predictor = Batcher(served.probabilities, "predict", *batch)
        self.embedder = Batcher(served.embeddings, "embed", *batch)
        self.state: Dict[str, Any] = {"ready": False, "draining": False}
        # the default executor's threads (min(32, cores + 4)): decoding and rollouts run on as many at once
        self.workers, self.waiting = asyncio.Semaphore(min(32, (os.cpu_count() or 1) + 4)), 0

    async def lifespan(self, app):
        await self.predictor.start()
        await self.embedder.start()
        self.state["ready"] = True
        yield
        self.state["draining"], self.state["ready"] = True, False
        await self.predictor.stop()
        await self.embedder.stop()

    async def _through(self, batcher: Batcher, request) -> Tuple[Any, str]:
        """The request's image decoded (in a worker thread), then its batch's answer for it; ``timeout_s``
        counts from the body's arrival over both (504 after), ``max_queue`` bounds both waits (503)."""
        with batcher.arriving():
            body, ctype = await self._body(request)
            deadline = time.monotonic() + self.options.timeout_s
            x, name = await self._in_worker(self._decoded, body, ctype, deadline=deadline)
        try:
            result = await asyncio.wait_for(batcher.submit(x), max(deadline - time.monotonic(), 0.001))
        except QueueFull:
            raise self._at_capacity() from None
        except Stopped:
            raise HttpError(503, "the server is shutting down", retry_after=5) from None
        except asyncio.TimeoutError:
            raise self._too_late() from None
        self.metrics.inc("vitkit_images_total", endpoint=batcher.name)
        return result, name

    async def _body(self, request) -> Tuple[bytes, str]:
        """The request's body (within the size and time limits) and its content type."""
        coding = request.headers.get("content-encoding", "identity").strip().lower()
        if coding not in ("", "identity"):  # (it was read as the image's bytes: "not an image")
            raise HttpError(415, f"Content-Encoding {coding[:40]!r} is not read: send the image's bytes as they are "
                                 f"(an image file is compressed already)", close=True)
        body = await _read_body(request, self.options.max_body_bytes, self.options.timeout_s,
                                lambda: self.state["draining"])
        return body, request.headers.get("content-type", "")

    def _decoded(self, body: bytes, ctype: str, deadline: float) -> Tuple[Any, str]:
        """(the model's input, the image's name) of a request's body (a worker thread's job)."""
        data, name = image_of(body, ctype)
        return self.served.image(data, name, deadline), name

    def _rollout_png(self, body: bytes, ctype: str, deadline: float) -> bytes:
        return self.served.rollout_png(*image_of(body, ctype), deadline)

    async def _in_worker(self, fn, *args: Any, deadline: float):
        """``fn(*args, deadline)`` (a form read and its image decoded, a rollout: each waits for the pixel budget
        until the deadline too) in a worker thread, as many at once as the default executor runs; past
        ``max_queue`` requests waiting for one, 503; past the deadline, 504. (Without this the executor's own
        queue grew without bound: neither the timeout nor the queue limit saw it.)"""
        if self.waiting >= self.options.max_queue:
            raise self._at_capacity()
        self.waiting += 1
        try:
            await asyncio.wait_for(self.workers.acquire(), max(deadline - time.monotonic(), 0.001))
        except asyncio.TimeoutError:
            raise self._too_late() from None
        finally:
            self.waiting -= 1
        job = asyncio.get_running_loop().run_in_executor(None, fn, *args, deadline)
        job.add_done_callback(self._worker_done)  # the thread cannot be stopped: its slot frees when it ends
        try:
            return await asyncio.wait_for(asyncio.shield(job), max(deadline - time.monotonic(), 0.001))
        except asyncio.TimeoutError:
            raise self._too_late() from None
        except BadImageError as e:
            raise HttpError(400, str(e)) from None

    def _at_capacity(self) -> HttpError:
        return HttpError(503, f"the server is at capacity ({self.options.max_queue} requests waiting): retry shortly",
                         retry_after=1)

    def _too_late(self) -> HttpError:
        return HttpError(504, f"no answer within {self.options.timeout_s:g} s (--timeout: the server is busy, or its "
                              f"model takes longer than that)")

    def _worker_done(self, job: "asyncio.Future") -> None:
        self.workers.release()
        if not job.cancelled():
            job.exception()  # read, so an answer given up on (504) leaves no "never retrieved" warning

    def _torch_only(self, what: str) -> None:
        if not self.served.can_embed:
            raise HttpError(501, f"{what} need the PyTorch runtime; this server runs {self.served.runtime}")

    async def predict(self, request: Request):
        """Top-k classes of one image (its bytes, or a multipart upload), as ``vitkit predict --json``."""
        from fastapi.responses import JSONResponse

        top_k = _top_k(request, self.options.top_k)
        probs, name = await self._through(self.predictor, request)
        return JSONResponse(self.served.answer(_finite(probs), top_k).to_dict(name))

    async def embed(self, request: Request):
        """The image's pooled pre-logits features (the PyTorch runtime)."""
        self._torch_only("embeddings")
        _only_query(request)
        features, name = await self._through(self.embedder, request)
        return {"image": name, "dim": len(features), "embedding": _finite(features).tolist()}

    async def rollout(self, request: Request):
        """The attention rollout over the image, as a PNG (the PyTorch runtime)."""
        from fastapi.responses import Response

        self._torch_only("attention maps")
        if why := self.served.no_rollout():  # no map to draw: said, as vitkit inspect says it
            raise HttpError(501, f"no attention rollout for this model: {why}")
        _only_query(request)
        body, ctype = await self._body(request)
        deadline = time.monotonic() + self.options.timeout_s
        png = await self._in_worker(self._rollout_png, body, ctype, deadline=deadline)
        return Response(png, media_type="image/png")

    async def healthz(self):
        """Liveness: the process answers."""
        return {"status": "ok"}

    async def readyz(self):
        """Readiness: the model is loaded and the server is not draining."""
        from fastapi.responses import JSONResponse

        body = {"ready": self.state["ready"], "draining": self.state["draining"], "runtime": self.served.runtime,
                "queue": self.predictor.depth + self.embedder.depth}
        return JSONResponse(body, status_code=200 if self.state["ready"] else 503)

    async def metrics_text(self):
        """Prometheus' text format: requests, images, queue depth, batch sizes, latencies."""
        from fastapi.responses import Response

        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def info(self):
        """What is served: the model, its runtime, input and classes, and the batching."""
        c, o = self.served.config, self.options
        return {"model": getattr(c, "name", None) or getattr(c, "architecture", "model"),
                "runtime": self.served.runtime, "input": [self.served.channels, *map(int, c.img_size)],
                "classes": len(self.served.labels) or c.num_classes, "labels": self.served.labels,
                "embed": self.served.can_embed, "max_batch": o.max_batch, "max_wait_ms": o.max_wait_ms,
                "max_body_bytes": o.max_body_bytes, "key": bool(o.api_key)}

    async def page(self):
        from fastapi.responses import HTMLResponse

        return HTMLResponse(page_html(self.title))

    async def example(self):
        from fastapi.responses import Response

        png = await asyncio.get_running_loop().run_in_executor(None, example_png, self.served)
        return Response(png, media_type="image/png")

    async def favicon(self):
        from fastapi.responses import Response

        return Response(favicon_png(), media_type="image/png", headers={"Cache-Control": "max-age=86400"})


#: the answer to a request in flight when a second Ctrl-C stops the server at once, and when a drain's time ran out
STOPPED_AT_ONCE = HttpError(503, "the server was stopped at once (a second Ctrl-C) before this request was "
                                 "answered: send it again once the server is back", close=True)
DRAIN_TIMED_OUT = HttpError(503, "the server stopped before this request was answered (its shutdown's time ran "
                                 "out): send it again once the server is back", close=True)


class Guard:
    """The API key, the drain, and every answer counted and timed: plain ASGI around the app
    (Starlette's ``BaseHTTPMiddleware`` costs a task and a body stream per request)."""

    def __init__(self, app: Any, endpoint: "Endpoint"):
        self.app, self.endpoint = app, endpoint

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from fastapi.responses import JSONResponse
        from starlette.datastructures import Headers

        endpoint, start, path, status, started = self.endpoint, time.perf_counter(), scope["path"], [500], [False]

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status[0], started[0] = message["status"], True
            await send(message)

        key = endpoint.options.api_key
        refused = None
        if key and path not in OPEN_PATHS and not path.startswith(OPEN_PREFIX) and \
                (wrong := _key_problem(Headers(scope=scope), key)):
            refused = HttpError(401, wrong)
        elif endpoint.state["draining"] and path not in ("/healthz", "/readyz", "/metrics"):
            refused = HttpError(503, "the server is shutting down", retry_after=5)
        try:
            if refused is not None:
                await error_response(JSONResponse, refused)(scope, receive, sending)
            else:
                await self.app(scope, receive, sending)
        except asyncio.CancelledError:  # a second Ctrl-C: uvicorn's answer to the cancelled was a plain-text 500
            if not started[0]:
                said = STOPPED_AT_ONCE if endpoint.state.get("stopped_at_once") else DRAIN_TIMED_OUT
                await error_response(JSONResponse, said)(scope, receive, sending)
            raise
        finally:
            name = path if path in ROUTES else OPEN_PREFIX.rstrip("/") if path.startswith(OPEN_PREFIX) else "other"
            endpoint.metrics.inc("vitkit_requests_total", endpoint=name, code=str(status[0]))
            endpoint.metrics.observe("vitkit_request_seconds", time.perf_counter() - start, endpoint=name)


def create_app(served: ServedModel, options: Optional[ServeOptions] = None, title: str = "vitkit") -> Any:
    """The FastAPI app serving ``served``: predict, embed, rollout, the probes, metrics and the page."""
    fastapi = require("fastapi", "serve", "vitkit serve")
    import starlette.exceptions as starlette_exceptions
    from fastapi.responses import JSONResponse

    options = options or ServeOptions()
    if problems := options.problems():
        raise ValueError("; ".join(problems))
    endpoint = Endpoint(served, options, title)
    assets = docs_assets()
    app = fastapi.FastAPI(title=title, lifespan=endpoint.lifespan, redirect_slashes=False,  # (a 307 to the Host
                          # header's name, body empty, for /predict/: a 404 in the one error shape instead)
                          description="vitkit serve: a ViT classifier behind HTTP, requests batched dynamically",
                          **({"docs_url": None, "redoc_url": None} if assets else {}))
    app.state.vitkit, app.state.metrics, app.state.endpoint = endpoint.state, endpoint.metrics, endpoint
    app.add_middleware(Guard, endpoint=endpoint)
    app.add_exception_handler(HttpError, lambda request, e: error_response(JSONResponse, e))
    # the framework's own answers (404 an unknown path, 405 a method) in the same one-line shape as every other
    app.add_exception_handler(starlette_exceptions.HTTPException, lambda request, e: JSONResponse(
        {"error": str(e.detail)}, status_code=e.status_code, headers=getattr(e, "headers", None)))
    for path, handler in (("/predict", endpoint.predict), ("/embed", endpoint.embed),
                          ("/rollout", endpoint.rollout)):
        app.add_api_route(path, handler, methods=["POST"], openapi_extra=UPLOAD)
    for path, handler in (("/healthz", endpoint.healthz), ("/readyz", endpoint.readyz),
                          ("/metrics", endpoint.metrics_text), ("/info", endpoint.info)):
        app.add_api_route(path, handler, methods=["GET"])
        app.add_api_route(path, handler, methods=["HEAD"], include_in_schema=False)  # probes and checkers ask
        # with HEAD (one route of both methods: one operation id twice in the schema, a warning at each build)
    for path, handler in (("/", endpoint.page), ("/example.png", endpoint.example), ("/favicon.ico", endpoint.favicon)):
        app.add_api_route(path, handler, methods=["GET", "HEAD"], include_in_schema=False)
    if assets:
        _add_offline_docs(app, title, assets)
    if options.api_key:
        _declare_key(app)
    return app


def _declare_key(app: Any) -> None:
    """The API key in the OpenAPI schema (an X-API-Key header on every operation but the open ones), so that the
    docs' Authorize button asks for it and sends it; clients generated from the schema send it too."""
    build = app.openapi

    def keyed() -> dict:
        if app.openapi_schema is None:
            schema = build()
            schema.setdefault("components", {}).setdefault("securitySchemes", {})["apiKey"] = {
                "type": "apiKey", "in": "header", "name": "X-API-Key"}
            for path, operations in schema.get("paths", {}).items():
                for operation in operations.values() if path not in OPEN_PATHS else ():
                    operation["security"] = [{"apiKey": []}]
        return app.openapi_schema

    app.openapi = keyed


#: Swagger UI's and ReDoc's files (the serve extra's fastapi-offline ships them) and their types
DOCS_ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
               "redoc.standalone.js": "text/javascript", "favicon.png": "image/png"}


def docs_assets() -> Optional[Path]:
    """The folder of :data:`DOCS_ASSETS`, or None (FastAPI's own /docs and /redoc, which fetch them from a
    CDN: blank pages on a machine without internet, where a model server often runs)."""
    try:
        import fastapi_offline
    except ImportError:
        return None
    folder = Path(fastapi_offline.__file__).parent / "static"
    return folder if all((folder / name).is_file() for name in DOCS_ASSETS) else None


def _add_offline_docs(app: Any, title: str, folder: Path) -> None:
    """/docs and /redoc as FastAPI writes them, their scripts and styles served from ``folder``."""
    import starlette.exceptions as starlette_exceptions
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
    from fastapi.responses import FileResponse

    def docs():
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{title} - API",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/docs-assets/favicon.png")

    def redoc():
        return get_redoc_html(openapi_url="/openapi.json", title=f"{title} - API",
                              redoc_js_url="/docs-assets/redoc.standalone.js",
                              redoc_favicon_url="/docs-assets/favicon.png", with_google_fonts=False)

    def asset(name: str):
        if name not in DOCS_ASSETS:
            raise starlette_exceptions.HTTPException(status_code=404)
        return FileResponse(folder / name, media_type=DOCS_ASSETS[name],
                            headers={"Cache-Control": "public, max-age=86400"})

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
    app.add_api_route("/redoc", redoc, methods=["GET"], include_in_schema=False)
    app.add_api_route("/docs-assets/{name}", asset, methods=["GET"], include_in_schema=False)


#: the paths counted by name in the metrics (others: "other", so a scan cannot grow them)
ROUTES = ("/predict", "/embed", "/rollout", "/healthz", "/readyz", "/metrics", "/info", "/", "/example.png",
          "/favicon.ico", "/openapi.json", "/docs", "/redoc")


def _key_problem(headers, key: str) -> str:
    """Why a request's key is refused ('' where it is the server's). Two keys that differ are refused as such,
    whichever is right: one of them was a mistake, and "wrong API key" beside a right Bearer token said neither. A
    header sent twice is refused too: only the first was read (a Basic line before a Bearer one hid the key)."""
    for name in ("Authorization", "X-API-Key"):
        if len(headers.getlist(name)) > 1:
            return f"{len(headers.getlist(name))} {name} headers were sent: send one"
    given = [headers.get("x-api-key") or ""]
    auth = headers.get("authorization") or ""
    given += [auth[7:].strip()] if auth.lower().startswith("bearer ") else []
    given = [g for g in given if g]
    if len(given) == 2 and not hmac.compare_digest(given[0].encode(), given[1].encode()):
        return "X-API-Key and Authorization: Bearer carry different keys: send the API key in one of them"
    if not given or not hmac.compare_digest(given[0].encode(), key.encode()):
        return "missing or wrong API key (send Authorization: Bearer KEY or X-API-Key: KEY)"
    return ""


def error_response(response_class, e: HttpError):
    headers = {"Retry-After": str(e.retry_after)} if e.retry_after is not None else {}
    if e.close:
        headers["Connection"] = "close"
    return response_class({"error": e.message}, status_code=e.status, headers=headers or None)


def _finite(values):
    """``values``, or a 500 saying the model gave NaN or inf (JSON has no number for them)."""
    if not values.isfinite().all():
        from ..evaluate.predict import NOT_FINITE

        raise HttpError(500, NOT_FINITE)
    return values


def _only_query(request, allowed: Tuple[str, ...] = ()) -> None:
    """A query parameter the route does not read is refused, not ignored (``?topk=3`` answered five classes)."""
    import difflib

    unknown = [k for k in dict.fromkeys(request.query_params.keys()) if k not in allowed]
    if unknown:
        close = difflib.get_close_matches(unknown[0].lower(), allowed, n=1)  # (?TOP_K=3 too)
        reads = f"it reads {', '.join(allowed)}" if allowed else "it reads none"
        raise HttpError(400, f"unknown query parameter {unknown[0][:40]!r} for {request.url.path} ({reads}"
                             f"{f'; did you mean {close[0]}?' if close else ''})")


def _top_k(request, default: int) -> int:
    _only_query(request, ("top_k",))
    given = request.query_params.getlist("top_k")
    if len(given) > 1:
        raise HttpError(400, f"top_k is given {len(given)} times: give it once")
    text = given[0] if given else None
    if text is None:
        return default
    # ASCII digits only (str.isdigit also passes '²' and other scripts' digits, which int() refuses or
    # reads), and few enough that int() takes them: anything past the classes is capped anyway
    if not (text.isascii() and text.isdigit()) or len(text) > 18 or int(text) < 1:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise HttpError(400, f"top_k must be a positive integer of at most 18 digits, not {shown!r}")
    return int(text)


#: seconds a body still arriving when the server begins to drain may take to arrive (503 after): a client that
#: stalled mid-upload held the drain, and the process's exit, for the whole --timeout
DRAIN_BODY_S = 5.0


async def _read_body(request, limit: int, timeout: float, draining: Callable[[], bool] = lambda: False) -> bytes:
    """The body, refused past ``limit`` bytes (413, before reading it when Content-Length says so)
    or when it takes longer than ``timeout`` to arrive (408: a slow client holds no worker long), or
    :data:`DRAIN_BODY_S` once the server drains (503)."""
    from starlette.requests import ClientDisconnect

    length = request.headers.get("content-length")
    if length is not None and length.isascii() and length.isdigit() and int(length) > limit:
        raise HttpError(413, f"the body is {int(length):,} bytes; this server takes at most {limit:,}")
    loop = asyncio.get_running_loop()
    deadline, drained = loop.time() + timeout, False
    chunks, size = [], 0
    stream = request.stream().__aiter__()
    while True:
        # waited for in slices, never cancelled mid-chunk (that would close the stream): a drain is seen in time
        chunk_task = asyncio.ensure_future(stream.__anext__())
        while not chunk_task.done():
            if not drained and draining():
                drained, deadline = True, min(deadline, loop.time() + DRAIN_BODY_S)
            if loop.time() >= deadline:
                chunk_task.cancel()
                if drained:
                    raise HttpError(503, "the server is shutting down: the body had not arrived", retry_after=5,
                                    close=True)
                raise HttpError(408, f"the body did not arrive within {timeout:g} s")
            await asyncio.wait([chunk_task], timeout=min(max(deadline - loop.time(), 0.001), 0.25))
        try:
            chunk = chunk_task.result()
        except StopAsyncIteration:
            break
        except ClientDisconnect:
            raise HttpError(400, "the client disconnected before sending the whole body") from None
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"the body is over {limit:,} bytes, the most this server takes")
        chunks.append(chunk)
    return b"".join(chunks)


def image_of(body: bytes, ctype: str) -> Tuple[bytes, str]:
    """(image bytes, a name for messages) of a request (:func:`.forms.read_upload`); a refused form is a 400."""
    try:
        return read_upload(body, ctype)
    except FormError as e:
        raise HttpError(400, str(e)) from None
