"""Lesson 05's measured 8-bit second moment: the linear int8 code breaks Adam, a log code over
enough decades does not (solutions/eight_bit.py)."""

from __future__ import annotations

import itertools
import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from solutions.eight_bit import LINEAR_CODE, adam_losses, log_code, through_code
from solutions.memory import choice_zeroed_share, dequantize_blockwise, quantize_blockwise


def test_the_linear_code_is_lesson_05s_int8_absmax_on_values_of_one_sign() -> None:
    torch.manual_seed(0)
    v = torch.rand(1000) ** 4  # non-negative, most of them small
    codes, scales = quantize_blockwise(v, 256)
    # float32 scales and one rounding each way: the two agree to float32's precision.
    assert torch.allclose(through_code(v, LINEAR_CODE),
                          dequantize_blockwise(codes, scales, v.shape, 256), rtol=1e-6, atol=0)


@given(st.lists(st.floats(1e-30, 1e30), min_size=1, max_size=600))
def test_the_log_code_stores_each_value_within_its_level_spacing(values) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    stored = through_code(x, log_code(12))
    block_max = torch.cat([x[i:i + 256].max().expand(len(x[i:i + 256]))
                           for i in range(0, len(x), 256)])
    covered = x >= block_max * 1e-12
    # Neighbouring levels are 10**(12/254) apart: a value moves by at most half that, plus
    # float32 rounding of the scale and of the result.
    spacing = 10 ** (12 / 254)
    relative = ((stored - x).abs() / x)[covered]
    assert bool((relative <= (spacing - 1) / 2 + 1e-6).all())


def test_the_linear_code_zeroes_nine_tenths_of_v_and_the_run_blows_up() -> None:
    assert choice_zeroed_share == "c"
    fp32, linear = adam_losses(None), adam_losses(LINEAR_CODE)
    assert fp32[-1] < 0.05 * fp32[0]  # fp32 converges
    assert not all(math.isfinite(x) for x in linear[:20])  # nan within 20 steps


def test_a_log_code_follows_fp32_only_over_enough_decades() -> None:
    fp32, seven, twelve = adam_losses(None), adam_losses(log_code(7)), adam_losses(log_code(12))
    assert seven[50] > 10 * seven[0]  # a few values still round to 0: the same jump
    assert twelve[-1] < 1.5 * fp32[-1]  # within half again of fp32 after 300 steps


def test_the_zeroes_after_the_first_step_are_as_lesson_05_says() -> None:
    """"nine in ten" for the linear code, "a quarter" over seven decades, one over twelve."""
    from solutions.eight_bit import least_squares_problem

    a, y = least_squares_problem()
    first_v = 0.001 * (2 * a.T @ (-y) / len(y)) ** 2
    zeroed = {name: int((through_code(first_v, code) == 0).sum()) for name, code in
              [("linear", LINEAR_CODE), ("7", log_code(7)), ("12", log_code(12))]}
    assert 0.85 < zeroed["linear"] / 256 < 0.95 and 0.2 < zeroed["7"] / 256 < 0.3
    assert zeroed["12"] <= 2  # one here; a value at the threshold may round either way elsewhere


def _dynamic_map(signed: bool, exponent_bits: int = 7) -> list[float]:
    """bitsandbytes' dynamic code as Dettmers et al. describe it, written anew: level group i
    (i = 0 .. 6) covers 10**(i - 6) times [0.1, 1] with the midpoints of an even split into
    2**i pieces (2**(i + 1) without a sign bit: the freed bit goes to the fraction); the
    signed code mirrors each group; 0 and 1 complete it."""
    levels = [0.0, 1.0]
    for i in range(exponent_bits):
        pieces = 2 ** i if signed else 2 ** (i + 1)
        edges = [0.1 + 0.9 * k / pieces for k in range(pieces + 1)]
        scale = 10.0 ** (i - exponent_bits + 1)
        group = [scale * (a + b) / 2 for a, b in itertools.pairwise(edges)]
        levels += group + ([-x for x in group] if signed else [])
    return sorted(levels)


def test_the_dynamic_codes_smallest_level_is_as_lesson_05_says() -> None:
    """"a few times 1e-7 of the block's largest (3.25e-7 for v), a range a little narrower than
    the seven-decade log code's" (whose smallest level is 1e-7)."""
    unsigned, signed = _dynamic_map(signed=False), _dynamic_map(signed=True)
    assert len(unsigned) == len(signed) == 256  # one byte either way
    smallest_v, smallest_m = min(x for x in unsigned if x > 0), min(x for x in signed if x > 0)
    assert math.isclose(smallest_v, 3.25e-7) and math.isclose(smallest_m, 5.5e-7)
    seven_decades = min(float(x) for x in log_code(7) if x > 0)
    assert math.isclose(seven_decades, 1e-7) and seven_decades < smallest_v < smallest_m
