"""``vitkit serve --ray``: the same app in replicas on Ray Serve. One real deployment as a process on a
local Ray instance (its answers are ``vitkit predict``'s, Ray's status shows two replicas running,
SIGTERM answers what is in flight and leaves no Ray process behind), and the plan, the flags and a
replica's failure checked without Ray.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import SERVED_LABELS, image_bytes, save_served_classifier

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

import vitkit  # noqa: E402
from vitkit.evaluate import predict_images  # noqa: E402
from vitkit.serve import ServeOptions  # noqa: E402
from vitkit.serve.ray_app import REPLICA_ERROR, RayPlan, _replica_error, app_builder, deployment_options  # noqa: E402

pytestmark = pytest.mark.xdist_group("serve")

LABELS = SERVED_LABELS
photo = image_bytes


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return save_served_classifier(tmp_path_factory.mktemp("serve_ray") / "model")


# ------------------------------------------------------------------ without Ray


def test_the_plan_becomes_fixed_or_autoscaled_replicas_that_take_whole_batches():
    options = ServeOptions(max_batch=8, max_queue=50, timeout_s=10)
    fixed = deployment_options(RayPlan(replicas=3, cpus=2), options)
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["max_ongoing_requests"] == 16 and fixed["max_queued_requests"] == 50
    assert fixed["ray_actor_options"] == {"num_cpus": 2} and fixed["graceful_shutdown_timeout_s"] == 11
    scaled = deployment_options(RayPlan(replicas=2, max_replicas=5), options)
    assert "num_replicas" not in scaled
    assert scaled["autoscaling_config"] == {"min_replicas": 2, "initial_replicas": 2, "max_replicas": 5,
                                            "target_ongoing_requests": 8}
    assert RayPlan(replicas=0, max_replicas=None, cpus=0).problems() == ["--replicas must be >= 1, not 0",
                                                                          "--threads must be >= 1, not 0"]


@pytest.mark.parametrize("args, words", [
    (["--replicas", "3"], "--replicas needs --ray"),
    (["--max-replicas", "3", "--ray-address", "auto"], "--max-replicas, --ray-address need --ray"),
    (["--ray", "--replicas", "0"], "--replicas must be >= 1, not 0"),
    (["--ray", "--replicas", "3", "--max-replicas", "2"], "--max-replicas must be at least --replicas (3), not 2"),
    (["--ray", "--host", "0.0.0.0"], "reachable from other machines: give an API key"),
    (["--ray", "--max-batch", "0"], "--max-batch must be >= 1"),
    (["--ray", "--threads", "0"], "--threads must be >= 1"),
])
def test_bad_ray_flags_are_one_line_before_ray_starts(args, words, tmp_path, capsys, monkeypatch):
    from vitkit.cli import main

    monkeypatch.delenv("VITKIT_API_KEY", raising=False)
    assert main(["serve", str(tmp_path / "absent"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and err[0].startswith("vitkit serve: error: "), err


def test_without_ray_the_error_names_the_extra(weights, capsys, monkeypatch):
    from vitkit.cli import main

    for name in [k for k in sys.modules if k == "ray" or k.startswith("ray.")] + ["ray"]:
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["serve", str(weights), "--ray"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ray is needed for vitkit serve --ray" in err[0] and "pip install -e '.[ray]'" in err[0]


def test_wrong_weights_are_one_line_before_ray_starts(tmp_path, capsys):
    pytest.importorskip("ray.serve")
    from vitkit.cli import main

    (tmp_path / "config.json").write_text("{}")
    assert main(["serve", str(tmp_path), "--ray", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no weights in folder" in err[0], err


def test_a_replica_that_cannot_start_says_why_in_one_line_found_in_rays_status(tmp_path):
    spec = {"weights": str(tmp_path / "absent"), "runtime": None, "quantize": None, "model_name": None,
            "options": ServeOptions(), "title": "t", "cpus": 1}
    with pytest.raises(RuntimeError) as e:
        app_builder(spec)()
    line = str(e.value)
    assert line.startswith(REPLICA_ERROR) and "weights not found" in line and "\n" not in line

    class Status:  # what serve.status() holds after three failed starts: the replica's traceback as text
        message = "Failed to update the deployments ['vitkit']."
        deployments = {"vitkit": type("D", (), {"message": f"failed 3 times. Error:\nTraceback\n  File x\n{line}"})}

    serve = type("Serve", (), {"status": staticmethod(lambda: type("S", (), {"applications": {"vitkit": Status}}))})
    assert _replica_error(serve) == line[len(REPLICA_ERROR):]


def test_a_replica_freezes_what_it_loaded_out_of_the_collector(weights):
    """Each replica, like `vitkit serve`, freezes its model, app and libraries once they are built
    (their full collections cost p99 latency: 606-638 ms against 392-403 frozen)."""
    import gc

    import torch

    spec = {"weights": str(weights), "runtime": "torch", "quantize": None, "model_name": None,
            "options": ServeOptions(), "title": "t", "cpus": 1}
    threads = torch.get_num_threads()
    gc.unfreeze()
    try:
        app = app_builder(spec)()
        frozen = gc.get_freeze_count()
    finally:
        gc.unfreeze()  # the test process goes on collecting as before
        torch.set_num_threads(threads)  # a replica takes its --threads
    assert app.state.endpoint.served.runtime == "torch" and frozen > 10_000


# ------------------------------------------------------------------ a real deployment on a local Ray instance


class Lines:
    """A process's stderr, read line by line in a thread (Ray may write much before vitkit's line)."""

    def __init__(self, stream):
        self.lines = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(iter(stream.readline, "")), daemon=True)
        self.thread.start()

    def wait_for(self, pattern: str, proc, timeout: float):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in list(self.lines):
                if found := re.search(pattern, line):
                    return found
            if proc.poll() is not None:
                self.thread.join(5)
                return None
            time.sleep(0.2)
        return None

    @property
    def text(self) -> str:
        return "".join(self.lines)


def marked_processes(marker: str) -> list:
    """Pids of the processes whose environment carries ``marker`` (Ray's inherit the driver's)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def ray_can_start() -> str:
    """Why a local Ray instance cannot start here ("" when it can)."""
    probe = "import ray; ray.init(num_cpus=1, include_dashboard=False, logging_level='ERROR'); ray.shutdown()"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "ray.init did not return within 120 s"
    lines = done.stderr.strip().splitlines()
    return "" if done.returncode == 0 else (lines[-1] if lines else f"ray.init exited {done.returncode}")


def replica_states(address: str) -> dict:
    """Ray Serve's status of the vitkit deployment, read by another driver on the same instance (with
    the token a new local instance made, where Ray has token authentication)."""
    read = ("import json, ray; from ray import serve; ray.init(address=%r, logging_level='ERROR'); "
            "d = serve.status().applications['vitkit'].deployments['vitkit']; "
            "print(json.dumps({'status': d.status.value, 'replicas': d.replica_states})); ray.shutdown()" % address)
    done = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, RAY_AUTH_MODE="token"))
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.full
def test_two_replicas_answer_as_vitkit_predict_and_sigterm_stops_every_ray_process(weights, tmp_path):
    pytest.importorskip("ray.serve")
    if not Path("/proc").is_dir():
        pytest.skip("Ray's processes are found through /proc (Linux)")
    marker = f"VITKIT_RAY_TEST={uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({marker.split("=")[0]: marker.split("=")[1], "OMP_NUM_THREADS": "1"})
    proc = subprocess.Popen([sys.executable, "-m", "vitkit", "serve", str(weights), "--ray", "--replicas", "2",
                             "--port", "0", "--max-wait-ms", "1500", "--max-batch", "16", "--max-queue", "4",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    err = Lines(proc.stderr)
    try:
        started = err.wait_for(r"on Ray Serve at (http://127\.0\.0\.1:\d+).*Ray at (\S+);", proc, 240)
        if started is None:
            if why := ray_can_start():
                pytest.skip(f"Ray cannot start a local instance here: {why}")
            pytest.fail(f"vitkit serve --ray did not start:\n{err.text[-3000:]}")
        url, address = started.group(1), started.group(2)
        line = json.loads(proc.stdout.readline())  # --json's ready line (Ray's was never written), with serve's keys
        assert line["url"] == url and f"{line['host']}:{line['port']}" in url and line["runtime"] == "ray"
        assert httpx.get(url + "/readyz", timeout=30).status_code == 200
        _answers_as_predict(url, weights, tmp_path)
        _a_burst_past_the_queue_is_refused_not_queued(url)
        states = replica_states(address)
        assert states == {"status": "HEALTHY", "replicas": {"RUNNING": 2}}, states
        assert len(marked_processes(marker)) >= 6, "Ray's processes should carry the marker (GCS, raylet, actors)"
        _sigterm_answers_in_flight(proc, url)
        assert proc.wait(90) == 0, err.text[-3000:]
        err.thread.join(10)
        assert "stopped: the replicas answered the requests in flight, and Ray shut down" in err.text
        deadline = time.time() + 30
        while (left := marked_processes(marker)) and time.time() < deadline:
            time.sleep(0.5)
        assert not left, f"Ray processes left behind: {left}"
    finally:
        for pid in [proc.pid] + marked_processes(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait(30)


def _answers_as_predict(url: str, weights, tmp_path) -> None:
    images = [photo(i) for i in range(4)]
    for i, data in enumerate(images):
        (tmp_path / f"{i}.png").write_bytes(data)
    expected = predict_images(vitkit.from_pretrained(weights), [tmp_path / f"{i}.png" for i in range(4)], top_k=3)
    with ThreadPoolExecutor(4) as pool:  # together: both replicas see work, and each batches its own
        answers = list(pool.map(lambda data: httpx.post(url + "/predict?top_k=3", content=data, timeout=60),
                                images))
    for answer, want in zip(answers, expected):
        assert answer.status_code == 200, answer.text
        top = answer.json()["top"]
        assert [t["label"] for t in top] == [label for _, label, _ in want.top]
        assert [t["probability"] for t in top] == pytest.approx([p for _, _, p in want.top], abs=1e-5)
    assert len({a.json()["top"][0]["index"] for a in answers}) > 1, "the images should not all look alike"
    for path in ("/healthz", "/info", "/", "/metrics", "/example.png"):  # the rest of the plain server's routes
        assert httpx.get(url + path, timeout=60).status_code == 200, path
    assert httpx.get(url + "/info", timeout=60).json()["labels"] == LABELS
    embedded = httpx.post(url + "/embed", content=images[0], timeout=60).json()
    assert embedded["dim"] == 192 and len(embedded["embedding"]) == 192
    rollout = httpx.post(url + "/rollout", content=images[0], timeout=60)
    assert rollout.status_code == 200 and rollout.content[:8] == b"\x89PNG\r\n\x1a\n"


def _a_burst_past_the_queue_is_refused_not_queued(url: str) -> None:
    """120 requests at once against 2 replicas taking 32 each (2 x --max-batch) and 4 more waiting
    at Ray's proxy (--max-queue): the rest are refused at once with 503, by Ray or by a replica's own
    bounded queue; every request ends, every answer is right, and the server stays ready."""
    data = photo(3)
    want = httpx.post(url + "/predict", content=data, timeout=60).json()["top"][0]["index"]
    with ThreadPoolExecutor(120) as pool:
        answers = list(pool.map(lambda _: httpx.post(url + "/predict", content=data, timeout=60), range(120)))
    codes = [a.status_code for a in answers]
    assert set(codes) <= {200, 503} and codes.count(503) > 0 and codes.count(200) >= 16, sorted(codes)
    assert all(a.json()["top"][0]["index"] == want for a in answers if a.status_code == 200)
    assert httpx.get(url + "/readyz", timeout=30).status_code == 200


def _sigterm_answers_in_flight(proc, url: str) -> None:
    with ThreadPoolExecutor(3) as pool:
        flying = [pool.submit(httpx.post, url + "/predict", content=photo(10 + i), timeout=60) for i in range(3)]
        time.sleep(0.5)  # the requests wait for their batch (1.5 s)
        proc.send_signal(signal.SIGTERM)
        answers = [f.result() for f in flying]
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
