"""Model definitions. Imports nothing of vitkit above ``models/`` (see docs/architecture.md).

Importing this package registers every family (each file registers its own, see
:mod:`.registry`): ViT (with DeiT and the hybrids), the ResNetV2 classifier, CaiT, ConViT and the later
ViTs (EVA, the VLM towers, NaFlexViT, SAM's and Gemma 4's encoders).
"""

from . import vit_names  # noqa: F401,E402  (timm's names of the later ViTs)
from .base import TokenModel
from .cait import CaiT, CaiTConfig
from .coca import CoCa, CoCaConfig  # noqa: E402
from .config_base import ConfigMixin, TokenConfig
from .convit import ConViT, ConViTConfig
from .deepseek import Deepseek, DeepseekConfig  # noqa: E402
from .eva import Eva, EvaConfig  # noqa: E402
from .gemma4 import Gemma4Config, Gemma4ViT  # noqa: E402
from .hybrid import HybridEmbed
from .layers import (
    Attention,
    Block,
    DropPath,
    LayerScale,
    Mlp,
    PatchEmbed,
    compile_for_inference,
    fast_inference,
    resample_pos_embed,
)
from .naflexvit import NaFlexConfig, NaFlexViT  # noqa: E402
from .qwen3 import Qwen3, Qwen3Config  # noqa: E402
from .registry import (
    Family,
    build_from_config,
    config_from_dict,
    create_model,
    families,
    family,
    family_of,
    family_of_state_dict,
    get_model_config,
    list_models,
    register_architecture,
    register_family,
    register_model,
    renamed_in_timm,
    unregister_family,
)
from .resnetv2 import ResNetV2, ResNetV2Config
from .sam import SamConfig, SamViT  # noqa: E402
from .vit import VIT_SIZES, VisionTransformer, ViTConfig, count_parameters, num_tokens

__all__ = [
    "ConViT", "ConViTConfig", "Eva", "EvaConfig", "Deepseek", "DeepseekConfig", "Qwen3", "Qwen3Config", "NaFlexViT",
    "NaFlexConfig", "SamViT", "SamConfig", "Gemma4ViT", "Gemma4Config", "CoCa", "CoCaConfig",
    "CaiT", "CaiTConfig",
    "HybridEmbed", "ResNetV2", "ResNetV2Config",
    "Attention", "Block", "DropPath", "LayerScale", "Mlp", "PatchEmbed", "resample_pos_embed",
    "VIT_SIZES", "build_from_config", "config_from_dict", "create_model", "get_model_config",
    "list_models", "register_architecture", "register_model", "ViTConfig", "VisionTransformer",
    "count_parameters", "num_tokens", "Family", "register_family", "unregister_family", "family", "family_of",
    "families", "family_of_state_dict", "renamed_in_timm", "TokenModel", "TokenConfig", "ConfigMixin", "fast_inference",
    "compile_for_inference",
]
