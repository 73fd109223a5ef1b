"""``vitkit serve``: a real server on a free loopback port, talked to over real HTTP (httpx, raw
sockets for the misbehaving clients): its answers are ``vitkit predict``'s, concurrent requests
share forward passes and each gets its own answer, and nothing a client sends takes it down.

Most tests run the server in a thread of this process (one torch import); the drain on SIGTERM
and the command line's own checks run ``python -m vitkit serve`` as a process.
"""

import asyncio
import base64
import contextlib
import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import forks
from conftest import SERVED_LABELS, image_bytes, run_chromium, save_served_classifier

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

import vitkit  # noqa: E402
from vitkit.evaluate import predict_images  # noqa: E402
from vitkit.serve import ServedModel, ServeOptions  # noqa: E402
from vitkit.serve.batcher import Batcher, QueueFull  # noqa: E402
from vitkit.serve.server import make_server  # noqa: E402

pytestmark = pytest.mark.xdist_group("serve")

LABELS = SERVED_LABELS
photo = image_bytes


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return save_served_classifier(tmp_path_factory.mktemp("serve") / "model")


class Running:
    """A server in a background thread: ``url``, and ``stop()`` that drains it."""

    def __init__(self, served, **options):
        self.server, sock, self.url = make_server(served, ServeOptions(**options), "127.0.0.1", 0)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def serving(weights):
    """Start servers for a test (torch runtime unless given a model); all stopped at its end."""
    started = []

    def start(model=None, runtime="torch", **options):
        model = model or vitkit.from_pretrained(weights)
        running = Running(ServedModel(model, runtime), **options)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


def post(url, data, path="/predict", **kw):
    return httpx.post(url + path, content=data, timeout=60, **kw)


# ------------------------------------------------------------------ the answers are predict's


def test_predictions_equal_vitkit_predict_for_bytes_and_multipart_uploads(serving, weights, tmp_path):
    running = serving(max_wait_ms=0)
    images = [photo(i) for i in range(3)] + [photo(9, (28, 28), "L")]
    paths = []
    for i, data in enumerate(images):
        paths.append(tmp_path / f"{i}.png")
        paths[-1].write_bytes(data)
    expected = predict_images(vitkit.from_pretrained(weights), paths, top_k=3)
    for data, path, want in zip(images, paths, expected):
        got = post(running.url, data, "/predict?top_k=3").json()
        assert [t["label"] for t in got["top"]] == [label for _, label, _ in want.top]
        assert np.allclose([t["probability"] for t in got["top"]], [p for _, _, p in want.top], atol=1e-5)
        form = httpx.post(running.url + "/predict?top_k=3", files={"file": (path.name, data, "image/png")},
                          timeout=60).json()
        assert form["image"] == path.name and form["top"] == got["top"]


def test_onnx_runtime_answers_as_vitkit_predict_does_on_the_same_file(serving, weights, tmp_path):
    pytest.importorskip("onnxruntime")
    from vitkit.deploy import export_onnx
    from vitkit.deploy.runtime import OnnxModel

    onnx = export_onnx(vitkit.from_pretrained(weights), tmp_path / "m.onnx")
    running = serving(OnnxModel(onnx), runtime="onnxruntime", max_wait_ms=0)
    data = photo(4)
    (tmp_path / "x.png").write_bytes(data)
    want = predict_images(OnnxModel(onnx), [tmp_path / "x.png"], top_k=5)[0]
    got = post(running.url, data).json()
    assert [t["index"] for t in got["top"]] == [i for i, _, _ in want.top]
    assert np.allclose([t["probability"] for t in got["top"]], [p for _, _, p in want.top], atol=1e-6)
    refused = post(running.url, data, "/embed")
    assert refused.status_code == 501 and "PyTorch runtime" in refused.json()["error"]


def test_embed_is_the_models_pooled_features(serving, weights):
    running = serving(max_wait_ms=0)
    data = photo(5)
    got = post(running.url, data, "/embed").json()
    model = vitkit.from_pretrained(weights).eval()
    x = vitkit.preprocess(model, data)
    with torch.no_grad():
        want = model.forward_head(model.forward_features(x), pre_logits=True)[0]
    assert got["dim"] == model.config.embed_dim and np.allclose(got["embedding"], want.numpy(), atol=1e-5)
    rollout = post(running.url, data, "/rollout")
    assert rollout.status_code == 200 and rollout.content[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_model_whose_maps_are_no_distributions_has_no_rollout_and_says_why(serving):
    """CaiT's talking heads: /rollout drew a map out of weights that are no distributions; it is now a 501 that
    says why, as vitkit inspect says it, and /predict still answers."""
    cait = vitkit.create_model("cait_xxs24_224", img_size=32, patch_size=8, embed_dim=32, depth=1, cls_depth=1,
                               num_heads=2, num_classes=3).eval()
    running = serving(cait, max_wait_ms=0)
    got = post(running.url, photo(5), "/rollout")
    assert got.status_code == 501 and "talking-heads attention (CaiT's)" in got.json()["error"], got.text
    assert post(running.url, photo(5)).status_code == 200


def test_a_model_whose_maps_would_not_fit_in_the_memory_has_no_rollout_and_says_why(serving, monkeypatch):
    """SAM's ViT-H at 1,024 px holds 32 GiB of maps an image: /rollout was a request that took the server's
    memory; it is a 501 that says so (as vitkit inspect refuses it), and /predict still answers."""
    import vitkit.machine

    monkeypatch.setattr(vitkit.machine, "available_memory", lambda: 1000)  # (bytes)
    running = serving(max_wait_ms=0)
    got = post(running.url, photo(5), "/rollout")
    assert got.status_code == 501 and re.search(r"no attention rollout for this model: the attention maps of one "
                                                r"image at \d+x\d+ px take .* serve a smaller --img-size$",
                                                got.json()["error"]), got.text
    assert post(running.url, photo(5)).status_code == 200


# ------------------------------------------------------------------ batching


def test_concurrent_requests_share_forward_passes_and_each_gets_its_own_answer(serving, weights, tmp_path):
    running = serving(max_batch=8, max_wait_ms=300)
    images = [photo(100 + i) for i in range(8)]
    for i, data in enumerate(images):
        (tmp_path / f"{i}.png").write_bytes(data)
    expected = predict_images(vitkit.from_pretrained(weights), [tmp_path / f"{i}.png" for i in range(8)], top_k=1)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda data: post(running.url, data, "/predict?top_k=1").json(), images))
    assert [a["top"][0]["index"] for a in answers] == [e.top[0][0] for e in expected]
    assert len({a["top"][0]["index"] for a in answers}) > 1, "the images should not all look alike to the model"
    text = httpx.get(running.url + "/metrics").text
    passes = float(re.search(r'vitkit_batch_size_count\{batcher="predict"\} (\S+)', text).group(1))
    images_seen = float(re.search(r'vitkit_batch_size_sum\{batcher="predict"\} (\S+)', text).group(1))
    assert images_seen == 8 and passes < 8, f"8 concurrent requests took {passes:g} forward passes"


def test_a_lone_request_runs_at_once_and_one_on_its_way_is_waited_for():
    async def scenario():
        calls = []

        def run(values):
            calls.append(list(values))
            return list(values)

        batcher = Batcher(run, "t", max_batch=8, max_wait_ms=60_000)  # a wait no test could sit out
        await batcher.start()
        assert await asyncio.wait_for(batcher.submit(1), 5) == 1  # nothing else queued or arriving
        assert calls == [[1]]

        async def decoded_later(value):
            with batcher.arriving():  # read and decoded meanwhile
                await asyncio.sleep(0.2)
            return await batcher.submit(value)

        second = asyncio.ensure_future(decoded_later(3))
        await asyncio.sleep(0.05)
        assert await asyncio.wait_for(batcher.submit(2), 5) == 2 and await second == 3
        assert calls == [[1], [2, 3]]  # the first waited for the one on its way: one forward pass
        await batcher.stop()

    asyncio.run(scenario())


def test_a_full_queue_refuses_at_once_with_retry_after():
    async def scenario():
        release = threading.Event()

        def slow(values):
            release.wait(10)
            return list(values)

        batcher = Batcher(slow, "t", max_batch=1, max_wait_ms=0, max_queue=2)
        await batcher.start()
        first = asyncio.ensure_future(batcher.submit(1))  # taken by the worker, blocked in the model
        await asyncio.sleep(0.05)
        waiting = [asyncio.ensure_future(batcher.submit(i)) for i in (2, 3)]  # the queue's two places
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFull):
            await batcher.submit(4)
        release.set()
        assert await first == 1 and [await w for w in waiting] == [2, 3]
        await batcher.stop()

    asyncio.run(scenario())


def test_overload_answers_503_with_retry_after_and_slowness_504(serving):
    def slow(model_call):
        def run(inputs):
            time.sleep(0.6)
            return model_call(inputs)
        return run

    running = serving(max_batch=1, max_wait_ms=0, max_queue=1, timeout_s=5)
    batcher = running.server.config.app.state.endpoint.predictor
    batcher.run = slow(batcher.run)
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda i: post(running.url, photo(i)), range(6)))
    statuses = sorted(r.status_code for r in answers)
    assert 200 in statuses and 503 in statuses, statuses
    busy = next(r for r in answers if r.status_code == 503)
    assert busy.headers["retry-after"] == "1" and "at capacity" in busy.json()["error"]
    quick = serving(max_batch=1, max_wait_ms=0, timeout_s=0.2)
    batcher = quick.server.config.app.state.endpoint.predictor
    batcher.run = slow(batcher.run)
    late = post(quick.url, photo(1))
    assert late.status_code == 504 and late.json()["error"] == "no answer within 0.2 s (--timeout: the server is " \
        "busy, or its model takes longer than that)"
    assert httpx.get(quick.url + "/healthz").status_code == 200


@pytest.mark.parametrize("route", ["/predict", "/rollout"])
def test_decoding_and_rollouts_wait_under_the_same_deadline_and_queue_limit(serving, route):
    """Decoding and /rollout ran in the default executor's unbounded queue: 64 rollouts with --timeout 3
    --max-queue 4 all got 200 (the last after 14 s) and a lone predict behind them waited 13 s."""
    workers = min(32, (os.cpu_count() or 1) + 4)  # as many at once as the default executor runs
    running = serving(max_wait_ms=0, max_queue=workers, timeout_s=4)  # (the batcher's queue holds as many)
    endpoint = running.server.config.app.state.endpoint
    assert endpoint.workers._value == workers
    served = endpoint.served
    # decoding 3 s slower, a rollout of 3 s (its figure, drawn one at a time, left out): the first answered 3 s
    # after they arrive, the waiting ones could end 6 s after the first arrived, past their 4 s however the
    # clients' arrivals spread (up to 0.7 s seen)
    decode = served.image
    served.image = lambda data, label, deadline=None: time.sleep(3) or decode(data, label)
    served.rollout_png = lambda data, label, deadline=None: time.sleep(3) or b"\x89PNG"
    extra = 5
    with ThreadPoolExecutor(2 * workers + extra) as pool:
        answers = list(pool.map(lambda i: post(running.url, photo(i), route), range(2 * workers + extra)))
    statuses = [a.status_code for a in answers]
    # `workers` are answered, as many wait and pass their deadline while waiting (504), the rest are refused (503)
    assert (statuses.count(200), statuses.count(504), statuses.count(503)) == (workers, workers, extra), statuses
    assert all("at capacity" in a.json()["error"] for a in answers if a.status_code == 503)
    assert all("no answer within 4 s" in a.json()["error"] for a in answers if a.status_code == 504)
    time.sleep(3.1)  # the given-up threads end; their slots free again
    assert post(running.url, photo(1), route).status_code == 200 and endpoint.waiting == 0


# ------------------------------------------------------------------ hostile clients


@pytest.mark.parametrize("make, fine", [
    (lambda: photo(1, mode="CMYK", fmt="JPEG"), True),
    (lambda: _sixteen_bit(), True),
    (lambda: _animated(), True),
    (lambda: b"GIF89a not really", False),
    (lambda: photo(2)[:60], False),  # cut short
    (lambda: b"", False),
])
def test_odd_images_are_handled_as_predict_does_or_refused_in_one_line(serving, weights, tmp_path, make, fine):
    running = serving(max_wait_ms=0)
    data = make()
    answer = post(running.url, data)
    if fine:
        (tmp_path / "x.bin").write_bytes(data)
        want = predict_images(vitkit.from_pretrained(weights), [tmp_path / "x.bin"], top_k=5)[0]
        assert answer.status_code == 200 and [t["index"] for t in answer.json()["top"]] == [i for i, _, _ in want.top]
    else:
        error = answer.json()["error"]
        assert answer.status_code == 400 and "\n" not in error and error, answer.text


def _sixteen_bit() -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(3).integers(0, 65535, (30, 30), dtype=np.uint16)).save(out, "PNG")
    return out.getvalue()


def _animated() -> bytes:
    frames = [Image.fromarray(np.full((30, 30, 3), v, np.uint8)) for v in (30, 200)]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    return out.getvalue()


def test_a_decompression_bomb_and_an_oversized_body_are_refused_before_decoding(serving):
    running = serving(max_wait_ms=0, max_body_bytes=200_000)
    for side, words in ((10_000, "10000 x 10000 pixels is more than the 40,000,000"),  # Pillow would decode it
                        (20_000, "400,000,000 pixels is more than the 40,000,000")):  # 400 megapixels in ~50 kB
        bomb = io.BytesIO()
        Image.new("1", (side, side)).save(bomb, "PNG")
        answer = post(running.url, bomb.getvalue())
        assert answer.status_code == 400 and words in answer.json()["error"], answer.text
        assert "178956970" not in answer.text  # Pillow's own limit was quoted beside the server's
    big = post(running.url, b"\0" * 300_000)
    assert big.status_code == 413 and "200,000" in big.json()["error"]
    thin = io.BytesIO()  # 1 kB, a million pixels in all, but resized by its shorter side: gigabytes
    Image.new("L", (1_000_000, 1)).save(thin, "PNG")
    for route in ("/predict", "/rollout"):
        answer = post(running.url, thin.getvalue(), path=route)
        assert answer.status_code == 400 and "would be resized to" in answer.json()["error"], answer.text
    assert post(running.url, photo(1)).status_code == 200


def test_slow_and_vanishing_clients_leave_the_server_answering(serving):
    running = serving(max_wait_ms=0, timeout_s=1)
    host, port = running.url.removeprefix("http://").split(":")
    data = photo(1)
    head = (f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: {len(data)}\r\n\r\n"
            ).encode()
    with socket.create_connection((host, int(port))) as slow:  # sends half the body, then nothing
        slow.sendall(head + data[: len(data) // 2])
        slow.settimeout(10)
        reply = slow.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 408") and "did not arrive within 1 s" in reply
    # headers never finished, or no request at all: held for ever (thousands of them and the server answered
    # nobody); a 408 once the timeout has passed, the connection closed
    for sent in (b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b""):
        with socket.create_connection((host, int(port))) as idle:
            idle.sendall(sent)
            idle.settimeout(10)
            reply = idle.recv(4096).decode()
            assert reply.startswith("HTTP/1.1 408") and "headers did not arrive within 1 s" in reply, reply
            assert idle.recv(4096) == b""  # closed
    with socket.create_connection((host, int(port))) as idle:  # kept alive after an answer, then idle: closed in
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # silence (a 408 there could be read as
        idle.settimeout(10)                                            # the answer to the next request)
        first = idle.recv(4096)
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b'{"status":"ok"}'), first
        assert idle.recv(4096) == b""
    with httpx.Client() as kept:  # a kept-alive connection is not cut while it answers requests
        for _ in range(3):
            assert kept.get(running.url + "/healthz").json() == {"status": "ok"}
    for _ in range(3):  # clients that go away mid-upload
        with socket.create_connection((host, int(port))) as gone:
            gone.sendall(head + data[:100])
    assert post(running.url, data).status_code == 200
    assert httpx.get(running.url + "/healthz").json() == {"status": "ok"}
    # the two headers-late 408s are counted as every answer is (no path was read: "other"); the body-late one
    # under its path
    counted = httpx.get(running.url + "/metrics").text
    assert 'vitkit_requests_total{code="408",endpoint="other"} 2' in counted, counted
    assert 'vitkit_requests_total{code="408",endpoint="/predict"} 1' in counted, counted


def test_a_client_that_half_closes_after_its_request_gets_its_answer(serving):
    """A client that shuts its sending side once the whole request is out (netcat, a script's shutdown(SHUT_WR))
    got no answer: uvicorn closed the connection on the end of its input and dropped the one being made. Now
    answered, then closed; a request cut short by the half-close gets a 400 that says so (it got nothing)."""
    running = serving(max_wait_ms=0, timeout_s=5)
    host, port = running.url.removeprefix("http://").split(":")
    data = photo(1)
    head = f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: {len(data)}\r\n\r\n"
    for body, answered in ((data, True), (data[:100], False)):
        with socket.create_connection((host, int(port))) as client:
            client.sendall(head.encode() + body)
            client.shutdown(socket.SHUT_WR)
            client.settimeout(10)
            reply = b""
            while chunk := client.recv(65536):
                reply += chunk
        if answered:
            status, _, rest = reply.partition(b"\r\n")
            assert status == b"HTTP/1.1 200 OK", reply[:300]  # (and closed: the read above ended)
            assert json.loads(rest.partition(b"\r\n\r\n")[2])["top"], reply[:300]
        else:
            status, _, rest = reply.partition(b"\r\n")
            assert status == b"HTTP/1.1 400 Bad Request", reply[:300]
            assert "ended before the bytes its Content-Length promised" in json.loads(
                rest.partition(b"\r\n\r\n")[2])["error"], reply[:300]
    # three whole requests pipelined, then the half-close: each answered (only the first was), then the close
    with socket.create_connection((host, int(port))) as client:
        client.sendall((head.encode() + data) * 3)
        client.shutdown(socket.SHUT_WR)
        client.settimeout(10)
        reply = b""
        while chunk := client.recv(65536):
            reply += chunk
    assert reply.count(b"HTTP/1.1 200 OK") == 3, reply[:300]
    assert post(running.url, data).status_code == 200
    counted = httpx.get(running.url + "/metrics").text
    assert 'vitkit_requests_total{code="400",endpoint="other"} 1' in counted, counted


def test_a_body_refused_or_late_closes_its_connection(serving):
    """After a 413 (from Content-Length, before the body) or a 408 (the body too slow) the connection stayed open:
    uvicorn read the rest of the declared body (8 GB in 6 s) and a client trickling a byte every few seconds held
    it for ever, past the header deadline (300 of them used up a server's files). Both say Connection: close."""
    running = serving(max_wait_ms=0, timeout_s=1, max_body_bytes=1000)
    host, port = running.url.removeprefix("http://").split(":")
    for length, status in ((100_000_000_000, "413"), (500, "408")):
        with socket.create_connection((host, int(port))) as client:
            client.sendall(f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\nx".encode())
            client.settimeout(10)
            reply = b""
            while b"}" not in reply:
                reply += client.recv(4096)
            assert reply.startswith(f"HTTP/1.1 {status}".encode()) and b"connection: close" in reply.lower(), reply
            started = time.monotonic()
            with contextlib.suppress(OSError):  # (a reset, where bytes were still coming, is a close too)
                while client.recv(4096):
                    client.send(b"x")
            assert time.monotonic() - started < 5
    assert post(running.url, photo(1)[:900]).status_code in (200, 400)  # the server answers on


def test_a_client_that_sends_its_whole_body_first_reads_the_413_not_a_reset(serving, monkeypatch):
    """Python's http.client sends the whole body before it reads: closing on the 413 with 30 MB unread reset the
    connection, and the client saw "connection reset by peer" where the answer said why. The server now reads and
    throws away what follows its answer, for a few seconds at most: a client that never stops is closed after it."""
    import http.client

    from vitkit.serve import protocol

    monkeypatch.setattr(protocol, "LINGER_S", 1.0)
    running = serving(max_wait_ms=0, max_body_bytes=1_000_000)
    host, port = running.url.removeprefix("http://").split(":")
    for size in (2_000_000, 30_000_000):
        client = http.client.HTTPConnection(host, int(port), timeout=30)
        client.request("POST", "/predict", body=b"x" * size, headers={"content-type": "image/png"})
        answer = client.getresponse()
        assert answer.status == 413 and answer.getheader("connection") == "close", size
        assert json.loads(answer.read())["error"] == f"the body is {size:,} bytes; this server takes at most 1,000,000"
        client.close()
    def endless(pause):
        """Seconds and bytes a client sending for ever (``pause`` between 64 kB) got out before the server cut it."""
        with socket.create_connection((host, int(port))) as client:
            client.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n")
            started, sent = time.monotonic(), 0
            with contextlib.suppress(OSError):
                while time.monotonic() - started < 8:
                    sent += client.send(b"x" * 65536)
                    time.sleep(pause)
            return time.monotonic() - started, sent

    seconds, sent = endless(pause=0.01)  # a slow one: cut by the time (LINGER_S here 1 s; the socket buffers
    assert seconds < 6 and sent < 20_000_000, (seconds, sent)  # take a few MB more before the client sees the cut)
    seconds, sent = endless(pause=0)  # a fast one: cut by the bytes, 32 MiB at most read and dropped
    assert sent < protocol.LINGER_BYTES + 20_000_000, (seconds, sent)
    monkeypatch.setattr(protocol, "LINGER_CONNECTIONS", 0)  # as many as the server lets linger do already:
    monkeypatch.setattr(protocol, "LINGER_S", 4.0)
    seconds, sent = endless(pause=0.01)  # the next is closed at once, as before lingering
    assert seconds < 2, (seconds, sent)
    assert post(running.url, photo(1)).status_code == 200  # the server answers on


@pytest.fixture
def uvicorn_log():
    """``listen()``: the records uvicorn's error logger passes on from then (after the server starts: its logging
    config replaces the logger's handlers, and pytest's caplog never sees them)."""
    records, handler, logger = [], logging.Handler(), logging.getLogger("uvicorn.error")
    handler.emit = records.append

    def listen():
        logger.addHandler(handler)
        return records

    yield listen
    logger.removeHandler(handler)


def test_a_request_uvicorn_cannot_read_is_answered_in_the_one_error_shape(serving, uvicorn_log):
    """A bad Content-Length or a request line that is none was uvicorn's plain-text "Invalid HTTP request
    received.": JSON now, as every other answer, and the connection closed. uvicorn logged that line for each, and
    answered 400 where h11 says 431 or 501."""
    running = serving(max_wait_ms=0)
    host, port = running.url.removeprefix("http://").split(":")
    logged = uvicorn_log()
    for request in (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
                    b"NOT A REQUEST LINE\r\n\r\n"):
        with socket.create_connection((host, int(port))) as client:
            client.settimeout(10)
            with contextlib.suppress(OSError):  # (the server may close before the whole header is sent)
                client.sendall(request)
            reply = b""
            with contextlib.suppress(OSError):
                while chunk := client.recv(4096):
                    reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head.lower(), reply[:300]
        assert json.loads(body)["error"].startswith("the request could not be read as HTTP/1.1"), body
    assert httpx.get(running.url + "/healthz").json() == {"status": "ok"}
    counted = httpx.get(running.url + "/metrics").text  # counted as every answer is (uvicorn's were not)
    assert 'vitkit_requests_total{code="400",endpoint="other"} 2' in counted, counted
    # uvicorn logged a line for each (a scanner's garbage filled the log): the first is said, with where the rest go
    said = [r.getMessage() for r in logged if r.getMessage().startswith("Invalid HTTP request")]
    assert said == ["Invalid HTTP request received: answered in JSON (400; 431 headers too large; 501 a transfer "
                    "coding it does not read); the next ones are counted in /metrics (vitkit_requests_total, "
                    "endpoint other), not logged"], said
    # headers too large: 431 (uvicorn said 400, and only where h11 saw them still arriving: sent at once they were
    # read), and a transfer coding h11 does not read: 501, as h11 says
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"
    for request, pieces, status in ((big, 1, b"431"), (big, 40, b"431"),
                                    (b"POST /predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 1,
                                     b"501")):
        with socket.create_connection((host, int(port))) as client:
            client.settimeout(10)
            step = -(-len(request) // pieces)
            with contextlib.suppress(OSError):
                for i in range(0, len(request), step):
                    client.sendall(request[i:i + step])
                    time.sleep(0.01 if pieces > 1 else 0)
            reply = b""
            with contextlib.suppress(OSError):
                while chunk := client.recv(4096):
                    reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 " + status) and b"application/json" in head, (pieces, reply[:300])
        assert json.loads(body)["error"], body
    counted = httpx.get(running.url + "/metrics").text
    assert 'vitkit_requests_total{code="431",endpoint="other"} 2' in counted, counted
    assert 'vitkit_requests_total{code="501",endpoint="other"} 1' in counted, counted
    assert httpx.get(running.url + "/healthz", headers={"X-Fine": "a" * 8_000}).json() == {"status": "ok"}


def test_a_drain_waits_for_a_stalled_upload_only_a_few_seconds(serving, monkeypatch):
    """A client that stalled mid-upload held the drain, and the process's exit, for the whole --timeout (30 s by
    default: past Kubernetes' grace period before its SIGKILL); a body still arriving when the drain begins
    has DRAIN_BODY_S more to arrive, then a 503, while a request whose body came is answered."""
    from vitkit.serve import app as serve_app

    monkeypatch.setattr(serve_app, "DRAIN_BODY_S", 1.0)
    running = serving(max_wait_ms=2000, timeout_s=60)
    host, port = running.url.removeprefix("http://").split(":")
    data = photo(1)
    with socket.create_connection((host, int(port))) as stalled, ThreadPoolExecutor(1) as pool:
        stalled.sendall(f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: "
                        f"{len(data)}\r\n\r\n".encode() + data[:100])
        came = pool.submit(post, running.url, data)  # waits for its batch (2 s)
        time.sleep(0.5)
        began = time.monotonic()
        running.server.handle_exit(signal.SIGTERM, None)
        stalled.settimeout(20)
        reply = stalled.recv(4096).decode()
        assert came.result().status_code == 200
    running.thread.join(20)
    assert reply.startswith("HTTP/1.1 503") and "shutting down: the body had not arrived" in reply, reply
    assert not running.thread.is_alive() and time.monotonic() - began < 10


def test_bad_query_values_are_one_line_400s(serving):
    running = serving(max_wait_ms=0)
    # '%C2%B2' is '²' and '%D9%A3' an Arabic-Indic 3: str.isdigit passes both (int() refused the one with a
    # 500 and read the other as 3); 4,301 digits are past what int() reads
    for value in ("0", "-1", "x", "1.5", "%C2%B2", "%D9%A3", "1" * 4301):
        answer = post(running.url, photo(1), f"/predict?top_k={value}")
        assert answer.status_code == 400 and "top_k must be a positive integer" in answer.json()["error"], answer.text
        assert len(answer.json()["error"]) < 120
    assert len(post(running.url, photo(1), "/predict?top_k=" + "9" * 18).json()["top"]) >= 1
    twice = post(running.url, photo(1), "/predict?top_k=1&top_k=3")  # was read as 3, without a word
    assert twice.status_code == 400 and twice.json() == {"error": "top_k is given 2 times: give it once"}
    typo = post(running.url, photo(1), "/predict?topk=3")  # answered five classes, without a word
    assert typo.status_code == 400 and typo.json() == {
        "error": "unknown query parameter 'topk' for /predict (it reads top_k; did you mean top_k?)"}
    import gzip

    zipped = post(running.url, gzip.compress(photo(1)), headers={"content-encoding": "gzip"})  # was "not an image"
    assert zipped.status_code == 415 and zipped.json()["error"].startswith("Content-Encoding 'gzip' is not read")
    shouted = post(running.url, photo(1), "/predict?TOP_K=3")
    assert shouted.status_code == 400 and shouted.json()["error"].endswith("did you mean top_k?)")
    extra = post(running.url, photo(1), "/embed?normalize=1")
    assert extra.status_code == 400 and "unknown query parameter 'normalize' for /embed (it reads none)" in \
        extra.json()["error"]


def _form(parts, boundary=b"BB") -> bytes:
    """A multipart body of (headers, payload) parts."""
    return b"".join(b"--" + boundary + b"\r\n" + head + b"\r\n\r\n" + payload + b"\r\n" for head, payload in parts) \
        + b"--" + boundary + b"--\r\n"


def test_a_form_holds_one_image_and_forms_that_choke_the_parser_are_400s(serving):
    """Several files in one form were answered for the first alone; 300,000 empty fields held the event loop
    (and every other client) for a minute; a form nested 3,000 deep was a 500 and a RecursionError."""
    running = serving(max_wait_ms=0)
    disposition = b'Content-Disposition: form-data; name="%s"; filename="%s.png"\r\nContent-Type: image/png'
    one = post(running.url, _form([(b'Content-Disposition: form-data; name="note"', b"hello"),
                                   (disposition % (b"file", b"a"), photo(1))]),
               headers={"content-type": "multipart/form-data; boundary=BB"})
    assert one.status_code == 200 and one.json()["image"] == "a.png"  # a field beside the file: fine
    bmp = io.BytesIO()  # an uncompressed image whose every pixel holds the bytes of a line starting with "--"
    Image.fromarray(np.tile(np.array([10, 45, 45], np.uint8), (40, 40, 1))).save(bmp, "BMP")
    plain = httpx.post(running.url + "/predict", files={"file": ("a.bmp", bmp.getvalue(), "image/bmp")}, timeout=60)
    assert plain.status_code == 200, plain.text
    two = httpx.post(running.url + "/predict", files=[("file", ("a.png", photo(1), "image/png")),
                                                      ("file", ("b.png", photo(2), "image/png"))], timeout=60)
    assert two.status_code == 400 and two.json() == {"error": "the form has 2 files: send one image per request"}
    field = httpx.post(running.url + "/predict", files={"file": ("a.png", photo(1), "image/png")},
                       data={"top_k": "1"}, timeout=60)  # was dropped without a word (every class came back)
    assert field.status_code == 400 and "top_k is read from the query" in field.json()["error"]
    fields = _form([(b'Content-Disposition: form-data; name="f%d"' % i, b"x") for i in range(100_000)])
    many = post(running.url, fields, headers={"content-type": "multipart/form-data; boundary=BB"})
    assert many.status_code == 400 and "more than 64 parts" in many.json()["error"], many.text
    inner = _form([(disposition % (b"file", b"a"), photo(1))], b"CC")
    nested = _form([(b'Content-Disposition: form-data; name="file"\r\nContent-Type: multipart/mixed; boundary=CC',
                     inner[:-2])])
    answer = post(running.url, nested, headers={"content-type": "multipart/form-data; boundary=BB"})
    assert answer.status_code == 400 and "nests another form" in answer.json()["error"], answer.text
    deep = b"x"
    for level in range(3000, 0, -1):
        deep = b"--b%d\r\nContent-Type: multipart/mixed; boundary=b%d\r\n\r\n%s\r\n--b%d--" % (level, level + 1, deep,
                                                                                              level)
    answer = post(running.url, deep, headers={"content-type": "multipart/form-data; boundary=b1"})
    assert answer.status_code == 400 and answer.json()["error"], answer.text
    # a part's headers of 300 kB held a worker thread for a minute (the parser reads them again per parameter)
    started = time.monotonic()
    heavy = post(running.url, _form([(b'Content-Disposition: form-data; name="file"' + b"; a=b" * 60_000, photo(1))]),
                 headers={"content-type": "multipart/form-data; boundary=BB"})
    assert heavy.status_code == 400 and heavy.json() == {"error": "a part of the form has more than 8 KiB of headers"}
    assert time.monotonic() - started < 5
    epilogue = _form([(disposition % (b"file", b"a"), photo(1))]) + b"x" * 20_000  # after the close: not a part
    assert post(running.url, epilogue, headers={"content-type": "multipart/form-data; boundary=BB"}).status_code == 200
    torn = _form([(disposition % (b"file", b"a"), photo(1))])[:-len(b"\r\n--BB--\r\n")]  # no closing boundary
    answer = post(running.url, torn, headers={"content-type": "multipart/form-data; boundary=BB"})  # was a 200
    assert answer.status_code == 400 and "a torn form" in answer.json()["error"], answer.text
    assert post(running.url, photo(1)).status_code == 200


def test_a_form_with_bare_lf_line_endings_keeps_a_file_that_ends_in_cr(serving):
    """Before a delimiter the parser strips CRLF or a bare LF alike: in a form whose lines end in LF alone, a file
    ending in the byte 13 (here an uncompressed image of it) lost that byte, and the image could not be read."""
    running = serving(max_wait_ms=0)
    bmp = io.BytesIO()
    Image.fromarray(np.full((40, 40, 3), 13, np.uint8)).save(bmp, "BMP")
    data = bmp.getvalue()
    assert data.endswith(b"\r")
    want = post(running.url, data).json()
    for eol in (b"\n", b"\r\n"):
        form = (b"--BB" + eol + b'Content-Disposition: form-data; name="file"; filename="a.bmp"' + eol + eol + data
                + eol + b"--BB--" + eol)
        got = post(running.url, form, headers={"content-type": "multipart/form-data; boundary=BB"})
        assert got.status_code == 200 and got.json()["top"] == want["top"], (eol, got.text)


def test_a_forms_parts_are_read_at_their_delimiters_only():
    """The header limit split the form at the boundary's bytes anywhere (a payload holding them, then 8 KiB with
    no blank line, was a 400), and the bare-LF fix read the whole body (a field before the file whose value was
    the file's bytes and a CR gave the file that CR)."""
    from vitkit.serve.app import HttpError, image_of

    payload = photo(1) + b"--BOUND" + bytes(range(256)).replace(b"\n", b"") * 40
    body = (b'--BOUND\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n\r\n' + payload
            + b"\r\n--BOUND--\r\n")
    assert image_of(body, "multipart/form-data; boundary=BOUND")[0] == payload
    body = (b'--B\nContent-Disposition: form-data; name="note"\n\nabc\r\n--B\nContent-Disposition: form-data; '
            b'name="file"; filename="f"\n\nabc\n--B--\n')
    assert image_of(body, "multipart/form-data; boundary=B")[0] == b"abc"
    dense = b"\n" * 2_000_000 + photo(1)  # a file of line feeds (the stdlib parser spent 6 s on 19 MB of them)
    body = b'--B\r\nContent-Disposition: form-data; name="file"; filename="d.png"\r\n\r\n' + dense + b"\r\n--B--\r\n"
    assert image_of(body, "multipart/form-data; boundary=B") == (dense, "d.png")
    body = (b'--B\r\nContent-Disposition: form-data; name="file"\r\nContent-Transfer-Encoding: base64\r\n\r\n'
            + base64.encodebytes(photo(1)) + b"\r\n--B--\r\n")  # an old client's encoding: decoded, as before
    assert image_of(body, "multipart/form-data; boundary=B")[0] == photo(1)
    body = (b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\nContent-Transfer-Encoding: '
            b"base64\r\n\r\n!!!@@@###\r\n--B--\r\n")  # no byte of the alphabet: was "the request has no image bytes"
    with pytest.raises(HttpError, match="the file's base64 transfer encoding could not be decoded"):
        image_of(body, "multipart/form-data; boundary=B")
    # the delimiter line as RFC 2046 has it (the delimiter at a line's start, then "--" or blanks only): a payload
    # line starting with the boundary's bytes stays payload, a preamble mentioning them decides no line ending
    tricky = b"DA\n--BTA\n--B--TA\r\n" + b"x--B" * 70  # (70 times: the old count of the bytes refused it)
    for form in (b"--B\r\n", b"a preamble --B\r\n--B\r\n"):
        body = form + b'Content-Disposition: form-data; name="file"\r\n\r\n' + tricky + b"\r\n--B--\r\n"
        assert image_of(body, "multipart/form-data; boundary=B")[0] == tricky, form
    body = b'--B\r\nContent-Disposition: form-data; name="file"\n\r\nDATA\r\n--B--\r\n'  # mixed line ends
    assert image_of(body, "multipart/form-data; boundary=B")[0] == b"DATA"
    body = b'--B\r\nContent-Disposition: form-data; name="file"\r\nContent-Transfer-Encoding: x-uuencode\r\n\r\n' \
        b"begin 644 a\r\n--B--\r\n"
    with pytest.raises(HttpError, match="transfer encoding x-uuencode is not read"):
        image_of(body, "multipart/form-data; boundary=B")
    # a boundary no header byte spells (a raw \xff as the server reads headers; RFC 2231's encoded form) was a 500
    for ctype in ("multipart/form-data; boundary=\xff", "multipart/form-data; boundary*=utf-8''%E2%98%83"):
        with pytest.raises(HttpError) as refused:
            image_of(body, ctype)
        assert refused.value.status == 400 and "boundary is not ASCII" in str(refused.value), ctype


def test_large_images_are_decoded_within_a_pixel_budget(monkeypatch):
    """A 40M-pixel RGBA PNG is 170 kB of upload and ~1.7 GB while decoded; eight at once took the server to 5.2 GB
    (up to 32 decode threads). Images are decoded while their pixels fit the budget (the largest image taken):
    two large ones wait for each other, a small one passes beside, and every answer is the same as alone."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from vitkit.serve import model as served_module
    from vitkit.serve.model import ServedModel

    served = ServedModel(vitkit.create_model("vit_fmnist"), "torch", max_pixels=20_000)
    real, inside, peak, lock = served_module.decode_image, [0], [0], threading.Lock()

    def slow_decode(data, channels, name):
        with Image.open(io.BytesIO(data)) as im:
            pixels = im.size[0] * im.size[1]
        with lock:
            inside[0] += pixels
            peak[0] = max(peak[0], inside[0])
        time.sleep(0.2)
        try:
            return real(data, channels, name)
        finally:
            with lock:
                inside[0] -= pixels

    def png(w, h, seed):
        out = io.BytesIO()
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 4), dtype=np.uint8), "RGBA").save(out,
                                                                                                            "PNG")
        return out.getvalue()

    uploads = [png(150, 100, i) for i in range(4)] + [png(40, 40, 9)]  # 15,000 pixels each, and 1,600
    alone = [served.image(u) for u in uploads]
    monkeypatch.setattr(served_module, "decode_image", slow_decode)
    with ThreadPoolExecutor(5) as pool:
        together = list(pool.map(served.image, uploads))
    assert 15_000 + 1_600 <= peak[0] <= 20_000, peak  # one large at a time, the small one beside it
    assert all(torch.equal(a, b) for a, b in zip(alone, together)) and served.decoding.used == 0
    with served.decoding.hold(20_000):  # a wait past the request's deadline gives up (its answer was a 504)
        with pytest.raises(TimeoutError):
            served.image(uploads[-1], "late", deadline=time.monotonic() + 0.05)
    assert served.decoding.used == 0 and not served.decoding._waiting


def test_a_model_that_overflows_is_a_json_500_not_a_broken_answer(serving, weights):
    model = vitkit.from_pretrained(weights)
    with torch.no_grad():
        model.head.weight[:2] = 1e38  # inf logits: NaN probabilities, which JSON cannot carry
    running = serving(model, max_wait_ms=0)
    answer = post(running.url, photo(1))
    assert answer.status_code == 500 and "not finite (NaN or inf)" in answer.json()["error"], answer.text


def test_unknown_paths_and_methods_answer_in_the_one_error_shape_and_probes_take_head(serving):
    running = serving(max_wait_ms=0)
    missing = httpx.get(running.url + "/nothing")
    assert missing.status_code == 404 and missing.json() == {"error": "Not Found"}
    for path in ("/predict/", "/predict%2f"):  # a 307 with an empty body, to the Host header's name (any host)
        slash = httpx.post(running.url + path, content=photo(1), headers={"host": "evil.example.com"})
        assert slash.status_code == 404 and slash.json() == {"error": "Not Found"}, path
    wrong = httpx.get(running.url + "/predict")
    assert wrong.status_code == 405 and wrong.json() == {"error": "Method Not Allowed"}
    assert "POST" in wrong.headers["allow"]
    for probe in ("/healthz", "/readyz", "/info", "/metrics", "/", "/example.png"):  # (the last four were 405s)
        head = httpx.head(running.url + probe)
        assert head.status_code == 200 and head.content == b"", probe


@pytest.mark.parametrize("key", ["kéy", " k", "k\tk"])
def test_an_api_key_no_client_can_send_is_one_line(serving, key, monkeypatch, capsys, tmp_path):
    with pytest.raises(ValueError, match="--api-key must be printable ASCII"):
        serving(api_key=key)
    from vitkit.cli import main

    monkeypatch.setenv("VITKIT_API_KEY", key)  # said by the variable's name, not a flag that was not given
    assert main(["serve", str(tmp_path / "absent"), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "vitkit serve: error: VITKIT_API_KEY must be printable ASCII without surrounding spaces (HTTP " \
                  "headers carry ASCII)", err


def test_the_api_key_guards_every_route_but_the_probes_and_the_page(serving):
    running = serving(max_wait_ms=0, api_key="s3cret")
    assert post(running.url, photo(1)).status_code == 401
    assert post(running.url, photo(1), headers={"X-API-Key": "wrong"}).status_code == 401
    assert post(running.url, photo(1), headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert post(running.url, photo(1), headers={"X-API-Key": "s3cret"}).status_code == 200
    both = {"X-API-Key": "s3cret", "Authorization": "Bearer s3cret"}
    assert post(running.url, photo(1), headers=both).status_code == 200
    for wrong in ({"X-API-Key": "wrong"}, {"Authorization": "Bearer wrong"}):  # (it said "missing or wrong")
        mixed = post(running.url, photo(1), headers={**both, **wrong})
        assert mixed.status_code == 401 and mixed.json()["error"] == "X-API-Key and Authorization: Bearer carry " \
            "different keys: send the API key in one of them", wrong
    for twice in ([("Authorization", "Basic dTpw"), ("Authorization", "Bearer s3cret")],
                  [("X-API-Key", "s3cret"), ("X-API-Key", "s3cret")]):  # (only the first was read)
        repeated = post(running.url, photo(1), headers=twice)
        assert repeated.status_code == 401 and repeated.json()["error"] == \
            f"2 {twice[0][0]} headers were sent: send one", twice
    assert httpx.get(running.url + "/metrics").status_code == 401
    for open_path in ("/healthz", "/readyz", "/"):
        assert httpx.get(running.url + open_path).status_code == 200
    icon = httpx.get(running.url + "/favicon.ico")  # a browser asks for it on every page: it was a 404
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(icon.content)).size == (32, 32) and httpx.head(running.url + "/favicon.ico").is_success
    # the API's description opens without the key (a browser cannot send one to /docs: 401), and it declares the
    # key, so the docs' Authorize button sends it with every call
    schema = httpx.get(running.url + "/openapi.json").json()
    assert schema["components"]["securitySchemes"]["apiKey"] == {"type": "apiKey", "in": "header", "name": "X-API-Key"}
    assert schema["paths"]["/predict"]["post"]["security"] == [{"apiKey": []}]
    assert "security" not in schema["paths"]["/healthz"]["get"]
    assert httpx.get(running.url + "/docs").status_code == 200
    with pytest.raises(ValueError, match="reachable from other machines: give an API key"):
        make_server(ServedModel(vitkit.create_model("vit_fmnist"), "torch"), ServeOptions(), "0.0.0.0", 0)


# ------------------------------------------------------------------ the command line and SIGTERM


def _processes_naming(text):
    """PIDs whose command line contains ``text`` (Linux /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if text in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(cmdline.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads processes from /proc")
def test_sigterm_during_the_export_apart_ends_its_processes_and_leaves_no_folder(weights, tmp_path):
    """The server exports weights on the fly in a child process (its own group): SIGTERM while the child works
    stops the server as a signal, ends the child, and leaves nothing in the temporary folder."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = forks.popen("serve", weights, "--port", "0", "--runtime", "onnxruntime", "--quantize", "int8",
                       stderr=subprocess.PIPE, env=dict(os.environ, TMPDIR=str(scratch)))
    try:
        deadline = time.time() + 120
        while not (children := _processes_naming(f"vitkit.deploy.apart {scratch}")):
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "no child"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143
        assert "stopped by SIGTERM" in proc.stderr.read()
        deadline = time.time() + 10  # (a loaded machine takes a moment to end the child's group)
        while any(Path(f"/proc/{pid}").exists() for pid in children) and time.time() < deadline:
            time.sleep(0.05)
        assert not any(Path(f"/proc/{pid}").exists() for pid in children)
        assert list(scratch.iterdir()) == []
    finally:
        proc.kill()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_answers_the_requests_in_flight_then_stops(weights, stop):
    """With --json, stdout's one line says where the server listens (with --port 0 the only way to learn it).
    One Ctrl-C drains as SIGTERM does (it said "stopped at once (a second Ctrl-C)": uvicorn raises the signal
    it caught again once it has drained, and that was taken for a second one)."""
    proc = forks.popen("serve", weights, "--port", "0", "--json", "--max-wait-ms", "1500", "--max-batch", "64",
                       stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        line = proc.stderr.readline()
        url = re.search(r"on (http://127\.0\.0\.1:\d+)", line).group(1)
        where = json.loads(proc.stdout.readline())
        assert where["url"] == url == f"http://127.0.0.1:{where['port']}" and where["weights"] == str(weights)
        assert where["runtime"] == "torch" and where["precision"] == "fp32"  # "runtime" was "fp32", /readyz's "torch"
        while httpx.get(url + "/readyz").status_code != 200:
            time.sleep(0.05)
        with ThreadPoolExecutor(3) as pool:
            flying = [pool.submit(post, url, photo(i)) for i in range(3)]
            time.sleep(0.5)  # the requests wait for their batch (1.5 s)
            proc.send_signal(stop)
            answers = [f.result() for f in flying]
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert proc.wait(30) == 0
        err = proc.stderr.read()
        assert "stopped: the requests in flight were answered" in err and "at once" not in err, err
        assert proc.stdout.read() == ""
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/healthz")
    finally:
        proc.kill()


def test_a_second_ctrl_c_stops_at_once_in_one_line(weights):
    """A second Ctrl-C cuts the requests in flight off and says so; the tasks uvicorn cancels then (its
    lifespan's, the requests') printed CancelledError tracebacks under "ERROR:" before that line."""
    proc = forks.popen("serve", weights, "--port", "0", stderr=subprocess.PIPE,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        url = re.search(r"on (http://127\.0\.0\.1:(\d+))", proc.stderr.readline())
        while httpx.get(url.group(1) + "/readyz").status_code != 200:
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", int(url.group(2)))) as client:  # a body still coming: the
            client.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"  # drain waits
                           b"Content-Length: 1000\r\n\r\n" + image_bytes(0)[:100])
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
            assert proc.poll() is None  # draining: the request is still in flight
            proc.send_signal(signal.SIGINT)
            code = proc.wait(30)
            client.settimeout(10)
            reply = b""
            while chunk := client.recv(65536):
                reply += chunk
        err = proc.stderr.read()
        assert code == 130 and err.strip().splitlines() == [
            "vitkit serve: stopped at once (a second Ctrl-C): requests in flight were cut off"], err
        # the request cut off is told so, in the one error shape (it was uvicorn's plain-text 500)
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"connection: close" in head.lower(), reply
        assert "stopped at once" in json.loads(body.split(b"\r\n")[1] if b"chunked" in head else body)["error"]
    finally:
        proc.kill()


@pytest.mark.parametrize("at_once", [True, False])
def test_a_request_cut_off_is_told_why_in_json(at_once):
    """A request still running when uvicorn cancels it (a second Ctrl-C, or a drain past its time: --timeout + 1 s)
    got uvicorn's plain-text 500; it gets a JSON 503 that says which, with Connection: close, and is counted."""
    from types import SimpleNamespace

    from vitkit.serve.app import Guard
    from vitkit.serve.metrics import Metrics

    endpoint = SimpleNamespace(options=SimpleNamespace(api_key=None), metrics=Metrics(),
                               state={"draining": False, "stopped_at_once": at_once})
    sent, started = [], asyncio.Event()

    async def running_for_ever(scope, receive, send):
        started.set()
        await asyncio.Event().wait()

    async def scenario():
        async def send(message):
            sent.append(message)

        request = asyncio.ensure_future(Guard(running_for_ever, endpoint)(
            {"type": "http", "path": "/predict", "method": "POST", "headers": []}, None, send))
        await started.wait()
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request

    asyncio.run(scenario())
    head, body = sent[0], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert head["status"] == 503 and (b"connection", b"close") in [(k.lower(), v) for k, v in head["headers"]]
    why = "stopped at once (a second Ctrl-C)" if at_once else "its shutdown's time ran out"
    assert why in body["error"] and "send it again once the server is back" in body["error"], body
    assert endpoint.metrics.value("vitkit_requests_total", endpoint="/predict", code="503") == 1


def test_a_sigterm_as_soon_as_the_server_says_it_is_ready_drains_it(weights):
    """A SIGTERM between the ready line and uvicorn's own handlers was raised as an exception in
    asyncio's start ("coroutine ... was never awaited", exit 143, nothing said). Sent from the ready
    callback itself, with the command line's handler in place: the server starts, drains, says so."""
    import vitkit.cli as cli_module
    import vitkit.serve.server as server_module

    said, previous = [], signal.signal(signal.SIGTERM, cli_module._on_sigterm)
    try:
        server_module.serve(str(weights), port=0, say=said.append,
                            ready=lambda where: os.kill(os.getpid(), signal.SIGTERM))
    except cli_module.Terminated:  # a KeyboardInterrupt: uncaught, it would end the whole test session
        pytest.fail(f"the SIGTERM was raised out of serve() rather than draining the server; said {said}")
    try:
        assert signal.getsignal(signal.SIGTERM) is cli_module._on_sigterm  # the command line's handler is back
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert said[-1] == "stopped: the requests in flight were answered" and said[-2].startswith("serving ")


def test_what_lives_as_long_as_the_server_is_frozen_out_of_the_collector(weights, monkeypatch):
    """`vitkit serve` freezes the objects it loaded (model, app, libraries) before serving: the
    collector's full passes then skip them (bench_serve at 32 clients on OpenVINO int8: p99 392-403
    ms against 606-638 without)."""
    import gc

    import vitkit.serve.server as server_module

    seen = {}

    class Recorder:
        def run(self, sockets):
            seen["frozen"] = gc.get_freeze_count()

    def fake_make_server(served, options, host, port, title, sock, host_checked=False):
        seen["host_checked"] = host_checked  # serve checked --host before the weights: not looked up twice
        return Recorder(), sock, f"http://{host}:{sock.getsockname()[1]}"

    monkeypatch.setattr(server_module, "make_server", fake_make_server)
    gc.unfreeze()
    try:
        server_module.serve(str(weights), port=0, say=lambda line: None)
    finally:
        gc.unfreeze()  # the test process goes on collecting as before
    assert seen["frozen"] > 10_000 and seen["host_checked"]  # torch's and the app's objects, not a handful


class BatchSizes(torch.nn.Module):
    """A model that notes each batch size it is given, around the real one."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config, self.sizes = model, model.config, []

    def forward(self, x):
        self.sizes.append(len(x))
        return self.model(x)


@pytest.mark.parametrize("runtime, sizes", [("openvino", [1, 2, 3, 4, 5, 6]), ("onnxruntime", [1, 6]),
                                            ("torch", [])])
def test_a_server_runs_the_batch_sizes_its_runtime_keeps_state_for_before_the_first_request(weights, runtime,
                                                                                                sizes):
    """OpenVINO keeps kernels and memory for each input shape from its first use on (ViT-S/16 int8:
    637 -> 1,182 MiB over batch sizes 1 to 32), so a server met a rare batch size late and grew late
    (864 -> 1,168 MiB over 48,000 requests): every size the batcher can form runs once first, on
    blank images of the model's own input; ONNX Runtime's arenas grow to the largest batch once, and
    to one image once (a lone image runs on a session of its own)."""
    model = BatchSizes(vitkit.from_pretrained(weights))
    served = ServedModel(model, runtime, max_batch=6)
    assert served.warm(progress=False) == len(sizes) and model.sizes == sizes
    assert ServedModel(model, runtime).warm(progress=False) == 0  # no largest batch: nothing to ready


def test_past_32_sizes_openvino_is_given_padded_batches_and_each_answer_is_its_own(weights):
    """With --max-batch 64, OpenVINO would keep state for 64 shapes (ever larger ones): batches are
    padded with blank images to even sizes, 32 shapes at most, and the padding never answers."""
    model = BatchSizes(vitkit.from_pretrained(weights))
    served = ServedModel(model, "openvino", max_batch=64)
    assert served.warm(progress=False) == 32 and model.sizes == list(range(2, 65, 2))
    images = [served.image(photo(i)) for i in range(3)]
    model.sizes.clear()
    padded = served.probabilities(images)
    assert model.sizes == [4] and len(padded) == 3
    with torch.inference_mode():
        alone = model.model(torch.stack(images)).softmax(-1)
    torch.testing.assert_close(torch.stack(padded), alone, atol=1e-5, rtol=0)
    assert [vitkit.serve.model.padded_size("openvino", n, 100) for n in (1, 4, 5, 97, 100)] == [4, 4, 8, 100, 100]
    assert [vitkit.serve.model.padded_size(r, 5, 100) for r in ("onnxruntime", "torch")] == [5, 5]
    assert vitkit.serve.model.padded_size("openvino", 5, 32) == 5


def test_while_the_model_loads_the_probes_answer_and_requests_are_told_to_come_back(weights, monkeypatch):
    """The socket listens before the weights are read; a client waited in the backlog, told nothing, for as long as
    the load took (a liveness probe with a timeout saw a dead server, and restarted it mid-load)."""
    import vitkit.serve.server as server_module

    release, ready, seen = threading.Event(), threading.Event(), {}
    load, open_socket, make = server_module.load_served, server_module.open_socket, server_module.make_server

    def slow_load(*args, **kw):
        assert release.wait(60)
        return load(*args, **kw)

    def recording(fn, key):
        def call(*args, **kw):
            seen[key] = fn(*args, **kw)
            return seen[key]
        return call

    monkeypatch.setattr(server_module, "load_served", slow_load)
    monkeypatch.setattr(server_module, "open_socket", recording(open_socket, "sock"))
    monkeypatch.setattr(server_module, "make_server", recording(make, "made"))
    thread = threading.Thread(target=server_module.serve, args=(str(weights),), daemon=True,
                              kwargs=dict(port=0, say=lambda line: None, ready=lambda where: ready.set()))
    thread.start()
    try:
        deadline = time.time() + 30
        while "sock" not in seen:
            assert time.time() < deadline, "serve() did not open its socket"
            time.sleep(0.01)
        url = f"http://127.0.0.1:{seen['sock'].getsockname()[1]}"
        live, unready = httpx.get(url + "/healthz", timeout=5), httpx.get(url + "/readyz", timeout=5)
        assert (live.status_code, live.json()) == (200, {"status": "loading"})
        assert unready.status_code == 503 and unready.json()["loading"] is True
        assert httpx.head(url + "/healthz", timeout=5).content == b""
        for body in (photo(1), b"x" * 3_000_000):  # a large body unread is not a reset connection
            early = post(url, body)
            assert early.status_code == 503 and early.headers["retry-after"] == "5"
            assert early.json() == {"error": "the model is loading: try again shortly"}
        assert not ready.is_set()
        release.set()
        assert ready.wait(60)
        assert httpx.get(url + "/readyz", timeout=5).json()["ready"] is True
        assert post(url, photo(1)).status_code == 200
    finally:
        release.set()
        if "made" in seen:
            seen["made"][0].should_exit = True
        thread.join(30)
    assert not thread.is_alive()


def test_serve_warms_every_batch_size_before_it_listens(weights, monkeypatch):
    import vitkit.serve.server as server_module

    order = []
    monkeypatch.setattr(ServedModel, "warm", lambda self, progress=True: order.append(("warm", self.max_batch)))

    def fake_make_server(served, options, host, port, title, sock, host_checked=False):
        order.append(("server", options.max_batch))
        return type("Recorder", (), {"run": lambda self, sockets: None})(), sock, "http://127.0.0.1:1"

    monkeypatch.setattr(server_module, "make_server", fake_make_server)
    server_module.serve(str(weights), port=0, options=ServeOptions(max_batch=7), say=lambda line: None)
    assert order == [("warm", 7), ("server", 7)]


@pytest.mark.parametrize("args, words", [
    (["--host", "0.0.0.0"], "reachable from other machines: give an API key"),
    # (were all "reachable from other machines: give an API key", and with a key "cannot listen")
    (["--host", "999.1.1.1"], "--host 999.1.1.1 cannot be resolved to an address"),
    (["--host", "127.0.0.1:80"], "--host 127.0.0.1:80: give the port with --port"),
    (["--host", "[::1]:8000"], "--host [::1]:8000: give the address without brackets (::1), and a port with"),
    (["--max-batch", "0"], "--max-batch must be >= 1"),
    (["--max-batch", "100000"], "--max-batch must be at most 1,024 (the server runs its largest batch once"),
    (["--max-wait-ms", "-1"], "--max-wait-ms must be between 0 and 10000"),
    (["--timeout", "0"], "--timeout must be more than 0 and at most 3600 seconds, not 0.0"),
    (["--max-body-mb", "0"], "--max-body-mb must be positive"),
    (["--max-body-mb", "0.0000001"], "not 1e-07 (less than one byte)"),  # was said as --max-body-bytes, no flag
    (["--max-body-mb", "nan"], "--max-body-mb must be positive and at most 1,048,576, not nan"),
    (["--max-body-mb", "inf"], "--max-body-mb must be positive and at most 1,048,576, not inf"),
    (["--port", "70000"], "--port must be between 0 and 65535"),
    (["--threads", "100000"], "--threads must be at most the"),  # torch's set_num_threads crashed (SIGSEGV)
    (["--ray", "--img-size", "32", "--labels", "a"], "--img-size, --labels are not passed to Ray's replicas"),
])
def test_bad_flags_are_one_line_before_the_weights_are_read(args, words, tmp_path, capsys):
    from vitkit.cli import main

    assert main(["serve", str(tmp_path / "absent"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and err[0].startswith("vitkit serve: error: "), err


def test_a_port_in_use_is_one_line(weights, capsys):
    from vitkit.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", str(weights), "--port", str(taken.getsockname()[1])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("vitkit serve: error: cannot listen on 127.0.0.1:") and "pick another --port" in \
        err[-1], err  # (it began "[Errno 98] ")


# ------------------------------------------------------------------ the page, in a real browser


@pytest.mark.slow
def test_the_page_classifies_the_example_image_in_headless_chromium(serving, tmp_path):
    running = serving(max_wait_ms=0)
    example = httpx.get(running.url + "/example.png").content
    want = post(running.url, example).json()["top"][0]["label"]
    dom = run_chromium(tmp_path, "--virtual-time-budget=15000", "--dump-dom", running.url + "/?example=1")
    found = re.search(r'data-top-label="([^"]*)"', dom)
    assert found, "the page never showed an answer"
    assert found.group(1) == want
    assert json.loads(httpx.get(running.url + "/info").text)["labels"] == LABELS


@pytest.mark.slow
def test_the_api_docs_render_from_the_server_alone_in_headless_chromium(serving, tmp_path):
    """FastAPI's /docs and /redoc load Swagger UI and ReDoc from a CDN: blank on a machine without
    internet (this one has none). The server serves their files itself; the browser lists the routes."""
    running = serving()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the schema is built without a warning (HEAD's probes had one each)
        operations = httpx.get(running.url + "/openapi.json").json()["paths"]
    assert list(operations["/healthz"]) == ["get"]
    for page in ("/docs", "/redoc"):
        html = httpx.get(running.url + page).text
        assert "/docs-assets/" in html and "https://" not in html, html
    assets = {name: httpx.get(f"{running.url}/docs-assets/{name}") for name in
              ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")}
    assert all(r.status_code == 200 and len(r.content) > 1000 for r in assets.values())
    assert assets["swagger-ui-bundle.js"].headers["content-type"].startswith("text/javascript")
    missing = httpx.get(running.url + "/docs-assets/..%2Fcore.py")
    assert missing.status_code == 404 and missing.json() == {"error": "Not Found"}
    dom = run_chromium(tmp_path, "--virtual-time-budget=15000", "--dump-dom", running.url + "/docs")
    listed = set(re.findall(r'data-path="(/[a-z]+)"', dom))
    assert {"/predict", "/embed", "/rollout", "/healthz", "/info"} <= listed, dom[-2000:]


@pytest.mark.slow
def test_the_page_of_a_server_with_a_key_asks_for_it_then_classifies(serving, tmp_path):
    """/info needs the key too: the page hid its key field behind the description it could not read, so
    every drop got 401 with no way to give the key."""
    pytest.importorskip("websockets")
    from conftest import DevTools

    running = serving(max_wait_ms=0, api_key="s3cret")
    upload = tmp_path / "garment.png"
    upload.write_bytes(photo(7))
    want = post(running.url, upload.read_bytes(), headers={"X-API-Key": "s3cret"}).json()["top"][0]["label"]
    browser = DevTools(tmp_path, running.url + "/")
    try:
        assert "asks for an API key" in browser.wait_for("(() => { const a = document.getElementById('about')"
                                                         ".textContent; return a.includes('API key') && a; })()")
        assert browser.evaluate("document.getElementById('keyrow').hidden") is False
        browser.evaluate("(() => { const k = document.getElementById('key'); k.value = 's3cret';"
                         " k.dispatchEvent(new Event('change')); })()")
        browser.wait_for("document.getElementById('about').textContent.includes(' classes')")
        browser.choose_file("#file", upload)
        assert browser.wait_for("document.documentElement.getAttribute('data-top-label')") == want
    finally:
        browser.close()


@pytest.mark.slow
def test_a_file_chosen_on_the_page_shows_its_top_label_and_rollout_in_headless_chromium(serving, tmp_path):
    """As a person does it: the page loads, a file is chosen in its file input, and the top label the
    endpoint gives for those bytes appears, with the attention rollout drawn over the image."""
    pytest.importorskip("websockets")
    from conftest import DevTools

    running = serving(max_wait_ms=0)
    upload = tmp_path / "garment.jpg"
    upload.write_bytes(photo(7, (64, 48), fmt="JPEG"))
    want = post(running.url, upload.read_bytes()).json()["top"][0]["label"]
    browser = DevTools(tmp_path, running.url + "/")
    try:
        browser.wait_for("document.getElementById('about').textContent.includes(' classes')")  # /info read
        assert browser.evaluate("document.documentElement.getAttribute('data-top-label')") is None
        browser.choose_file("#file", upload)
        assert browser.wait_for("document.documentElement.getAttribute('data-top-label')") == want
        rows = browser.evaluate("[...document.querySelectorAll('#top tr')].map(r => r.cells[0].textContent)")
        assert rows[0] == want and len(rows) == min(5, len(LABELS))
        width = browser.wait_for("(() => { const r = document.getElementById('rollout');"
                                 " return !r.hidden && r.complete && r.naturalWidth; })()")
        assert width > 0
    finally:
        browser.close()
