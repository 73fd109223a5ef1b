"""`make test` runs two pytest-xdist workers with ``--dist loadgroup``; the tests of a module
that share a module-scoped fixture (a pretraining run, a trained model) must stay on one worker,
or the fixture is built once per worker (pytest 9.2 with xdist 3.8 silently lost the groups:
three minutes more of the suite). Checked on a small suite of its own, run as `make test` runs."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("xdist")


def test_a_module_fixture_keeps_its_tests_on_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (tmp_path / "test_shared.py").write_text(textwrap.dedent("""
        import os
        import pytest

        @pytest.fixture(scope="module")
        def built():
            return os.environ.get("PYTEST_XDIST_WORKER")

        @pytest.mark.parametrize("i", range(6))
        def test_uses_it(built, i, tmp_path_factory):
            with open(os.environ["WHO_RAN"], "a") as f:
                f.write(f"{i} {built} {os.environ['PYTEST_XDIST_WORKER']}\\n")

        @pytest.mark.parametrize("i", range(6))
        def test_alone(i):
            pass
    """))
    who = tmp_path / "who_ran.txt"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "WHO_RAN": str(who)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split() for line in who.read_text().splitlines()]
    assert len(rows) == 6
    assert len({worker for _, _, worker in rows}) == 1, rows  # one worker ran them all
    assert all(built == worker for _, built, worker in rows)  # and built the fixture itself, once
