"""Hidden checks of lesson 02 (tensors, storage and strides). See
grader/content/cases/__init__.py."""

import math
import random

from grader.content.cases import Case, raises
from grader.content.variants import Variants

CASES: dict[str, list[Case | str]] = {
    "contiguous_strides": [
        "contiguous_strides((5, 7, 3))",
        "contiguous_strides((3, 0, 2))",
        "contiguous_strides((1, 1, 6, 1))",
        "contiguous_strides((9,))",
        "contiguous_strides(())",
        "contiguous_strides([4, 3, 2, 5])",
        raises("contiguous_strides((2, -3))", "ValueError"),
        raises("contiguous_strides(5)", "TypeError"),
    ],
    "flat_offset": [
        "flat_offset((2, 1, 3), (20, 5, 1))",
        "flat_offset((3, 2), (1, 4), 7)",
        "flat_offset((1, 4), (0, 2), 3)",
        "flat_offset((), (), 11)",
        "flat_offset([0, 0, 0], [6, 2, 1], storage_offset=4)",
        raises("flat_offset((1, 2), (3,))", "ValueError"),
        raises("flat_offset((-1, 0), (3, 1))", "IndexError"),
    ],
    "transpose": [
        "transpose((2, 5, 3), (15, 3, 1), 0, 2)",
        "transpose((2, 5, 3), (15, 3, 1), -1, 1)",
        "transpose((4, 6), (1, 4), 0, -1)",
        "transpose((3, 1, 2), (2, 9, 1), 1, 1)",
        "transpose((), (), 0, -1)",
        raises("transpose((2, 3), (3, 1), 0, 2)", "IndexError"),
        raises("transpose((2, 3), (3, 1), -3, 0)", "IndexError"),
        raises("transpose((2, 3), (3,), 0, 1)", "ValueError"),  # _layout: one stride per dim
        raises("transpose((2, 3.5), (3, 1), 0, 1)", "TypeError"),  # _layout: ints
    ],
    "permute": [
        "permute((2, 3, 4), (12, 4, 1), (2, 0, 1))",
        "permute((2, 3, 4, 5), (60, 20, 5, 1), (-1, 1, -4, 2))",
        "permute((7,), (3,), (0,))",
        "permute((2, 0, 3), (3, 3, 1), (1, 2, 0))",
        "permute((), (), ())",
        raises("permute((2, 3), (3, 1), (0, 0))", "ValueError"),
        raises("permute((2, 3), (3, 1), (0,))", "ValueError"),
        raises("permute((2, 3), (3, 1), (0, 2))", "IndexError"),  # out of range, as in torch
    ],
    "slice_dim": [
        "slice_dim((10,), (1,), 0, 0, 2, 9, 3)",
        "slice_dim((4, 6), (6, 1), 5, 1, 1, None, 2)",
        "slice_dim((4, 6), (6, 1), 0, -2, -3, None, 1)",
        "slice_dim((4, 6), (6, 1), 0, 0, 10, 20, 1)",
        "slice_dim((5, 3), (1, 5), 2, 0, 3, 1, 1)",
        "slice_dim((8, 2), (2, 1), 0, 0, None, None, 20)",
        "slice_dim((3, 4, 5), (20, 5, 1), 1, 2, -100, 100, 2)",
        raises("slice_dim((10,), (1,), 0, 0, 0, 5, 0)", "ValueError"),
    ],
    "is_contiguous": [
        "is_contiguous((2, 3, 4), (12, 4, 1))",
        "is_contiguous((3, 4), (1, 3))",
        "is_contiguous((3, 1, 4), (4, 100, 1))",
        "is_contiguous((3, 4), (8, 1))",
        "is_contiguous((2, 0, 5), (1, 7, 3))",
        "is_contiguous((4, 3), (0, 1))",
        "is_contiguous((1, 1), (5, 9))",
        "is_contiguous((), ())",
    ],
    "view_strides": [
        "view_strides((4, 6), (6, 1), (2, 2, 3, 2))",
        "view_strides((4, 6), (1, 4), (24,))",
        "view_strides((4, 6), (1, 4), (2, 2, 6))",
        "view_strides((2, 3, 4), (24, 4, 1), (2, 12))",
        "view_strides((2, 3, 4), (24, 4, 1), (6, 4))",
        "view_strides((2, 3, 4), (12, 4, 1), (-1, 1, 4, 1))",
        "view_strides((3, 1, 4), (4, 7, 1), (12,))",
        "view_strides((4, 6), (1, 4), (1, 4, 1, 6))",  # size-1 dims taken with each chunk
        "view_strides((3, 4), (0, 1), (12,))",
        "view_strides((0, 4), (4, 1), (2, 0, 2))",
        "view_strides((0, 3), (6, 2), (0, 3))",
        "view_strides((), (), (1, 1, 1))",
        raises("view_strides((4, 6), (6, 1), (-1, -1))", "ValueError"),
        raises("view_strides((4, 6), (6, 1), (5, 5))", "ValueError"),
        raises("view_strides((4, 6), (6, 1), (-2, -12))", "ValueError"),
    ],
    "as_strided": [
        "as_strided(torch.arange(20.), (3, 4), (1, 3), 2)",
        "as_strided(torch.arange(10), (2, 3), (0, 2), 1)",
        "as_strided(torch.arange(30, dtype=torch.int16), (2, 2, 3), (12, 1, 4), 5)",
        "as_strided(torch.arange(6.), (4, 3), (1, 1))",
        Case("as_strided(torch.arange(6.), (), (), 4)", expected="torch.tensor(4.)"),
        "as_strided(torch.arange(6.), (2, 0), (3, 1), 2)",
        Case("as_strided(torch.arange(200.), (10, 10), (1, 10), 0)",
             expected="torch.arange(100.).reshape(10, 10).T"),
        raises("as_strided(torch.arange(6.), (3, 3), (1, 1), 2)", "IndexError"),
    ],
    "broadcast_shapes": [
        "broadcast_shapes((8, 1, 6, 1), (7, 1, 5))",
        "broadcast_shapes((5, 4), (1,))",
        "broadcast_shapes((), (3, 2))",
        "broadcast_shapes((1, 0), (4, 1))",
        "broadcast_shapes([2, 1, 3], [2, 3, 1])",
        raises("broadcast_shapes((2, 3), (4, 3))", "ValueError"),
        raises("broadcast_shapes((5, 1, 2), (3, 3))", "ValueError"),
        raises("broadcast_shapes((0,), (4,))", "ValueError"),  # 0 with 4 fails
    ],
    "split_heads": [
        "split_heads(torch.arange(24.).reshape(1, 2, 12), 3)",
        "split_heads(torch.arange(24.).reshape(2, 3, 4), 2)",
        "split_heads(torch.arange(12.).reshape(1, 2, 6), 1)",
        "split_heads(torch.arange(24.).reshape(1, 2, 12), 4).stride()",
        raises("split_heads(torch.ones(1, 2, 12), 5)", "ValueError"),
        raises("split_heads(torch.ones(1, 2, 12), 0)", "ValueError"),
    ],
    "merge_heads": [
        "merge_heads(torch.arange(24.).reshape(1, 2, 3, 4))",
        "merge_heads(torch.arange(24.).reshape(2, 3, 2, 2))",
        "merge_heads(split_heads(torch.arange(24.).reshape(1, 2, 12), 3))",
    ],
    "attention_scores": [
        "attention_scores(torch.arange(24.).reshape(1, 2, 3, 4), torch.ones(1, 2, 2, 4))",
        "attention_scores(torch.eye(4).reshape(1, 1, 4, 4), torch.arange(8.).reshape(1, 1, 2, 4))",
        # Non-integer products: a student's summation order may differ in the last bits.
        Case("attention_scores(torch.arange(12.).reshape(1, 1, 3, 4) / 10, "
             "torch.arange(12.).reshape(1, 1, 3, 4) / 10)",
             expected="torch.tensor([[0.07, 0.19, 0.31], [0.19, 0.63, 1.07], "
             "[0.31, 1.07, 1.83]]).reshape(1, 1, 3, 3)", rel_tol=1e-5, abs_tol=1e-6),
    ],
    "project": [
        "project(torch.arange(12.).reshape(1, 3, 4), torch.ones(4, 2))",
        "project(torch.arange(6.).reshape(2, 1, 3), torch.arange(6.).reshape(3, 2))",
    ],
    # A prediction, graded within a band: 10% accepts the MiB written as MB (4 MiB as 4e6 for the
    # default, 4.6% low) and refuses the usual mistakes: 0 (a view), twice the answer (both
    # copies), and another element size (half or twice the answer: 2 or 8 bytes for float32,
    # float32's 4 for a 16-bit dtype). float(): an int counts too.
    "predicted_transpose_reshape_bytes": [
        Case("float(predicted_transpose_reshape_bytes)", rel_tol=0.1)],
}

# Each student's matrix for the graded prediction, and the bytes m.T.reshape(-1) copies: 4 MiB for
# the default (the lesson's measurement makes it), 3, 6, 8 and 10 MiB for the others (not 2 MiB: the
# measurement of the default prints a copy of that size). Every one has two dims above 1 (so no view
# of m.T as one dim exists) and a whole number of MiB (so the MB slip passes as above), and two use
# a 16-bit dtype, where float32's 4 bytes per element give twice the answer; no student's answer
# passes another's band. tests/test_strides.py makes each matrix and measures the copy.
VARIANTS = {
    "predicted_transpose_reshape_bytes": Variants(
        ("m_shape", "m_dtype"),
        (((1024, 1024), "float32"), ((1536, 1024), "bfloat16"), ((768, 2048), "float32"),
         ((1024, 4096), "float16"), ((1280, 2048), "float32")),
        "m = torch.zeros({m_shape[0]}, {m_shape[1]}, dtype=torch.{m_dtype})"),
}


# Hidden inputs of each student's own (grader/content/variants.py): a layout is integers, so a
# view's strides and a slice's shape, strides and offset are exact for any input. Drawn anywhere
# in what each exercise accepts, they need no tolerance, and no answer copied from another
# student's checks passes them.
def _row_major(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= size
    return strides


def _regrouped(rng: random.Random, shape: list[int]) -> tuple[int, ...]:
    """The same element count in other dims: two neighbours merged, one dim split in two, or the
    count's prime factors dealt to one to four dims; one size -1 a third of the time."""
    new = list(shape)
    how = rng.choice(("merge", "split", "factor"))
    if how == "merge":
        i = rng.randrange(len(new) - 1)
        new[i : i + 2] = [new[i] * new[i + 1]]
    elif how == "split":
        i = rng.randrange(len(new))
        first = rng.choice([d for d in range(1, new[i] + 1) if new[i] % d == 0])
        new[i : i + 1] = [first, new[i] // first]
    else:
        count, new = math.prod(shape), [1] * rng.randint(1, 4)
        p = 2
        while count > 1:
            while count % p == 0:
                new[rng.randrange(len(new))] *= p
                count //= p
            p += 1
    if rng.randrange(3) == 0:
        new[rng.randrange(len(new))] = -1
    return tuple(new)


def _drawn_view_strides(rng: random.Random) -> list[str]:
    """Three tensors of two to four dims (sizes 2 to 6, a third of the time one of them 1), each
    viewed as another shape: a row-major one (a view always exists), a permuted one (flattened
    half the time) and one sliced with a step (a view may or may not exist)."""
    calls = []
    for kind in ("row-major", "permuted", "sliced"):
        shape = [rng.randint(2, 6) for _ in range(rng.randint(2, 4))]
        if rng.randrange(3) == 0:
            shape[rng.randrange(len(shape))] = 1
        strides = _row_major(shape)
        new_shape = _regrouped(rng, shape)
        if kind == "permuted":
            order = list(range(len(shape)))
            while order == sorted(order):
                rng.shuffle(order)
            shape, strides = [shape[d] for d in order], [strides[d] for d in order]
            new_shape = (-1,) if rng.randrange(2) else _regrouped(rng, shape)
        elif kind == "sliced":  # x[..., ::step, ...] of a row-major tensor `step` times longer
            dim, step = rng.randrange(len(shape)), rng.randint(2, 3)
            strides = _row_major([size * step if d == dim else size
                                  for d, size in enumerate(shape)])
            strides[dim] *= step
        calls.append(f"view_strides({tuple(shape)}, {tuple(strides)}, {new_shape})")
    return calls


def _drawn_slice_dim(rng: random.Random) -> list[str]:
    """Three slices of tensors of one to three dims, row-major or permuted, with an offset, along
    any dim (negative too): starts and stops of None, negative or past the end, steps 1 to 4.
    The first two keep at least one element; the third may be empty."""
    calls = []
    for call in range(3):
        shape = [rng.randint(1, 8) for _ in range(rng.randint(1, 3))]
        order = list(range(len(shape)))
        rng.shuffle(order)
        strides = _row_major(shape)
        shape, strides = [shape[d] for d in order], [strides[d] for d in order]
        dim, step = rng.randrange(-len(shape), len(shape)), rng.randint(1, 4)
        while True:
            start, stop = (rng.choice((None, rng.randint(-10, 10))) for _ in range(2))
            if call == 2 or range(*slice(start, stop, step).indices(shape[dim])):
                break
        calls.append(f"slice_dim({tuple(shape)}, {tuple(strides)}, {rng.randint(0, 12)}, "
                     f"{dim}, {start}, {stop}, {step})")
    return calls


DRAWN = {"view_strides": _drawn_view_strides, "slice_dim": _drawn_slice_dim}
