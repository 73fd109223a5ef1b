"""``python -m vitkit ARGV`` as a real process of its own, forked from a server that has imported torch.

A short ``vitkit train`` spends most of its life starting: Python, torch, the compiler module torch's
optimizers import on their first step, matplotlib and vitkit (about 6 s of 8 on an AMX Xeon, twice
that on Zen 3), and the suite starts about a hundred of them. Each xdist worker starts one server
(this file run as a script) that imports all that once and then forks a child per command. A child
is still a process of its own (its own pid, signals, exit status, file descriptors, working folder
and environment), so kill-and-resume tests and SIGTERM tests see what a user's process does.

What a fork cannot change: every child hashes with ``PYTHONHASHSEED=0`` (the bitwise resume tests ask
for it), and what a library reads once at import (matplotlib's ``MPLCONFIGDIR``) is the server's. The
thread count follows the child's own ``OMP_NUM_THREADS``, as in a new process. Tests of the
interpreter's own start (``--help`` without torch, a broken pipe, the console entry point) start a
plain process instead.
"""

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

_server = {}  # this process's server: {"proc": Popen, "path": socket path}
_AT_LOAD = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # read once, when OpenMP loads


def _start_server() -> str:
    if _server and _server["proc"].poll() is None:
        return _server["path"]
    folder = tempfile.mkdtemp(prefix="vitkit-forks-")
    path = os.path.join(folder, "s")
    env = {k: v for k, v in os.environ.items() if k not in _AT_LOAD}  # a child sets them from its own
    env["PYTHONHASHSEED"] = "0"
    proc = subprocess.Popen([sys.executable, __file__, path], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not os.path.exists(path):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"the fork server did not start (exit {proc.poll()})")
        time.sleep(0.05)
    _server.update(proc=proc, path=path, folder=folder)
    atexit.register(_stop_server)
    return path


def _stop_server() -> None:
    if _server and _server["proc"].poll() is None:
        _server["proc"].kill()
        _server["proc"].wait()
    if _server:
        Path(_server["path"]).unlink(missing_ok=True)
        os.rmdir(_server["folder"])
        _server.clear()


class Forked:
    """A forked ``vitkit`` process, used as a :class:`subprocess.Popen` (pid, poll, wait,
    communicate, send_signal, kill, terminate, stdout, stderr, returncode)."""

    def __init__(self, argv: Sequence, env: Optional[dict], cwd, stdout, stderr, text: bool,
                 start_new_session: bool = False):
        self.args = [str(a) for a in argv]
        self.returncode = None
        ours, theirs = [], []
        for fd, which in ((1, stdout), (2, stderr)):
            if which == subprocess.PIPE:
                r, w = os.pipe()
                ours.append(os.fdopen(r, "r" if text else "rb"))
                theirs.append(w)
            else:
                ours.append(None)
                theirs.append(os.open(os.devnull, os.O_WRONLY) if which == subprocess.DEVNULL
                              else os.dup(fd if which is None else which.fileno()))  # None: this process's
        self.stdout, self.stderr = ours
        stdin = os.open(os.devnull, os.O_RDONLY)
        request = {"argv": self.args, "env": dict(os.environ if env is None else env),
                   "cwd": str(cwd or os.getcwd()), "setsid": start_new_session}
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(_start_server())
            socket.send_fds(self._sock, [json.dumps(request).encode() + b"\n"], [stdin, *theirs])
        finally:
            for fd in (stdin, *theirs):
                os.close(fd)
        self._said = b""
        self.pid = int(self._line(timeout=60))

    def _line(self, timeout: Optional[float]) -> bytes:
        self._sock.settimeout(timeout)
        while b"\n" not in self._said:
            chunk = self._sock.recv(256)
            if not chunk:
                raise RuntimeError("the fork server went away")
            self._said += chunk
        line, self._said = self._said.split(b"\n", 1)
        return line

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = int(self._line(timeout))
            except (socket.timeout, BlockingIOError):
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self._sock.close()
        return self.returncode

    def poll(self) -> Optional[int]:
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never a signal to a pid that may be another's by now
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, timeout: Optional[float] = None):
        """Both pipes read to their end (by threads, so neither fills up), then the exit status."""
        said = [None, None]

        def drain(i, f):
            said[i] = f.read()
            f.close()

        readers = [threading.Thread(target=drain, args=(i, f), daemon=True)
                   for i, f in enumerate((self.stdout, self.stderr)) if f is not None]
        for t in readers:
            t.start()
        start = time.time()
        for t in readers:
            t.join(None if timeout is None else max(0.0, timeout - (time.time() - start)))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if timeout is None else max(0.0, timeout - (time.time() - start)))
        return tuple(said)


def popen(*argv, env=None, cwd=None, stdout=None, stderr=None, text=True, start_new_session=False) -> Forked:
    """``subprocess.Popen([python, -m, vitkit, *ARGV], ...)``, forked."""
    return Forked(argv, env, cwd, stdout, stderr, text, start_new_session)


def run(*argv, env=None, cwd=None, timeout=None, capture_output=True, check=False, text=True):
    """``subprocess.run([python, -m, vitkit, *ARGV], ...)``, forked; a timeout kills the child."""
    pipe = subprocess.PIPE if capture_output else None
    proc = Forked(argv, env, cwd, pipe, pipe, text)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


# ------------------------------------------------------------------------------ the server


def _child(request: dict, fds: list) -> None:
    """In the forked child: become ``python -m vitkit ARGV`` in the asked folder and environment."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if request["setsid"]:
        os.setsid()
    tempfile.tempdir = None  # read TMPDIR again, as a new process would
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    sys.argv = ["vitkit", *request["argv"]]
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or _FRESH_THREADS))  # as a new process starts
    code = 0
    try:
        from vitkit.cli import main

        code = main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code if isinstance(code, int) else 1)


def _answer(conn: socket.socket, pid: int) -> None:
    """Tell the client its child's pid, then its exit status as Popen reports it (-N: killed by N)."""
    conn.sendall(f"{pid}\n".encode())
    status = os.waitpid(pid, 0)[1]
    try:
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    except OSError:
        pass  # the client went away
    conn.close()


_FRESH_THREADS = 1


def serve(path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (what torch's optimizers import on their first step)

    import vitkit.cli  # noqa: F401
    import vitkit.data  # noqa: F401
    import vitkit.train  # noqa: F401

    global _FRESH_THREADS
    _FRESH_THREADS = torch.get_num_threads()

    parent = os.getppid()

    def orphaned() -> None:  # the worker died without stopping the server (SIGKILL): end with it
        while os.getppid() == parent:
            time.sleep(1)
        Path(path).unlink(missing_ok=True)
        os.rmdir(os.path.dirname(path))
        os._exit(0)

    threading.Thread(target=orphaned, daemon=True).start()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(16)
    os.rename(path + ".new", path)  # the client waits for this name
    while True:
        conn, _ = listener.accept()
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        while not msg.endswith(b"\n"):
            msg += conn.recv(1 << 20)
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            _child(json.loads(msg), fds)
        for fd in fds:
            os.close(fd)
        threading.Thread(target=_answer, args=(conn, pid), daemon=True).start()


if __name__ == "__main__":
    serve(sys.argv[1])
