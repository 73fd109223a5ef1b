"""``vitkit serve``: a classifier behind HTTP with dynamic batching (``vitkit.serve.serve``), or the same
app in replicas on Ray Serve (``--ray``: ``vitkit.serve.ray_app.serve_ray``)."""

from __future__ import annotations

import argparse
import json

from .common import check_threads, say_for, stand_ins_of


def cmd_serve(args: argparse.Namespace) -> int:
    from ..serve import ServeOptions, serve

    body_bytes = args.max_body_mb * 1024 * 1024
    if not (1 <= body_bytes and args.max_body_mb <= MAX_BODY_MB):  # nan, inf: the limit is whole bytes
        tiny = " (less than one byte)" if 0 < body_bytes < 1 else ""
        raise ValueError(f"--max-body-mb must be positive and at most {MAX_BODY_MB:,}, not {args.max_body_mb}{tiny}")
    options = ServeOptions(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, max_queue=args.max_queue,
                           max_body_bytes=int(body_bytes), timeout_s=args.timeout,
                           top_k=args.top_k, api_key=args.api_key)
    if problems := options.problems():  # before the weights are read
        raise ValueError("; ".join(problems))
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, not {args.threads}")
    if not args.ray:  # (Ray's replicas have their own machines' cores)
        check_threads(args.threads)
    ready = (lambda where: print(json.dumps(where), flush=True)) if args.json else None  # one line on stdout
    stand_ins = stand_ins_of(args)
    if args.ray:
        if given := ["--" + k.replace("_", "-") for k, v in stand_ins.items() if v is not None]:
            raise ValueError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} not passed to Ray's replicas: "
                             f"export the model with its metadata (vitkit convert) and serve that")
        return _serve_on_ray(args, options, ready)
    if given := [flag for flag, value in RAY_FLAGS.items() if getattr(args, value) is not None]:
        raise ValueError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} --ray")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    forced = serve(args.weights, args.host, args.port, args.runtime, args.quantize, args.model, options,
                   say=say_for("serve"), calibration=args.calibration, ready=ready, **stand_ins)
    return 130 if forced else 0  # a second Ctrl-C: stopped by it, as the shell counts


#: the largest --max-body-mb (1 TiB): a body limit is a finite number of bytes
MAX_BODY_MB = 1024 * 1024

#: the flags that only mean something with --ray, and their argparse names
RAY_FLAGS = {"--replicas": "replicas", "--max-replicas": "max_replicas", "--ray-address": "ray_address"}


def _serve_on_ray(args: argparse.Namespace, options, ready) -> int:
    """The same app on Ray Serve: --threads is each replica's (the CPUs Ray reserves for it)."""
    from ..serve.ray_app import RayPlan, serve_ray

    plan = RayPlan(replicas=2 if args.replicas is None else args.replicas, max_replicas=args.max_replicas,
                   address=args.ray_address, cpus=args.threads or 1)
    serve_ray(args.weights, plan, args.host, args.port, args.runtime, args.quantize, args.model, options,
              say=say_for("serve"), calibration=args.calibration, ready=ready)
    return 0


def add_serve(verb) -> None:
    from .common import add_runtime_flags, add_stand_in_flags

    p = verb("serve", "serve a classifier over HTTP: predict, embed, attention rollout, metrics and a page to try "
                      "it, requests batched dynamically")
    p.add_argument("weights", help="a run folder, a weights file or folder, hf-hub:org/name, an .onnx file or an "
                                   "OpenVINO .xml")
    p.add_argument("--model", help="architecture name when the weights have no config")
    add_runtime_flags(p)
    add_stand_in_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, this machine "
                                                       "only; another needs an API key)")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed) [default: 8000]")
    p.add_argument("--api-key", help="required of every request but /healthz, /readyz, the page, its images and the "
                                     "API's description (/docs, /redoc, /openapi.json) (default: "
                                     "VITKIT_API_KEY; none on 127.0.0.1)")
    p.add_argument("--max-batch", type=int, default=32, help="images per batched forward pass [default: 32]")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long a batch waits to fill after its first request, while others are being "
                        "read or decoded [default: 5]")
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests waiting before new ones get 503 with Retry-After [default: 256]")
    p.add_argument("--max-body-mb", type=float, default=20.0, help="largest request body, MiB [default: 20]")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds a request may wait for its headers, its body and its answer [default: 30]")
    p.add_argument("--top-k", type=int, default=5, help="classes per answer unless ?top_k= asks [default: 5]")
    p.add_argument("--threads", type=int, help="CPU threads for the model (default: torch's; with --ray, each "
                                               "replica's, and the CPUs Ray reserves for it: 1)")
    p.add_argument("--ray", action="store_true",
                   help="run the same app in replicas on Ray Serve (the ray extra): a new local Ray instance, or "
                        "--ray-address's cluster; each replica batches its own requests")
    p.add_argument("--replicas", type=int, help="with --ray: replicas to run [default: 2]; with --max-replicas, "
                                                "the fewest the autoscaler keeps")
    p.add_argument("--max-replicas", type=int,
                   help="with --ray: let Ray's autoscaler run between --replicas and this many")
    p.add_argument("--ray-address", help="with --ray: a running Ray cluster (HOST:PORT, ray://HOST:PORT or auto; "
                                         "default: RAY_ADDRESS, else a new local instance stopped on exit)")
    p.set_defaults(func=cmd_serve)
