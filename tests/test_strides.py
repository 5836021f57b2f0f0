"""Lesson 02 reference code against torch's own strides, offsets, views and broadcasting."""

from __future__ import annotations

import math

import jaxtyping
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grader.content.cases import as_case, reference_value
from grader.content.cases.strides import DRAWN, VARIANTS
from grader.content.lessons import load_lesson
from grader.grading.plans import variant_answer
from solutions import strides
from solutions.expand import expand_layout
from solutions.strides import (
    as_strided,
    attention_scores,
    broadcast_shapes,
    contiguous_strides,
    flat_offset,
    is_contiguous,
    merge_heads,
    permute,
    project,
    slice_dim,
    split_heads,
    transpose,
    view_strides,
)
from tests.grading_helpers import judged_with, with_edits
from tests.line_count import lines_run

FEW = settings(max_examples=200, deadline=None)


def layout(t: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    return tuple(t.shape), t.stride(), t.storage_offset()


def is_plain(value: object) -> bool:
    """An int, or tuples of them: what the notebook's check() demands (no torch.Size, no
    numpy ints)."""
    if type(value) is tuple:
        return all(is_plain(v) for v in value)
    return type(value) is int


@st.composite
def shapes(draw: st.DrawFn, min_dims: int = 0, max_dims: int = 5) -> tuple[int, ...]:
    """``min_dims`` to ``max_dims`` small sizes; about one shape in ten has a size-0 dim."""
    shape = draw(st.lists(st.integers(1, 4), min_size=min_dims, max_size=max_dims))
    if shape and draw(st.integers(0, 9)) == 0:
        shape[draw(st.integers(0, len(shape) - 1))] = 0
    return tuple(shape)


@st.composite
def strided_tensors(
    draw: st.DrawFn, min_dims: int = 0, min_ops: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(storage, t): ``storage`` is ``arange`` (value = storage position) and ``t`` a view of it
    made by real torch ops: a storage offset, then at least ``min_ops`` of permutes, stepped
    slices, expands of size-1 dims (stride 0), unsqueezes and new strides for size-1 dims (any
    stride is valid there, and torch's ops leave all sorts), in any order."""
    shape = draw(shapes(min_dims=min_dims, max_dims=4))
    offset = draw(st.integers(0, 5))
    numel = math.prod(shape)
    storage = torch.arange(offset + numel + draw(st.integers(0, 3)))
    t = storage[offset : offset + numel].view(shape)
    ops = st.sampled_from(["permute", "slice", "expand", "unsqueeze", "restride"])
    for op in draw(st.lists(ops, min_size=min_ops, max_size=4)):
        if op == "permute":
            t = t.permute(draw(st.permutations(range(t.dim()))))
        elif op == "slice" and t.dim() > 0:  # non-empty slices: test_slice_dim_* does the rest
            dim = draw(st.integers(0, t.dim() - 1))
            start = draw(st.integers(0, max(t.shape[dim] - 1, 0)))
            stop = draw(st.none() | st.integers(start + 1, max(t.shape[dim], start + 1)))
            t = t[(slice(None),) * dim + (slice(start, stop, draw(st.integers(1, 3))),)]
        elif op == "expand" and 1 in t.shape:
            t = t.expand(*[draw(st.integers(1, 3)) if s == 1 else s for s in t.shape])
        elif op == "unsqueeze" and t.dim() < 5:
            t = t.unsqueeze(draw(st.integers(0, t.dim())))
        elif op == "restride" and 1 in t.shape:
            new = [draw(st.integers(0, 9)) if n == 1 else s
                   for n, s in zip(t.shape, t.stride(), strict=True)]
            t = t.as_strided(t.shape, new, t.storage_offset())
    return storage, t


@st.composite
def dims_of(draw: st.DrawFn, ndim: int) -> int:
    """A valid dim of an ``ndim``-dim tensor, negative half the time (torch allows both)."""
    dim = draw(st.integers(0, max(ndim, 1) - 1))
    return dim - max(ndim, 1) if draw(st.booleans()) else dim


# ---------------------------------------------------------------- strides and offsets


@FEW
@given(shapes())
def test_contiguous_strides_equal_strides_of_a_new_torch_tensor(shape: tuple[int, ...]) -> None:
    got = contiguous_strides(shape)
    assert got == torch.empty(shape).stride()
    assert type(got) is tuple and is_plain(got)


@FEW
@given(strided_tensors(), st.data())
def test_flat_offset_finds_the_storage_position_of_every_element(case, data) -> None:
    storage, t = case
    if t.numel() == 0:
        return
    index = tuple(data.draw(st.integers(0, size - 1)) for size in t.shape)
    got = flat_offset(index, t.stride(), t.storage_offset())
    assert is_plain(got)
    assert got == t[index].item()  # storage is arange: the value is the position
    assert storage[got] == t[index]


def test_flat_offset_of_a_row_major_matrix() -> None:
    assert flat_offset((1, 2), (4, 1)) == 6
    assert flat_offset((1, 2), (1, 3), storage_offset=5) == 12
    assert flat_offset((), ()) == 0 and flat_offset((), (), 7) == 7


# ---------------------------------------------------------------- transpose, permute, slice


@FEW
@given(strided_tensors(), st.data())
def test_transpose_matches_torch_including_negative_dims(case, data) -> None:
    _, t = case
    dim0, dim1 = data.draw(dims_of(t.dim())), data.draw(dims_of(t.dim()))
    got = transpose(t.shape, t.stride(), dim0, dim1)
    want = t.transpose(dim0, dim1)
    assert got == (tuple(want.shape), want.stride())
    assert is_plain(got)


@FEW
@given(strided_tensors(), st.data())
def test_permute_matches_torch_including_negative_dims(case, data) -> None:
    _, t = case
    order = data.draw(st.permutations(range(t.dim())))
    dims = tuple(d - t.dim() if data.draw(st.booleans()) else d for d in order)
    got = permute(t.shape, t.stride(), dims)
    want = t.permute(dims)
    assert got == (tuple(want.shape), want.stride())
    assert is_plain(got)


@FEW
@given(strided_tensors(), st.data())
def test_slice_dim_matches_torch_indexing_with_steps_and_clamping(case, data) -> None:
    _, t = case
    if t.dim() == 0:
        return
    dim = data.draw(dims_of(t.dim()))
    start = data.draw(st.none() | st.integers(-6, 6))
    stop = data.draw(st.none() | st.integers(-6, 6))
    step = data.draw(st.integers(1, 4))
    want = t[(slice(None),) * (dim % t.dim()) + (slice(start, stop, step),)]
    got = slice_dim(t.shape, t.stride(), t.storage_offset(), dim, start, stop, step)
    assert got == layout(want)
    assert is_plain(got)


def test_slice_past_the_end_keeps_torchs_offset() -> None:
    t = torch.arange(10)
    assert slice_dim((10,), (1,), 0, 0, 20, None, 1) == layout(t[20:]) == ((0,), (1,), 10)
    assert slice_dim((10,), (1,), 0, 0, None, None, 20) == layout(t[::20]) == ((1,), (20,), 0)
    assert slice_dim((10,), (1,), 0, 0, 7, 3, 2) == layout(t[7:3:2]) == ((0,), (2,), 7)


# ---------------------------------------------------------------- contiguity and views


@FEW
@given(strided_tensors())
def test_is_contiguous_matches_torch_on_tensors_made_by_views(case) -> None:
    _, t = case
    assert is_contiguous(t.shape, t.stride()) is t.is_contiguous()


def test_is_contiguous_matches_torch_on_arbitrary_strides() -> None:
    seen = set()

    @FEW
    @given(shapes(max_dims=4), st.data())
    def check(shape: tuple[int, ...], data) -> None:
        strides = tuple(data.draw(st.sampled_from([0, 1, 2, 3, 4, 6, 12])) for _ in shape)
        t = torch.empty(200).as_strided(shape, strides)
        got = is_contiguous(shape, strides)
        assert got is t.is_contiguous()
        seen.add(got)

    check()
    assert seen == {True, False}


def test_is_contiguous_ignores_the_stride_of_size_1_dims() -> None:
    assert is_contiguous((3, 1, 4), (4, 99, 1))
    assert torch.empty(99).as_strided((3, 1, 4), (4, 99, 1)).is_contiguous()
    assert not is_contiguous((3, 4), (1, 3)) and is_contiguous((2, 0, 3), (7, 5, 2))


@st.composite
def new_shapes(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape with the same number of elements: either regroup neighbouring dims of ``shape``
    (merge two, or split one into two), or a fresh factorisation of the element count; size-1
    dims sprinkled in, and sometimes one size replaced by -1."""
    new = list(shape)
    how = draw(st.sampled_from(["merge", "merge", "split", "factor"]))  # merges can fail
    if how == "merge" and len(new) >= 2:
        i = draw(st.integers(0, len(new) - 2))
        new[i : i + 2] = [new[i] * new[i + 1]]
    elif how == "split" and new:
        i = draw(st.integers(0, len(new) - 1))
        first = draw(st.sampled_from([d for d in range(1, new[i] + 1) if new[i] % d == 0] or [0]))
        new[i : i + 1] = [first, new[i] // first] if first else [0, draw(st.integers(1, 3))]
    elif how == "factor":  # each prime factor of the element count goes to a random dim
        numel = math.prod(shape)
        new = [1 if numel else 0] + [1] * draw(st.integers(0, 3))
        for p in _prime_factors(numel):
            new[draw(st.integers(0, len(new) - 1))] *= p
    for _ in range(draw(st.integers(0, 2))):
        new.insert(draw(st.integers(0, len(new))), 1)
    if new and draw(st.integers(0, 3)) == 0 and math.prod(new) != 0:
        new[draw(st.integers(0, len(new) - 1))] = -1
    return tuple(new)


def _prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors


def test_view_strides_match_torch_view_success_failure_and_storage() -> None:
    outcomes = {"view": 0, "copy": 0}

    @FEW
    @given(strided_tensors(min_dims=2, min_ops=3), st.data())
    def check(case, data) -> None:
        _, t = case
        new_shape = data.draw(new_shapes(tuple(t.shape)))
        got = view_strides(t.shape, t.stride(), new_shape)
        try:
            viewed = t.view(new_shape)
        except RuntimeError as error:
            assert "view size is not compatible" in str(error)
            assert got is None
            reshaped = t.reshape(new_shape)  # so a copy is needed: reshape makes one
            assert reshaped.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
            outcomes["copy"] += 1
            return
        assert got == viewed.stride()
        assert is_plain(got)
        assert viewed.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        assert t.reshape(new_shape).stride() == got
        outcomes["view"] += 1

    check()
    # The drawn shapes must exercise both sides of the rule, not only the easy one.
    assert outcomes["view"] >= 10 and outcomes["copy"] >= 10, outcomes


@FEW
@given(shapes(), st.data())
def test_view_strides_of_a_contiguous_tensor_are_contiguous(shape, data) -> None:
    new_shape = data.draw(new_shapes(shape))
    got = view_strides(shape, contiguous_strides(shape), new_shape)
    want = torch.empty(shape).view(new_shape)
    assert got == want.stride()
    if math.prod(shape) > 0:
        assert got == contiguous_strides(want.shape)


def test_view_strides_examples() -> None:
    assert view_strides((2, 3, 4), (12, 4, 1), (6, -1)) == (4, 1)
    assert view_strides((4, 3), (1, 4), (12,)) is None  # a transposed matrix cannot flatten
    assert view_strides((4, 3), (1, 4), (2, 2, 3)) == (2, 1, 4)  # but its dims can split
    assert view_strides((), (), (1, 1)) == (1, 1)
    assert view_strides((0, 3), (3, 1), (3, 0)) == (1, 1)
    empty = torch.empty(0, 6)[:, ::2]
    assert view_strides((0, 3), (6, 2), (0, 3)) == (6, 2) == empty.view(0, 3).stride()
    odd = torch.empty(6).as_strided((2, 1, 3), (3, 7, 1))  # a size-1 dim's stride is never used
    assert view_strides((2, 1, 3), (3, 7, 1), (6,)) == (1,) == odd.view(6).stride()


@pytest.mark.parametrize(
    ("new_shape", "match"),
    [((5,), "element counts must match"), ((4, -1), "not a multiple of 4"),
     ((-1, -1), "at most one -1"), ((2, -3), "sizes must be >= 0")],
)
def test_view_strides_rejects_bad_shapes_where_torch_does(new_shape, match) -> None:
    with pytest.raises(ValueError, match=match):
        view_strides((2, 3), (3, 1), new_shape)
    with pytest.raises(RuntimeError):
        torch.empty(2, 3).view(new_shape)


def test_view_strides_cannot_infer_minus_one_for_zero_elements_like_torch() -> None:
    with pytest.raises(ValueError, match="cannot infer"):
        view_strides((0, 3), (3, 1), (0, -1))
    with pytest.raises(RuntimeError, match="ambiguous"):
        torch.empty(0, 3).view(0, -1)
    assert view_strides((0, 3), (3, 1), (2, -1)) == torch.empty(0, 3).view(2, -1).stride()


# ---------------------------------------------------------------- as_strided


@FEW
@given(shapes(max_dims=4), st.data())
def test_as_strided_gathers_what_torch_as_strided_shows(shape, data) -> None:
    strides = tuple(data.draw(st.integers(0, 6)) for _ in shape)
    offset = data.draw(st.integers(0, 5))
    reach = flat_offset([max(s - 1, 0) for s in shape], strides, offset)
    dtype = data.draw(st.sampled_from([torch.float32, torch.int64, torch.bfloat16]))
    size = reach + 1 + data.draw(st.integers(0, 3))
    storage = torch.randperm(size, generator=torch.Generator().manual_seed(size)).to(dtype)
    got = as_strided(storage, shape, strides, offset)
    want = torch.as_strided(storage, shape, strides, offset)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)
    if got.numel():
        assert got.untyped_storage().data_ptr() != storage.untyped_storage().data_ptr()


@FEW
@given(strided_tensors())
def test_as_strided_rebuilds_any_view_from_its_storage(case) -> None:
    storage, t = case
    assert torch.equal(as_strided(storage, t.shape, t.stride(), t.storage_offset()), t)


def test_as_strided_rejects_reads_past_the_storage_like_torch() -> None:
    storage = torch.arange(6.0)
    with pytest.raises(IndexError, match="position 6, but the storage has 6"):
        as_strided(storage, (2, 3), (3, 1), 1)
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.as_strided(storage, (2, 3), (3, 1), 1)
    assert as_strided(storage, (0, 3), (3, 1), 50).shape == (0, 3)  # nothing read: allowed


def test_as_strided_runs_a_few_python_lines_not_one_per_element() -> None:
    storage = torch.arange(10_000, dtype=torch.int32)
    # 10,000 elements, read transposed
    lines, got = lines_run(strides, lambda: as_strided(storage, (100, 100), (1, 100)))
    assert torch.equal(got, storage.view(100, 100).T)
    assert 0 < lines < 100  # a loop over elements would run at least 10,000 lines


# ---------------------------------------------------------------- broadcasting


@st.composite
def shape_pairs(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes that broadcast (derived from one shape) or, a third of the time, any two."""
    if draw(st.integers(0, 2)) == 0:
        return draw(shapes()), draw(shapes())
    full = draw(shapes())

    def part() -> tuple[int, ...]:
        kept = full[draw(st.integers(0, len(full))) :]
        return tuple(1 if draw(st.booleans()) else size for size in kept)

    return part(), part()


def test_broadcast_shapes_matches_torch_including_its_errors() -> None:
    outcomes = set()

    @FEW
    @given(shape_pairs())
    def check(pair) -> None:
        a, b = pair
        try:
            want = tuple(torch.broadcast_shapes(a, b))
        except RuntimeError:
            with pytest.raises(ValueError, match="do not broadcast") as error:
                broadcast_shapes(a, b)
            assert str(a) in str(error.value) and str(b) in str(error.value)
            outcomes.add("error")
            return
        got = broadcast_shapes(a, b)
        assert got == want and is_plain(got)
        outcomes.add("ok")

    check()
    assert outcomes == {"ok", "error"}


def test_broadcast_error_names_every_clashing_dim() -> None:
    message = r"\(2, 3, 4\) and \(5, 1, 6\) do not broadcast \(dim -3: 2 vs 5; dim -1: 4 vs 6"
    with pytest.raises(ValueError, match=message):
        broadcast_shapes((2, 3, 4), (5, 1, 6))
    assert broadcast_shapes((1,), (0,)) == (0,) == tuple(torch.broadcast_shapes((1,), (0,)))


# ---------------------------------------------------------------- expand


@st.composite
def expand_targets(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape to expand ``shape`` to. Built as ``expand`` allows (dims of size 1 stretched to
    any size, 0 included; sizes kept, or written -1; new dims on the left), then, half the time,
    with one rule broken: a size other than 1 changed, a dim dropped, -1 in a new dim, or a
    size below -1. A broken rule may happen to be harmless (a size changed to itself)."""
    new = []
    for size in shape:
        if size == 1 and draw(st.booleans()):
            new.append(draw(st.integers(0, 3)))
        else:
            new.append(-1 if draw(st.integers(0, 3)) == 0 else size)
    new = draw(st.lists(st.integers(0, 3), max_size=2)) + new
    how = draw(st.sampled_from(["keep", "keep", "resize", "drop", "new -1", "negative"]))
    if how == "resize" and shape:
        new[len(new) - len(shape) + draw(st.integers(0, len(shape) - 1))] = draw(
            st.integers(0, 4))
    elif how == "drop" and new:
        del new[draw(st.integers(0, len(new) - 1))]
    elif how == "new -1":
        new.insert(0, -1)
    elif how == "negative" and new:
        new[draw(st.integers(0, len(new) - 1))] = draw(st.integers(-3, -2))
    return tuple(new)


def test_expand_layout_refuses_exactly_what_torch_expand_refuses() -> None:
    outcomes = {"expanded": 0, "refused": 0}

    @FEW
    @given(strided_tensors(), st.data())
    def check(case, data) -> None:
        _, t = case
        new_shape = data.draw(expand_targets(tuple(t.shape)))
        try:
            want = t.expand(new_shape)
        except RuntimeError:
            want = None
        if want is None or min(want.shape, default=0) < 0:  # see the next test for the second
            with pytest.raises(ValueError, match="cannot expand"):
                expand_layout(t.shape, t.stride(), new_shape)
            outcomes["refused"] += 1
            return
        got = expand_layout(t.shape, t.stride(), new_shape)
        assert got == (tuple(want.shape), want.stride())
        assert is_plain(got)
        outcomes["expanded"] += 1

    check()
    # The drawn shapes must exercise both sides of the rule, not only the easy one.
    assert outcomes["expanded"] >= 20 and outcomes["refused"] >= 20, outcomes


def test_expand_layout_refuses_negative_sizes_that_torch_lets_through_when_empty() -> None:
    """torch 2.13 checks a size below -1 only through the element count, which is 0 when
    another size is 0: it returns a tensor of shape (-2, 0), which no tensor can have. The
    course's helper refuses every size below -1 (torch does, with any element to count)."""
    assert tuple(torch.zeros(0).expand(-2, 0).shape) == (-2, 0)
    with pytest.raises(RuntimeError):
        torch.zeros(1).expand(-2, 1)
    for shape, new_shape in [((0,), (-2, 0)), ((1,), (-2, 1))]:
        with pytest.raises(ValueError, match="sizes must be >= 0"):
            expand_layout(shape, contiguous_strides(shape), new_shape)


@pytest.mark.parametrize(("shape", "old_strides", "new_shape"), [
    ((3, 4), (4, 1), (1, 4)),  # the review's example: broadcasting allows it, expand does not
    ((3, 4), (4, 1), (4,)),  # a dim dropped
    ((4,), (1,), (-1, 4)),  # -1 in a new dim has no size to keep
    ((0,), (1,), (1,)),  # a size-0 dim is not a size-1 dim
    ((1,), (1,), (-2,)),
])
def test_expand_layout_refuses_what_broadcasting_would_allow(shape, old_strides,
                                                             new_shape) -> None:
    with pytest.raises(RuntimeError):
        torch.empty(12).as_strided(shape, old_strides).expand(new_shape)
    with pytest.raises(ValueError, match="cannot expand"):
        expand_layout(shape, old_strides, new_shape)


@pytest.mark.parametrize(("shape", "old_strides", "new_shape"), [
    ((4,), (1,), (1, 1, 4)), ((2, 1, 3), (3, 5, 1), (1, 2, 1, 3)), ((), (), (1, 2)),
    ((1,), (1,), (0,)), ((1, 4), (4, 1), (-1, -1)), ((1,), (7,), (1,)),
])
def test_expand_layout_gives_torchs_strides_to_new_and_stretched_dims(shape, old_strides,
                                                                      new_shape) -> None:
    want = torch.empty(12).as_strided(shape, old_strides).expand(new_shape)
    assert expand_layout(shape, old_strides, new_shape) == (tuple(want.shape), want.stride())


# ---------------------------------------------------------------- predict, then measure


def test_the_sealed_answers_of_the_lesson_are_what_torch_does() -> None:
    t = torch.arange(24.0).reshape(2, 3, 4)
    with pytest.raises(RuntimeError):
        t.transpose(1, 2).view(2, 12)
    assert strides.choice_transposed_view == "c"  # (c): torch refuses
    m = torch.zeros(1024, 1024)
    assert (strides.m_shape, strides.m_dtype) == MATRICES.choices[0] == ((1024, 1024), "float32")
    assert strides.predicted_transpose_reshape_bytes == 4 * 2**20
    big = torch.zeros(2048, 2048, device="meta").clone()
    ratio = big.nbytes / m.clone().untyped_storage().nbytes()
    assert strides.predicted_copy_time_ratio == ratio == 4.0


MATRICES = VARIANTS["predicted_transpose_reshape_bytes"]


@pytest.mark.parametrize("index", range(len(MATRICES.choices)))
def test_each_students_transpose_reshape_copies_the_bytes_of_their_answer(index: int) -> None:
    """Each student's matrix, made by torch: m.T.reshape(-1) copies, and the copy's storage
    holds that variant's answer; the band's reasoning (grader/content/cases/strides.py) holds."""
    shape, dtype = MATRICES.choices[index]
    answer = variant_answer(load_lesson("02_tensors_and_strides"),
                            "predicted_transpose_reshape_bytes", index)
    m = torch.zeros(shape, dtype=getattr(torch, dtype))
    copied = m.T.reshape(-1)
    assert copied.untyped_storage().data_ptr() != m.untyped_storage().data_ptr()
    assert type(answer) is float and answer == copied.untyped_storage().nbytes()
    mib = answer / 2**20
    assert mib == int(mib) and math.isclose(mib * 1e6, answer, rel_tol=0.1)  # MB for MiB: in
    wrong = [0, 2 * answer, *(m.numel() * size for size in (1, 2, 4, 8) if size != m.itemsize)]
    assert not any(math.isclose(w, answer, rel_tol=0.1) for w in wrong)
    others = [variant_answer(load_lesson("02_tensors_and_strides"),
                             "predicted_transpose_reshape_bytes", i)
              for i in range(len(MATRICES.choices)) if i != index]
    assert not any(math.isclose(other, answer, rel_tol=0.1) for other in others)


def torch_view_strides(shape, strides_, new_shape):
    """The strides torch gives .view(new_shape) of that layout, or None where it refuses."""
    t = torch.arange(1 + sum((n - 1) * s for n, s in zip(shape, strides_, strict=True)))
    try:
        return t.as_strided(shape, strides_).view(new_shape).stride()
    except RuntimeError:
        return None


def torch_slice_dim(shape, strides_, offset, dim, start, stop, step=1):
    """The layout of torch's own slice of that layout."""
    t = torch.arange(1 + offset + sum((n - 1) * s for n, s in zip(shape, strides_, strict=True)))
    t = t.as_strided(shape, strides_, offset)
    return layout(t[(slice(None),) * (dim % t.dim()) + (slice(start, stop, step),)])


@pytest.mark.parametrize("exercise", sorted(DRAWN))
def test_drawn_hidden_inputs_are_valid_and_differ_between_students(exercise: str) -> None:
    """Each student's drawn calls are ones the exercise accepts, the reference answers them as
    torch does (exactly: no tolerance), and the same seed draws the same calls."""
    oracle = {**vars(strides), "view_strides": torch_view_strides,
              "slice_dim": torch_slice_dim}
    from tests.grading_helpers import drawn_calls

    answers = []
    for calls in drawn_calls(DRAWN[exercise], range(40)):
        for case in map(as_case, calls):
            assert case.raises is None and not case.rel_tol
            got = reference_value(case, vars(strides))
            assert got == eval(case.expression, oracle), case  # the same call, on torch
            assert got is None or is_plain(got), case
            answers.append(got)
    if exercise == "view_strides":  # both sides of the rule come up
        assert answers.count(None) >= 10 and len(answers) - answers.count(None) >= 10


# ---------------------------------------------------------------- bad input


def test_bad_layouts_raise_errors_that_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="negative size"):
        contiguous_strides((2, -1))
    with pytest.raises(TypeError, match="sequence of ints"):
        contiguous_strides(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence of ints"):
        is_contiguous((2.0, 3), (3, 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one stride per dim"):
        is_contiguous((2, 3), (1,))
    with pytest.raises(ValueError, match="torch strides are >= 0"):
        transpose((2, 3), (-3, 1), 0, 1)
    with pytest.raises(ValueError, match="one index per dim"):
        flat_offset((1,), (3, 1))
    with pytest.raises(IndexError, match="negative entry"):
        flat_offset((0, -1), (3, 1))


def test_bad_dims_raise_like_torch() -> None:
    t = torch.empty(2, 3)
    for call, torch_call, error in [
        (lambda: transpose((2, 3), (3, 1), 0, 2), lambda: t.transpose(0, 2), IndexError),
        (lambda: slice_dim((2, 3), (3, 1), 0, -3, 0, 1, 1), lambda: t.narrow(-3, 0, 1), IndexError),
        (lambda: permute((2, 3), (3, 1), (0, 0)), lambda: t.permute(0, 0), ValueError),
        (lambda: permute((2, 3), (3, 1), (0,)), lambda: t.permute(0), ValueError),
        (lambda: permute((2, 3), (3, 1), (0, 2)), lambda: t.permute(0, 2), IndexError),
        (lambda: slice_dim((), (), 0, 0, 0, 1, 1), lambda: torch.tensor(1.0)[0:1], IndexError),
    ]:
        with pytest.raises(error, match=r"out of range|permutation|once|0-dim"):
            call()
        with pytest.raises((IndexError, RuntimeError)):
            torch_call()
    with pytest.raises(IndexError):  # the lesson's text: as torch does, not ValueError
        t.permute(0, 2)
    with pytest.raises(ValueError, match="step must be positive"):
        slice_dim((4,), (1,), 0, 0, None, None, -1)
    with pytest.raises(ValueError, match="step must be greater than zero"):
        torch.arange(4)[::-1]


def test_a_view_that_leaves_trailing_size_1_dims_out_of_a_chunk_fails_a_visible_check() -> None:
    """Hint 3 of view_strides, "and any size-1 dims": a size-1 new dim at the left end of a chunk
    belongs to it. Left for the next chunk (or none), it gets another stride than torch's."""
    assert view_strides((2, 3), (3, 1), (1, 2, 3)) == torch.empty(2, 3).view(1, 2, 3).stride()
    left_out = with_edits(view_strides, ("(view_numel < chunk_numel or new_shape[new_dim] == 1)",
                                         "view_numel < chunk_numel"))
    assert left_out((2, 3), (3, 1), (1, 2, 3)) != (6, 3, 1)
    verdict = judged_with("02_tensors_and_strides", "view_strides", view_strides=left_out)
    assert [f.split(":")[0] for f in verdict.visible_failures] == [
        "view_strides((2, 3), (3, 1), (1, 2, 3))"]
    assert verdict.hidden_failures


def test_a_0_dim_tensor_transposes_and_permutes_to_itself_like_torch() -> None:
    s = torch.tensor(1.0)
    assert transpose((), (), 0, -1) == ((), ()) == (tuple(s.transpose(0, -1).shape), s.stride())
    assert permute((), (), ()) == ((), ())
    assert is_contiguous((), ()) is s.is_contiguous() is True


# ---------------------------------------------------------------- einops and jaxtyping


@FEW
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3))
def test_split_heads_is_a_view_equal_to_view_then_transpose(b, s, h, d) -> None:
    x = torch.arange(b * s * h * d, dtype=torch.float32).reshape(b, s, h * d)
    got = split_heads(x, h)
    assert torch.equal(got, x.view(b, s, h, d).transpose(1, 2))
    assert got.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # no copy
    assert torch.equal(merge_heads(got), x)


def test_merge_heads_views_split_heads_output_but_copies_contiguous_heads() -> None:
    x = torch.arange(120, dtype=torch.float32).reshape(2, 5, 12)
    heads = split_heads(x, 3)
    merged = merge_heads(heads)  # h and d are still neighbours in storage: a view
    assert torch.equal(merged, x)
    assert merged.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    dense = heads.contiguous()  # as an attention output is: b h s d in row-major order
    assert view_strides(*permute(dense.shape, dense.stride(), (0, 2, 1, 3)), (2, 5, 12)) is None
    copied = merge_heads(dense)
    assert torch.equal(copied, x)
    assert copied.untyped_storage().data_ptr() != dense.untyped_storage().data_ptr()
    with pytest.raises(ValueError, match="n_heads=5"):
        split_heads(x, 5)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 5), st.integers(1, 5),
       st.integers(1, 8))
def test_attention_scores_reproduce_torch_scaled_dot_product_attention(b, h, s_q, s_k, d) -> None:
    generator = torch.Generator().manual_seed(b * 1000 + h * 100 + s_q * 10 + s_k + d)
    q, k, v = (torch.randn(b, h, n, d, generator=generator) for n in (s_q, s_k, s_k))
    scores = attention_scores(q, k)
    assert scores.shape == (b, h, s_q, s_k)
    # float32 dot products of length <= 8 summed in a different order: error ~ 1e-6 per score.
    assert torch.allclose(scores, q @ k.transpose(-2, -1) / math.sqrt(d), atol=1e-5, rtol=1e-5)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(scores.softmax(-1) @ v, want, atol=1e-5, rtol=1e-5)


def test_project_matches_matmul_and_rejects_swapped_weights_naming_the_dims() -> None:
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 4, generator=generator), torch.randn(4, 5, generator=generator)
    # The same four products per output, maybe summed in another order: float32 rounding only.
    assert torch.allclose(project(x, w), x @ w, atol=1e-6, rtol=1e-6)
    with pytest.raises(jaxtyping.TypeCheckError, match=r"(?s)parameter 'w'.*d_model=4"):
        project(x, w.T)
    with pytest.raises(jaxtyping.TypeCheckError, match="parameter 'x'"):
        project(x.long(), w)  # integers are not Float
    with pytest.raises(jaxtyping.TypeCheckError):
        project(x[0], w)  # a missing batch dim
