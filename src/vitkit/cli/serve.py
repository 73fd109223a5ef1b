"""``vitkit serve``: a classifier behind HTTP with dynamic batching (``vitkit.serve.serve``)."""

from __future__ import annotations

import argparse
import sys


def cmd_serve(args: argparse.Namespace) -> int:
    from ..serve import ServeOptions, serve

    if args.max_body_mb <= 0:
        raise ValueError(f"--max-body-mb must be positive, not {args.max_body_mb}")
    options = ServeOptions(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, max_queue=args.max_queue,
                           max_body_bytes=int(args.max_body_mb * 1024 * 1024), timeout_s=args.timeout,
                           top_k=args.top_k, api_key=args.api_key)
    if problems := options.problems():  # before the weights are read
        raise ValueError("; ".join(problems))
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, not {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    serve(args.weights, args.host, args.port, args.runtime, args.quantize, args.model, options,
          say=lambda line: print(f"vitkit serve: {line}", file=sys.stderr, flush=True))
    return 0


def add_serve(verb) -> None:
    from .common import add_runtime_flags

    p = verb("serve", "serve a classifier over HTTP: predict, embed, attention rollout, metrics and a page to try "
                      "it, requests batched dynamically")
    p.add_argument("weights", help="a run folder, a weights file or folder, hf-hub:org/name, an .onnx file or an "
                                   "OpenVINO .xml")
    p.add_argument("--model", help="architecture name when the weights have no config")
    add_runtime_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, this machine "
                                                       "only; another needs an API key)")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed) [default: 8000]")
    p.add_argument("--api-key", help="required of every request but /healthz, /readyz and the page (default: "
                                     "VITKIT_API_KEY; none on 127.0.0.1)")
    p.add_argument("--max-batch", type=int, default=32, help="images per batched forward pass [default: 32]")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long a batch waits to fill after its first request [default: 5]")
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests waiting before new ones get 503 with Retry-After [default: 256]")
    p.add_argument("--max-body-mb", type=float, default=20.0, help="largest request body, MiB [default: 20]")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds a request may wait for its body and for its answer [default: 30]")
    p.add_argument("--top-k", type=int, default=5, help="classes per answer unless ?top_k= asks [default: 5]")
    p.add_argument("--threads", type=int, help="CPU threads for the model (default: torch's)")
    p.set_defaults(func=cmd_serve)
