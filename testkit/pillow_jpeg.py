"""JPEG through Pillow, image by image: the reference our batched codec
(``aisafety/defense/jpeg_codec.py``) is checked against (tests/test_input_defenses.py) and
timed against (bench/input_defenses.py)."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image


def pillow_round_trip(x: torch.Tensor, quality: int) -> torch.Tensor:
    """Each image of ``x`` (N, C, H, W in [0, 1], C 1 or 3) saved as JPEG at ``quality`` and
    read back, as a float tensor of the same shape."""
    decoded = []
    for image in (x.permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8):
        buffer = io.BytesIO()
        Image.fromarray(image[..., 0] if image.shape[2] == 1 else image).save(
            buffer, format="JPEG", quality=quality
        )
        pixels = np.asarray(Image.open(buffer), dtype=np.float32) / 255
        decoded.append(pixels.reshape(*pixels.shape[:2], -1))
    return torch.from_numpy(np.stack(decoded)).permute(0, 3, 1, 2)
