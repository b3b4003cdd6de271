"""Shape buckets: round lengths up so varying prompt and cache sizes reuse a few compilations.

The jitted turn function is compiled once per (batch, cache size, chunk length, new-token
width) shape. Rounding each length up to a bucket bounds the number of shapes; the default
buckets are the powers of two and their midpoints (16, 24, 32, 48, 64, 96, ...), so padding
wastes at most a third of a chunk and there are two compilations per doubling of length.
"""

from __future__ import annotations

from collections.abc import Sequence


def default_buckets(minimum: int, maximum: int = 1 << 24) -> tuple[int, ...]:
    """Powers of two and 1.5x powers of two in [minimum, maximum]."""
    out, p = [], 1
    while p <= maximum:
        for b in (p, p + p // 2):
            if minimum <= b <= maximum and (not out or b > out[-1]):
                out.append(b)
        p *= 2
    return tuple(out)


def round_up(length: int, buckets: Sequence[int], *, what: str) -> int:
    """The smallest bucket >= length.

    Args:
      length: the length to pad.
      buckets: ascending bucket sizes.
      what: what the length measures, named in the error.

    Raises:
      ValueError: when length exceeds the largest bucket.
    """
    for b in buckets:
        if b >= length:
            return b
    raise ValueError(
        f"{what}={length} exceeds the largest bucket {buckets[-1]}; add a larger bucket "
        f"(buckets: {list(buckets)})"
    )


# Choice and allowed-id counts (constrained decoding) are rounded up to these, so the turn and
# the RL update compile once per bucket rather than once per count.
COUNT_BUCKETS = default_buckets(1)


def check_buckets(buckets: Sequence[int], *, what: str) -> tuple[int, ...]:
    """Validates a configured bucket list (positive, strictly ascending) and returns it."""
    buckets = tuple(int(b) for b in buckets)
    if not buckets or buckets[0] < 1 or any(a >= b for a, b in zip(buckets, buckets[1:])):
        raise ValueError(
            f"{what}={list(buckets)}: expected a non-empty ascending list of sizes >= 1"
        )
    return buckets
