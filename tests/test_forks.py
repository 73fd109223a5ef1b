"""tests/forks.py's children answer as ``python -m vitkit`` processes do: the same output and exit
status, their own pid, folder and environment, and a signal's death reported as Popen reports it."""

import json
import os
import signal
import subprocess
import sys

import forks
import vitkit


def real(*argv, **kw):
    return subprocess.run([sys.executable, "-m", "vitkit", *map(str, argv)], capture_output=True, text=True, **kw)


def test_a_forked_command_says_what_a_new_process_says(tmp_path):
    vitkit.create_model("vit_fmnist").save_pretrained(tmp_path / "m")
    for argv in (["info", "m"], ["train", "--bogus"], ["info", "nothing-here"]):
        want, got = real(*argv, cwd=tmp_path), forks.run(*argv, cwd=tmp_path)
        assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr), argv
    assert forks.run("info", "m").returncode == 2  # the folder was the child's own: here there is no m


def test_a_forked_server_is_a_process_of_its_own_and_dies_by_its_signal(tmp_path):
    vitkit.create_model("vit_fmnist").save_pretrained(tmp_path / "m")
    proc = forks.popen("serve", tmp_path / "m", "--port", "0", "--json", stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        assert json.loads(proc.stdout.readline())["port"] > 0
        assert proc.pid != os.getpid() and proc.poll() is None
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:  # forked from the server, not from this worker
            assert b"forks.py" in f.read()
        proc.kill()
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.stdout.close()
