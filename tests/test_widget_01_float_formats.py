"""Lesson 01's explorer in a real browser: the instructor version runs in JupyterLab, a bit is
switched with a click (and one with the keyboard), and the explorer shows what the lesson's
reference ``decode`` and ``split_bits`` give for the new pattern."""

from __future__ import annotations

import time

import pytest

from grader.content.lessons import load_lesson
from solutions.float_explorer import bit_readout
from solutions.floats import FP8_E4M3, FP16, decode
from tests.test_browser import CHROMIUM, SCREENSHOTS, run_all

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("widget-01"),
              pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium "
                                 "(make test installs it where it can)")]

FOLDER = "widget-01"  # the instructor version's folder in the shared lab


@pytest.fixture(scope="module")
def lab(shared_lab):
    """The worker's lab server (conftest's ``shared_lab``) over lesson 01's instructor
    version."""
    with shared_lab.serving({FOLDER: load_lesson("01_float_formats").folder}) as served:
        yield served


def readout(page) -> dict[str, str]:
    """The explorer's readout as shown on the page: label -> text."""
    cells = page.eval_on_selector_all(".ctc-float-readout td",
                                      "els => els.map(e => e.textContent)")
    return dict(zip(cells[::2], cells[1::2], strict=True))


def shows(page, bits: int, fmt, timeout: float = 30) -> dict[str, str]:
    """Wait until the readout is the reference's for ``bits``; return what is shown."""
    want = bit_readout(bits, fmt)
    deadline = time.monotonic() + timeout
    while (shown := readout(page)) != want and time.monotonic() < deadline:
        time.sleep(0.2)  # the kernel answers each click
    assert shown == want
    return shown


def test_switching_bits_shows_what_decode_gives(lab) -> None:
    base, token, browser = lab
    page = run_all(browser, base, token, FOLDER, "widget-float-explorer")
    page.locator(".ctc-float-readout").scroll_into_view_if_needed()
    assert shows(page, 0x3C00, FP16)["value"] == repr(decode(0x3C00, FP16)) == "1.0"

    page.locator(".ctc-bit-6").click()  # the first mantissa bit: 1.5
    assert shows(page, 0x3E00, FP16)["value"] == repr(decode(0x3E00, FP16)) == "1.5"
    page.locator(".ctc-bit-0").focus()  # the sign bit, from the keyboard
    page.keyboard.press("Space")
    assert shows(page, 0xBE00, FP16)["category"].startswith("normal")
    page.locator(".ctc-bit-1").click()  # 01111 -> 11111: all ones, with a mantissa: NaN
    assert shows(page, 0xFE00, FP16)["category"].startswith("NaN")

    page.locator(".widget-dropdown select").select_option("fp8 E4M3")
    shows(page, 0x38, FP8_E4M3)  # 1.0 in the format picked
    assert page.locator("[class*='ctc-bit-']").count() == 8
    for bit in (1, 5, 6):  # 0 0111 000 -> 0 1111 110, the largest E4M3 number
        page.locator(f".ctc-bit-{bit}").click()
    assert shows(page, 0x7E, FP8_E4M3)["value"] == repr(decode(0x7E, FP8_E4M3)) == "448.0"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    explorer = page.locator(".ctc-float-readout").locator("xpath=..")  # menu, bits, readout
    explorer.screenshot(path=str(SCREENSHOTS / "float-explorer.png"))
