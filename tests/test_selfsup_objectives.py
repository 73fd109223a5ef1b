"""The objectives' own facts: masks and their statistics, the paper's 3-bit colour targets, what
the encoder sees, every ViT option, saving, and the refusals."""

import math

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.selfsup import MAE, MaskedPatchPrediction, SimMIM, create_pretrainer, encoder_of
from vitkit.selfsup.masking import INTACT, MASK_TOKEN, RANDOM_PATCH, UNCHANGED, block_mask, corruption, random_mask
from vitkit.selfsup.mpp import class_colour, colour_class

TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64)
SMALL_MAE = dict(decoder_dim=16, decoder_depth=1, decoder_heads=2, decoder_mlp_dim=32)


def tiny(**kw):
    return vitkit.ViTConfig(**{**dict(img_size=32, patch_size=4, in_chans=3, **TINY), **kw})


def make(objective, encoder, **kw):
    extra = {"mae": SMALL_MAE, "simmim": {"mask_block": 8}}.get(objective, {})
    return create_pretrainer(objective, encoder, **{**extra, **kw})


# ----------------------------------------------------------------------------- masks


def test_mpp_corruption_statistics():
    """Over many draws: 50% of the patches corrupted, of those 80% [mask], 10% another patch, 10% kept."""
    model = MaskedPatchPrediction(tiny())  # 8x8 grid
    draws = model.draw(4000, torch.Generator().manual_seed(0))
    mask, kinds, sources = draws["mask"], draws["kinds"], draws["sources"]
    assert mask.sum(1).eq(32).all()  # exactly half of each image's 64 patches
    corrupted = kinds[mask]
    shares = [(corrupted == k).float().mean().item() for k in (MASK_TOKEN, RANDOM_PATCH, UNCHANGED)]
    assert abs(shares[0] - 0.8) < 0.02 and abs(shares[1] - 0.1) < 0.02 and abs(shares[2] - 0.1) < 0.02
    assert (kinds[~mask] == INTACT).all()
    positions = torch.arange(64).expand_as(sources)
    swapped = kinds == RANDOM_PATCH
    assert (sources[swapped] != positions[swapped]).all(), "a random patch is another patch"
    assert (sources[~swapped] == positions[~swapped]).all()
    counts = torch.bincount(sources[swapped], minlength=64).float()
    assert counts.min() > 0.7 * counts.mean(), "other patches are drawn uniformly"


def test_mpp_corruption_is_applied_as_drawn():
    model = randomize(MaskedPatchPrediction(tiny(pos_embed="none")))
    x = torch.randn(2, 3, 32, 32)
    mask = random_mask(2, 64, 32, torch.Generator().manual_seed(1))
    kinds, sources = corruption(mask, (0.8, 0.1, 0.1), torch.Generator().manual_seed(2))
    seen = {}
    enc = model.encoder
    original = enc.embed_tokens

    def spy(tokens, grid):  # the patch embeddings as corrupted, before positions
        seen["tokens"] = tokens
        return original(tokens, grid)

    enc.embed_tokens = spy
    with torch.no_grad():
        out = model(x, mask=mask, kinds=kinds, sources=sources)
        clean = enc.patch_tokens(x)[0]
    got = seen["tokens"]
    for b in range(2):
        for n in range(64):
            k = kinds[b, n].item()
            want = {INTACT: clean[b, n], UNCHANGED: clean[b, n], RANDOM_PATCH: clean[b, sources[b, n]],
                    MASK_TOKEN: model.mask_token[0, 0]}[k]
            assert torch.equal(got[b, n], want), (b, n, k)
    assert torch.equal(out.kinds, kinds) and torch.equal(out.mask, mask.float())


def test_mpp_mean_colour_target_by_hand():
    """Each channel's mean over the patch in [0, 1], 3 bits each, red the most significant digit."""
    model = MaskedPatchPrediction(tiny(img_size=16, patch_size=8, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0)))
    x = torch.zeros(1, 3, 16, 16)
    x[0, :, :8, :8] = torch.tensor([0.1, 0.5, 0.99])[:, None, None]  # bins 0, 4, 7
    x[0, 0, :8, 8:] = 1.0  # pure red: bins 7, 0, 0
    x[0, 1, 8:, :4], x[0, 1, 8:, 4:] = 0.2, 0.4  # green mean 0.3 -> bin 2
    x[0, :, 8:, 8:] = 0.999
    assert model.num_colours == 512
    assert model.targets(x).tolist() == [[0 * 64 + 4 * 8 + 7, 7 * 64, 2 * 8, 511]]
    assert colour_class(torch.tensor([0.125, 0.0, 0.124])).item() == 64
    grey = MaskedPatchPrediction(tiny(in_chans=1, img_size=16, patch_size=8))
    assert grey.num_colours == 8
    centre = class_colour(torch.tensor([39]), 3)
    assert torch.allclose(centre, torch.tensor([[0.0625, 0.5625, 0.9375]]))


def test_simmim_masks_whole_blocks():
    mask = block_mask(500, (8, 8), (4, 4), 8, 0.6, torch.Generator().manual_seed(0)).reshape(500, 8, 8)
    blocks = mask.reshape(500, 4, 2, 4, 2)
    assert (blocks.all(dim=(2, 4)) | ~blocks.any(dim=(2, 4))).all(), "every 2x2 block is all masked or none"
    assert mask.sum((1, 2)).eq(4 * math.ceil(0.6 * 16)).all()
    assert mask.float().mean((0,)).min() > 0.5  # every position gets masked about 62.5% of the time


def test_mae_masks_by_noise_and_the_encoder_sees_the_visible_patches():
    model = MAE(tiny(), **SMALL_MAE, mask_ratio=0.75)
    noise = torch.rand(2, 64)
    lengths = []
    model.encoder.blocks[0].register_forward_pre_hook(lambda m, args: lengths.append(args[0].shape[1]))
    out = model(torch.randn(2, 3, 32, 32), noise=noise)
    assert lengths == [1 + 16]  # class token + int(64 x 0.25) visible patches
    kept = torch.argsort(noise, 1)[:, :16]
    assert (out.mask.gather(1, kept) == 0).all() and out.mask.sum().item() == 2 * 48
    assert torch.equal(out.ids_restore, torch.argsort(torch.argsort(noise, 1), 1))


@pytest.mark.parametrize("objective", ["simmim", "mpp", "mae"])
def test_bf16_autocast_keeps_the_mask_and_loss_in_fp32(objective):
    """A bf16 sum of ones is exact only up to 256: the mask that normalises the loss stays fp32."""
    model = make(objective, tiny(img_size=64))  # 16x16 grid: 256 patches an image
    x = torch.randn(4, 3, 64, 64)
    draws = model.draw(4, torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x, **draws)
    assert out.mask.dtype == torch.float32 and out.loss.dtype == torch.float32
    assert out.mask.sum().item() == draws.get("mask", out.mask).float().sum().item() > 256
    with torch.no_grad():
        ref = model(x, **draws).loss
    assert abs(out.loss.item() - ref.item()) < 0.05 * abs(ref.item())


def test_draws_follow_the_generator():
    for objective in ("simmim", "mpp", "mae"):
        model = make(objective, tiny())
        a = model.draw(3, torch.Generator().manual_seed(5))
        b = model.draw(3, torch.Generator().manual_seed(5))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- any plain ViT


@pytest.mark.parametrize("objective", ["simmim", "mpp", "mae"])
@pytest.mark.parametrize("encoder", [
    dict(),
    dict(img_size=(16, 32), class_token=False, global_pool="avg", pos_embed="sincos2d"),
    dict(pos_embed="learned_2d", patch_size=(4, 8)),
    dict(pos_embed="none", init_values=1e-5, qkv_bias=False),
    dict(in_chans=1, mean=(0.5,), std=(0.5,)),
], ids=["base", "nonsquare-nocls-sincos", "2d-rect-patch", "nopos-layerscale", "grey"])
def test_every_objective_on_every_vit_option(objective, encoder, tmp_path):
    model = randomize(make(objective, tiny(**encoder))).train()  # MPP's head starts at zero: no gradient below it
    enc = model.encoder.config
    x = torch.randn(3, enc.in_chans, *enc.img_size)
    out = model(x)
    n = model.num_patches
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    assert out.mask.shape == (3, n) and out.pred.shape[:2] == (3, n)
    out.loss.backward()
    assert model.encoder.patch_embed.proj.weight.grad.abs().sum() > 0
    model.save_pretrained(tmp_path / "m")
    back = vitkit.from_pretrained(tmp_path / "m")
    assert type(back) is type(model) and back.config == model.config
    draws = model.draw(3, torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        assert max_diff(model(x, **draws).pred, back(x, **draws).pred) == 0
    plain = vitkit.from_pretrained(tmp_path / "m", encoder_only=True)
    assert isinstance(plain, vitkit.VisionTransformer) and plain.num_classes == 0


@pytest.mark.parametrize("objective", ["simmim", "mpp", "mae"])
@pytest.mark.parametrize("rope, extra", [
    ("axial", dict(mlp="swiglu", pos_embed="learned", rope_ref_grid=(4, 4))),  # EVA-02's layout
    ("mixed", dict(init_values=1e-5, pos_embed="none")),  # RoPE-Mixed, LayerScale
    ("dinov3", dict(rope_half=True, reg_tokens=4, pos_embed="none", img_size=(32, 16))),  # registers, not square
])
def test_every_objective_pre_trains_an_eva_style_encoder_and_saves_it_as_one(objective, rope, extra, tmp_path):
    """EVA-02 and timm's rope ViTs were refused ("built as a plain ViT, without EVA's rotary positions"): each
    objective now trains them with their rotations (MAE's, per image, are timm's: test_selfsup_parity), and
    the run's encoder reads back as the EVA model it is."""
    from vitkit.models.eva import Eva, EvaConfig

    config = EvaConfig(**{**dict(img_size=32, patch_size=4, in_chans=3, **TINY), "rope": rope, **extra})
    model = randomize(make(objective, config)).train()
    assert type(model.encoder) is Eva and model.encoder.rope is not None
    x = torch.randn(2, 3, *config.img_size)
    out = model(x)
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.encoder.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    model.save_pretrained(tmp_path / "m")
    back, plain = vitkit.from_pretrained(tmp_path / "m"), vitkit.from_pretrained(tmp_path / "m", encoder_only=True)
    assert type(back) is type(model) and type(plain) is Eva and plain.config.rope == rope
    draws = model.draw(2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert max_diff(model.eval()(x, **draws).pred, back.eval()(x, **draws).pred) == 0
        assert max_diff(model.encoder(x), plain(x)) == 0


def test_layouts_that_cannot_hold_an_encoder_say_why_in_words(tmp_path):
    """A CLIP-style encoder to Hugging Face's ViTMAE was a bare "no Hugging Face name for parameter
    'norm_pre.weight'", and an EVA MAE to the official layout "would have encoder EVA state dict: ..."."""
    from vitkit.models.eva import EvaConfig
    from vitkit.weights import WeightsError, export_weights

    clip = make("mae", tiny(pre_norm=True))
    with pytest.raises(WeightsError, match=r"^cannot export to Hugging Face ViT: HF ViT has no norm after the "
                                           r"embedding \(CLIP's ln_pre"):
        export_weights(clip, tmp_path / "hf", "hf")
    eva = make("mae", EvaConfig(**{**dict(img_size=32, patch_size=4, in_chans=3, **TINY), "rope": "axial"}))
    with pytest.raises(WeightsError, match=r"^the official MAE layout holds a plain ViT, not an EVA encoder"):
        export_weights(eva, tmp_path / "eva.pth", "mae")
    with pytest.raises(WeightsError, match=r"HF ViT has no rotary positions \(an EVA-style model"):
        export_weights(eva, tmp_path / "hf2", "hf")
    assert not any(tmp_path.iterdir())  # nothing half-written


@pytest.mark.parametrize("objective", ["simmim", "mpp", "mae"])
def test_load_weights_takes_a_pretraining_state_dict_and_refuses_another_objective(objective):
    a, b = randomize(make(objective, tiny())), make(objective, tiny())
    report = vitkit.load_weights(b, a.state_dict())
    assert report.format == "vitkit" and not report.missing and not report.unexpected
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    other = "mae" if objective != "mae" else "simmim"
    with pytest.raises(vitkit.WeightsError, match=f"hold a {objective} model, the model is {other}"):
        vitkit.load_weights(make(other, tiny()), a.state_dict())
    with pytest.raises(vitkit.WeightsError, match="no pre-training model"):
        vitkit.load_weights(b, vitkit.create_model("vit_fmnist").state_dict())


@pytest.mark.parametrize("objective", ["simmim", "mpp", "mae"])
def test_a_few_steps_lower_the_loss(objective):
    torch.manual_seed(0)
    model = make(objective, tiny())
    # smooth images: a masked patch is predictable from its neighbours (pixel noise is not,
    # least of all normalised per patch as MAE's default target is)
    x = torch.nn.functional.interpolate(torch.rand(8, 3, 4, 4), size=(32, 32), mode="bilinear")
    draws = model.draw(8, torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model(x, **draws).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


def test_mae_fixes_a_learned_table_at_maes_sincos():
    from vitkit.selfsup.mae import mae_pos_table

    model = MAE(tiny(), **SMALL_MAE)
    assert not model.encoder.pos_embed.requires_grad and not model.decoder_pos_embed.requires_grad
    assert torch.equal(model.encoder.pos_embed.detach(), mae_pos_table((8, 8), 32, 1))
    assert model.encoder.pos_embed[0, 0].abs().sum() == 0
    trained = MAE(tiny(), **SMALL_MAE, fixed_pos_embed=False)
    assert trained.encoder.pos_embed.requires_grad


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("ratio", [0.0, 1.0, 1.5, -0.1, "half", True])
@pytest.mark.parametrize("objective", ["simmim", "mpp", "mae"])
def test_mask_ratio_outside_zero_one_is_refused(objective, ratio):
    with pytest.raises(ValueError, match="mask_ratio must be in \\(0, 1\\)"):
        make(objective, tiny(), mask_ratio=ratio)


def test_mask_block_that_does_not_tile_is_refused():
    with pytest.raises(ValueError, match="mask_block 8 px does not tile the 28x28 image.*blocks that do: 4, 28 px"):
        SimMIM("vit_fmnist", mask_block=8)
    with pytest.raises(ValueError, match="mask_block 6 px"):
        SimMIM(tiny(), mask_block=6)
    assert SimMIM("vit_fmnist", mask_block=4).config.mask_block == 4


@pytest.mark.parametrize("objective", ["simmim", "mpp", "mae"])
def test_a_grid_of_one_patch_is_refused(objective):
    """MPP masked none of a one-patch grid (count_for's at least 1 and at most n - 1): a loss of exactly 0 and
    exit 0 for a run that learnt nothing."""
    with pytest.raises(ValueError, match=r"1x1 grid of patches leaves none to mask"):
        create_pretrainer(objective, tiny(img_size=8, patch_size=8))


def test_mae_ratio_that_leaves_nothing_visible_is_refused():
    with pytest.raises(ValueError, match="leaves no visible patch"):
        MAE(tiny(img_size=8), **SMALL_MAE, mask_ratio=0.9)


@pytest.mark.parametrize("name,reason", [
    ("vit_fmnist_hybrid", "hybrid.*leak"),
    ("cait_xxs24_224", "CaiT's class-attention"),
    ("convit_tiny", "ConViT's gated positional attention"),
    ("deit_tiny_distilled_patch16_224", "distillation token"),
    ("resnetv2_50_nopreact", "CNN without patch tokens"),
])
@pytest.mark.parametrize("objective", ["simmim", "mpp", "mae"])
def test_architectures_that_cannot_apply_are_refused_by_name(objective, name, reason):
    with pytest.raises(ValueError, match=reason):
        create_pretrainer(objective, name)


@pytest.mark.parametrize("pos_embed", ["relative", "relative_mlp"])
def test_mae_refuses_a_relative_bias_of_either_kind(pos_embed):
    """relative_mlp's bias was not refused as relative's is: an internal "size of tensor a (12) must match the size
    of tensor b (49)" at the first step, after the run's folder was made."""
    with pytest.raises(ValueError, match="relative position bias over the whole grid cannot follow"):
        MAE(tiny(pos_embed=pos_embed), **SMALL_MAE)


def test_a_classifier_is_not_an_encoder_and_bad_masks_are_named():
    with pytest.raises(ValueError, match="without a head"):
        SimMIM(vitkit.create_model("vit_fmnist"), mask_block=4)
    model = SimMIM(tiny(), mask_block=8)
    with pytest.raises(ValueError, match="mask must have shape \\(batch, patches\\) = \\(2, 64\\)"):
        model(torch.randn(2, 3, 32, 32), mask=torch.zeros(2, 63, dtype=torch.bool))
    with pytest.raises(ValueError, match="must be a bool tensor"):
        model(torch.randn(2, 3, 32, 32), mask=torch.zeros(2, 64))
    with pytest.raises(ValueError, match="noise must have shape"):
        MAE(tiny(), **SMALL_MAE)(torch.randn(2, 3, 32, 32), noise=torch.rand(3, 64))
    # accepted: an all-False mask scored a loss of exactly 0, integer or NaN noise was sorted as given, and
    # norm_pix_loss="no" was kept and read as true
    with pytest.raises(ValueError, match="mask must mask at least one patch of each image; image 1 has none"):
        model(torch.randn(2, 3, 32, 32), mask=torch.zeros(2, 64, dtype=torch.bool).index_fill_(1, torch.tensor(
            [3]), True).index_fill_(0, torch.tensor([1]), False))
    for noise in (torch.randint(0, 9, (2, 64)), torch.full((2, 64), float("nan"))):
        with pytest.raises(ValueError, match="noise must be finite floating-point values"):
            MAE(tiny(), **SMALL_MAE)(torch.randn(2, 3, 32, 32), noise=noise)
    with pytest.raises(ValueError, match="norm_pix_loss must be true or false, got 'no'"):
        MAE(tiny(), **SMALL_MAE, norm_pix_loss="no")
    assert encoder_of(model) is model.encoder

