"""ImageFolder on real generated files: every mode, EXIF rotation, and the broken files of real collections."""

import logging
import os

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from vitkit.data.folder import BadImageError, ImageFolder, collate_skip_bad, decode_image


def noise(h, w, c=3, seed=0):
    shape = (h, w) if c == 1 else (h, w, c)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def to_tensor(im):
    arr = np.asarray(im)
    return torch.from_numpy((arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)).copy())


def to_tensor_8x8(im):
    return to_tensor(im.resize((8, 8)))


def jpeg_with_orientation(path):
    """A 30x20 (w x h) JPEG whose top-left 10x10 is red, tagged 'rotate 90 degrees clockwise'."""
    arr = np.zeros((20, 30, 3), np.uint8)
    arr[:10, :10] = (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(arr).save(path, quality=95, exif=exif)


@pytest.fixture
def collection(tmp_path):
    root = tmp_path / "photos"
    cats, dogs = root / "cats", root / "dogs"
    cats.mkdir(parents=True)
    dogs.mkdir()
    Image.fromarray(noise(12, 20)).save(cats / "rgb.jpg")
    Image.fromarray(noise(10, 10, c=1)).save(cats / "grey.png")
    Image.new("CMYK", (16, 8), (0, 255, 255, 0)).save(cats / "cmyk.jpg")  # pure red in CMYK
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[..., 2] = 255
    rgba[:4, ..., 3] = 255  # top half opaque blue, bottom half transparent
    Image.fromarray(rgba, "RGBA").save(dogs / "rgba.png")
    palette = Image.new("P", (6, 6), 1)
    palette.putpalette([0, 0, 0, 0, 255, 0] + [0] * 762)
    palette.putpixel((0, 0), 0)
    palette.save(dogs / "palette.png", transparency=0)  # index 0 transparent, index 1 green
    Image.fromarray((np.arange(64).reshape(8, 8) * 1000).astype(np.uint16)).save(dogs / "deep.png")
    jpeg_with_orientation(dogs / "rotated.jpeg")
    Image.fromarray(noise(64, 64, seed=3)).save(tmp_path / "whole.jpg", quality=95)
    data = (tmp_path / "whole.jpg").read_bytes()
    (dogs / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (cats / "empty.png").write_bytes(b"")
    (dogs / "notes.jpg").write_text("these are not pixels\n")
    (dogs / "README.txt").write_text("ignored: not an image extension\n")
    return root


GOOD = {"cats": ["cmyk.jpg", "grey.png", "rgb.jpg"],
        "dogs": ["deep.png", "palette.png", "rgba.png", "rotated.jpeg"]}


def test_header_scan_skips_empty_and_non_images(collection, caplog):
    with caplog.at_level(logging.WARNING, logger="vitkit.data"):
        ds = ImageFolder(collection)
    assert ds.classes == ["cats", "dogs"]
    assert sorted(p.rsplit("/", 1)[-1] for p, _ in ds.skipped) == ["empty.png", "notes.jpg"]
    assert dict(ds.skipped)[str(collection / "cats" / "empty.png")].startswith("empty file")
    assert str(collection / "dogs" / "notes.jpg") in caplog.text and "empty.png" in caplog.text
    # README.txt is no image by its name: left out, and said (once, with its kind)
    assert f"left out 1 file(s) of {collection} without an image extension (.txt x1)" in caplog.text
    assert "beside its class folders" not in caplog.text


def test_images_beside_the_class_folders_are_said_not_dropped_in_silence(collection, caplog):
    """An image at the top of the split, beside the class folders, has no class: it was left out of every count
    without a word (a whole class's images left there by mistake went unnoticed)."""
    import shutil

    shutil.copy(collection / "cats" / "rgb.jpg", collection / "stray.jpg")
    with caplog.at_level(logging.WARNING, logger="vitkit.data"):
        ds = ImageFolder(collection)
    assert f"left out 1 image(s) of {collection} that lie beside its class folders, in no class (stray.jpg)" \
        in caplog.text
    assert all("stray" not in p for p, _ in ds.samples + ds.skipped)
    # The header check cannot see the truncation: the file is listed and fails when loaded.
    names = [p.rsplit("/", 1)[-1] for p, _ in ds.samples]
    assert names == GOOD["cats"] + sorted(GOOD["dogs"] + ["truncated.jpg"])
    bad = ds[names.index("truncated.jpg")]
    assert bad.name.endswith("truncated.jpg") and "image file is truncated" in bad.reason + caplog.text


def test_full_scan_catches_truncation(collection):
    ds = ImageFolder(collection, verify="full")
    assert len(ds) == 7 and sorted(p.rsplit("/", 1)[-1] for p, _ in ds.skipped) == \
        ["empty.png", "notes.jpg", "truncated.jpg"]
    assert all(ds[i] is not None for i in range(len(ds)))
    assert ImageFolder(collection, verify="full", scan_threads=2).skipped == ds.skipped
    unchecked = ImageFolder(collection, verify="none")  # only the empty file is known before loading
    assert [p.rsplit("/", 1)[-1] for p, _ in unchecked.skipped] == ["empty.png"] and len(unchecked) == 9


def test_every_mode_decodes_to_rgb(collection):
    ds = ImageFolder(collection, transform=to_tensor, verify="full")
    out = {p.rsplit("/", 1)[-1]: ds[i] for i, (p, _) in enumerate(ds.samples)}
    for name, (x, label) in out.items():
        assert x.dtype == torch.uint8 and x.shape[0] == 3, name
        assert label == (0 if name in GOOD["cats"] else 1)
    assert out["rgb.jpg"][0].shape == (3, 12, 20) and out["grey.png"][0].shape == (3, 10, 10)
    grey = out["grey.png"][0]
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[0], grey[2])
    assert out["cmyk.jpg"][0][:, 4, 8].tolist() == pytest.approx([255, 0, 0], abs=3)
    rgba = out["rgba.png"][0]
    assert rgba[:, 0, 0].tolist() == [0, 0, 255] and rgba[:, 7, 0].tolist() == [255, 255, 255]
    palette = out["palette.png"][0]
    assert palette[:, 0, 0].tolist() == [255, 255, 255] and palette[:, 3, 3].tolist() == [0, 255, 0]
    deep = out["deep.png"][0][0]  # 16-bit values 0..63000 are scaled, not clipped at 255
    assert deep[0, 0] == 0 and deep[7, 7] == round(63000 * 255 / 65535) and deep[0, 1] == round(1000 * 255 / 65535)


def test_exif_orientation_is_applied(collection):
    im = decode_image(collection / "dogs" / "rotated.jpeg")
    assert im.size == (20, 30), "stored 30x20 with orientation 6 must come out 20 wide, 30 high"
    arr = np.asarray(im).astype(int)
    # The red top-left went top-right (the centre of the block: JPEG blurs its edges).
    assert arr[2:8, -8:-2].mean(axis=(0, 1)) == pytest.approx([255, 0, 0], abs=12)
    assert arr[2:8, 2:8].mean() < 12 and arr[-8:-2, -8:-2].mean() < 12


def test_one_channel(collection):
    ds = ImageFolder(collection, transform=to_tensor, channels=1, verify="full")
    x, _ = ds[ds.samples.index((str(collection / "cats" / "cmyk.jpg"), 0))]
    assert x.shape == (1, 8, 16)


def test_strict_names_the_file(collection, tmp_path):
    with pytest.raises(BadImageError, match="empty.png: empty file"):
        ImageFolder(collection, strict=True)
    (collection / "cats" / "empty.png").unlink()
    (collection / "dogs" / "notes.jpg").unlink()
    ds = ImageFolder(collection, strict=True)
    with pytest.raises(BadImageError, match=r"truncated\.jpg: OSError: image file is truncated"):
        ds[[p for p, _ in ds.samples].index(str(collection / "dogs" / "truncated.jpg"))]


def test_dataloader_drops_and_counts_bad_files(collection):
    ds = ImageFolder(collection, transform=to_tensor_8x8)  # header scan: the truncated file gets through
    loader = DataLoader(ds, batch_size=3, num_workers=1, collate_fn=collate_skip_bad)
    seen, skipped, labels = 0, [], []
    for images, batch_labels, names in loader:
        if images is not None:
            assert images.shape[1:] == (3, 8, 8) and len(images) == len(batch_labels)
            seen += len(images)
            labels += batch_labels.tolist()
        skipped += names
    assert (seen, len(skipped), len(ds.skipped)) == (7, 1, 2)
    assert skipped == [str(collection / "dogs" / "truncated.jpg")]  # named, not just counted
    assert labels == [0, 0, 0, 1, 1, 1, 1]


def test_collate_of_all_bad_batch():
    from vitkit.data.images import Skipped

    images, labels, names = collate_skip_bad([None, Skipped("a.png", "truncated")])
    assert images is None and labels.shape == (0,) and names == ("<unnamed sample>", "a.png")


def test_empty_and_missing_folders(tmp_path):
    with pytest.raises(FileNotFoundError, match="image folder not found: .*nowhere"):
        ImageFolder(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=f"no class subfolders in {tmp_path / 'empty'}"):
        ImageFolder(tmp_path / "empty")
    (tmp_path / "flat").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "flat" / "a.png")
    with pytest.raises(ValueError, match="holds 1 images directly"):
        ImageFolder(tmp_path / "flat")
    (tmp_path / "noimages" / "cls").mkdir(parents=True)
    (tmp_path / "noimages" / "cls" / "a.txt").write_text("x")
    with pytest.raises(ValueError, match=f"no image files .* of {tmp_path / 'noimages'}"):
        ImageFolder(tmp_path / "noimages")
    (tmp_path / "allbad" / "cls").mkdir(parents=True)
    (tmp_path / "allbad" / "cls" / "a.jpg").write_bytes(b"")
    with pytest.raises(ValueError, match="none of the 1 image files"):
        ImageFolder(tmp_path / "allbad")


def test_linked_folders_are_followed_and_a_loop_lists_each_image_once(tmp_path):
    """Symbolic links are followed, as torchvision's ImageFolder follows them (the same samples, in
    the same order); a link back up the tree (sub/up -> ..) listed every image again at each depth,
    about 40 times over, for training as for predict; now each real folder is read once."""
    import os

    import torchvision

    from vitkit.data.folder import image_files

    for path in ("train/cat/a.png", "extra/b.png", "train/dog/c.png"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(noise(8, 8)).save(tmp_path / path)
    os.symlink(tmp_path / "extra", tmp_path / "train" / "cat" / "more")  # a dataset assembled from links
    theirs = torchvision.datasets.ImageFolder(str(tmp_path / "train")).samples
    assert ImageFolder(tmp_path / "train", progress=False).samples == theirs
    assert len(theirs) == 3
    (tmp_path / "train" / "cat" / "sub").mkdir()
    os.symlink("..", tmp_path / "train" / "cat" / "sub" / "up")  # a loop
    assert ImageFolder(tmp_path / "train", progress=False).samples == theirs
    assert image_files([tmp_path / "train"]) == [path for path, _ in theirs]


def test_a_fifo_or_a_device_among_the_images_is_said_as_one(tmp_path):
    """A FIFO and a link to /dev/zero named x.png were skipped as "empty file (0 bytes)"."""
    from vitkit.data.folder import check_image

    os.mkfifo(tmp_path / "fifo.png")
    (tmp_path / "zero.png").symlink_to("/dev/zero")
    (tmp_path / "empty.png").write_bytes(b"")
    assert check_image(tmp_path / "fifo.png") == check_image(tmp_path / "zero.png") == \
        "not a regular file (a link to nothing, a FIFO or a device)"
    assert check_image(tmp_path / "empty.png") == "empty file (0 bytes)"


def test_a_data_dir_that_is_a_file_is_said_as_one(tmp_path):
    """It was said "data folder not found" for a file that is there."""
    from vitkit.data.datasets import DatasetNotFound, file_split_dirs

    (tmp_path / "f").write_text("x")
    with pytest.raises(DatasetNotFound, match=r"--data-dir .*f is a file: give the folder that holds train/"):
        file_split_dirs("folder", str(tmp_path / "f"))


def test_class_names_in_two_unicode_forms_are_said_as_such():
    """'Café' precomposed in the training folders and combined in the test ones was refused as other classes
    whose names print the same: "only in the weights: 'Café'; only in the data: 'Café'"."""
    import unicodedata

    from vitkit.data.datasets import class_difference

    nfc, nfd = unicodedata.normalize("NFC", "Café"), unicodedata.normalize("NFD", "Café")
    said = class_difference([nfc, "bag"], [nfd, "bag"])
    assert said.startswith("the same names in two Unicode forms ('Caf\\xe9' in the weights, 'Cafe\\u0301' in the "
                           "data")
    assert class_difference(["a", "b"], ["a", "c"]).startswith("other classes")


def test_a_one_channel_model_trained_on_colour_images_says_they_are_read_as_grey(tmp_path, capsys):
    """The default model has one channel: a folder of red and green images trained at chance (both colours are
    about the same grey), and nothing said so. A folder of grey images saved as RGB says nothing."""
    from conftest import in_process

    def pixel(name, c):
        return (90,) * 3 if name == "grey" else (255, 0, 0) if c == "red" else (0, 130, 0)

    for name in ("colour", "grey"):
        for split, n in (("train", 6), ("test", 2)):
            for c in ("red", "green"):
                (tmp_path / name / split / c).mkdir(parents=True)
                for i in range(n):
                    Image.new("RGB", (32, 32), pixel(name, c)).save(tmp_path / name / split / c / f"{i}.png")
    said = {}
    for name in ("colour", "grey"):
        done = in_process(capsys, "train", "--dataset", "folder", "--data-dir", tmp_path / name, "--max-steps", "1",
                          "--batch-size", "4", "--val-size", "2", "--workers", "0", "--threads", "1",
                          "--runs-dir", tmp_path / "runs", "--name", name, "--no-progress", "--no-tensorboard")
        assert done.returncode == 0, done.stderr[-1500:]
        said[name] = next(line for line in done.stderr.splitlines() if line.startswith("training "))
    assert "its colour images read as grey, the model's one channel (--model-args '{\"in_chans\": 3}' keeps the " \
           "colour)" in said["colour"], said["colour"]
    assert "read as grey" not in said["grey"], said["grey"]


def test_a_class_folder_that_links_to_another_is_refused(tmp_path):
    """`ln -s a a2`: every image of a was read twice, once as a and once as a2, without a word."""
    import os

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        Image.new("L", (8, 8), 0).save(tmp_path / name / "0.png")
    os.symlink("a", tmp_path / "a2")
    with pytest.raises(ValueError, match=r"the class folders 'a' and 'a2' of .* are one folder \(a link\)"):
        ImageFolder(tmp_path)


def test_an_empty_file_and_json_are_said_for_what_they_are(tmp_path):
    """predict called an empty file "not an image Pillow can identify" (eval: "empty file (0 bytes)"), and the
    server said the same of a JSON body sent where the image's bytes go."""
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "body.png").write_bytes(b' {"image": "aGVsbG8="}')
    for source, reason in ((tmp_path / "empty.jpg", "empty (0 bytes)"), (b"", "empty (0 bytes)"),
                           (tmp_path / "body.png", "it is JSON"),
                           (b'{"image": 1}', "it is JSON (send the image file's own bytes, or a form upload)"),
                           (b"not an image", "not an image Pillow can identify")):
        with pytest.raises(BadImageError) as info:
            decode_image(source)
        assert info.value.reason.endswith(reason), info.value.reason
