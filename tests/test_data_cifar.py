"""CIFAR binary-version decoding on tiny synthetic files in the official layout."""

import hashlib
import http.server
import tarfile
import threading
from functools import partial

import numpy as np
import pytest

from vitkit.data import cifar
from vitkit.data.fashion_mnist import DatasetNotFound


def planes(n, seed):
    """Random R, G, B planes (n, 3, 32, 32), as the file stores them."""
    return np.random.default_rng(seed).integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)


def records(label_bytes, pixel_planes):
    """The official record: label byte(s), then the R, G and B planes, each row-major."""
    return b"".join(bytes(lab) + p.tobytes() for lab, p in zip(label_bytes, pixel_planes))


def make_cifar10(folder, n=3, meta=True):
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for i, name in enumerate(cifar.VARIANTS["cifar10"].data_files):
        px, labels = planes(n, seed=i), [[(i + k) % 10] for k in range(n)]
        (folder / name).write_bytes(records(labels, px))
        written[name] = (px, [lab[0] for lab in labels])
    if meta:
        (folder / "batches.meta.txt").write_text("\n".join(f"name{i}" for i in range(10)) + "\n\n")
    return written


def make_cifar100(folder, n=4):
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for i, name in enumerate(["train.bin", "test.bin"]):
        px = planes(n, seed=10 + i)
        labels = [[k % 20, 99 - k] for k in range(n)]  # coarse, then fine
        (folder / name).write_bytes(records(labels, px))
        written[name] = (px, labels)
    (folder / "fine_label_names.txt").write_text("\n".join(f"fine{i}" for i in range(100)) + "\n")
    return written


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """An empty user cache, no VITKIT_DATA."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("VITKIT_DATA", raising=False)
    return tmp_path


def test_record_layout_lands_in_hwc():
    px = np.zeros((1, 3, 32, 32), np.uint8)
    px[0, 0, 3, 5] = 255   # red plane, row 3, column 5
    px[0, 1, 7, 1] = 128   # green plane, row 7, column 1
    px[0, 2] = 9           # blue plane everywhere
    images, labels = cifar.decode_records(records([[7]], px), cifar.VARIANTS["cifar10"], "fine", "x")
    assert images.shape == (1, 32, 32, 3) and images.dtype == np.uint8 and labels.tolist() == [7]
    assert images[0, 3, 5].tolist() == [255, 0, 9] and images[0, 7, 1].tolist() == [0, 128, 9]
    assert images[0, 5, 3].tolist() == [0, 0, 9], "rows and columns swapped"


def test_cifar10_folder_splits_and_meta(isolated):
    written = make_cifar10(isolated / "data" / "cifar-10-batches-bin")
    train = cifar.load_split("train", isolated / "data", "cifar10", download=False)
    test = cifar.load_split("test", isolated / "data" / "cifar-10-batches-bin", download=False)
    assert len(train) == 15 and len(test) == 3
    assert train.classes == [f"name{i}" for i in range(10)] and train.labels.dtype == np.int64
    px, labels = written["data_batch_2.bin"]
    assert np.array_equal(train.images[3:6], px.transpose(0, 2, 3, 1)) and train.labels[3:6].tolist() == labels
    assert np.array_equal(test.images, written["test_batch.bin"][0].transpose(0, 2, 3, 1))


def test_cifar10_builtin_names_without_meta(isolated):
    make_cifar10(isolated / "c10", meta=False)
    assert cifar.load_split("test", isolated / "c10", download=False).classes == cifar.CIFAR10_CLASSES
    with pytest.raises(ValueError, match="'fine'"):
        cifar.load_split("test", isolated / "c10", label="coarse", download=False)


def test_cifar100_fine_and_coarse(isolated):
    written = make_cifar100(isolated / "cifar-100-binary")
    fine = cifar.load_split("train", isolated, "cifar100", download=False)
    coarse = cifar.load_split("train", isolated, "cifar100", label="coarse", download=False)
    px, labels = written["train.bin"]
    assert np.array_equal(fine.images, px.transpose(0, 2, 3, 1)) and np.array_equal(coarse.images, fine.images)
    assert fine.labels.tolist() == [lab[1] for lab in labels] and fine.classes[0] == "fine0"
    assert coarse.labels.tolist() == [lab[0] for lab in labels]
    assert coarse.classes == cifar.CIFAR100_COARSE_CLASSES  # no coarse meta file: built-in names
    fine = cifar.CIFAR100_FINE_CLASSES
    assert len(fine) == 100 and fine == sorted(fine)


def make_archive(folder, archive):
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return archive


def test_reads_tar_gz_without_extracting(isolated, monkeypatch):
    written = make_cifar100(isolated / "src" / "cifar-100-binary")
    archive = make_archive(isolated / "src" / "cifar-100-binary", isolated / "cifar-100-binary.tar.gz")
    before = sorted(p.name for p in isolated.iterdir())
    test = cifar.load_split("test", isolated, "cifar100", download=False)
    assert test.source == str(archive) and sorted(p.name for p in isolated.iterdir()) == before
    assert np.array_equal(test.images, written["test.bin"][0].transpose(0, 2, 3, 1))
    assert test.classes[5] == "fine5"
    monkeypatch.setenv("VITKIT_DATA", str(isolated))  # found through the environment as well
    assert cifar.locate("cifar100", download=False) == archive


def test_wrong_size_and_bad_label_name_the_file(isolated):
    folder = isolated / "cifar-10-batches-bin"
    make_cifar10(folder)
    data = (folder / "data_batch_3.bin").read_bytes()
    (folder / "data_batch_3.bin").write_bytes(data[:-100])
    with pytest.raises(ValueError, match=r"data_batch_3\.bin.*not a whole number of 3073-byte"):
        cifar.load_split("train", folder, download=False)
    (folder / "test_batch.bin").write_bytes(b"\x0a" + data[1:3073])  # label 10 in a 10-class set
    with pytest.raises(ValueError, match=r"test_batch\.bin.*label 10, outside 0-9"):
        cifar.load_split("test", folder, download=False)


def test_missing_folder_lists_expected_files(isolated):
    with pytest.raises(DatasetNotFound, match=r"data_batch_1\.bin.*cifar-10-binary\.tar\.gz"):
        cifar.load_split("train", isolated / "typo", download=False)
    (isolated / "cifar-10-batches-py").mkdir()
    (isolated / "cifar-100-python").mkdir()
    for variant in ("cifar10", "cifar100"):
        with pytest.raises(DatasetNotFound, match="python version, a pickle"):
            cifar.locate(variant, isolated, download=False)
    with pytest.raises(DatasetNotFound, match="VITKIT_DATA"):
        cifar.locate("cifar100", download=False)


def test_download_is_checked_and_atomic(isolated):
    make_cifar10(isolated / "remote" / "cifar-10-batches-bin")
    archive = make_archive(isolated / "remote" / "cifar-10-batches-bin", isolated / "remote" / "c10.tar.gz")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(isolated / "remote"))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/c10.tar.gz"
    try:
        with pytest.raises(DatasetNotFound, match="checksum mismatch"):
            cifar.locate("cifar10", url=url, md5="0" * 32)
        cache = cifar.user_cache_dir()
        assert not cache.exists(), "half-written or unchecked file, or the empty folder made for it, left behind"
        got = cifar.locate("cifar10", url=url, md5=md5)
        assert got == cache / "cifar-10-binary.tar.gz"
        assert len(cifar.load_split("test", got.parent, download=False)) == 3
    finally:
        server.shutdown()
    with pytest.raises(DatasetNotFound, match="download from"):
        cifar.locate("cifar100", url="http://127.0.0.1:9/x.tar.gz")  # nothing listens on the discard port


def test_unknown_variant_and_split(tmp_path):
    with pytest.raises(ValueError, match="variant must be"):
        cifar.load_split("train", tmp_path, variant="cifar1000")
    with pytest.raises(ValueError, match="split must be"):
        cifar.load_split("val", tmp_path)
