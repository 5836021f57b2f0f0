"""Lesson 02: tensors, storage and strides.

A tensor is a window onto a flat storage: element ``(i0, i1, ...)`` lives at storage position
``storage_offset + i0 * stride0 + i1 * stride1 + ...``. Transposing, permuting, slicing with a
step and most reshapes only rewrite the shape, the strides and the offset; no element moves.
``.view`` succeeds exactly when the new shape can be described by strides over the same storage;
otherwise a copy is needed (what ``.reshape`` then makes). Everything here works on plain tuples
of ints, the way torch itself keeps this metadata, and is checked against torch's own answers.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch
from beartype import beartype
from einops import einsum, rearrange
from jaxtyping import Float, jaxtyped
from torch import Tensor


def _ints(values: Sequence[int], what: str) -> tuple[int, ...]:
    """``values`` as a tuple of plain ints, or a TypeError that names ``what``."""
    try:
        return tuple(operator.index(v) for v in values)
    except TypeError:
        message = f"{what} must be a sequence of ints such as (2, 3), got {values!r}"
        raise TypeError(message) from None


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Strides of a freshly allocated (row-major, C-order) tensor of ``shape``.

    Args:
        shape: sizes of the dims, e.g. ``(2, 3, 4)``; sizes may be 0; ``()`` gives ``()``.

    Returns:
        One stride per dim, in elements: ``(12, 4, 1)`` for ``(2, 3, 4)``. A size-0 dim counts
        as size 1 for the strides of the dims to its left, as in torch.
    """
    shape = _ints(shape, "shape")
    if any(size < 0 for size in shape):
        raise ValueError(f"shape {shape} has a negative size; sizes must be >= 0")
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def flat_offset(index: Sequence[int], strides: Sequence[int], storage_offset: int = 0) -> int:
    """Storage position of the element at ``index``.

    Args:
        index: one non-negative index per dim, e.g. ``(1, 2)``; ``()`` for a 0-dim tensor.
        strides: the tensor's strides, in elements.
        storage_offset: the position of element ``(0, 0, ...)`` in storage.

    Returns:
        ``storage_offset + sum(i * stride)``.
    """
    index, strides = _ints(index, "index"), _ints(strides, "strides")
    storage_offset = operator.index(storage_offset)
    if len(index) != len(strides):
        raise ValueError(f"index {index} has {len(index)} entries but strides {strides} has "
                         f"{len(strides)}; give one index per dim")
    if any(i < 0 for i in index):
        raise IndexError(f"index {index} has a negative entry; wrap it with the shape first "
                         "(i + size) since flat_offset does not know the sizes")
    if storage_offset < 0:
        raise ValueError(f"storage_offset must be >= 0, got {storage_offset}")
    return storage_offset + sum(i * stride for i, stride in zip(index, strides, strict=True))


def _layout(
    shape: Sequence[int], strides: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Check that ``shape`` and ``strides`` describe a torch tensor; return them as int tuples."""
    shape, strides = _ints(shape, "shape"), _ints(strides, "strides")
    if len(shape) != len(strides):
        raise ValueError(f"shape {shape} and strides {strides} differ in length; give one stride "
                         "per dim")
    if any(size < 0 for size in shape):
        raise ValueError(f"shape {shape} has a negative size; sizes must be >= 0")
    if any(stride < 0 for stride in strides):
        raise ValueError(f"strides {strides} has a negative stride; torch strides are >= 0 "
                         "(torch.flip copies instead)")
    return shape, strides


def _wrap_dim(dim: int, ndim: int) -> int:
    """``dim`` in ``0..ndim-1``, counting negative dims from the end as torch does."""
    dim, limit = operator.index(dim), max(ndim, 1)  # torch lets a 0-dim tensor use dim 0 or -1
    if not -limit <= dim < limit:
        raise IndexError(f"dim {dim} is out of range for a tensor with {ndim} dims; use a dim "
                         f"in {-limit}..{limit - 1}")
    return dim % limit


def transpose(
    shape: Sequence[int], strides: Sequence[int], dim0: int, dim1: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides of ``x.transpose(dim0, dim1)``: swap two dims, move no data.

    Args:
        shape, strides: the tensor's layout.
        dim0, dim1: the dims to swap; negative dims count from the end.

    Returns:
        (new shape, new strides).
    """
    shape, strides = _layout(shape, strides)
    dim0, dim1 = _wrap_dim(dim0, len(shape)), _wrap_dim(dim1, len(shape))
    if not shape:  # a 0-dim tensor transposes to itself
        return (), ()
    new_shape, new_strides = list(shape), list(strides)
    new_shape[dim0], new_shape[dim1] = shape[dim1], shape[dim0]
    new_strides[dim0], new_strides[dim1] = strides[dim1], strides[dim0]
    return tuple(new_shape), tuple(new_strides)


def permute(
    shape: Sequence[int], strides: Sequence[int], dims: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides of ``x.permute(dims)``: dim ``i`` of the result is dim ``dims[i]``.

    Args:
        shape, strides: the tensor's layout.
        dims: a permutation of ``range(len(shape))`` (``()`` for a 0-dim tensor); negative
            dims count from the end.

    Returns:
        (new shape, new strides).
    """
    shape, strides = _layout(shape, strides)
    dims = _ints(dims, "dims")
    if len(dims) != len(shape):
        raise ValueError(f"dims {dims} has {len(dims)} entries but the tensor has {len(shape)} "
                         "dims; give each dim exactly once")
    wrapped = [_wrap_dim(d, len(shape)) for d in dims]
    if sorted(wrapped) != list(range(len(shape))):
        raise ValueError(f"dims {dims} is not a permutation of 0..{len(shape) - 1}: a dim repeats")
    return tuple(shape[d] for d in wrapped), tuple(strides[d] for d in wrapped)


def slice_dim(
    shape: Sequence[int],
    strides: Sequence[int],
    offset: int,
    dim: int,
    start: int | None,
    stop: int | None,
    step: int = 1,
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Layout of ``x[..., start:stop:step]`` taken along ``dim``: a view, no copy.

    Args:
        shape, strides, offset: the tensor's layout and storage offset.
        dim: the dim to slice; negative dims count from the end.
        start, stop: as in a Python slice: None for the ends, negatives count from the end,
            anything past either end is clamped.
        step: a positive step (torch has no negative steps).

    Returns:
        (new shape, new strides, new offset). The slice may be empty (size 0).
    """
    shape, strides = _layout(shape, strides)
    offset, step = operator.index(offset), operator.index(step)
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if not shape:
        raise IndexError("cannot slice a 0-dim tensor: it has no dims")
    if step <= 0:
        raise ValueError(f"step must be positive, got {step}; torch has no negative steps "
                         "(torch.flip reverses, with a copy)")
    dim = _wrap_dim(dim, len(shape))
    start, stop, _ = slice(start, stop, step).indices(shape[dim])  # clamps like Python
    size = len(range(start, stop, step))
    new_shape = (*shape[:dim], size, *shape[dim + 1 :])
    new_strides = (*strides[:dim], strides[dim] * step, *strides[dim + 1 :])
    return new_shape, new_strides, offset + start * strides[dim]


def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether the layout is row-major with no gaps, by torch's rule.

    Args:
        shape, strides: the tensor's layout.

    Returns:
        True when every dim of size > 1 has the stride of ``contiguous_strides``; the stride of
        a size-1 dim is never used, so it may be anything. A tensor with no elements is
        contiguous.
    """
    shape, strides = _layout(shape, strides)
    if math.prod(shape) == 0:
        return True
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size  # a size-1 dim changes nothing
    return True


def view_strides(
    shape: Sequence[int], strides: Sequence[int], new_shape: Sequence[int]
) -> tuple[int, ...] | None:
    """Strides that ``x.view(new_shape)`` would get, or None where no view exists.

    Args:
        shape, strides: the tensor's layout.
        new_shape: the requested shape; one entry may be -1, inferred from the element count.

    Returns:
        The strides of the view over the same storage, or None when ``.view`` fails and a copy
        (``.reshape``) is needed. Old dims group into chunks that are contiguous among
        themselves; a view exists when the new dims split the same chunks (torch's rule,
        ATen's ``computeStride``).
    """
    shape, strides = _layout(shape, strides)
    new_shape = list(_ints(new_shape, "new_shape"))
    numel = math.prod(shape)
    if any(size < -1 for size in new_shape) or new_shape.count(-1) > 1:
        raise ValueError(f"new_shape {tuple(new_shape)} is invalid: sizes must be >= 0, with at "
                         "most one -1 for a size to infer")
    if -1 in new_shape:
        known = math.prod(size for size in new_shape if size != -1)
        if known == 0 or numel % known:
            why = "the other sizes multiply to 0" if known == 0 else f"not a multiple of {known}"
            raise ValueError(f"cannot infer the -1 in {tuple(new_shape)} for {numel} elements: "
                             f"{why}")
        new_shape[new_shape.index(-1)] = numel // known
    if math.prod(new_shape) != numel:
        raise ValueError(f"cannot view shape {shape} ({numel} elements) as {tuple(new_shape)} "
                         f"({math.prod(new_shape)} elements); the element counts must match")
    if not shape:  # a 0-dim tensor holds one element: any all-ones shape views it
        return (1,) * len(new_shape)
    if numel == 0:  # no element is ever read, so any strides do; torch picks these
        return strides if tuple(new_shape) == shape else contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    new_dim = len(new_shape) - 1
    chunk_stride = strides[-1]  # stride of the innermost dim of the current chunk
    chunk_numel = view_numel = 1
    for dim in range(len(shape) - 1, -1, -1):
        chunk_numel *= shape[dim]
        # The chunk ends where the next dim to the left does not step over this whole chunk.
        if dim == 0 or (shape[dim - 1] != 1 and strides[dim - 1] != chunk_numel * chunk_stride):
            while new_dim >= 0 and (view_numel < chunk_numel or new_shape[new_dim] == 1):
                new_strides[new_dim] = view_numel * chunk_stride
                view_numel *= new_shape[new_dim]
                new_dim -= 1
            if view_numel != chunk_numel:
                return None  # a new dim would span two chunks: no single stride reaches it
            if dim > 0:
                chunk_stride, chunk_numel, view_numel = strides[dim - 1], 1, 1
    return tuple(new_strides)


def as_strided(
    storage: Tensor, shape: Sequence[int], strides: Sequence[int], offset: int = 0
) -> Tensor:
    """Gather the tensor that ``shape``, ``strides`` and ``offset`` describe over ``storage``.

    Args:
        storage: 1-D tensor, the elements in storage order.
        shape, strides: the layout to read, strides in elements; shape ``()`` reads the one
            element at ``offset``.
        offset: storage position of element ``(0, 0, ...)``.

    Returns:
        A new tensor of ``shape`` and ``storage.dtype`` (a copy) with the values
        ``torch.as_strided(storage, shape, strides, offset)`` would show.
    """
    if not isinstance(storage, Tensor) or storage.dim() != 1:
        got = f"shape {tuple(storage.shape)}" if isinstance(storage, Tensor) else repr(storage)
        raise TypeError(f"storage must be a 1-D tensor (flatten it first), got {got}")
    shape, strides = _layout(shape, strides)
    offset = operator.index(offset)
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if math.prod(shape) > 0:
        last = flat_offset([size - 1 for size in shape], strides, offset)  # the farthest element
        if last >= storage.numel():
            raise IndexError(f"shape {shape}, strides {strides} and offset {offset} reach storage "
                             f"position {last}, but the storage has {storage.numel()} elements")
    index = torch.tensor(offset, device=storage.device)
    for size, stride in zip(shape, strides, strict=True):
        # Each dim adds a new last axis: positions so far plus this dim's steps, by broadcasting.
        index = index.unsqueeze(-1) + torch.arange(size, device=storage.device) * stride
    return torch.take(storage, index)  # a gather: one read per element of index, a new tensor


def broadcast_shapes(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """Shape of the result when tensors of shapes ``a`` and ``b`` are broadcast together.

    Args:
        a, b: the two shapes. Aligned from the right; missing leading dims count as size 1.

    Returns:
        The broadcast shape: per dim, the sizes must be equal or one of them 1.
    """
    a, b = _ints(a, "a"), _ints(b, "b")
    if any(size < 0 for size in (*a, *b)):
        raise ValueError(f"shapes {a} and {b}: sizes must be >= 0")
    result, clashes = [], []
    for dim in range(-1, -max(len(a), len(b)) - 1, -1):
        size_a = a[dim] if -dim <= len(a) else 1
        size_b = b[dim] if -dim <= len(b) else 1
        if size_a != size_b and 1 not in (size_a, size_b):
            clashes.append(f"dim {dim}: {size_a} vs {size_b}")
        result.append(size_b if size_a == 1 else size_a)
    if clashes:
        raise ValueError(f"shapes {a} and {b} do not broadcast ({'; '.join(reversed(clashes))}, "
                         "dims counted from the right); sizes must be equal or one of them 1")
    return tuple(reversed(result))


def split_heads(x: Float[Tensor, "b s d_model"], n_heads: int) -> Float[Tensor, "b h s d_head"]:
    """Split the last dim into heads and move the head dim forward: ``b s (h d) -> b h s d``.

    Args:
        x: activations, shape (batch, seq, d_model) with d_model = n_heads * d_head.
        n_heads: number of heads h.

    Returns:
        A view of shape (batch, n_heads, seq, d_head).
    """
    n_heads = operator.index(n_heads)
    if n_heads <= 0 or x.shape[-1] % n_heads:
        raise ValueError(f"cannot split d_model={x.shape[-1]} into n_heads={n_heads} equal heads")
    return rearrange(x, "b s (h d) -> b h s d", h=n_heads)


def merge_heads(x: Float[Tensor, "b h s d_head"]) -> Float[Tensor, "b s d_model"]:
    """Undo ``split_heads``: ``b h s d -> b s (h d)``.

    Args:
        x: per-head values, shape (batch, n_heads, seq, d_head).

    Returns:
        Shape (batch, seq, n_heads * d_head): a view when ``x`` came from ``split_heads``
        (h and d are still neighbours in storage), a copy when ``x`` is contiguous.
    """
    return rearrange(x, "b h s d -> b s (h d)")


def attention_scores(
    q: Float[Tensor, "b h s_q d"], k: Float[Tensor, "b h s_k d"]
) -> Float[Tensor, "b h s_q s_k"]:
    """Scaled dot products of every query with every key: ``q @ k^T / sqrt(d)``.

    Args:
        q: queries, shape (batch, heads, s_q, d).
        k: keys, shape (batch, heads, s_k, d).

    Returns:
        Scores, shape (batch, heads, s_q, s_k), before the softmax.
    """
    scores = einsum(q, k, "b h s_q d, b h s_k d -> b h s_q s_k")
    return scores / math.sqrt(q.shape[-1])


@jaxtyped(typechecker=beartype)
def project(
    x: Float[Tensor, "b s d_model"], w: Float[Tensor, "d_model d_out"]
) -> Float[Tensor, "b s d_out"]:
    """Apply a linear map to every position; shapes are checked at call time by jaxtyping.

    Args:
        x: activations, shape (batch, seq, d_model), floating point.
        w: weights, shape (d_model, d_out).

    Returns:
        ``x @ w``, shape (batch, seq, d_out). A call whose sizes disagree (say ``w`` given as
        (d_out, d_model)) raises ``jaxtyping.TypeCheckError`` naming each dim's size.
    """
    return einsum(x, w, "b s d_model, d_model d_out -> b s d_out")


# ---------------------------------------------------------------- predict, then measure
# The answers to section 12's questions, computed with the functions above; the notebook holds
# them sealed, and tests/test_notebooks.py checks that each sealed value is the one here.
# t.transpose(1, 2).view(2, 12), t of shape (2, 3, 4): (a) a view with strides (12, 1), (b) a
# copy, (c) an error. .view never copies: it is (a) where a view exists, (c) where none does.
choice_transposed_view = "c" if view_strides(
    *transpose((2, 3, 4), contiguous_strides((2, 3, 4)), 1, 2), (2, 12)) is None else "a"
# New bytes of m.T.reshape(-1), m a matrix of shape m_shape and dtype m_dtype: a copy where no
# view exists. Each student has a matrix of their own (grader/content/cases/strides.py); these
# are the default's, which the notebook's text describes.
m_shape = (1024, 1024)
m_dtype = "float32"
predicted_transpose_reshape_bytes = float(
    0 if view_strides(*transpose(m_shape, contiguous_strides(m_shape), 0, 1), (-1,)) is not None
    else math.prod(m_shape) * getattr(torch, m_dtype).itemsize)
# How much longer a copy takes when n doubles: as its bytes, in proportion to n**2.
predicted_copy_time_ratio = math.prod((2048, 2048)) / math.prod((1024, 1024))
