"""Running the endpoint: the weights loaded on their runtime, the app on uvicorn, and SIGTERM as a
drain (stop accepting, answer what is in flight, then exit).

It binds to 127.0.0.1 unless told otherwise, and a bind beyond this machine needs an API key:
a model endpoint open to a network without one is a mistake far more often than a choice.
"""

from __future__ import annotations

import gc
import ipaddress
import json
import logging
import os
import select
import signal
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from ..extras import require
from .app import KEY_RULE, ServeOptions, create_app, header_safe
from .model import ServedModel, load_served
from .protocol import connection_protocol

#: hosts that only this machine can reach
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
#: where the API key is read from when no --api-key is given
KEY_VARIABLE = "VITKIT_API_KEY"


def key_given(api_key: Optional[str]) -> Optional[str]:
    """The API key: ``api_key`` (--api-key), else :data:`KEY_VARIABLE`'s, whose bad value is said by the
    variable's name (it was said as --api-key's, a flag not given)."""
    if api_key:
        return api_key
    key = os.environ.get(KEY_VARIABLE) or None
    if key is not None and not header_safe(key):
        raise ValueError(f"{KEY_VARIABLE} {KEY_RULE}")
    return key


def check_bind(host: str, api_key: Optional[str]) -> None:
    """A host this machine can listen on, and an API key where other machines can reach it (a name counts as
    what it resolves to). A host that resolves to nothing, or carries a port or brackets, was refused as
    "reachable from other machines: give an API key", and with a key bound to nothing."""
    if not host.strip():
        raise ValueError("--host is empty: give an address such as 127.0.0.1, or 0.0.0.0 for every interface")
    if host.startswith("["):
        inner = host[1:].split("]")[0]
        raise ValueError(f"--host {host}: give the address without brackets ({inner}), and a port with --port")
    if host.count(":") == 1:  # (IPv6 addresses hold two or more)
        raise ValueError(f"--host {host}: give the port with --port, not in --host")
    if host in LOCAL_HOSTS:
        return
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except (socket.gaierror, UnicodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise ValueError(f"--host {host} cannot be resolved to an address ({reason}): give an address such as "
                         f"127.0.0.1 or 0.0.0.0") from None
    if not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in found) and not api_key:
        raise ValueError(f"--host {host} is reachable from other machines: give an API key (--api-key KEY or "
                         f"{KEY_VARIABLE}=KEY), or serve on 127.0.0.1 behind your own proxy")


def open_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the weights are read (port 0: a free one, known at once)."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port must be between 0 and 65535, not {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on {host}:{port} ({e.strerror}): pick another --port or --host") \
            from None
    sock.listen(2048)  # from now on a client waits in the backlog while the model loads, never refused
    return sock


class LoadingAnswers:
    """While the weights load and warm (an OpenVINO int8 export on the fly takes a minute), the bound socket
    answers each connection once and closes it: ``/healthz`` 200 (the process lives: a liveness probe must
    not restart it), ``/readyz`` 503, any other path 503 with Retry-After. A client waited in the backlog,
    told nothing, for as long as the load took, and a probe with a timeout read that as dead. Uvicorn takes
    the socket once this stops (connections still waiting are its own)."""

    #: the most connections answered at once; more wait in the backlog
    MOST = 32

    def __init__(self, sock: socket.socket, poll_s: float = 0.05):
        self.sock, self.poll_s, self.stop = sock, poll_s, threading.Event()
        self.active = threading.BoundedSemaphore(self.MOST)
        self.thread = threading.Thread(target=self._accept, name="vitkit-loading-answers", daemon=True)

    def __enter__(self) -> "LoadingAnswers":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()

    def _accept(self) -> None:
        while not self.stop.is_set():
            if not self.active.acquire(timeout=self.poll_s):  # as many answering as it takes: the rest wait
                continue
            try:
                if not select.select([self.sock], [], [], self.poll_s)[0]:
                    raise BlockingIOError
                conn = self.sock.accept()[0]
            except OSError:  # none came, the client left before it was accepted, or the socket was closed
                self.active.release()
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(2.0)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 16384:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                head += chunk
            words = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            method, path = (words[0], words[1].split("?")[0]) if len(words) >= 2 else ("GET", "")
            conn.sendall(loading_response(method, path))
            conn.shutdown(socket.SHUT_WR)
            until = time.monotonic() + 2.0  # a body left unread: closing on it resets the connection, answer unread
            while time.monotonic() < until and conn.recv(65536):
                pass
        except OSError:
            pass
        finally:
            conn.close()
            self.active.release()


def loading_response(method: str, path: str) -> bytes:
    """The whole HTTP response to ``method path`` while the model loads (:class:`LoadingAnswers`)."""
    if path == "/healthz":
        status, body, extra = "200 OK", {"status": "loading"}, ""
    elif path == "/readyz":
        status, body, extra = "503 Service Unavailable", {"ready": False, "draining": False, "loading": True}, ""
    else:
        status, body, extra = ("503 Service Unavailable", {"error": "the model is loading: try again shortly"},
                               "retry-after: 5\r\n")
    data = json.dumps(body).encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n{extra}"
            f"connection: close\r\n\r\n").encode() + (b"" if method == "HEAD" else data)


def make_server(served: ServedModel, options: ServeOptions, host: str = "127.0.0.1", port: int = 8000,
                title: str = "vitkit", sock: Optional[socket.socket] = None, *,
                host_checked: bool = False) -> Tuple[object, socket.socket, str]:
    """(uvicorn server, its bound socket, its URL) for ``served``; ``server.run(sockets=[sock])`` runs
    it (in the main thread, SIGINT and SIGTERM drain it). ``sock``: one already bound (``open_socket``).
    ``host_checked``: the caller ran :func:`check_bind` on this host and key (a name is not looked up twice)."""
    uvicorn = require("uvicorn", "serve", "vitkit serve")
    if not host_checked:
        check_bind(host, options.api_key)
    app = create_app(served, options, title)
    sock = sock or open_socket(host, port)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # new requests on open connections are refused while draining
            app.state.vitkit["draining"] = True
            super().handle_exit(sig, frame)
            if self.force_exit:  # a second Ctrl-C: the tasks it cancels are not errors (the last line says so)
                app.state.vitkit["stopped_at_once"] = True  # (its answer to them says so; a drain's timeout is other)
                logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL + 1)

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=int(options.timeout_s) + 1, timeout_keep_alive=5,
                            http=connection_protocol(options.timeout_s, app.state.metrics))
    name = sock.getsockname()
    shown = f"[{name[0]}]" if sock.family == socket.AF_INET6 else name[0]
    return Server(config), sock, f"http://{shown}:{name[1]}"


def serve(weights: str, host: str = "127.0.0.1", port: int = 8000, runtime: Optional[str] = None,
          quantize: Optional[str] = None, model_name: Optional[str] = None, options: Optional[ServeOptions] = None,
          say: Callable[[str], None] = print, calibration: Optional[str] = None,
          ready: Optional[Callable[[dict], None]] = None, **stand_ins: Any) -> bool:
    """Serve the classifier ``weights`` name (a run folder, a weights file or folder, an ``.onnx`` or
    OpenVINO ``.xml``) on ``runtime`` until SIGINT or SIGTERM, which drain it (``calibration``: the
    images a calibrated int8 export calibrates on). ``ready`` is given the address once the socket
    listens and the model is warm (``url``, ``host``, ``port``, ``weights``, ``runtime``,
    ``precision``): with
    ``port=0`` the only way to learn the port the system chose. ``stand_ins`` (img_size, mean, std,
    labels): an ``.onnx`` file without vitkit's metadata, as ``vitkit predict`` takes them. Returns whether
    a second signal stopped it at once (requests in flight cut off), rather than a drain."""
    from ..deploy.choose import runtime_label

    options = options or ServeOptions()
    options.api_key = key_given(options.api_key)
    check_bind(host, options.api_key)  # before the weights are read
    if problems := options.problems():
        raise ValueError("; ".join(problems))
    sock = open_socket(host, port)  # a port in use: said before the weights are read
    try:
        with LoadingAnswers(sock):
            served = load_served(weights, runtime, quantize, model_name, say, calibration, options.max_batch,
                                 **stand_ins)
        label = runtime_label(served.model)
        server, sock, url = make_server(served, options, host, port, f"vitkit serve: {weights}", sock,
                                        host_checked=True)
    except BaseException:
        sock.close()
        raise
    previous = _drain_on_signals(server)
    errors = logging.getLogger("uvicorn.error")
    level = errors.level  # a forced stop quiets it (make_server's handle_exit): put back for the next server
    try:
        say(f"serving {weights} ({label}) on {url}  -- page {url}/, API {url}/docs, metrics {url}/metrics; "
            f"Ctrl-C or SIGTERM drains and stops")
        if ready is not None:
            ready({"url": url, "host": sock.getsockname()[0], "port": sock.getsockname()[1], "weights": str(weights),
                   "runtime": served.runtime, "precision": label})  # the runtime as /readyz and /info name it
        gc.freeze()  # the model, the app and the libraries live as long as the server: the collector skips them
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # where the drain could not take the signals (not the main thread), the
        pass                   # command line's handler raises the stop: done
    finally:
        sock.close()
        errors.setLevel(level)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    forced = bool(getattr(server, "force_exit", False))
    say("stopped at once (a second Ctrl-C): requests in flight were cut off" if forced
        else "stopped: the requests in flight were answered")
    return forced


def _drain_on_signals(server: Any) -> Dict[int, Any]:
    """From the ready line on, SIGINT and SIGTERM drain the server, as inside ``run``: one that came
    before uvicorn took them over was raised as an exception in asyncio's start ("coroutine was
    never awaited", exit 143) by a server that had said it was serving. Returns the handlers to put back."""
    handle_exit = getattr(server, "handle_exit", None)
    if handle_exit is None or threading.current_thread() is not threading.main_thread():
        return {}

    def drain(sig, frame):  # (uvicorn raises the signal it caught again once it has drained: not a second one)
        if not getattr(server, "should_exit", False):
            handle_exit(sig, frame)

    return {sig: signal.signal(sig, drain) for sig in (signal.SIGINT, signal.SIGTERM)}
