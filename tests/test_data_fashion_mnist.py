"""IDX reading, Fashion-MNIST location, and the real download code against a local server."""

import gzip
import hashlib
import http.server
import os
import threading
from functools import partial

import numpy as np
import pytest

from vitkit.data import fashion_mnist as fm
from vitkit.data import idx
from vitkit.data.idx import IDXError, read_idx


def write_idx(path, arr, compress=True):
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    (gzip.open if compress else open)(path, "wb").write(data)
    return data


def test_read_idx_raw_gz_and_damaged(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a.gz", arr)
    data = write_idx(tmp_path / "a", arr, compress=False)
    assert np.array_equal(read_idx(tmp_path / "a.gz"), arr) and np.array_equal(read_idx(tmp_path / "a"), arr)
    (tmp_path / "short").write_bytes(data[:-5])
    with pytest.raises(IDXError, match="truncated or corrupt"):
        read_idx(tmp_path / "short")
    (tmp_path / "junk").write_bytes(b"\x89PNG....")
    with pytest.raises(IDXError, match="not an IDX file"):
        read_idx(tmp_path / "junk")
    (tmp_path / "bad.gz").write_bytes(b"not gzip")
    with pytest.raises(IDXError, match="cannot read"):
        read_idx(tmp_path / "bad.gz")


def test_a_large_file_is_decoded_once_per_version_and_each_reader_gets_its_own_copy(tmp_path, monkeypatch):
    """A study trains many runs in one process: Fashion-MNIST's images are decompressed once. A
    file written again (another size, time or inode) is read again; a reader's changes stay its own."""
    monkeypatch.setattr(idx, "CACHE_FROM_BYTES", 0)
    monkeypatch.setattr(idx, "_decoded", type(idx._decoded)())
    decoded = []
    monkeypatch.setattr(idx, "_decode", lambda p, real=idx._decode: decoded.append(p.name) or real(p))
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a.gz", arr)
    first = read_idx(tmp_path / "a.gz")
    first[:] = 7
    assert np.array_equal(read_idx(tmp_path / "a.gz"), arr) and decoded == ["a.gz"]
    write_idx(tmp_path / "new.gz", arr[:1])
    (tmp_path / "new.gz").replace(tmp_path / "a.gz")  # replaced as a download replaces it: a new inode
    assert np.array_equal(read_idx(tmp_path / "a.gz"), arr[:1]) and decoded == ["a.gz", "a.gz"]
    (tmp_path / "a.gz").unlink()
    with pytest.raises(IDXError, match="cannot read"):
        read_idx(tmp_path / "a.gz")


def make_fake_set(folder):
    """Four tiny files with the official names (structure only)."""
    folder.mkdir(parents=True, exist_ok=True)
    for (split, kind), stem in fm.FILES.items():
        arr = np.zeros((3, 28, 28), np.uint8) if kind == "images" else np.array([1, 2, 3], np.uint8)
        write_idx(folder / (stem + ".gz"), arr)
    return folder


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No system copy, an empty user cache, no VITKIT_DATA."""
    monkeypatch.setattr(fm, "DEBIAN_DIR", tmp_path / "no-debian")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("VITKIT_DATA", raising=False)
    return tmp_path


def test_locate_order_and_explicit_folder(isolated, monkeypatch):
    with pytest.raises(fm.DatasetNotFound, match="train-images-idx3-ubyte"):
        fm.locate(isolated / "typo")
    env = make_fake_set(isolated / "env" / "fashion-mnist")
    monkeypatch.setenv("VITKIT_DATA", str(isolated / "env"))
    assert fm.locate() == env
    explicit = make_fake_set(isolated / "mine")
    assert fm.locate(explicit) == explicit


def serve(folder):
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def test_download_checks_checksums(isolated):
    remote = make_fake_set(isolated / "remote")
    sums = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in remote.iterdir()}
    server, url = serve(remote)
    try:
        got = fm.locate(base_url=url, checksums=sums)
        assert got == fm.user_cache_dir() and sorted(p.name for p in got.iterdir()) == sorted(sums)
        for p in list(got.iterdir()):
            p.unlink()
        bad = dict(sums, **{"t10k-images-idx3-ubyte.gz": "0" * 32})
        with pytest.raises(fm.DatasetNotFound, match="checksum mismatch"):
            fm.locate(base_url=url, checksums=bad)
        assert not (got / "t10k-images-idx3-ubyte.gz").exists()
        assert not [p for p in got.iterdir() if p.name.endswith(".tmp")], "half-written file left behind"
    finally:
        server.shutdown()


def test_offline_message_says_how_to_get_it(isolated):
    with pytest.raises(fm.DatasetNotFound, match="apt-get install dataset-fashion-mnist"):
        fm.locate(base_url="http://127.0.0.1:9/")  # nothing listens on the discard port
    with pytest.raises(fm.DatasetNotFound, match="VITKIT_DATA"):
        fm.locate(download=False)


real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")


@real
def test_real_fashion_mnist_splits():
    train, test = fm.load_split("train"), fm.load_split("test")
    assert train.images.shape == (60_000, 28, 28) and test.images.shape == (10_000, 28, 28)
    assert np.bincount(train.labels).tolist() == [6000] * 10 and np.bincount(test.labels).tolist() == [1000] * 10
    assert train.images.dtype == np.uint8 and 60 < train.images.mean() < 90


@real
def test_other_idx_files_under_fashion_mnists_names_are_said(tmp_path):
    """MNIST and KMNIST ship under the same four file names: they were read as Fashion-MNIST, their digits named
    't-shirt', 'trouser', ..., without a word. The decoded arrays are checked (the files' compression varies)."""
    import shutil
    import warnings

    for name in os.listdir(fm.DEBIAN_DIR):
        shutil.copy(fm.DEBIAN_DIR / name, tmp_path / name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fm.load_split("test", tmp_path)  # the real files: nothing said
    test = fm.load_split("test")
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", ((test.labels + 1) % 10).astype(np.uint8))
    with pytest.warns(UserWarning, match=r"under Fashion-MNIST's names whose test split is not Fashion-MNIST's"):
        fm.load_split("test", tmp_path)


def test_registered_fashion_mnist_models_expect_the_datasets_statistics():
    """models/ cannot import data/, so the statistics are written twice; they must agree,
    and with the dataset table training runs normalise by."""
    from vitkit.data import datasets
    from vitkit.models import get_model_config

    assert datasets.stats("fashion-mnist") == (fm.MEAN, fm.STD)
    for name in ("vit_fmnist", "vit_fmnist_hybrid"):
        config = get_model_config(name)
        assert (config.mean, config.std) == (fm.MEAN, fm.STD), name
