"""vitkit's tar shards against the reference reader/writer, the ``webdataset`` package.

``vitkit.data.shards`` says its shards are in webdataset's layout without depending on the
package: webdataset reads what ``folder_to_shards`` writes, and ``ShardDataset`` reads what
webdataset's ``ShardWriter`` writes, sample for sample (key, label, pixels).
"""

import io
import json

import numpy as np
import pytest
from PIL import Image

from vitkit.data.shards import ShardDataset, decode_record, folder_to_shards, iter_records

wds = pytest.importorskip("webdataset")

CLASSES = ("cat", "dog", "eel")


def noise(seed, h, w, channels=3):
    shape = (h, w, channels) if channels == 3 else (h, w)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def encode(arr, fmt):
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def rgb(im):
    return np.asarray(im.convert("RGB"))


def make_folder(root):
    """3 classes x 4 images: RGB PNG, JPEG (.jpg and .jpeg), grey PNG; every image different."""
    sources = {}  # file bytes -> class name
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i, (fmt, ext, channels) in enumerate([("PNG", "png", 3), ("JPEG", "jpg", 3), ("JPEG", "jpeg", 3),
                                                   ("PNG", "png", 1)]):
            data = encode(noise(10 * c + i, 6 + i, 9 - i, channels), fmt)
            (root / name / f"img{i}.{ext}").write_bytes(data)
            sources[data] = name
    return sources


def test_webdataset_reads_vitkit_shards(tmp_path):
    sources = make_folder(tmp_path / "folder")
    paths = folder_to_shards(tmp_path / "folder", tmp_path / "shards", max_per_shard=5, seed=3)
    assert len(paths) == 3  # 5 + 5 + 2 samples
    urls = [str(p) for p in paths]

    # vitkit's own view: keys from the raw records, (image, label) from ShardDataset in order
    records = [r for url in urls for r in iter_records(url, strict=True)]
    mine = [decode_record(r) for r in records]
    streamed = list(ShardDataset(tmp_path / "shards"))
    assert len(mine) == len(streamed) == len(sources) == 12
    for (im, label), (im2, label2) in zip(mine, streamed):
        assert label == label2 and np.array_equal(rgb(im), rgb(im2))

    # webdataset, raw: the same keys, the file bytes as they were, the label as an ASCII integer
    raw = list(wds.WebDataset(urls, shardshuffle=False))
    assert [s["__key__"] for s in raw] == [r.key for r in records]
    classes = json.loads((tmp_path / "shards" / "meta.json").read_text())["classes"]
    assert classes == list(CLASSES)
    assert (tmp_path / "shards" / "classes.txt").read_text().split() == list(CLASSES)
    exts = []
    for s, (_, label) in zip(raw, mine):
        (ext,) = [k for k in s if k in ("png", "jpg", "jpeg")]
        exts.append(ext)
        assert {k for k in s if not k.startswith("__")} == {ext, "cls"}
        assert int(s["cls"].decode("ascii")) == label
        assert sources[s[ext]] == classes[label]  # the label names the folder the file came from
    assert sorted(exts) == ["jpeg"] * 3 + ["jpg"] * 3 + ["png"] * 6

    # webdataset, decoded to PIL with its "cls" -> int handler: the same samples as vitkit's
    decoded = list(wds.WebDataset(urls, shardshuffle=False).decode("pil").to_tuple("__key__", "cls", "png;jpg;jpeg"))
    assert len(decoded) == 12
    for (key, cls, im), record, (mine_im, label) in zip(decoded, records, mine):
        assert key == record.key and cls == label and isinstance(cls, int)
        assert im.mode == mine_im.mode == "RGB"
        assert np.array_equal(np.asarray(im), np.asarray(mine_im))
    assert sorted(cls for _, cls, _ in decoded) == [0] * 4 + [1] * 4 + [2] * 4


def test_vitkit_reads_webdataset_shards(tmp_path):
    out = tmp_path / "wds"
    out.mkdir()
    (out / "classes.txt").write_text("".join(f"{c}\n" for c in CLASSES))  # vitkit's class-name file
    expected = []  # (key, label, RGB pixels)
    with wds.ShardWriter(str(out / "train-%06d.tar"), maxcount=4, verbose=0) as sink:
        for i in range(10):
            label = (3 * i + 1) % 3
            key = f"part.{i // 5}/img-{i:04d}"  # a folder in the key, with a dot in the folder's name
            if i % 3 == 0:  # a PIL image: webdataset encodes it (lossless)
                arr = noise(100 + i, 5 + i % 4, 7)
                sample = {"__key__": key, "png": Image.fromarray(arr), "cls": label}
            elif i % 3 == 1:  # JPEG bytes as they are
                data = encode(noise(100 + i, 8, 6), "JPEG")
                arr = rgb(Image.open(io.BytesIO(data)))
                sample = {"__key__": key, "jpg": data, "cls": label}
            else:  # grey PNG bytes
                grey = noise(100 + i, 4, 9, channels=1)
                arr = np.repeat(grey[..., None], 3, axis=2)
                sample = {"__key__": key, "png": encode(grey, "PNG"), "cls": label}
            sink.write(sample)
            expected.append((key, label, arr))
    shards = sorted(str(p) for p in out.glob("*.tar"))
    assert len(shards) == 3  # 4 + 4 + 2 samples

    ds = ShardDataset(out)  # the folder: its *.tar in order, classes from classes.txt, no meta.json
    assert ds.shards == shards and ds.classes == list(CLASSES)
    assert ds.samples_per_shard() == [4, 4, 2] and ds.num_samples == 10
    got = list(ds)
    assert len(got) == 10 and all(s is not None for s in got)
    records = [r for s in shards for r in iter_records(s, strict=True)]
    assert [r.key for r in records] == [k for k, _, _ in expected]
    for (im, label), (key, want_label, arr) in zip(got, expected):
        assert label == want_label
        assert im.mode == "RGB" and np.array_equal(np.asarray(im), arr), key

    # and webdataset itself agrees with both about what it wrote
    back = list(wds.WebDataset(shards, shardshuffle=False).decode("pil").to_tuple("__key__", "cls", "png;jpg"))
    assert [(k, c) for k, c, _ in back] == [(k, lab) for k, lab, _ in expected]
    assert all(np.array_equal(rgb(im), arr) for (_, _, im), (_, _, arr) in zip(back, expected))
