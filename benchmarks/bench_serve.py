"""Serving under load: `vitkit serve` against timm's model behind a plain endpoint, in one run.

Both serve the same function: timm's ``vit_small_patch16_224`` built with a fixed seed (random
weights), its state dict loaded into vitkit's model (``bench_inference.build_pair``; the fp32
logits compared, the run stops if they differ) and saved both ways. Each server is its own
process on loopback:

- **vitkit**: ``python -m vitkit serve FOLDER --port 0`` (``--runtime``, ``--max-batch``,
  ``--max-wait-ms`` as given; ``--max-body-mb 2`` so the fault run's 3 MiB body is refused);
- **plain**: timm's model "written the usual way" (this file, ``--serve-plain``): a FastAPI
  ``async def`` endpoint decodes the body with PIL, applies timm's transform
  (``resolve_data_config`` + ``create_transform``), runs the model on that one image under
  ``torch.inference_mode`` in the event loop and returns the top 5 as JSON, on uvicorn with the
  same settings as vitkit's (uvloop, httptools, no access log).

The load: one client process (this one: a single ``aiohttp.ClientSession`` on one event loop, so
it takes little of the CPU the servers need -- about 0.2 ms per request, where an
``httpx.AsyncClient``, ``--client httpx``, took 2-3 ms, a sixth of the machine at vitkit's rate on
OpenVINO int8; its own CPU time is reported per level), at 1, 8,
32 and 128 concurrent clients, ``--requests`` each, every request POSTing a real photo
(scikit-image's astronaut, chelsea, coffee and rocket as JPEG, cycled). The levels are
interleaved (vitkit then plain, the other way round at the next level) so drift hits both.
Per level: img/s, p50/p95/p99 latency, errors, top-1 answers that differ from the offline
answer, the server's CPU (cores), the client's CPU per request, other processes' load, and for
vitkit its batch sizes (``/metrics``' histogram, the level's difference).

Baselines and goals (issue 45 item 5): the same runtime and model offline, in this process
(``ServedModel.probabilities`` on batches of ``--max-batch`` preprocessed images, before and
after the levels): vitkit's img/s at 32 clients over it, goal >= 0.8; over the plain endpoint
at 32 clients, goal >= 3. Every figure is also stated against the machine's limit (the GEMM
peak of the precision the path computes in -- fp32, or int8 with ``--quantize`` -- over the
model's GFLOPs per image, limits.py).

The fault run: ``--fault-requests`` (10,000) at ``--fault-concurrency`` (32) clients against
the vitkit server, every ``--fault-every``-th request (10) a fault in turn: random bytes (400),
a 3 MiB body (413) and a client that sends the headers and half its body, then closes. Every
good answer's top-1 is checked against the offline answer for its image; the server's RSS is
sampled every second: after warm-up (10% of the requests) and at the end, flat if the end is
within 10% of it.

    python benchmarks/bench_serve.py             # full run: ViT-S/16 at 224 px (~16 minutes on 2 cores)
    python benchmarks/bench_serve.py --smoke     # smoke check: a tiny ViT at 32 px, few requests (< 1 min)
    python benchmarks/bench_serve.py --runtime onnxruntime --levels 1 32 --note "quiet"

A benchmark, not a test: run it on a quiet machine (both servers and the client share its cores)
and say what else ran (``--note``); the load averages at start and end and every level's load
from other processes are recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import io
import json
import os
import queue
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import timm
import torch

try:  # the plain endpoint's annotation (FastAPI reads it, by name, from this module)
    from starlette.requests import Request
except ImportError:  # pragma: no cover - the serve extra is needed to run this benchmark at all
    Request = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_inference import (  # noqa: E402
    LOGITS_TOLERANCE,
    build_pair,
    dated_name,
    machine_info,
    results_path,
    write_json_atomic,
)
from bench_training import _cpu_busy_s  # noqa: E402
from limits import at_limit, close_limits, describe  # noqa: E402

DEFAULT_MODEL = "vit_small_patch16_224"
SMOKE_MODEL, SMOKE_KWARGS = "vit_tiny_patch16_224", {"img_size": 32, "patch_size": 8, "depth": 2}
LEVELS, SMOKE_LEVELS = [1, 8, 32, 128], [1, 8, 32]
REQUESTS, SMOKE_REQUESTS = 400, 48
FAULT_REQUESTS, SMOKE_FAULT_REQUESTS = 10_000, 200
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")
OVERSIZED_BYTES = 3 * 1024 * 1024  # over the server's --max-body-mb 2
GOAL_OFFLINE, GOAL_OVER_PLAIN, MEMORY_TOLERANCE, WARM_FRACTION = 0.8, 3.0, 0.10, 0.10
REQUEST_TIMEOUT_S, START_TIMEOUT_S = 300.0, 600.0
URL_LINE = re.compile(r" on (http://127\.0\.0\.1:\d+)")
FAULTS = ("bad_image", "oversized", "disconnect")
CLIENT_SESSIONS = {"aiohttp": "aiohttp.ClientSession", "httpx": "httpx.AsyncClient"}


# ---------------------------------------------------------------------------- model, weights, images


def prepare_weights(name: str, kwargs: dict, folder: Path, seed: int) -> dict:
    """timm's model with seeded random weights, loaded into vitkit's; saved as ``folder/vitkit``
    (vitkit's files) and ``folder/timm`` (timm's state dict as safetensors and how to build it)."""
    from safetensors.torch import save_file

    from vitkit.models.complexity import complexity

    torch.manual_seed(seed)
    timm_model, vk_model = build_pair(name, torch.device("cpu"), vitkit_first=False, **kwargs)
    h, w = (int(v) for v in vk_model.config.img_size)
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        diff = (timm_model(x) - vk_model(x)).abs().max().item()
    if not diff <= LOGITS_TOLERANCE:
        raise SystemExit(f"FAIL: fp32 logits of timm and vitkit differ by {diff:.3e}: not the same function")
    vk_model.save_pretrained(folder / "vitkit")
    (folder / "timm").mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in timm_model.state_dict().items()}, folder / "timm" / "model.safetensors")
    (folder / "timm" / "model.json").write_text(json.dumps({"model": name, "kwargs": kwargs}))
    return {"name": name, "kwargs": kwargs, "img_size": [h, w], "seed": seed,
            "gflop_per_image": complexity(vk_model.config).flops / 1e9,
            "params": sum(p.numel() for p in vk_model.parameters()), "logits_max_abs_diff": diff}


def photos(side: int) -> list:
    """(name, JPEG bytes) of scikit-image's photos, their longer side ``side`` pixels."""
    import skimage.data
    from PIL import Image

    out = []
    for name in PHOTOS:
        im = Image.fromarray(getattr(skimage.data, name)()).convert("RGB")
        im.thumbnail((side, side), Image.BICUBIC)
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=90)
        out.append((name, buf.getvalue()))
    return out


def load_served(folder: Path, runtime: str, quantize=None, calibration=None):
    """The model as `vitkit serve` loads it (``load_classifier``), as its ``ServedModel``."""
    from vitkit.deploy.choose import load_classifier
    from vitkit.serve import ServedModel

    return ServedModel(load_classifier(str(folder), runtime, quantize, calibration=calibration))


def calibration_folder(args, folder: Path, bodies: list):
    """OpenVINO's int8 calibrates on images and random weights' classes name no dataset: the photos
    themselves, as files (both the server and the offline baseline quantize on them); None elsewhere."""
    from vitkit.deploy.quantize import calibrates

    if not calibrates(args.runtime, args.quantize):
        return None
    (folder / "calibration").mkdir(exist_ok=True)
    for name, body in bodies:
        (folder / "calibration" / f"{name}.jpg").write_bytes(body)
    return folder / "calibration"


def offline_samples(served, inputs: list, batch: int, repeats: int, warmup: int = 2) -> list:
    """img/s of ``ServedModel.probabilities`` on batches of ``batch`` preprocessed images."""
    xs = [inputs[i % len(inputs)] for i in range(batch)]
    for _ in range(warmup):
        served.probabilities(xs)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        served.probabilities(xs)
        samples.append(batch / (time.perf_counter() - start))
    return samples


# ---------------------------------------------------------------------------- the plain endpoint


def plain_app(folder: Path, threads=None):
    """timm's model behind FastAPI the usual way: one image per request, run in the event loop."""
    from fastapi import FastAPI
    from PIL import Image
    from safetensors.torch import load_file
    from timm.data import create_transform, resolve_data_config

    if threads:
        torch.set_num_threads(threads)
    meta = json.loads((folder / "model.json").read_text())
    model = timm.create_model(meta["model"], pretrained=False, **meta["kwargs"])
    model.load_state_dict(load_file(folder / "model.safetensors"))
    model.eval()
    config = resolve_data_config({}, model=model)
    config["input_size"] = (3, *model.patch_embed.img_size)  # a smoke model's own size (its cfg says 224)
    transform = create_transform(**config)
    app = FastAPI()

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.post("/predict")
    async def predict(request: Request):
        image = Image.open(io.BytesIO(await request.body())).convert("RGB")
        x = transform(image).unsqueeze(0)
        with torch.inference_mode():
            probs = model(x).softmax(-1)[0]
        values, indices = probs.topk(5)
        return {"top": [{"index": i, "probability": p} for i, p in zip(indices.tolist(), values.tolist())]}

    return app


def serve_plain(folder: str, threads=None) -> int:
    import uvicorn

    app = plain_app(Path(folder), threads)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    print(f"plain: serving {folder} on http://127.0.0.1:{sock.getsockname()[1]}", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=5))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    return 0


# ---------------------------------------------------------------------------- server processes


class Server:
    """A server process: its URL (read from its stderr), readiness, CPU time, RSS; ``stop()`` ends it."""

    def __init__(self, name: str, command: list, ready_path: str):
        self.name, self.command, self.ready_path = name, command, ready_path
        self.started = time.perf_counter()
        # a session of its own: a Ctrl-C reaches this process alone, which stops the server on its way out
        # (rather than both stopping at once, the client seeing refused connections instead of the interrupt)
        self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines, self._url = [], queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.url, self.startup_s = None, None

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())
            if (found := URL_LINE.search(line)) and self._url.empty():
                self._url.put(found.group(1))
        self._url.put(None)

    def wait_ready(self) -> None:
        import httpx

        try:
            self.url = self._url.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            self.url = None
        while self.url and self.proc.poll() is None:
            try:
                if httpx.get(self.url + self.ready_path, timeout=10).status_code == 200:
                    self.startup_s = round(time.perf_counter() - self.started, 2)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"FAIL: the {self.name} server did not start ({' '.join(self.command)}):\n"
                         + "\n".join(self.lines[-20:]))

    def cpu_s(self) -> float:
        try:
            import psutil

            t = psutil.Process(self.proc.pid).cpu_times()
            return t.user + t.system
        except ImportError:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        try:
            import psutil

            return psutil.Process(self.proc.pid).memory_info().rss / 2 ** 20
        except ImportError:
            with open(f"/proc/{self.proc.pid}/status") as f:
                kb = next(line.split()[1] for line in f if line.startswith("VmRSS:"))
            return int(kb) / 1024

    def metrics(self) -> str:
        import httpx

        return httpx.get(self.url + "/metrics", timeout=30).text if self.name == "vitkit" else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # vitkit serve drains on SIGTERM: nothing is in flight by now
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)


def batch_counts(text: str) -> dict:
    """The predict batcher's batch-size histogram from /metrics: cumulative bucket counts, count, sum."""
    out = {"buckets": {}, "count": 0.0, "sum": 0.0}
    for line in text.splitlines():
        if line.startswith("vitkit_batch_size") and 'batcher="predict"' in line:
            name, value = line.rsplit(" ", 1)
            if "_bucket" in name and (le := re.search(r'le="([^"]+)"', name).group(1)) != "+Inf":
                out["buckets"][float(le)] = float(value)
            elif "_count" in name:
                out["count"] = float(value)
            elif "_sum" in name:
                out["sum"] = float(value)
    return out


def batch_delta(before: dict, after: dict) -> dict:
    """A level's batches: how many, their mean size, and how many of each size range."""
    count = after["count"] - before["count"]
    histogram, low, seen = {}, 1, 0.0
    for bound in sorted(after["buckets"]):
        cumulative = after["buckets"][bound] - before["buckets"].get(bound, 0.0)
        if cumulative - seen:
            histogram[str(int(bound)) if low >= bound else f"{low}-{int(bound)}"] = int(cumulative - seen)
        seen, low = cumulative, int(bound) + 1
    return {"count": int(count), "mean_size": round((after["sum"] - before["sum"]) / count, 2) if count else None,
            "histogram": histogram}


# ---------------------------------------------------------------------------- the client


@contextlib.asynccontextmanager
async def open_client(kind: str, url: str, concurrency: int):
    """One HTTP client session for ``concurrency`` connections to ``url`` (aiohttp or httpx), as the function
    ``send(body) -> (status, JSON answer or None)`` that POSTs one JPEG to /predict through that client's API."""
    headers = {"content-type": "image/jpeg"}
    if kind == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=REQUEST_TIMEOUT_S) as client:
            async def send_httpx(body: bytes) -> tuple:
                r = await client.post("/predict", content=body, headers=headers)
                return r.status_code, (r.json() if r.status_code == 200 else None)
            yield send_httpx
        return
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as client:
        async def send_aiohttp(body: bytes) -> tuple:
            async with client.post("/predict", data=body, headers=headers) as r:
                return r.status, (await r.json() if r.status == 200 else None)
        yield send_aiohttp


async def drive(url: str, total: int, concurrency: int, request, done=None, kind: str = "aiohttp") -> tuple:
    """``request(send, i)`` for every i < ``total`` on ``concurrency`` workers sharing one client session
    (``kind``; ``send``: :func:`open_client`'s) -> (the results in order, wall seconds). ``done``: a one-item
    list counting finished requests."""
    results, order = [None] * total, iter(range(total))
    async with open_client(kind, url, concurrency) as send:
        async def worker():
            for i in order:  # one shared iterator: each request once
                results[i] = await request(send, i)
                if done is not None:
                    done[0] += 1
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, total))))
        return results, time.perf_counter() - start


def client_errors() -> tuple:
    """What a request can end in besides an answer, for either client."""
    import aiohttp
    import httpx

    return httpx.HTTPError, aiohttp.ClientError, asyncio.TimeoutError


async def post(send, body: bytes) -> dict:
    """One POST /predict through ``send`` (:func:`open_client`'s): its status (or the error's name), the
    top-1 index, the latency in ms."""
    start = time.perf_counter()
    try:
        status, answer = await send(body)
        top1 = answer["top"][0]["index"] if answer is not None else None
    except client_errors() as e:  # counted per level, not fatal
        status, top1 = type(e).__name__, None
    return {"status": status, "top1": top1, "ms": (time.perf_counter() - start) * 1000}


def client_cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def percentiles(ms: list) -> dict:
    if not ms:
        return {"p50": None, "p95": None, "p99": None, "mean": None, "max": None}
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return {"p50": round(p50, 2), "p95": round(p95, 2), "p99": round(p99, 2), "mean": round(statistics.mean(ms), 2),
            "max": round(max(ms), 2)}


def measure_level(server: Server, clients: int, requests: int, bodies: list, expected: list, limit,
                  kind: str = "aiohttp") -> dict:
    """One load level on one server, with its CPU, the client's, other load and (vitkit) batch sizes."""
    metrics, server_cpu, own, busy = batch_counts(server.metrics()), server.cpu_s(), client_cpu_s(), _cpu_busy_s()
    results, wall = asyncio.run(drive(server.url, requests, clients,
                                      lambda send, i: post(send, bodies[i % len(bodies)]), kind=kind))
    own, server_cpu = client_cpu_s() - own, server.cpu_s() - server_cpu
    busy_after = _cpu_busy_s()
    ok = [(i, r) for i, r in enumerate(results) if r["status"] == 200]
    img_s = len(ok) / wall
    row = {"server": server.name, "clients": clients, "requests": requests, "ok": len(ok),
           "errors": requests - len(ok), "error_codes": dict(Counter(str(r["status"]) for r in results
                                                                    if r["status"] != 200)),
           "top1_differs_from_offline": sum(r["top1"] != expected[i % len(expected)] for i, r in ok),
           "wall_s": round(wall, 3), "img_s": round(img_s, 2), "latency_ms": percentiles([r["ms"] for _, r in ok]),
           "server_cpu_s": round(server_cpu, 2), "server_cores": round(server_cpu / wall, 2),
           "client_cpu_s": round(own, 3), "client_cpu_ms_per_request": round(1000 * own / requests, 3),
           "other_load_cores": None if busy is None or busy_after is None else
           round(max(0.0, busy_after[0] - busy[0] - own - server_cpu) / wall, 2),
           "server_rss_mb": round(server.rss_mb(), 1), "limit": limit(img_s)}
    if server.name == "vitkit":
        row["batches"] = batch_delta(metrics, batch_counts(server.metrics()))
    return row


# ---------------------------------------------------------------------------- the fault run


def fault_kind(i: int, every: int) -> str:
    """Every ``every``-th request a fault, the three kinds in turn; the rest good."""
    return FAULTS[(i // every) % len(FAULTS)] if i % every == every - 1 else "good"


async def fault_request(send, i: int, every: int, bodies: list, junk: list, big: bytes, url: str) -> dict:
    kind = fault_kind(i, every)
    if kind == "good":
        return {"kind": kind, "image": i % len(bodies), **await post(send, bodies[i % len(bodies)])}
    if kind != "disconnect":
        return {"kind": kind, **await post(send, junk[i % len(junk)] if kind == "bad_image" else big)}
    host, port = url.removeprefix("http://").split(":")
    body = bodies[i % len(bodies)]
    head = f"POST /predict HTTP/1.1\r\nHost: {host}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(body)}\r\n\r\n"
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head.encode() + body[: len(body) // 2])
    await writer.drain()
    writer.close()  # gone mid-upload
    await writer.wait_closed()
    return {"kind": kind, "status": "closed", "top1": None, "ms": 0.0}


async def fault_load(server: Server, total: int, every: int, concurrency: int, bodies: list,
                     kind: str = "aiohttp") -> tuple:
    """The fault run with the server's RSS sampled every second -> (results, wall, RSS samples)."""
    rng = np.random.default_rng(0)
    junk = [rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes() for _ in range(8)]
    big, done, samples, stop = b"\0" * OVERSIZED_BYTES, [0], [], asyncio.Event()

    async def sample():
        start = time.perf_counter()
        while not stop.is_set():
            samples.append({"t_s": round(time.perf_counter() - start, 1), "done": done[0],
                            "rss_mb": round(server.rss_mb(), 1)})
            if len(samples) % 30 == 0:  # a line every half minute: the full run's fault run takes minutes
                print(f"  {done[0]:,}/{total:,} requests, server RSS {samples[-1]['rss_mb']:.0f} MiB", flush=True)
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
    sampler = asyncio.get_running_loop().create_task(sample())
    results, wall = await drive(server.url, total, concurrency, lambda send, i: fault_request(
        send, i, every, bodies, junk, big, server.url), done, kind)
    stop.set()
    await sampler
    samples.append({"t_s": samples[-1]["t_s"] if samples else 0.0, "done": done[0],
                    "rss_mb": round(server.rss_mb(), 1)})
    return results, wall, samples


def fault_run(server: Server, total: int, every: int, concurrency: int, bodies: list, expected: list,
              kind: str = "aiohttp") -> dict:
    import httpx

    results, wall, samples = asyncio.run(fault_load(server, total, every, concurrency, bodies, kind))
    good = [r for r in results if r["kind"] == "good"]
    answered = [r for r in good if r["status"] == 200]
    correct = sum(r["top1"] == expected[r["image"]] for r in answered)
    warm = next((s for s in samples if s["done"] >= WARM_FRACTION * total), samples[0])["rss_mb"]
    end = samples[-1]["rss_mb"]
    faults = {kind: {"sent": sum(r["kind"] == kind for r in results),
                     "answers": dict(Counter(str(r["status"]) for r in results if r["kind"] == kind))}
              for kind in FAULTS}
    want = {"bad_image": "400", "oversized": "413", "disconnect": "closed"}
    try:
        alive = httpx.get(server.url + "/healthz", timeout=30).status_code == 200
    except httpx.HTTPError:
        alive = False
    return {"requests": total, "fault_every": every, "concurrency": concurrency, "wall_s": round(wall, 2),
            "good": len(good), "answered": len(answered), "correct": correct, "incorrect": len(answered) - correct,
            "good_errors": len(good) - len(answered),
            "good_error_codes": dict(Counter(str(r["status"]) for r in good if r["status"] != 200)),
            "good_img_s": round(len(answered) / wall, 2), "latency_ms": percentiles([r["ms"] for r in answered]),
            "faults": faults, "faults_answered_as_expected": all(
                f["answers"].get(want[k], 0) == f["sent"] for k, f in faults.items()),
            "rss_mb_after_warmup": warm, "rss_mb_end": end, "rss_growth": round(end / warm - 1, 4),
            "rss_samples": samples, "server_alive_after": alive}


# ---------------------------------------------------------------------------- output


def fmt_row(cells) -> str:
    widths = (7, 8, 8, 8, 8, 8, 7, 7, 7, 9, 7)
    return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))


HEADER = ["server", "clients", "img/s", "p50 ms", "p95 ms", "p99 ms", "errors", "batch", "cores", "client ms",
          "limit"]


def show(row: dict) -> str:
    lat, frac = row["latency_ms"], row["limit"]["fraction_of_limit"]
    mean_batch = (row.get("batches") or {}).get("mean_size")
    return fmt_row([row["server"], row["clients"], f"{row['img_s']:.1f}", lat["p50"], lat["p95"], lat["p99"],
                    row["errors"], "-" if mean_batch is None else mean_batch, row["server_cores"],
                    f"{row['client_cpu_ms_per_request']:.2f}", "-" if frac is None else f"{frac:.1%}"])


def at_clients(rows: list, server: str, clients: int):
    return next((r["img_s"] for r in rows if r["server"] == server and r["clients"] == clients), None)


def goals(rows: list, offline_img_s: float, fault) -> list:
    vk, plain = at_clients(rows, "vitkit", 32), at_clients(rows, "plain", 32)
    x = round(vk / offline_img_s, 4) if vk is not None and offline_img_s else None
    y = round(vk / plain, 4) if vk is not None and plain else None
    summary = None if fault is None else {k: fault[k] for k in (
        "requests", "good", "correct", "incorrect", "good_errors", "faults_answered_as_expected",
        "server_alive_after", "rss_mb_after_warmup", "rss_mb_end", "rss_growth")}
    return [{"offline_fraction_at_32": x, "goal": GOAL_OFFLINE, "met": x is not None and x >= GOAL_OFFLINE},
            {"over_plain_at_32": y, "goal": GOAL_OVER_PLAIN, "met": y is not None and y >= GOAL_OVER_PLAIN},
            {"fault_run": summary, "memory_flat": None if fault is None else fault["rss_growth"] <= MEMORY_TOLERANCE,
             "all_correct": None if fault is None else (fault["incorrect"] == 0 and fault["good_errors"] == 0)}]


# ---------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help=f"timm architecture (default {DEFAULT_MODEL}; --smoke: a 2-block {SMOKE_MODEL} "
                                   f"at 32 px)")
    p.add_argument("--img-size", type=int, help="input side in pixels (default: the model's)")
    p.add_argument("--runtime", choices=["torch", "onnxruntime", "openvino"], default="torch",
                   help="vitkit serve's runtime, and the offline baseline's (default torch)")
    p.add_argument("--quantize", choices=["int8"], help="with --runtime onnxruntime or openvino: the int8 model "
                                                        "(dynamic int8 for ONNX Runtime, NNCF for OpenVINO)")
    p.add_argument("--max-batch", type=int, default=32, help="vitkit serve --max-batch (default 32)")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="vitkit serve --max-wait-ms (default 5)")
    p.add_argument("--max-body-mb", type=float, default=2.0, help="vitkit serve --max-body-mb (default 2: the "
                                                                  "fault run's 3 MiB body is over it)")
    p.add_argument("--client", choices=list(CLIENT_SESSIONS), default="aiohttp",
                   help="the load's HTTP client (default aiohttp: it takes less of the CPU the servers share)")
    p.add_argument("--levels", type=int, nargs="+", help="concurrent clients per level (default 1 8 32 128)")
    p.add_argument("--requests", type=int, help=f"requests per level and server (default {REQUESTS})")
    p.add_argument("--warmup", type=int, help="requests per server before the levels (default 2 x --max-batch)")
    p.add_argument("--offline-repeats", type=int, help="timed offline batches, before and after the levels "
                                                       "(default 5)")
    p.add_argument("--fault-requests", type=int, help=f"requests of the fault run (default {FAULT_REQUESTS:,}; "
                                                      f"0: none)")
    p.add_argument("--fault-every", type=int, default=10, help="every N-th fault-run request a fault (default 10)")
    p.add_argument("--fault-concurrency", type=int, default=32, help="clients of the fault run (default 32)")
    p.add_argument("--image-side", type=int, default=384, help="the photos' longer side in pixels (default 384)")
    p.add_argument("--threads", type=int, help="torch threads of both servers and the offline baseline "
                                               "(default: torch's)")
    p.add_argument("--seed", type=int, default=0, help="the random weights' seed (default 0)")
    p.add_argument("--note", help="what else ran on the machine (recorded; say 'quiet' only if nothing did)")
    p.add_argument("--out", help="results file, or a folder for the default name (default: benchmarks/results/"
                                 "serve_<device-slug>_<date>.json; --smoke: the smoke folder)")
    p.add_argument("--smoke", action="store_true", help="smoke check: a tiny model, levels 1 8 32, 48 requests, "
                                                        "200 in the fault run (explicit options win)")
    p.add_argument("--serve-plain", help=argparse.SUPPRESS)  # the plain endpoint's own process
    args = p.parse_args(argv)
    smoke = args.smoke
    args.kwargs = {} if args.model or not smoke else dict(SMOKE_KWARGS)
    if args.img_size:
        args.kwargs["img_size"] = args.img_size
    args.model = args.model or (SMOKE_MODEL if smoke else DEFAULT_MODEL)
    args.levels = args.levels or (SMOKE_LEVELS if smoke else LEVELS)
    args.requests = (SMOKE_REQUESTS if smoke else REQUESTS) if args.requests is None else args.requests
    args.warmup = 2 * args.max_batch if args.warmup is None else args.warmup
    args.offline_repeats = (3 if smoke else 5) if args.offline_repeats is None else args.offline_repeats
    if args.fault_requests is None:
        args.fault_requests = SMOKE_FAULT_REQUESTS if smoke else FAULT_REQUESTS
    problems = [f"--{k.replace('_', '-')} must be >= 1" for k in ("requests", "max_batch", "fault_every",
                                                                  "fault_concurrency", "image_side", "offline_repeats")
                if getattr(args, k) < 1]
    problems += ["--levels must all be >= 1"] if min(args.levels) < 1 else []
    problems += [f"--{k.replace('_', '-')} must be >= 0" for k in ("warmup", "fault_requests") if getattr(args, k) < 0]
    if problems:
        p.error("; ".join(problems))
    if args.model not in timm.list_models():
        p.error(f"unknown model {args.model!r} (a timm architecture name)")
    return args


def start_servers(args, folder: Path, servers: list, calibration=None) -> None:
    threads = ["--threads", str(args.threads)] if args.threads else []
    calibrate = ["--calibration", str(calibration)] if calibration else []
    vitkit_cmd = [sys.executable, "-m", "vitkit", "serve", str(folder / "vitkit"), "--port", "0", "--runtime",
                  args.runtime, "--max-batch", str(args.max_batch), "--max-wait-ms", f"{args.max_wait_ms:g}",
                  "--max-body-mb", f"{args.max_body_mb:g}", *threads, *calibrate,
                  *(["--quantize", args.quantize] if args.quantize else [])]
    servers.append(Server("vitkit", vitkit_cmd, "/readyz"))  # listed at once: a Ctrl-C now still stops it
    servers.append(Server("plain", [sys.executable, os.path.abspath(__file__), "--serve-plain", str(folder / "timm"),
                                    *threads], "/healthz"))
    for server in servers:
        server.wait_ready()


def run(args, info: dict, folder: Path, servers: list) -> dict:
    model = prepare_weights(args.model, args.kwargs, folder, args.seed)
    bodies = photos(args.image_side)
    calibration = calibration_folder(args, folder, bodies)
    served = load_served(folder / "vitkit", args.runtime, args.quantize, calibration)
    inputs = [served.image(body, name) for name, body in bodies]
    data = [body for _, body in bodies]
    probs = torch.stack(served.probabilities(inputs))
    expected = probs.argmax(-1).tolist()
    top2 = probs.topk(2).values
    images = [{"name": name, "bytes": len(body), "offline_top1": e, "top1_probability_margin": float(m[0] - m[1])}
              for (name, body), e, m in zip(bodies, expected, top2)]
    # each server against the peak of the precision it computes in (vitkit's int8 products where quantized)
    peaks = {"vitkit": info["limits"].get("int8_gop_s" if args.quantize else "fp32_gflop_s"),
             "plain": info["limits"].get("fp32_gflop_s")}

    def limit(img_s, server="vitkit"):
        return at_limit(img_s, model["gflop_per_image"], peaks[server])
    before = offline_samples(served, inputs, args.max_batch, args.offline_repeats)
    print(f"offline ({args.runtime}, batch {args.max_batch}): {statistics.median(before):.1f} img/s", flush=True)
    start_servers(args, folder, servers, calibration)
    for server in servers:  # every batch size seen once before anything is timed
        asyncio.run(drive(server.url, args.warmup, args.max_batch, lambda send, i: post(send, data[i % len(data)]),
                          kind=args.client))
    print(fmt_row(HEADER) + "\n" + "-" * len(fmt_row(HEADER)), flush=True)
    rows = []
    for n, clients in enumerate(args.levels):
        for server in servers if n % 2 == 0 else servers[::-1]:
            rows.append(measure_level(server, clients, args.requests, data, expected,
                                      lambda img_s, name=server.name: limit(img_s, name), args.client))
            print(show(rows[-1]), flush=True)
    after = offline_samples(served, inputs, args.max_batch, args.offline_repeats, warmup=1)
    offline = {"batch": args.max_batch, "runtime": served.runtime, "samples_before_img_s": before,
               "samples_after_img_s": after, "median_img_s": statistics.median(before + after)}
    offline["limit"] = limit(offline["median_img_s"])
    print(f"offline after the levels: {statistics.median(after):.1f} img/s", flush=True)
    fault = None
    if args.fault_requests:
        print(f"fault run: {args.fault_requests:,} requests, every {args.fault_every}th a fault ...", flush=True)
        fault = fault_run(servers[0], args.fault_requests, args.fault_every, args.fault_concurrency,
                          data, expected, args.client)
    return {"model": model, "images": images, "offline": offline, "rows": rows, "fault_run": fault,
            "servers": {s.name: {"command": s.command, "startup_s": s.startup_s} for s in servers},
            "goals": goals(rows, offline["median_img_s"], fault)}


def report(result: dict) -> None:
    g = result["goals"]
    x, y = g[0]["offline_fraction_at_32"], g[1]["over_plain_at_32"]
    print(f"\noffline {result['offline']['median_img_s']:.1f} img/s (median, before and after)")
    print(f"vitkit at 32 clients / offline: {'n/a' if x is None else f'{x:.2f}'} (goal >= {GOAL_OFFLINE}: "
          f"{'met' if g[0]['met'] else 'not met'})")
    print(f"vitkit / plain at 32 clients: {'n/a' if y is None else f'{y:.2f}'}x (goal >= {GOAL_OVER_PLAIN}: "
          f"{'met' if g[1]['met'] else 'not met'})")
    if (f := result["fault_run"]) is not None:
        print(f"fault run: {f['correct']:,}/{f['good']:,} good requests answered correctly, {f['incorrect']} wrong, "
              f"{f['good_errors']} errors; faults answered as expected: {f['faults_answered_as_expected']} "
              f"{f['faults']}; RSS {f['rss_mb_after_warmup']:.0f} MiB after warm-up -> {f['rss_mb_end']:.0f} MiB "
              f"at the end ({f['rss_growth']:+.1%}: {'flat' if g[2]['memory_flat'] else 'GROWING'}); "
              f"server alive after: {f['server_alive_after']}")


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM or SIGHUP as Ctrl-C: the servers are stopped on the way out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.serve_plain:
        return serve_plain(args.serve_plain, args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    info = machine_info(device)
    info.setdefault("loadavg_at_start", os.getloadavg())
    out = results_path(args.out, dated_name("serve", device, info), smoke=args.smoke)
    settings = {k: getattr(args, k) for k in ("model", "kwargs", "runtime", "quantize", "max_batch", "max_wait_ms",
                                              "max_body_mb", "levels", "requests", "warmup", "offline_repeats",
                                              "fault_requests", "fault_every", "fault_concurrency", "image_side",
                                              "smoke")}
    settings.update(threads=torch.get_num_threads(), oversized_bytes=OVERSIZED_BYTES,
                    client=f"one {CLIENT_SESSIONS[args.client]} in this process",
                    started=datetime.datetime.now().astimezone().isoformat(timespec="seconds"))
    print(f"{info.get('cpu_model')} | torch {info.get('torch')} | timm {info.get('timm')} | vitkit {info.get('vitkit')}"
          f" | threads {settings['threads']} | {args.model} {args.kwargs or ''} on {args.runtime}"
          f"{' ' + args.quantize if args.quantize else ''}")
    print(describe(info["limits"]), flush=True)
    start, servers, main_thread = time.perf_counter(), [], threading.current_thread() is threading.main_thread()
    handled = (signal.SIGTERM, signal.SIGHUP) if main_thread else ()
    previous = {sig: signal.signal(sig, _interrupt) for sig in handled}
    try:
        with tempfile.TemporaryDirectory(prefix="vitkit-bench-serve-") as tmp:
            result = run(args, info, Path(tmp), servers)
    except KeyboardInterrupt:
        print("\ninterrupted: servers stopped, nothing written", file=sys.stderr)
        return 130
    finally:
        for server in servers:
            server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    settings["finished"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    settings["wall_s"] = round(time.perf_counter() - start, 1)
    info["limits"] = close_limits(info["limits"])
    info["loadavg_at_end"] = os.getloadavg()
    info["other_load"] = args.note or "not stated (--note): see loadavg_at_start/_end and each level's other_load_cores"
    report(result)
    write_json_atomic(out, {"benchmark": "serve", "machine": info, "settings": settings, **result})
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
