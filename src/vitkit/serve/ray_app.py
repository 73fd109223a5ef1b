"""``vitkit serve --ray``: the same endpoint on Ray Serve, in N replicas (or N to M, autoscaled) behind
Ray's HTTP proxy, on a new local Ray instance or a running cluster (the ``ray`` extra).

Deployment: ``serve.ingress`` given a builder function (Ray 2.47 and later). Ray calls it in each
replica as the replica starts: it loads the weights there (``load_classifier``, as ``vitkit serve``
does) and returns :func:`~vitkit.serve.create_app`'s FastAPI app, whose lifespan starts the
replica's batchers. Every route, limit, the API key and the page are the plain server's; /metrics
and /readyz describe the replica that answers.

Batching: the app's own batcher inside each replica, not ``@serve.batch``. The routes await it
(predict and embed batch separately, with a bounded queue, per-request timeouts and batch-size
metrics), so both servers batch alike and nothing is written twice. Ray's router spreads requests
over the replicas, at most 2 x --max-batch at a time on each (one batch computing, the next
filling); up to --max-queue more wait at Ray's proxy, and beyond that Ray answers 503.

Autoscaling: --max-replicas M hands the count to Ray's autoscaler, between --replicas N and M,
aiming at --max-batch requests in flight per replica (a full batch each).

On a cluster, the replicas read the weights where they run (a path on storage every node mounts, or
hf-hub:NAME), and every node needs vitkit installed.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional
from urllib.parse import urlsplit

from ..extras import first_line, require
from .app import ServeOptions
from .server import check_bind, key_given, open_socket

#: the Ray Serve application's name (and its deployment's): what ``serve status`` lists
APP_NAME = "vitkit"
#: where Ray reads a cluster's address when --ray-address is not given
ADDRESS_VARIABLE = "RAY_ADDRESS"
#: how a replica's error begins, so that its one line is found in the traceback Ray hands back
REPLICA_ERROR = "vitkit replica error: "


@dataclass
class RayPlan:
    """How many replicas run, and where (``vitkit serve --ray``'s flags)."""
    #: replicas started; with ``max_replicas``, the fewest the autoscaler keeps
    replicas: int = 2
    #: the most the autoscaler starts; None: exactly ``replicas``, no autoscaling
    max_replicas: Optional[int] = None
    #: a running cluster (HOST:PORT, ray://HOST:PORT, auto); None: RAY_ADDRESS, else a new local instance
    address: Optional[str] = None
    #: CPUs Ray reserves for each replica, and its torch threads
    cpus: int = 1

    def problems(self) -> list:
        out = []
        if self.replicas < 1:
            out.append(f"--replicas must be >= 1, not {self.replicas}")
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            out.append(f"--max-replicas must be at least --replicas ({self.replicas}), not {self.max_replicas}")
        if self.cpus < 1:
            out.append(f"--threads must be >= 1, not {self.cpus}")
        return out

    @property
    def local(self) -> bool:
        """Whether this process starts (and so stops) its own Ray instance."""
        return not (self.address or os.environ.get(ADDRESS_VARIABLE))


def deployment_options(plan: RayPlan, options: ServeOptions) -> Dict[str, Any]:
    """``serve.deployment``'s keyword arguments: the replicas (fixed or autoscaled), the requests each
    takes at a time, Ray's queue in front of them, and the drain time on shutdown."""
    out: Dict[str, Any] = {
        "name": APP_NAME,
        "max_ongoing_requests": 2 * options.max_batch,
        "max_queued_requests": options.max_queue,
        "ray_actor_options": {"num_cpus": plan.cpus},
        "graceful_shutdown_timeout_s": options.timeout_s + 1,  # the requests in flight are answered
    }
    if plan.max_replicas is None:
        out["num_replicas"] = plan.replicas
    else:
        out["autoscaling_config"] = {"min_replicas": plan.replicas, "initial_replicas": plan.replicas,
                                     "max_replicas": plan.max_replicas,
                                     "target_ongoing_requests": options.max_batch}
    return out


def replica_app(spec: Dict[str, Any]) -> Any:
    """In a replica: the weights loaded on their runtime, and the plain server's app around them."""
    import torch

    from .app import create_app
    from .model import load_served

    torch.set_num_threads(spec["cpus"])
    served = load_served(spec["weights"], spec["runtime"], spec["quantize"], spec["model_name"], print,
                         spec.get("calibration"), spec["options"].max_batch, progress=False)  # as vitkit serve
    app = create_app(served, spec["options"], spec["title"])
    gc.freeze()  # as vitkit serve does: what lives as long as the replica is left out of the collector's passes
    return app


def app_builder(spec: Dict[str, Any]) -> Callable[[], Any]:
    """The builder ``serve.ingress`` takes (a plain function: Ray calls it in each replica); a replica
    that cannot start says why in one marked line."""
    def build() -> Any:
        try:
            return replica_app(spec)
        except Exception as e:
            from ..errors import describe_error

            raise RuntimeError(REPLICA_ERROR + describe_error(e)) from None
    return build


def check_weights(weights: str, model_name: Optional[str]) -> None:
    """The weights read once here, so that a wrong name or a model without classes is one line before
    Ray starts rather than three failed replica starts later (a local instance: the replicas read the
    same files)."""
    from ..deploy.choose import check_classifier, is_onnx, read_weights
    from ..deploy.openvino import is_openvino

    if is_onnx(weights) or is_openvino(weights):
        if not Path(weights).is_file():
            raise FileNotFoundError(f"weights not found: {weights} (no such file)")
        return
    check_classifier(read_weights(weights, model_name), weights)


def serve_ray(weights: str, plan: RayPlan, host: str = "127.0.0.1", port: int = 8000, runtime: Optional[str] = None,
              quantize: Optional[str] = None, model_name: Optional[str] = None,
              options: Optional[ServeOptions] = None, say: Callable[[str], None] = print,
              calibration: Optional[str] = None, ready: Optional[Callable[[dict], None]] = None) -> None:
    """Serve the classifier ``weights`` on Ray Serve as ``plan`` says until SIGINT or SIGTERM, which
    delete the application (its replicas answer what is in flight) and stop a local Ray instance.
    ``ready`` is given the address once the replicas answer (``vitkit serve --json``'s line)."""
    options = options or ServeOptions()
    options.api_key = key_given(options.api_key)
    check_bind(host, options.api_key)
    if problems := options.problems() + plan.problems():
        raise ValueError("; ".join(problems))
    ray = require("ray", "ray", "vitkit serve --ray")
    serve = require("ray.serve", "ray", "vitkit serve --ray")
    if plan.local:  # the port checked (0: a free one chosen) and the weights read before Ray starts
        sock = open_socket(host, port)
        port = sock.getsockname()[1]
        sock.close()
        check_weights(weights, model_name)
    if Path(weights).exists():
        weights = str(Path(weights).resolve())  # a replica's working folder is Ray's
    if calibration is not None and Path(calibration).exists():
        calibration = str(Path(calibration).resolve())
    spec = {"weights": weights, "runtime": runtime, "quantize": quantize, "model_name": model_name,
            "calibration": calibration,
            "options": options, "title": f"vitkit serve: {weights}", "cpus": plan.cpus}
    try:
        _start_ray(ray, plan)
        url = _deploy(serve, spec, plan, host, port)
        kept = "" if plan.local else " (a Serve already running there keeps its own host and port)"
        say(f"serving {weights} with {_replica_words(plan)} on Ray Serve at {url}{kept}  -- page {url}/, API "
            f"{url}/docs; Ray at {ray.get_runtime_context().gcs_address}; Ctrl-C or SIGTERM stops")
        if ready is not None:
            where = urlsplit(url)  # (the keys of serve's own ready line, which scripts read: host and port too)
            ready({"url": url, "host": where.hostname, "port": where.port, "weights": weights, "runtime": "ray",
                   "replicas": _replica_words(plan)})
        threading.Event().wait()  # until a signal raises here
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM through the command line's handler
        pass
    finally:
        _stop(ray, serve, plan)
    say("stopped: the replicas answered the requests in flight" + (", and Ray shut down" if plan.local else ""))


def _start_ray(ray: Any, plan: RayPlan) -> None:
    """Ray started or joined, this process's own signal handlers kept (ray.init puts in its own)."""
    import logging

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} \
        if threading.current_thread() is threading.main_thread() else {}
    kwargs: Dict[str, Any] = {"address": plan.address, "logging_level": "WARNING", "log_to_driver": False}
    if plan.local:  # every replica fits (more than there are cores share them rather than wait forever)
        kwargs["num_cpus"] = max(os.cpu_count() or 1, (plan.max_replicas or plan.replicas) * plan.cpus)
        kwargs["include_dashboard"] = False
    try:
        ray.init(**kwargs)
    except ConnectionError as e:
        raise OSError(f"cannot reach the Ray cluster at {plan.address or os.environ.get(ADDRESS_VARIABLE)} "
                      f"({first_line(e)}): check --ray-address") from None
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # its progress lines; the warnings stay


def _deploy(serve: Any, spec: Dict[str, Any], plan: RayPlan, host: str, port: int) -> str:
    """The application deployed and every replica ready; its URL."""
    quiet = {"log_level": "WARNING"}
    serve.start(http_options={"host": host, "port": port}, logging_config=quiet)
    deployment = serve.deployment(serve.ingress(app_builder(spec))(), **deployment_options(plan, spec["options"]))
    try:
        serve.run(deployment.bind(), name=APP_NAME, route_prefix="/", logging_config=quiet)
    except RuntimeError as e:  # a replica that could not start: Ray's status holds its traceback
        said = _replica_error(serve)
        if said is None:
            raise RuntimeError(f"the replicas did not start ({first_line(e)}): Ray's Serve logs say why "
                               f"(by default /tmp/ray/session_latest/logs/serve on the head node)") from None
        raise ValueError(f"the replicas did not start: {said}") from None  # already worded as the CLI words it
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _stop(ray: Any, serve: Any, plan: RayPlan) -> None:
    """The application deleted first, while Ray's proxy still runs: its replicas answer the requests
    in flight, then stop (serve.shutdown alone stops the proxy with them unanswered). On a local
    instance, Serve and Ray then shut down."""
    if not ray.is_initialized():
        return
    try:
        serve.delete(APP_NAME)
        if plan.local:
            serve.shutdown()
    except Exception:  # Serve never started, or is gone already: nothing to stop
        pass
    finally:
        ray.shutdown()


def _replica_error(serve: Any) -> Optional[str]:
    """A failed replica's own line (after :data:`REPLICA_ERROR`) in Ray's status, if there is one."""
    try:
        status = serve.status().applications[APP_NAME]
        text = "\n".join([status.message, *(d.message for d in status.deployments.values())])
    except Exception:  # the status is gone with the controller
        return None
    found = [line.split(REPLICA_ERROR, 1)[1].strip() for line in text.splitlines() if REPLICA_ERROR in line]
    return found[-1] if found else None


def _replica_words(plan: RayPlan) -> str:
    if plan.max_replicas is not None and plan.max_replicas != plan.replicas:
        return f"{plan.replicas} to {plan.max_replicas} replicas (autoscaled)"
    return f"{plan.replicas} replica" + ("s" if plan.replicas != 1 else "")
