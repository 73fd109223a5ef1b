"""Model definitions. Imports nothing else of vitkit (see docs/architecture.md)."""

from .cait import CaiT, CaiTConfig
from .convit import ConViT, ConViTConfig
from .hybrid import HybridEmbed, ResNetV2, ResNetV2Config
from .layers import Attention, Block, DropPath, LayerScale, Mlp, PatchEmbed, resample_pos_embed
from .registry import (
                       VIT_SIZES,
                       build_from_config,
                       config_from_dict,
                       create_model,
                       get_model_config,
                       list_models,
                       register_architecture,
                       register_model,
)
from .vit import VisionTransformer, ViTConfig, count_parameters, num_tokens

__all__ = [
    "ConViT", "ConViTConfig",
    "CaiT", "CaiTConfig",
    "HybridEmbed", "ResNetV2", "ResNetV2Config",
    "Attention", "Block", "DropPath", "LayerScale", "Mlp", "PatchEmbed", "resample_pos_embed",
    "VIT_SIZES", "build_from_config", "config_from_dict", "create_model", "get_model_config",
    "list_models", "register_architecture", "register_model", "ViTConfig", "VisionTransformer",
    "count_parameters", "num_tokens",
]
