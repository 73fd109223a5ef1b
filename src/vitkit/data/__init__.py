"""Data: image reading, IDX files, Fashion-MNIST, transforms (more datasets grow here)."""

from .fashion_mnist import ArrayDataset, DatasetNotFound
from .fashion_mnist import load_split as load_fashion_mnist
from .idx import IDXError, read_idx
from .transforms import EvalTransform, load_image, preprocess, transform_for

__all__ = ["ArrayDataset", "DatasetNotFound", "load_fashion_mnist", "IDXError", "read_idx",
           "EvalTransform", "load_image", "preprocess", "transform_for"]
