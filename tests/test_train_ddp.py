"""torchrun with 2 CPU processes (gloo) follows the same losses as 1 process at the same global batch."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import in_process, vitkit_here
from vitkit.data import fashion_mnist as fm

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")]

ARGS = ["--max-steps", "8", "--batch-size", "64", "--val-size", "100", "--precision", "fp32", "--log-every", "1",
        "--warmup-steps", "1", "--lr", "2e-3", "--crop-pad", "2", "--hflip", "--no-progress", "--threads", "1",
        "--random-erasing", "0", "--test-size", "100", "--json"]
# (erasing draws per rank by design: off for the equality; the losses compared are the training
# rows, so the scores at the end need few images)


def losses(run: Path):
    return [json.loads(line)["train_loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
            if "train_loss" in line]


def _torchrun() -> str:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun, "torchrun ships with torch"
    return torchrun


VERBS = {"train": ["train"], "pretrain-mpp": ["pretrain", "--objective", "mpp", "--no-fewshot"]}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """One torchrun job of 2 processes for two tests (each start of torchrun and its two processes cost 10-15 s on a
    2-core EPYC): each process calls ``python -m vitkit``'s main for each verb (a second run in a process is what a
    study does), then train() three times more: run b33 refused on every rank before joining the job (its batch),
    run c refused on every rank after joining it (its --init weights are not there), and run d, which cannot join
    a job its group has left."""
    runs = tmp_path_factory.mktemp("two")
    script = runs / "both.py"
    script.write_text("import os\nimport sys\nfrom vitkit.cli import main\nfrom vitkit.train import resolve_config, "
                      "train\n" + "".join(
                          f"if main({[*verb, *ARGS, '--runs-dir', str(runs), '--name', f'two-{name}']!r}):\n"
                          f"    sys.exit(2)\n" for name, verb in VERBS.items()) + f"""
for name, batch, init in (("b33", 33, None), ("c", 16, {str(runs / "missing")!r}), ("d", 16, None)):
    cfg = resolve_config("fmnist", max_steps=2, batch_size=batch, val_size=50, test_size=50,
                         model_args={{"depth": 1}}, runs_dir={str(runs)!r}, name=name, progress=False,
                         tensorboard=False, threads=1, init=init)
    try:
        train(cfg, log=lambda m: None)
    except Exception as e:  # b33 and c fail on every rank; d then cannot join a job its group has left
        os.write(2, f"{{name}} {{type(e).__name__}} {{e}}\\n".encode())  # one write: the ranks' lines never mix
""")
    job = subprocess.run([_torchrun(), "--standalone", "--nproc-per-node", "2", str(script)], capture_output=True,
                         text=True, timeout=300)
    return runs, job


def test_two_gloo_processes_match_one(tmp_path, two_processes):
    """Pre-training too: each rank keeps its part of masks drawn for the whole micro-batch (MPP's
    corruption draws the most: its mask, the 80/10/10 kinds and the source patches)."""
    runs, two = two_processes
    # the one process: this one (the command's own code, without a second start of Python and torch;
    # its --threads 1 is given back after)
    for name, verb in VERBS.items():
        assert vitkit_here(*verb, *ARGS, "--runs-dir", tmp_path, "--name", f"one-{name}") == 0, name
    assert two.returncode == 0, two.stderr[-2000:]
    summaries = [json.loads(line) for line in two.stdout.splitlines() if line.startswith("{")]
    assert [s["processes"] for s in summaries] == [2, 2]  # rank 0 reports, once per run
    for name in VERBS:
        a, b = losses(tmp_path / f"one-{name}"), losses(runs / f"two-{name}")
        assert len(a) == len(b) == 8, name
        assert a[-1] < a[0] - 0.05, f"the comparison needs a run that learns ({name})"
        # fp32 sums in another order (an all-reduce of two halves against one batch), grown over 8 steps: relative
        # to the loss, 0.5e-5 seen with AVX-512 kernels and 1.14e-5 with AVX2's (ATEN_CPU_CAPABILITY=avx2)
        assert max(abs(x - y) / max(1.0, abs(x)) for x, y in zip(a, b)) <= 3e-5, name


def _children(pid: int):
    """The processes whose parent is ``pid`` (torchrun's ranks), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return sorted(found)


@pytest.mark.parametrize("rank, how", [(0, "SIGTERM"), (1, "SIGTERM"), (1, "SIGKILL"), (0, "SIGKILL")])
def test_a_stop_of_one_rank_ends_the_whole_job(tmp_path, rank, how):
    """The stopped rank waited at the process group's closing barrier while the other waited in a step's
    all-reduce: both ranks and torchrun stayed (10 minutes, until killed). Now the job ends, the stop is
    said, and the run keeps its checkpoint to resume from; a rank killed outright left rank 0 with gloo's
    "unexpected RuntimeError ... Connection closed by peer" and no word of the checkpoint."""
    import os
    import signal
    import time

    args = [a for a in ARGS if a not in ("--json",)]
    args[args.index("--max-steps") + 1] = "100000"
    args[args.index("--batch-size") + 1] = "16"  # (a stop proves nothing more in steps of 64: 1-2 s more a job)
    job = subprocess.Popen([_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "vitkit", "train", *args,
                            "--checkpoint-every", "2", "--runs-dir", str(tmp_path), "--name", "stopped"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while not list((tmp_path / "stopped").glob("checkpoints/step_*.pt")):
            assert job.poll() is None and time.time() < deadline, "no checkpoint was written"
            time.sleep(0.2)
        ranks = _children(job.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[rank], getattr(signal, how))
        _, err = job.communicate(timeout=120)  # torchrun ends its other rank once one has ended
    finally:
        if job.poll() is None:
            job.kill()
            for pid in _children(job.pid):
                os.kill(pid, signal.SIGKILL)
    assert job.returncode != 0 and not _children(job.pid)
    assert "stopped by SIGTERM" in err or "interrupted" in err, err[-2000:]
    assert "unexpected" not in err, err[-2000:]
    if how == "SIGKILL":  # (rank 0 killed: rank 1 says it, where it said nothing)
        # the survivor meets the loss in its next all-reduce ("another process of the job stopped, so this one
        # did"), or on a loaded machine torchrun's SIGTERM first ("stopped by SIGTERM"): the checkpoint is said
        assert re.search(r"interrupted; \S+ keeps its checkpoint of step \d+: vitkit train --resume \S+ goes on "
                         r"from there", err), err[-2000:]
        assert "Traceback (most recent call last)" not in err.split("vitkit train: error:")[-1].split("\n", 1)[0]
    assert list((tmp_path / "stopped").glob("checkpoints/step_*.pt"))


def test_an_error_is_said_once_and_a_process_may_train_twice(tmp_path, two_processes, capsys, monkeypatch):
    """Under torchrun every rank said an input error (twice), and an error rank 0 alone met (its folder taken)
    left rank 1 with gloo's "unexpected RuntimeError ... please report it"; a second train() in one process
    (what a study does) waited for ever joining the process group again, and vitkit study ran on every rank."""
    args = [a for a in ARGS if a not in ("--json",)]
    args[args.index("--max-steps") + 1] = "2"
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("someone's")
    (tmp_path / "note.yaml").write_text('lr: "2e-3"\n')  # a config note: said once, as errors are
    # taken: rank 0 alone, after the job is joined; 33: every rank (before the data: test_an_undividable_batch...)
    for extra, said in ((["--name", "taken"], "run directory"), (["--name", "odd", "--batch-size", "33", "--config",
                                                                   str(tmp_path / "note.yaml")],
                                                                  "batch_size 33 must divide")):
        job = subprocess.run([_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "vitkit", "train", *args,
                              "--runs-dir", str(tmp_path), *extra], capture_output=True, text=True, timeout=300)
        lines = [line for line in job.stderr.splitlines() if line.startswith("vitkit train:")]
        errors = [line for line in lines if ": error: " in line]
        assert job.returncode != 0 and len(errors) == 1 and said in errors[0], job.stderr[-2000:]
        assert len(lines) == 1 + ("--config" in extra), lines
    # the study's refusal, in this process as torchrun's first process sees it (a job of its own proved no more:
    # its other process's silence is the 33 job's and the test below's, torchrun's variables the jobs' above)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    study = in_process(capsys, "study", "position-embeddings", "--smoke", "--work", tmp_path / "s")
    assert study.returncode == 2 and [line for line in study.stderr.splitlines() if line.startswith("vitkit")] == [
        "vitkit study: error: vitkit study runs in one process, not under torchrun (each rank would run all of it): "
        "run it without torchrun (vitkit train and pretrain use its processes)"], study.stderr[-2000:]
    runs, twice = two_processes  # (each process trained, then pre-trained)
    assert twice.returncode == 0, twice.stderr[-2000:]
    ran = [json.loads((runs / f"two-{name}" / "summary.json").read_text())["processes"] for name in VERBS]
    assert ran == [2, 2]
    assert "b33 ValueError batch_size 33 must divide" in twice.stderr  # (before joining: the group goes on)
    assert "c FileNotFoundError" in twice.stderr  # (after joining: the group ended)
    assert "d RuntimeError a run that stopped under torchrun ended this process's part in the job" in twice.stderr


def test_an_undividable_batch_is_refused_before_the_data_is_read(tmp_path, capsys, monkeypatch):
    """--batch-size 33 of 2 processes was refused after the data was read, the job joined and the model built
    (11 s of a torchrun job on a 2-core EPYC): now before, in one line."""
    from vitkit.train import loop

    def read(*a, **k):
        raise AssertionError("the data was read")

    monkeypatch.setattr(loop, "open_data", read)
    monkeypatch.setattr(loop.distributed, "setup", read)
    monkeypatch.setenv("WORLD_SIZE", "2")  # (no LOCAL_RANK: not torchrun's, so this process says its error)
    done = in_process(capsys, "train", *ARGS, "--batch-size", "33", "--runs-dir", tmp_path, "--name", "odd")
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "vitkit train: error: batch_size 33 must divide into 1 accumulation steps x 2 processes"], done.stderr
    assert not (tmp_path / "odd").exists()
    from vitkit.train import resolve_config, train  # the library's train(), what a script under torchrun calls

    cfg = resolve_config("fmnist", batch_size=33, runs_dir=str(tmp_path), name="lib", progress=False)
    with pytest.raises(ValueError, match="^batch_size 33 must divide into 1 accumulation steps x 2 processes$"):
        train(cfg, log=lambda m: None)
    assert not (tmp_path / "lib").exists()


@pytest.mark.parametrize("env, said", [({"WORLD_SIZE": "abc"}, "WORLD_SIZE must be a whole number of at least 1"),
                                       ({"WORLD_SIZE": "0"}, "WORLD_SIZE must be a whole number of at least 1"),
                                       ({"WORLD_SIZE": "2", "LOCAL_RANK": "x"}, "LOCAL_RANK must be a whole number")])
def test_a_launchers_variable_that_is_no_number_is_one_line_naming_it(tmp_path, capsys, monkeypatch, env, said):
    """WORLD_SIZE=abc said "invalid literal for int() with base 10: 'abc'"; LOCAL_RANK=x beside WORLD_SIZE=2 read as
    torchrun's second process, which leaves its error to the first: it ended without a word."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    done = in_process(capsys, "train", *ARGS, "--runs-dir", tmp_path, "--name", "r")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and said in done.stderr, done.stderr
    assert repr(list(env.values())[-1]) in done.stderr and not (tmp_path / "r").exists()


def test_each_rank_draws_its_own_dropout_and_drop_path_masks():
    """Every rank started from the seed the weights were initialised with, so under torchrun each drew the same
    drop-path masks for its part of the batch (recorded: [0,1,1,0] then [0,1,1,1] on both ranks). A step's
    layers draw from (seed, step, rank): other ranks, other masks; the same step again, the same masks (resume)."""
    from types import SimpleNamespace

    import torch

    from vitkit.models.layers import DropPath
    from vitkit.train.loop import seed_random_layers

    layer = DropPath(0.5).train()

    def masks(world, rank, step):
        run = SimpleNamespace(dist=SimpleNamespace(world=world, rank=rank), cfg=SimpleNamespace(seed=0))
        torch.manual_seed(0)  # the initialisation seed every rank shares
        seed_random_layers(run, step)
        return layer(torch.ones(64, 1, 1))[:, 0, 0] > 0

    assert not torch.equal(masks(2, 0, 5), masks(2, 1, 5))
    assert torch.equal(masks(2, 1, 5), masks(2, 1, 5)) and not torch.equal(masks(2, 1, 5), masks(2, 1, 6))
    assert torch.equal(masks(1, 0, 5), masks(1, 0, 6))  # one process: its one generator, as checkpoints save it


def test_a_rank_knows_when_its_machines_first_process_is_gone(tmp_path):
    """Rank 0 killed outright says nothing, and torchrun's SIGTERM may reach rank 1 before its next all-reduce
    meets the loss: rank 1 was silent too, and no line named the checkpoint (CI's red run of the SIGKILL case
    above). The check reads the siblings (the parent's other children) from /proc: a first process that runs
    counts, a dead one (a zombie) does not. (Forcing that order end to end sends rank 1 two SIGTERMs, ours and
    torchrun's, a race of its own: the mechanism is tested here and in the test below.)"""
    import os
    import signal

    probe = [sys.executable, "-c", "from vitkit.machine import first_process_alive; print(first_process_alive())"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "WORLD_SIZE": "2"}
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**env, "LOCAL_RANK": "0"})
    try:
        ask = lambda: subprocess.run(probe, env={**env, "LOCAL_RANK": "1"}, capture_output=True,  # noqa: E731
                                     text=True, check=True).stdout.strip()
        assert ask() == "True"
        os.kill(first.pid, signal.SIGKILL)
        for _ in range(100):  # killed, not yet reaped: a zombie
            if Path(f"/proc/{first.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            __import__("time").sleep(0.05)
        assert ask() == "False"
        first.wait()
        assert ask() == "False"
        alone = subprocess.run(probe, env={**env, "LOCAL_RANK": "0"}, capture_output=True, text=True, check=True)
        assert alone.stdout.strip() == "True"  # the first process itself
    finally:
        first.kill()
        first.wait()


def test_a_rank_that_leaves_its_error_to_the_first_waits_for_it_to_say_it(tmp_path):
    """A rank whose error the first process says exited at once, and torchrun stopped the first before its line (on
    a busy machine, still importing): the job ended without a word (a fresh clone's make test, 2026-12-06: the study
    above). It waits while its first process runs, and goes quietly when torchrun stops it, or once the first ends.
    (Both ranks wait beside one first process: one after another, their waits cost 7 s.)"""
    import os
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "WORLD_SIZE": "2"}
    said = [sys.executable, "-m", "vitkit", "study", "position-embeddings", "--smoke", "--work", str(tmp_path / "s")]
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**env, "LOCAL_RANK": "0"})
    seconds = []
    try:
        seconds += [subprocess.Popen(said, env={**env, "LOCAL_RANK": "1"}, stderr=subprocess.PIPE, text=True)
                   for _ in range(2)]
        time.sleep(4)  # (its error comes within a second)
        assert [s.poll() for s in seconds] == [None, None]
        seconds[0].send_signal(signal.SIGTERM)  # the first has failed: torchrun's SIGTERM ends the wait, without a line
        assert seconds[0].wait(timeout=30) == 2 and seconds[0].stderr.read() == ""
        assert seconds[1].poll() is None
        first.kill()  # the first said its line and ended: the other goes, without a line
        first.wait()
        assert seconds[1].wait(timeout=20) == 2 and seconds[1].stderr.read() == ""
    finally:
        first.kill()
        first.wait()
        for s in seconds:
            s.kill()
            s.wait()


def test_a_ctrl_c_is_never_read_as_another_ranks_death():
    """Every rank gets a terminal's Ctrl-C; one whose KeyboardInterrupt came late (a long C call) could find rank 0
    already gone and say "another process of the job stopped": only torchrun's SIGTERM is read that way."""
    from types import SimpleNamespace

    from vitkit.signals import Terminated
    from vitkit.train import loop

    rank1 = SimpleNamespace(main=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "first_process_alive", lambda: False)
        assert not loop._first_killed(rank1, KeyboardInterrupt())
        assert loop._first_killed(rank1, Terminated())
        assert not loop._first_killed(SimpleNamespace(main=True), Terminated())
