"""The ranges of the shape arguments every command accepts (``--batch-size``, ``--seq-len``,
``--image-size``): wide enough for any real training step, narrow enough that a typo (``1e9``) is refused
with the allowed range instead of being traced. No imports: the CLI reads these before torch loads."""

MAX_BATCH_SIZE = 1 << 20
"""Samples per step per GPU (1,048,576)."""
MAX_SEQ_LEN = 1 << 22
"""Tokens per sample (4,194,304)."""
MAX_IMAGE_SIZE = 1 << 14
"""Pixels per side (16,384)."""

LIMITS = {"batch_size": MAX_BATCH_SIZE, "seq_len": MAX_SEQ_LEN, "image_size": MAX_IMAGE_SIZE}
