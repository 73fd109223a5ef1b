"""An export on the fly in a child process, for a process that lives on after it (``vitkit serve``).

The export leaves its machinery in the process that ran it: ``torch.export``, onnxscript and
OpenVINO's ONNX frontend stay imported and the allocator keeps what they freed. A server that
exported ViT-S/16 to OpenVINO int8 itself held 1,586 MiB after warm-up, one that exported it in a
child 1,065 MiB, as much as one serving the file ``vitkit convert`` wrote (1,053; 2-core Zen 4).
The child reads the model the parent saved, exports it and writes the file the parent then loads;
the calibration images are resolved in the parent, so a missing dataset or folder is the same one
line as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import torch
from torch import nn

from ..files import PathLike, work_folder
from ..models.serialize import save_pretrained
from ..signals import how_it_ended
from . import onnx_export, openvino
from .onnx_export import OnnxExportError
from .quantize import CalibrationSource, calibrates, calibration_images


def export_apart(model: nn.Module, path: PathLike, runtime: str, quantize: Optional[str] = None,
                 calibration: CalibrationSource = None) -> Path:
    """Write ``model`` for ``runtime`` (``onnxruntime``: ``.onnx``, ``openvino``: ``.xml``) at ``path`` as
    :func:`~.onnx_export.export_onnx` / :func:`~.openvino.export_openvino` would, from a child process (the
    model and images handed to it in a work folder beside ``path``, removed after). A failure in the child
    is one line (:class:`OnnxExportError`); its progress is shown as the export's own."""
    path = Path(path)
    if runtime not in ("onnxruntime", "openvino"):
        raise ValueError(f"an export runs for onnxruntime or openvino, not {runtime!r}")
    if calibration is not None and not calibrates(runtime, quantize):  # as each export refuses it here
        kind = "int8" if runtime == "openvino" else "int8-static"
        raise OnnxExportError(f"calibration images are used by {kind} quantization only")
    with work_folder(path.parent, path.name) as work:
        images = None
        if calibrates(runtime, quantize):  # resolved here: a missing folder or dataset is the usual one line
            purpose = (openvino if runtime == "openvino" else onnx_export).CALIBRATION_PURPOSE
            images = work / "calibration.npy"
            np.save(images, calibration_images(model, source=calibration, purpose=purpose).numpy(),
                    allow_pickle=False)
        saved = save_pretrained(model, work / "model")
        code, said = _run_child([sys.executable, "-m", "vitkit.deploy.apart", str(saved), str(path), runtime,
                                 quantize or "", str(images or "")])
        if code != 0:
            raise OnnxExportError(said or how_it_ended(code, "the export process"))
    return path


def _run_child(command: list) -> Tuple[int, str]:
    """Run the child in its own process group -> (exit code, the line it said why it failed). The line comes
    through a pipe (a full disk cannot lose it). The whole group ends with it: a stop here (Ctrl-C, SIGTERM)
    or the child killed would otherwise leave NNCF's process under it running. A second pipe is the parent's
    lifeline: where the parent is killed outright (SIGKILL, the OOM killer), its end closes and the child ends
    its group (it went on exporting, a minute of CPU under NNCF, owned by nobody)."""
    read, write = os.pipe()
    life_read, life_write = os.pipe()
    try:
        with _started([*command, str(write), str(life_read)], (write, life_read)) as child:
            for fd in (write, life_read):
                os.close(fd)
            write = life_read = -1
            try:
                code = child.wait()
            finally:  # a stop here, or a child killed under NNCF's process: none of them goes on
                _end_group(child)
        return code, os.read(read, 1 << 16).decode(errors="replace").strip()
    finally:
        for fd in (read, write, life_read, life_write):
            if fd >= 0:
                os.close(fd)


def _started(command: list, fds: Tuple[int, ...]) -> subprocess.Popen:
    """The child, started in a thread of its own: a stop (Ctrl-C, SIGTERM: Python raises it in the main thread)
    that landed inside Popen after the fork left a child that nobody owned, running on after the parent had
    stopped (a server's SIGTERM test saw it under load). If the stop lands while the thread starts it, its
    group is ended before the stop goes on."""
    started: list = []
    failed: list = []

    def start() -> None:
        try:
            started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True,
                                            pass_fds=fds))
        except BaseException as e:  # (OSError: said by the caller's thread)
            failed.append(e)

    starter = threading.Thread(target=start, name="vitkit-apart-start", daemon=True)
    starter.start()
    try:
        starter.join()
    except BaseException:
        starter.join()
        if started:
            _end_group(started[0])
        raise
    if failed:
        raise failed[0]
    return started[0]


def _end_group(child: subprocess.Popen) -> None:
    """Kill the child's process group and wait until it is gone: a process of it still writing would put
    files back into the work folder as it is removed (seen: NNCF's int8 IR left behind)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
        for _ in range(100):
            child.poll()  # the child reaped: its zombie would keep the group alive
            os.killpg(child.pid, 0)
            time.sleep(0.05)


def _export_here(saved: str, path: str, runtime: str, quantize: str, images: str) -> None:
    """The child's work: the saved model read back, exported as the parent asked."""
    from ..weights import from_pretrained
    from .onnx_export import export_onnx
    from .openvino import export_openvino

    model = from_pretrained(saved).eval()
    calibration = torch.from_numpy(np.load(images, allow_pickle=False)) if images else None
    export = export_openvino if runtime == "openvino" else export_onnx
    export(model, path, quantize=quantize or None, calibration=calibration)


def _end_with_parent(lifeline: int) -> None:
    """End this process's group (the child and NNCF's process under it) once the parent's end of ``lifeline``
    closes: the parent is gone, however it went."""
    def watch() -> None:
        while os.read(lifeline, 1):
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="vitkit-apart-lifeline", daemon=True).start()


if __name__ == "__main__":  # the child of export_apart: SAVED PATH RUNTIME QUANTIZE IMAGES PIPE LIFELINE
    from ..extras import first_line

    *arguments, pipe, lifeline = sys.argv[1:8]
    _end_with_parent(int(lifeline))
    try:
        _export_here(*arguments)
    except Exception as e:  # the parent raises it as one line
        os.write(int(pipe), first_line(e).encode())
        sys.exit(2)
