"""What a ViT learned: the paper's analyses (figures and the report come with the CLI)."""

from .analysis import (
                       attention_maps,
                       attention_rollout,
                       convit_gates,
                       embedding_filters,
                       embedding_filters_pca,
                       mean_attention_distance,
                       patch_distances,
                       pos_embed_similarity,
                       prefix_attention,
                       token_norms,
)

__all__ = ["attention_maps", "attention_rollout", "mean_attention_distance", "pos_embed_similarity",
           "embedding_filters", "embedding_filters_pca", "patch_distances", "convit_gates", "token_norms",
           "prefix_attention"]

from .report import InspectResult, default_folder, inspect_model  # noqa: E402  (figures need matplotlib, a dependency)

__all__ += ["inspect_model", "InspectResult", "default_folder"]
