"""rloader.vision: torchvision's `ImageFolder` with its JPEG/PNG decoding and its leading
transforms run in Rust, giving torchvision + Pillow's tensors bit for bit.

Needs torchvision and Pillow (`pip install rloader[vision]`); `import rloader` does not.
"""

try:
    import torchvision  # noqa: F401
    from PIL import Image  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised without torchvision only
    raise ImportError(
        "rloader.vision needs torchvision and Pillow: pip install 'rloader[vision]' "
        f"(or pip install torchvision pillow); {err}"
    ) from err

from ._folder import DatasetFolder, ImageFolder

__all__ = ["DatasetFolder", "ImageFolder"]
