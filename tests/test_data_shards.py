"""Tar shards: folder round trip, patterns, the split across ranks and workers, order, bad samples."""

import io
import itertools
import json
import logging
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from vitkit.data.folder import BadImageError, collate_skip_bad
from vitkit.data.images import Skipped
from vitkit.data.shards import ShardDataset, _reading_plan, expand_braces, folder_to_shards, write_shards


def image_of(sample_id):
    """A 4x5 image whose pixel (0, 0) red value names it, the rest random."""
    arr = np.random.default_rng(sample_id).integers(0, 256, (4, 5, 3), dtype=np.uint8)
    arr[0, 0, 0] = sample_id
    return arr


def png_bytes(arr):
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def ident(sample):
    im, label = sample
    return int(np.asarray(im)[0, 0, 0]), label


def to_tensor(im):
    return torch.from_numpy(np.asarray(im).transpose(2, 0, 1).copy())


@pytest.fixture
def folder(tmp_path):
    """7 PNGs in 2 classes; returns (root, {id: (pixels, label)})."""
    root, truth = tmp_path / "folder", {}
    for sample_id in range(7):
        label = int(sample_id >= 4)
        path = root / ["ants", "bees"][label] / f"{sample_id}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image_of(sample_id)).save(path)
        truth[sample_id] = (image_of(sample_id), label)
    return root, truth


@pytest.fixture
def shards(folder, tmp_path):
    """The folder in 3 shards of 3, 3 and 1 samples."""
    root, truth = folder
    paths = folder_to_shards(root, tmp_path / "shards", max_per_shard=3)
    return paths, truth


def test_folder_round_trip(shards):
    paths, truth = shards
    assert [p.name for p in paths] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    meta = json.loads((paths[0].parent / "meta.json").read_text())
    assert meta["classes"] == ["ants", "bees"] and meta["shards"] == {p.name: n for p, n in zip(paths, [3, 3, 1])}
    assert (paths[0].parent / "classes.txt").read_text() == "ants\nbees\n"
    ds = ShardDataset(str(paths[0].parent / "shard-*.tar"))
    assert ds.classes == ["ants", "bees"] and ds.num_samples == 7
    got = list(ds)
    assert sorted(ident(s)[0] for s in got) == list(range(7))
    for im, label in got:
        sample_id = int(np.asarray(im)[0, 0, 0])
        assert np.array_equal(np.asarray(im), truth[sample_id][0]) and label == truth[sample_id][1]
    labels_in_order = [label for _, label in got]
    assert labels_in_order != sorted(labels_in_order), "folder_to_shards should mix the classes"


def test_write_shards_is_reproducible_and_checks_input(tmp_path):
    samples = [(png_bytes(image_of(i)), "png", i % 2) for i in range(3)]
    a = write_shards(samples, tmp_path / "a" / "s-%03d.tar", max_per_shard=2)
    b = write_shards(samples, tmp_path / "b" / "s-%03d.tar", max_per_shard=2)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    with tarfile.open(a[0]) as tar:
        assert tar.getnames() == ["000000000.png", "000000000.cls", "000000001.png", "000000001.cls"]
    with pytest.raises(ValueError, match="one %-field"):
        write_shards(samples, tmp_path / "c" / "shard.tar")
    with pytest.raises(ValueError, match="image extension"):
        write_shards([(b"x", "txt", 0)], tmp_path / "c" / "s-%d.tar")
    with pytest.raises(ValueError, match="below 2"):
        write_shards([(b"x", "png", 2)], tmp_path / "c" / "s-%d.tar", classes=["a", "b"])
    assert not list((tmp_path / "c").glob("*.tar")), "a failed shard must not be left behind"


def test_brace_patterns(shards):
    paths, _ = shards
    assert expand_braces("s-{000..002}.tar") == ["s-000.tar", "s-001.tar", "s-002.tar"]
    assert expand_braces("{a,b}-{8..10}") == ["a-8", "a-9", "a-10", "b-8", "b-9", "b-10"]
    folder = paths[0].parent
    ds = ShardDataset(str(folder / "shard-{000000..000002}.tar"))
    assert ds.shards == [str(p) for p in paths] and ShardDataset(folder).shards == ds.shards
    with pytest.raises(FileNotFoundError, match="1 of 4 shards not found, first: .*shard-000003.tar"):
        ShardDataset(str(folder / "shard-{000000..000003}.tar"))
    with pytest.raises(FileNotFoundError, match="no shards match"):
        ShardDataset(str(folder / "nope-*.tar"))


@pytest.mark.parametrize("num_shards,world_size,num_workers",
                         [(s, r, w) for s in range(1, 8) for r in range(1, 4) for w in range(1, 4)])
def test_every_sample_has_exactly_one_reader(num_shards, world_size, num_workers):
    per_shard = 5
    owners = {}
    for rank, worker in itertools.product(range(world_size), range(num_workers)):
        positions, modulus, residue = _reading_plan(num_shards, rank, world_size, worker, num_workers)
        for s in positions:
            for k in range(per_shard):
                if (k + s) % modulus == residue:
                    assert (s, k) not in owners, "read twice"
                    owners[(s, k)] = rank
    assert len(owners) == num_shards * per_shard, "sample lost"
    per_rank = np.bincount(list(owners.values()), minlength=world_size)
    assert per_rank.max() - per_rank.min() <= per_shard  # at most a shard apart


@pytest.mark.parametrize("max_per_shard", [3, 100])  # 3 shards for 2 ranks; 1 shard: split by sample
def test_two_ranks_disjoint_and_complete(folder, tmp_path, max_per_shard):
    root, _ = folder
    paths = folder_to_shards(root, tmp_path / "s", max_per_shard=max_per_shard)
    seen = [[ident(s) for s in ShardDataset(paths, rank=r, world_size=2, shuffle_buffer=2)] for r in (0, 1)]
    ids = [{i for i, _ in rank_seen} for rank_seen in seen]
    assert not ids[0] & ids[1] and ids[0] | ids[1] == set(range(7))
    assert len(seen[0]) + len(seen[1]) == 7


def test_epoch_length_keeps_ranks_in_step(shards):
    paths, _ = shards
    for epoch_length, expected in (("auto", 3), (5, 5)):
        lengths = []
        for rank in (0, 1):
            ds = ShardDataset(paths, rank=rank, world_size=2, shuffle_buffer=3, epoch_length=epoch_length)
            assert len(ds) == expected
            lengths.append(len([s for s in ds if s is not None]))
        assert lengths == [expected, expected]
    with pytest.raises(TypeError, match="epoch_length"):
        len(ShardDataset(paths))


def test_a_stale_meta_count_that_makes_an_epoch_repeat_its_samples_is_said(shards, caplog):
    """meta.json's per-shard counts x10 (shards rewritten with fewer samples): training said "300 images, 1.0
    epochs" and read the 30 real ones 10 times, without a word (evaluation warned)."""
    paths, _ = shards
    meta_path = Path(paths[0]).parent / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["shards"] = {name: 10 * n for name, n in meta["shards"].items()}
    meta_path.write_text(json.dumps(meta))
    with caplog.at_level(logging.INFO, logger="vitkit.data"):
        ds = ShardDataset(paths, rank=0, world_size=1, shuffle_buffer=3, epoch_length="auto")
        assert len(ds) == 70 and len(list(ds)) == 70  # as its counts say, 7 samples 10 times
    said = [r for r in caplog.records if "stale meta.json" in r.getMessage()]
    assert said and said[0].levelno == logging.WARNING and "gave 7 samples where meta.json's counts make its " \
        "epoch 70" in said[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vitkit.data"):  # an explicit length past the data: not called stale
        list(ShardDataset(paths, rank=0, world_size=1, shuffle_buffer=3, epoch_length=20))
    assert not [r for r in caplog.records if "stale" in r.getMessage()]


def test_same_seed_and_epoch_same_order(shards):
    paths, _ = shards
    ds = ShardDataset(paths, seed=3, shuffle_buffer=4)
    first = [ident(s) for s in ds]
    assert [ident(s) for s in ds] == first
    assert [ident(s) for s in ShardDataset(paths, seed=3, shuffle_buffer=4)] == first
    ds.set_epoch(1)
    second = [ident(s) for s in ds]
    assert second != first and sorted(second) == sorted(first)
    unshuffled = [ident(s) for s in ShardDataset(paths)]
    assert unshuffled == [ident(s) for s in ShardDataset(paths)]


def write_tar(path, members):
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_bad_samples_are_skipped_and_counted(tmp_path, caplog):
    good = png_bytes(image_of(1))
    shard = write_tar(tmp_path / "bad-0.tar", [
        ("a/k0.png", good), ("a/k0.cls", b"1"),
        ("a/k1.png", b"not a png at all"), ("a/k1.cls", b"0"),   # undecodable image
        ("a/k2.png", good),                                      # no label
        ("a/k3.png", good), ("a/k3.cls", b"one"),                # label not an integer
        ("a/k4.jpg", png_bytes(image_of(2))), ("a/k4.cls", b" 0\n"),
    ])
    with caplog.at_level(logging.WARNING, logger="vitkit.data"):
        out = list(ShardDataset(shard))
    assert [isinstance(s, Skipped) for s in out] == [False, True, True, True, False]
    assert [ident(s) for s in out if not isinstance(s, Skipped)] == [(1, 1), (2, 0)]
    assert f"{shard}:a/k1.png" in caplog.text and "no .cls label" in caplog.text and "not an integer" in caplog.text
    with pytest.raises(BadImageError, match=r"bad-0\.tar:a/k1\.png"):
        list(ShardDataset(shard, strict=True))
    # A shard cut short: what precedes the damage is read, the rest skipped with a warning.
    data = shard.read_bytes()
    cut = (tmp_path / "cut.tar")
    cut.write_bytes(data[:2600])
    with caplog.at_level(logging.WARNING, logger="vitkit.data"):
        partial = list(ShardDataset(cut))
    assert len(partial) < 6 and "is damaged" in caplog.text
    lost = [s for s in partial if isinstance(s, Skipped)]
    assert lost and lost[-1].name == f"{cut}#rest"  # the lost rest is counted, and named


def test_two_samples_under_one_key_are_skipped_not_merged(tmp_path, caplog):
    """Consecutive samples written under one key were read as one sample, the first's image and label lost
    without a word (half of a test split scored); webdataset refuses such a tar. Now the sample is skipped,
    named and counted; --strict-data stops."""
    wds = pytest.importorskip("webdataset")
    shard = write_tar(tmp_path / "dup-0.tar", [
        ("k0.png", png_bytes(image_of(1))), ("k0.cls", b"1"), ("k0.png", png_bytes(image_of(2))), ("k0.cls", b"0"),
        ("k1.png", png_bytes(image_of(3))), ("k1.cls", b"1")])
    with pytest.raises(ValueError, match="duplicate file name"):  # the reference: webdataset's reading of it
        list(wds.WebDataset(str(shard), shardshuffle=False))
    with caplog.at_level(logging.WARNING, logger="vitkit.data"):
        out = list(ShardDataset(shard))
    assert [isinstance(s, Skipped) for s in out] == [True, False] and ident(out[1]) == (3, 1)
    assert f"{shard}:k0" in caplog.text and "holds .png twice: two samples under one key" in caplog.text
    with pytest.raises(BadImageError, match=r"dup-0\.tar:k0: holds .png twice"):
        list(ShardDataset(shard, strict=True))


def test_a_shard_folder_holds_exactly_what_its_meta_lists_and_compressed_shards_are_read(shards, tmp_path):
    """A listed shard deleted read 10 of 12 test images, a stale unlisted one 22: each without a word. Now the
    folder is refused, naming the shard; a .tar.gz in the folder (which the reader takes) is read, not left out."""
    import gzip
    import shutil

    paths, truth = shards
    folder = tmp_path / "shards"
    assert len(list(ShardDataset(folder))) == 7
    shutil.copy(paths[0], folder / "old-000009.tar")
    with pytest.raises(FileNotFoundError, match=r"does not hold the shards its meta.json lists: 1 shard\(s\) are "
                                                r"not listed \(first: old-000009.tar"):
        ShardDataset(folder)
    (folder / "old-000009.tar").unlink()
    moved = tmp_path / "elsewhere.tar"
    shutil.move(paths[-1], moved)
    with pytest.raises(FileNotFoundError, match=rf"1 listed shard\(s\) are not there \(first: {Path(paths[-1]).name}"):
        ShardDataset(folder)
    plain = tmp_path / "plain"  # no meta.json's list: the tars there, compressed ones too
    plain.mkdir()
    shutil.copy(paths[0], plain / "a.tar")
    with open(moved, "rb") as src, gzip.open(plain / "b.tar.gz", "wb") as dst:
        dst.write(src.read())
    want = sorted(ident(s) for s in [*ShardDataset(paths[0]), *ShardDataset(str(moved))])
    assert sorted(ident(s) for s in ShardDataset(plain)) == want and len(want) == 4


def test_dataloader_with_a_worker(shards, tmp_path):
    paths, _ = shards
    bad = write_tar(tmp_path / "extra.tar", [("x.png", b"garbage"), ("x.cls", b"0")])
    ds = ShardDataset(list(paths) + [bad], transform=to_tensor, shuffle_buffer=3, seed=1)
    loader = DataLoader(ds, batch_size=3, num_workers=1, collate_fn=collate_skip_bad)
    images, skipped = [], []
    for x, labels, names in loader:
        if x is not None:
            assert x.shape[1:] == (3, 4, 5) and x.dtype == torch.uint8 and len(labels) == len(x)
            images += x[:, 0, 0, 0].tolist()
        skipped += names
    assert sorted(images) == list(range(7)) and skipped == [f"{bad}:x.png"]
    again = [i for x, _, _ in loader if x is not None for i in x[:, 0, 0, 0].tolist()]
    assert again == images, "same seed and epoch: same order through a worker"
