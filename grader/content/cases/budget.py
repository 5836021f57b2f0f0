"""Hidden checks of lesson 10 (Chinchilla's loss, the compute-optimal and lifetime-optimal
models, an IsoFLOP profile's minimum, a run's cost, ZeRO-Offload's step). See
grader/content/cases/__init__.py.

Every input stays inside what its exercise states: sizes, budgets and rates finite and above 0,
inference tokens at or above 0, E at or above 0, a target loss above E, PUE at or above 1, and
each error case one that the text names (the lesson asks for ValueError for every bad input)."""

import random

from grader.content.cases import Case, raises
from grader.content.variants import Variants

# The loss is E plus two powers: a correct formula in another order (A·N^-α, exp(-α·ln N)·A)
# differs in the last bits only, times the exponent's ln N (under 60): 1e-12 leaves room.
_LOSS = 1e-12
# The compute-optimal point is a power of a quotient and one more division; written through
# logs, or with D found first, it moves by ln C (under 140) ulps at most: 1e-9.
_OPTIMAL = 1e-9
# The lifetime-optimal model is a minimum the student finds by a search of their own: its loss
# and lifetime FLOPs are checked, each within 1e-6 (the exercise's text), not N and D, which a
# flat minimum leaves loose (a search that stops at 1e-12 in FLOPs leaves N uncertain by 1e-6).
_LIFETIME = 1e-6
# A parabola's vertex from a least-squares fit: numpy.polyfit, lstsq or the normal equations
# agree to the conditioning of a Vandermonde matrix of ln N around 20 (1e-9 or better here).
_VERTEX = 1e-7
# Products and sums of a few floats: a few ulps.
_COST = 1e-12

_HOFFMANN_FIT = "1.69, 406.4, 410.7, 0.34, 0.28"  # the exercises' defaults
_REFIT_FIT = "1.8172, 482.01, 2085.43, 0.3478, 0.3658"  # Besiroglu et al.'s


def _keywords(fit: str) -> str:
    """A fit's five numbers as the exercises' keyword arguments, E=..., A=..., ..., beta=...."""
    return ", ".join(f"{name}={value}"
                     for name, value in zip(("E", "A", "B", "alpha", "beta"), fit.split(", "),
                                            strict=True))


_REFIT = _keywords(_REFIT_FIT)


def _lifetime(target: str, inference: str, fit: str = _HOFFMANN_FIT) -> Case:
    """A check of lifetime_optimal(target, inference, fit): the loss the answer reaches and its
    lifetime FLOPs, computed from the fit's numbers written out (the student's chinchilla_loss is
    checked on its own)."""
    e, a, b, alpha, beta = fit.split(", ")
    keywords = "" if fit == _HOFFMANN_FIT else f", {_keywords(fit)}"
    return Case(f"(lambda n, d: ({e} + {a} / n**{alpha} + {b} / d**{beta}, "
                f"6 * n * d + 2 * n * {inference}))(*lifetime_optimal({target}, {inference}"
                f"{keywords}))", rel_tol=_LIFETIME)


CASES: dict[str, list[Case | str]] = {
    "chinchilla_loss": [
        Case("chinchilla_loss(70e9, 1.4e12)", rel_tol=_LOSS),  # Chinchilla: 1.94
        Case("chinchilla_loss(280e9, 300e9)", rel_tol=_LOSS),  # Gopher: 1.99
        Case("chinchilla_loss(8e9, 15e12)", rel_tol=_LOSS),  # Llama 3 8B
        Case(f"chinchilla_loss(70e9, 1.4e12, {_REFIT})", rel_tol=_LOSS),
        Case("chinchilla_loss(1, 1)", rel_tol=_LOSS),  # E + A + B
        Case("chinchilla_loss(1e6, 2e7, E=0, A=1, B=1, alpha=0.5, beta=0.5)", rel_tol=_LOSS),
        Case("chinchilla_loss(125e6, 2.5e9, 2.0, 300.0, 500.0, 0.3, 0.3)", rel_tol=_LOSS),
        raises("chinchilla_loss(0, 1.4e12)", "ValueError"),
        raises("chinchilla_loss(70e9, -1.4e12)", "ValueError"),
        raises("chinchilla_loss(math.nan, 1.4e12)", "ValueError"),
        raises("chinchilla_loss(70e9, math.inf)", "ValueError"),
        raises("chinchilla_loss(True, 1.4e12)", "ValueError"),
        raises("chinchilla_loss('70e9', 1.4e12)", "ValueError"),
        raises("chinchilla_loss(70e9, 1.4e12, alpha=0)", "ValueError"),
        raises("chinchilla_loss(70e9, 1.4e12, B=-410.7)", "ValueError"),
        raises("chinchilla_loss(70e9, 1.4e12, E=-0.5)", "ValueError"),
    ],
    "compute_optimal": [
        Case("compute_optimal(5.76e23)", rel_tol=_OPTIMAL),  # Gopher's budget: 93 tokens each
        Case(f"compute_optimal(5.76e23, {_REFIT})", rel_tol=_OPTIMAL),  # the refit: 18
        Case("compute_optimal(1e21)", rel_tol=_OPTIMAL),
        Case("compute_optimal(3.8e25)", rel_tol=_OPTIMAL),  # Llama 3 405B's budget
        Case("compute_optimal(6.0)", rel_tol=_OPTIMAL),  # N·D = 1
        Case("compute_optimal(6e20, A=100.0, B=100.0, alpha=0.5, beta=0.5)", rel_tol=_OPTIMAL),
        Case("compute_optimal(1e22, E=0.0)", rel_tol=_OPTIMAL),  # E does not move the optimum
        raises("compute_optimal(0)", "ValueError"),
        raises("compute_optimal(-5.76e23)", "ValueError"),
        raises("compute_optimal(math.inf)", "ValueError"),
        raises("compute_optimal(math.nan)", "ValueError"),
        raises("compute_optimal(False)", "ValueError"),
        raises("compute_optimal(5.76e23, beta=0)", "ValueError"),
        raises("compute_optimal(5.76e23, A=-406.4)", "ValueError"),
        raises("compute_optimal(None)", "ValueError"),
    ],
    "lifetime_optimal": [
        _lifetime("2.0", "0"),  # no inference: the compute-optimal model for that loss
        _lifetime("2.0", "1e13"),
        _lifetime("1.9485", "6.86e13"),  # Llama 3 8B's loss: about 8B on 15T tokens
        _lifetime("1.9485", "1e15"),
        _lifetime("1.8", "5e14"),
        _lifetime("2.5", "1e12", _REFIT_FIT),
        _lifetime("3.0", "0", _REFIT_FIT),
        _lifetime("1.7", "1e16"),  # 0.01 above E: an enormous model
        raises("lifetime_optimal(1.69, 0)", "ValueError"),  # at E: no finite model
        raises("lifetime_optimal(1.5, 1e13)", "ValueError"),  # below E
        raises("lifetime_optimal(2.0, -1)", "ValueError"),
        raises("lifetime_optimal(2.0, math.inf)", "ValueError"),
        raises("lifetime_optimal(math.nan, 1e13)", "ValueError"),
        raises("lifetime_optimal(2.0, 1e13, alpha=-0.34)", "ValueError"),
        raises("lifetime_optimal(2.0, True)", "ValueError"),
        raises("lifetime_optimal('2.0', 1e13)", "ValueError"),
        # 1e-200 above E: N and D far beyond a float
        raises("lifetime_optimal(1e-200, 1e12, E=0.0)", "ValueError"),
    ],
    "isoflop_minimum": [
        # an exact parabola of loss in ln N, its vertex at N = 1e8
        Case("isoflop_minimum([1e7, 3e7, 1e8, 3e8, 1e9], "
             "[2.0 + 0.05 * (math.log(n) - math.log(1e8)) ** 2 "
             "for n in [1e7, 3e7, 1e8, 3e8, 1e9]])", rel_tol=_VERTEX),
        Case("isoflop_minimum([1e6, 1e7, 1e8], [3.1, 2.9, 3.0])", rel_tol=_VERTEX),
        Case("isoflop_minimum((2e8, 5e8, 1e9, 2e9, 5e9, 1e10), "
             "(2.61, 2.49, 2.44, 2.43, 2.46, 2.53))", rel_tol=_VERTEX),
        Case("isoflop_minimum([400, 900, 1600, 2500], [1, 0.5, 0.4, 0.6])", rel_tol=_VERTEX),
        Case("isoflop_minimum(np.array([1e7, 1e8, 1e9]), np.array([2.5, 2.3, 2.4]))",
             rel_tol=_VERTEX),
        raises("isoflop_minimum([1e7, 1e8], [2.5, 2.3])", "ValueError"),  # two points
        raises("isoflop_minimum([1e7, 1e7, 1e8], [2.5, 2.4, 2.3])", "ValueError"),  # two sizes
        raises("isoflop_minimum([1e7, 1e8, 1e9], [2.5, 2.4])", "ValueError"),  # lengths
        raises("isoflop_minimum([1e7, 1e8, 1e9], [2.3, 2.5, 2.3])", "ValueError"),  # a maximum
        raises("isoflop_minimum([1e7, 1e8, 1e9], [2.5, 2.4, 2.3])", "ValueError"),  # a line
        raises("isoflop_minimum([0, 1e8, 1e9], [2.5, 2.3, 2.4])", "ValueError"),
        raises("isoflop_minimum([1e7, 1e8, 1e9], [2.5, math.nan, 2.4])", "ValueError"),
        raises("isoflop_minimum('abc', [2.5, 2.3, 2.4])", "ValueError"),
        # a parabola barely curved (its rise 1e-6, a thousand times the line's), its vertex at
        # ln N ≈ 1,390: beyond a float
        raises("isoflop_minimum([1, 2, 4], [1.0, 0.999, 0.998 + 5e-7])", "ValueError"),
    ],
    "run_cost": [
        Case("run_cost(2.788e6, 2.0, 700.0)", rel_tol=_COST),  # DeepSeek-V3: $5.576M
        Case("run_cost(39.3e6, 2.0, 700.0, 1.0, 0.414)", rel_tol=_COST),  # Llama 3.1
        Case("run_cost(1000, 1.5, 400, pue=1.1, kg_co2_per_kwh=0.35)", rel_tol=_COST),
        Case("run_cost(0.5, 3.0, 300.0, 1.2)", rel_tol=_COST),
        "run_cost(10, 2.0, 1000, 1, 0)",  # 20 dollars, 10 kWh, no emissions: exact
        Case("run_cost(8, 0.5, 250, 1.5, 0.5)", rel_tol=_COST),  # $4, 3 kWh, 1.5 kg
        raises("run_cost(0, 2.0, 700.0)", "ValueError"),
        raises("run_cost(1000, -2.0, 700.0)", "ValueError"),
        raises("run_cost(1000, 2.0, 0)", "ValueError"),
        raises("run_cost(1000, 2.0, 700.0, pue=0.9)", "ValueError"),
        raises("run_cost(1000, 2.0, 700.0, kg_co2_per_kwh=-0.1)", "ValueError"),
        raises("run_cost(math.inf, 2.0, 700.0)", "ValueError"),
        raises("run_cost(1000, 2.0, 700.0, 1.1, math.nan)", "ValueError"),
        raises("run_cost(1000, True, 700.0)", "ValueError"),
    ],
    "offload_seconds": [
        Case("offload_seconds(7e9, 32e9, 1e9)", rel_tol=_COST),  # 7B over PCIe 5
        Case("offload_seconds(13e9, 16e9, 2.5e9, grad_bytes=4)", rel_tol=_COST),
        Case("offload_seconds(1.5e9, 25e9, 4e8, 2, 4)", rel_tol=_COST),
        Case("offload_seconds(1, 3, 7, 0.5, 0.25)", rel_tol=_COST),
        "offload_seconds(1e9, 4e9, 1e9)",  # 1 s on the link, 1 s of Adam: 2.0
        raises("offload_seconds(0, 32e9, 1e9)", "ValueError"),
        raises("offload_seconds(7e9, 0, 1e9)", "ValueError"),
        raises("offload_seconds(7e9, 32e9, -1e9)", "ValueError"),
        raises("offload_seconds(7e9, 32e9, 1e9, grad_bytes=0)", "ValueError"),
        raises("offload_seconds(7e9, 32e9, 1e9, param_bytes=math.inf)", "ValueError"),
        raises("offload_seconds(7e9, math.nan, 1e9)", "ValueError"),
        raises("offload_seconds(True, 32e9, 1e9)", "ValueError"),
    ],
    # the graded prediction, within 5%: the answer growth^(β/(α+β)); the square root of the
    # growth (N and D growing alike, the "20 tokens a parameter" rule) is 10% or more off in
    # every variant (the larger over the smaller), the exponents swapped (α/(α+β)) 20% or
    # more (VARIANTS below, tests/test_budget.py)
    "predicted_model_growth": [Case("float(predicted_model_growth)", rel_tol=0.05)],
}

# Each student's budget growth and fit for the graded prediction: how many times larger the
# compute-optimal model gets when the budget grows `budget_growth` times under a fit with
# exponents `fit_alpha` and `fit_beta`. The default is Hoffmann et al.'s fit and a budget a
# hundred times larger; the others a thousand and ten thousand times under that fit, ten
# thousand under Besiroglu et al.'s refit, and two fits of our own whose exponents lean the
# other way (β > α: the model grows faster than the square root) and further than Hoffmann's.
# The five answers a student with an id draws (6.98 to 112) lie 20% or more apart.
VARIANTS = {
    "predicted_model_growth": Variants(
        ("budget_growth", "fit_alpha", "fit_beta"),
        ((100, 0.34, 0.28), (1000, 0.34, 0.28), (10000, 0.34, 0.28), (10000, 0.3478, 0.3658),
         (30, 0.30, 0.40), (1000, 0.36, 0.26)),
        "a budget {budget_growth} times larger, under a fit with alpha = {fit_alpha} and "
        "beta = {fit_beta}"),
}


# Hidden inputs of each student's own (grader/content/variants.py), with the fixed cases'
# tolerances: budgets, sizes and prices drawn over the ranges of today's runs.
def _drawn_chinchilla_loss(rng: random.Random) -> list[Case]:
    """A model from 10M to 1T parameters on 1 to 1000 tokens a parameter, under each fit, and
    one under a fit of round numbers."""
    def model() -> str:
        n = 10 ** rng.uniform(7, 12)
        return f"{n:.4g}, {n * 10 ** rng.uniform(0, 3):.4g}"

    calls = [f"chinchilla_loss({model()})", f"chinchilla_loss({model()}, {_REFIT})",
             f"chinchilla_loss({model()}, {rng.uniform(1, 2):.3f}, {rng.randint(100, 900)}, "
             f"{rng.randint(100, 3000)}, {rng.uniform(0.2, 0.5):.3f}, "
             f"{rng.uniform(0.2, 0.5):.3f})"]
    return [Case(call, rel_tol=_LOSS) for call in calls]


def _drawn_compute_optimal(rng: random.Random) -> list[Case]:
    """Budgets from 1e18 to 1e27 FLOPs under each fit, and one under a fit of round numbers."""
    calls = [f"compute_optimal({10 ** rng.uniform(18, 27):.4g})",
            f"compute_optimal({10 ** rng.uniform(18, 27):.4g}, {_REFIT})",
            f"compute_optimal({10 ** rng.uniform(18, 27):.4g}, A={rng.randint(100, 900)}, "
            f"B={rng.randint(100, 3000)}, alpha={rng.uniform(0.2, 0.5):.3f}, "
            f"beta={rng.uniform(0.2, 0.5):.3f})"]
    return [Case(call, rel_tol=_OPTIMAL) for call in calls]


def _drawn_lifetime_optimal(rng: random.Random) -> list[Case]:
    """Target losses 0.05 to 1 above each fit's E, with no inference and with 1e11 to 1e16
    inference tokens."""
    hoffmann = [_lifetime(f"{1.69 + rng.uniform(0.05, 1):.4f}", inference)
                for inference in ("0", f"{10 ** rng.uniform(11, 16):.3g}")]
    refit = _lifetime(f"{1.8172 + rng.uniform(0.05, 1):.4f}", f"{10 ** rng.uniform(11, 16):.3g}",
                      _REFIT_FIT)
    return [*hoffmann, refit]


def _drawn_run_cost(rng: random.Random) -> list[Case]:
    """Runs of 1,000 to 10M GPU-hours at $1 to $4, 300 W to 1,200 W, PUE 1 to 1.6, grids of
    0 to 0.8 kg a kWh."""
    return [Case(f"run_cost({10 ** rng.uniform(3, 7):.4g}, {rng.uniform(1, 4):.2f}, "
            f"{rng.randint(300, 1200)}, {rng.uniform(1, 1.6):.2f}, {rng.uniform(0, 0.8):.3f})",
                 rel_tol=_COST) for _ in range(3)]


def _drawn_offload_seconds(rng: random.Random) -> list[Case]:
    """Models of 100M to 200B parameters over links of 8 to 64 GB/s, CPUs updating 0.2 to
    5 billion parameters a second, gradients and parameters in 2 or 4 bytes."""
    return [Case(f"offload_seconds({10 ** rng.uniform(8, 11.3):.4g}, "
                 f"{rng.choice((8, 16, 32, 64))}e9, {rng.uniform(0.2, 5):.2f}e9, "
                 f"{rng.choice((2, 4))}, {rng.choice((2, 4))})", rel_tol=_COST) for _ in range(3)]


DRAWN = {"chinchilla_loss": _drawn_chinchilla_loss, "compute_optimal": _drawn_compute_optimal,
         "lifetime_optimal": _drawn_lifetime_optimal, "run_cost": _drawn_run_cost,
         "offload_seconds": _drawn_offload_seconds}
