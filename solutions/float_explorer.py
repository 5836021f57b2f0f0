"""Lesson 01's explorer: the bits of a float format as toggles, decoded as they change.

Pick a format, switch bits on and off, and read the pattern's fields, value and category. Every
number shown comes from the lesson's own functions: ``split_bits`` for the fields and ``decode``
for the value (in the notebook, the student's versions of them). ``python -m grader sync``
copies this code into the notebook as a given cell.
"""

from __future__ import annotations

import html
import math

import ipywidgets as widgets

from solutions.floats import BF16, FP8_E4M3, FP8_E5M2, FP16, FP32, FloatFormat, decode, split_bits

EXPLORER_FORMATS = {"fp32": FP32, "fp16": FP16, "bf16": BF16, "fp8 E4M3": FP8_E4M3,
                    "fp8 E5M2": FP8_E5M2}
# Each field's colour for a bit that is 0 (pale) and 1 (full), as in the lesson's layout plot.
BIT_COLOURS = {"sign": ("#F5DDA8", "#E69F00"), "exponent": ("#D2EAF9", "#56B4E9"),
               "mantissa": ("#B3E2D5", "#009E73")}


def float_category(bits: int, fmt: FloatFormat) -> str:
    """What a bit pattern stands for: "normal", "subnormal", "zero", "inf" or "NaN"."""
    value = decode(bits, fmt)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf"
    if value == 0:
        return "zero"
    return "subnormal" if split_bits(bits, fmt)[1] == 0 else "normal"


def bit_readout(bits: int, fmt: FloatFormat) -> dict[str, str]:
    """What the explorer shows for a pattern: one line of text per label.

    Args:
        bits: the pattern as an unsigned integer.
        fmt: its format.

    Returns:
        The lines "bits", "sign", "exponent field", "mantissa field", "value" (``repr`` of
        ``decode``) and "category", each from ``split_bits`` and ``decode``.
    """
    sign, exponent, mantissa = split_bits(bits, fmt)
    category = float_category(bits, fmt)
    plus_minus = "-" if sign else "+"
    if category == "normal":
        power = exponent - fmt.bias
        meaning = f"power of two {exponent} - {fmt.bias} = {power}"
        formula = f"{plus_minus}(1 + {mantissa}/2^{fmt.mantissa_bits}) × 2^{power}"
    elif category in ("subnormal", "zero"):
        meaning = f"power of two fixed at 1 - {fmt.bias} = {1 - fmt.bias}, no leading 1"
        formula = f"{plus_minus}{mantissa}/2^{fmt.mantissa_bits} × 2^{1 - fmt.bias}"
    else:
        meaning = ("all ones: inf or NaN" if fmt.ieee_specials
                   else "all ones, with an all-ones mantissa: NaN (E4M3 has no inf)")
        formula = f"{plus_minus}inf" if category == "inf" else "not a number"
    return {
        "bits": f"{sign} {exponent:0{fmt.exponent_bits}b} {mantissa:0{fmt.mantissa_bits}b}"
                f"  (0x{bits:0{fmt.total_bits // 4}X})",
        "sign": f"{sign} ({plus_minus})",
        "exponent field": f"{exponent}: {meaning}",
        "mantissa field": f"{mantissa}, one of 0 to {2**fmt.mantissa_bits - 1} "
                          f"({fmt.mantissa_bits} bits)",
        "value": repr(decode(bits, fmt)),
        "category": f"{category}: {formula}",
    }


def float_explorer(fmt: FloatFormat = FP16, bits: int | None = None) -> widgets.VBox:
    """Buttons for every bit of a format, with its fields, value and category shown live.

    Args:
        fmt: the format shown first; a menu switches to the others.
        bits: the pattern shown first (None: the pattern of 1.0, exponent field = bias).

    Returns:
        The widget, for ``display``. A click on a bit's button switches the bit. Each button
        has the CSS class ``ctc-bit-<i>`` (i counts from the sign bit, 0), the readout
        ``ctc-float-readout``.
    """
    names = {f: name for name, f in EXPLORER_FORMATS.items()}
    menu = widgets.Dropdown(options=list(EXPLORER_FORMATS), value=names[fmt],
                            description="format")
    row = widgets.HBox(layout=widgets.Layout(flex_flow="row wrap"))
    readout = widgets.HTML()
    readout.add_class("ctc-float-readout")
    shown = {"fmt": fmt, "bits": 0}

    def field(i: int) -> str:
        return "sign" if i == 0 else "exponent" if i <= shown["fmt"].exponent_bits else "mantissa"

    def refresh() -> None:
        total_bits = shown["fmt"].total_bits
        for i, button in enumerate(row.children):
            bit = shown["bits"] >> (total_bits - 1 - i) & 1
            button.description = str(bit)
            button.style.button_color = BIT_COLOURS[field(i)][bit]
        lines = bit_readout(shown["bits"], shown["fmt"])
        readout.value = "<table>" + "".join(
            f"<tr><td>{html.escape(label)}</td><td><code>{html.escape(text)}</code></td></tr>"
            for label, text in lines.items()) + "</table>"

    def flipper(i: int):
        def flip(_button: widgets.Button) -> None:
            shown["bits"] ^= 1 << (shown["fmt"].total_bits - 1 - i)
            refresh()
        return flip

    def show(new_fmt: FloatFormat, pattern: int) -> None:
        shown.update(fmt=new_fmt, bits=pattern)
        buttons = []
        for i in range(new_fmt.total_bits):
            button = widgets.Button(tooltip=f"{field(i)} bit, click to switch",
                                    layout=widgets.Layout(width="25px", padding="0"))
            button.add_class(f"ctc-bit-{i}")
            button.on_click(flipper(i))
            buttons.append(button)
        row.children = buttons
        refresh()

    def switch(change: dict) -> None:
        new_fmt = EXPLORER_FORMATS[change["new"]]
        show(new_fmt, new_fmt.bias << new_fmt.mantissa_bits)

    menu.observe(switch, names="value")
    show(fmt, fmt.bias << fmt.mantissa_bits if bits is None else bits)
    return widgets.VBox([menu, row, readout])
