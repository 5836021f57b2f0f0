"""Lesson 07's measurements and given code: distributed_demos.py on real processes (gloo's
all-reduce against the exact sum and against the bytes the ring must send, counted on a private
loopback interface; ZeroRedundancyOptimizer's partition and state against the greedy rule and
zero_bytes_per_device; DDP and FSDP over micro-batches against accumulation_comm_bytes; no rank
left behind, killed or interrupted), and solutions/parallel_demos.py (the robust alpha-beta fit,
the pictures, the ring's and the pipeline's schedules)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from grader.content.lessons import load_lesson
from grader.content.variants import variants_of
from grader.grading.plans import variant_answer
from grader.grading.sandbox import bwrap_path
from solutions.parallel import (
    accumulation_comm_bytes,
    collective_bytes,
    zero_bytes_per_device,
)
from solutions.parallel_demos import (
    draw_allreduce_sweep,
    draw_ring,
    fit_alpha_beta,
    idle_share,
    largest_fitting,
    pipeline_schedule,
    ring_contributions,
    ring_schedule,
)
from solutions.parallel_processes import DemoInterrupted, run_demo

LESSON = load_lesson("07_many_devices")
SCRIPT = LESSON.folder / "distributed_demos.py"


def demo(*args: str, private_network: bool = False, timeout: float = 120) -> dict:
    """Run the script and return its JSON; in a network namespace of its own when asked (then
    the loopback interface carries the ranks' traffic and nothing else)."""
    command = [sys.executable, str(SCRIPT), *args]
    if private_network:
        if bwrap_path() is None:
            pytest.skip("needs bubblewrap for a private network namespace")
        command = [bwrap_path(), "--dev-bind", "/", "/", "--unshare-net", "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


RING_VARIANTS = variants_of(LESSON)["predicted_ring_bytes_per_rank"]


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_gloo_sums_exactly_and_sends_what_the_ring_counts(world_size: int) -> None:
    """Every rank's result equals the exact sum, and the loopback bytes per rank are the
    ring's 2 (n-1)/n B plus under 1% of headers and gloo's own messages (12 MiB tensors). So
    it is for every student's all-reduce of section 3's graded prediction on this many ranks
    (the default: 4 ranks, 12 MiB), measured as the notebook's cell measures it: the answer
    plus under 1%."""
    size = 12 * 2**20
    small = 12 * 1024  # splits into 2, 3 and 4 equal shards of whole float32 values
    students = {index: 4 * RING_VARIANTS.bound(index)["n_elements"]
                for index in range(len(RING_VARIANTS.choices))
                if RING_VARIANTS.bound(index)["n_ranks"] == world_size}
    sizes = list(dict.fromkeys([small, size, *students.values()]))
    result = demo("allreduce", "--world-size", str(world_size), "--sizes",
                  ",".join(map(str, sizes)), "--repeats", "2", "--backend", "gloo",
                  private_network=True)
    assert result["correct"] and result["backend"] == "gloo"
    measured = {n: r["loopback_bytes_per_rank"]
                for n, r in zip(sizes, result["results"], strict=True)}
    expected = collective_bytes("all_reduce", size, world_size)
    assert expected <= measured[size] < 1.01 * expected
    # a 12 KiB tensor: the same headers and messages are a large part of what crosses the wire
    assert measured[small] > 1.05 * collective_bytes("all_reduce", small, world_size)
    for index, student_size in students.items():
        answer = variant_answer(LESSON, "predicted_ring_bytes_per_rank", index)
        assert answer <= measured[student_size] < 1.01 * answer, index
    assert world_size == 2 or students  # every world size a student may draw is measured


def test_zero_redundancy_optimizer_gives_whole_tensors_largest_first() -> None:
    """Its partition is the greedy one (largest tensor to the rank with fewest elements), its
    AdamW state is 8 bytes per owned element plus one 4-byte step per tensor, and together the
    ranks hold what zero_bytes_per_device says one rank would hold alone."""
    widths = [64, 128, 16, 4]
    result = demo("zero", "--world-size", "2", "--widths", ",".join(map(str, widths)))
    parameters = result["parameters"]
    loads = [0, 0]
    for parameter in sorted(parameters, key=lambda p: -p["elements"]):  # stable, as torch's
        rank = loads.index(min(loads))
        assert parameter["rank"] == rank, parameter
        loads[rank] += parameter["elements"]
    n_params = result["n_params"]
    assert n_params == sum(p["elements"] for p in parameters) == 10_452
    for rank in result["ranks"]:
        owned = [p for p in parameters if p["rank"] == rank["rank"]]
        assert rank["moment_bytes"] == 8 * sum(p["elements"] for p in owned)
        assert rank["step_bytes"] == 4 * len(owned)
    assert sum(r["moment_bytes"] for r in result["ranks"]) == zero_bytes_per_device(
        n_params, 1, 1, 0, 0, 8)
    # the lesson's choice: one rank holds more than three quarters of the state
    assert max(r["moment_bytes"] for r in result["ranks"]) / (8 * n_params) > 0.75
    assert result["max_abs_difference_from_adamw"] == 0.0


# Loopback bytes beyond a collective's payload, per collective call and per barrier (two around
# each counted step): headers, gloo's own messages, TCP's acknowledgements. A few KB each on an
# idle machine; a loaded one sends smaller segments, so more headers and acknowledgements (19 KB
# measured for one all-reduce of two buckets and its barriers while the whole suite ran on 2
# cores, where 8 KB per bucket had been allowed).
SLACK, BARRIERS = 12 * 1024, 2


@pytest.mark.slow
def test_fsdp_and_ddp_over_microbatches_send_what_accumulation_comm_bytes_counts() -> None:
    """PyTorch's own behaviour, on real processes: DDP all-reduces after every micro-batch
    unless no_sync; FSDP2 gathers the weights for every forward and backward pass and
    reduce-scatters every micro-batch's gradients by default, and once each when told to keep
    them whole (set_requires_gradient_sync, reshard_after_forward=False,
    set_reshard_after_backward). The collectives FSDP calls, on NCCL's ring, are
    accumulation_comm_bytes's count; the loopback bytes are that count where gloo's
    reduce-scatter sends an all-reduce's bytes; and every way leaves the same weights."""
    m = 3
    result = demo("accumulate", "--world-size", "2", "--microbatches", str(m), "--steps", "1",
                  "--hidden", "64", private_network=True)
    n, n_params = 2, result["n_params"]
    assert n_params == 64 * 256 + 256 + 256 * 64 + 64 and result["parameter_bytes"] == 4 * n_params
    modes = result["modes"]
    layers = 2  # each linear layer is an FSDP unit of its own
    assert modes["fsdp_reshard"]["calls"] == {"all_gather": 2 * m * layers,
                                              "reduce_scatter": m * layers}
    assert modes["fsdp_keep"]["calls"] == {"all_gather": layers, "reduce_scatter": layers}
    for mode, keep in (("fsdp_reshard", False), ("fsdp_keep", True)):
        whole = modes[mode]["whole_bytes"]
        on_the_ring = sum(collective_bytes(op, whole[op], n) for op in whole)
        counted = accumulation_comm_bytes(n_params, n, 3, m, keep, 4, 4)
        assert on_the_ring == counted
        # gloo's reduce-scatter is an all-reduce: the gradients' part of the count twice
        on_gloo = counted + accumulation_comm_bytes(n_params, n, 3, m, keep, 0, 4)
        # plus TCP/IP headers (1%) and gloo's own messages and acknowledgements per collective
        # and per barrier around the step (SLACK)
        calls = sum(modes[mode]["calls"].values())
        assert on_gloo <= modes[mode]["loopback_bytes_per_rank"] < \
            1.01 * on_gloo + SLACK * (calls + BARRIERS)
    one_allreduce = collective_bytes("all_reduce", 4 * n_params, n)
    for mode, allreduces in (("ddp_every", m), ("ddp_no_sync", 1)):
        sent = modes[mode]["loopback_bytes_per_rank"]
        expected = allreduces * one_allreduce
        # 2 buckets each; the bound stays far under the next count (3 all-reduces against 1)
        assert expected <= sent < 1.01 * expected + SLACK * (2 * allreduces + BARRIERS)
    assert one_allreduce == accumulation_comm_bytes(n_params, n, 0, m, bytes_per_param=4,
                                                    bytes_per_grad=4)
    # float32 sums of 3 micro-batches in another order: a few units in the last place
    assert result["max_abs_difference"] < 1e-6


@pytest.mark.parametrize(("args", "words"), [
    (["allreduce", "--sizes", "6"], "multiples of 4"),
    (["allreduce", "--world-size", "9"], "--world-size must be between 1 and 8"),
    (["allreduce", "--sizes", "a,b"], "comma-separated integers"),
    (["zero", "--world-size", "4", "--widths", "8,4"], "fewer than the 4 ranks"),
    (["accumulate", "--steps", "0"], "--steps must be between 1 and 1000"),
    (["accumulate", "--backend", "nccl"], "runs on gloo only"),
    (["allreduce", "--traffic-calls", "-1"], "--traffic-calls must be between 0 and 1000"),
    (["allreduce", "--backend", "nccl", "--world-size", "2"], "needs a CUDA GPU per rank"),
])
def test_bad_options_exit_2_and_say_what_is_wrong(args: list[str], words: str) -> None:
    if "nccl" in args and "allreduce" in args and _gpus() >= 2:
        pytest.skip("this machine has the GPUs that NCCL needs")
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and words in done.stderr, done.stderr


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _sigint_as_in_a_terminal() -> None:
    """Let SIGINT interrupt the child, as it does in a terminal or a kernel, even when this test
    runs where SIGINT is ignored (a background job of a shell), which a child would inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (Linux's /proc)."""
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            children = (task / "children").read_text().split() if (task / "children").exists() \
                else []
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    frontier.append(child)
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="ranks die with the script on Linux only")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_killing_the_script_as_its_ranks_start_leaves_no_rank_behind(how: signal.Signals) -> None:
    """A notebook's timeout kills the script with SIGKILL, which it cannot catch, and Ctrl-C
    in a terminal sends SIGINT: either way its ranks end with it, even at the worst moment,
    as the first rank is forked (a Ctrl-C there was once dropped by Python's after-fork hooks,
    or left a started rank for the exit to wait on, and the demo ran on). Stopping it while
    the ranks run is test_an_interrupted_measurement_stops_every_process_and_says_so_in_one_line."""
    process = subprocess.Popen([sys.executable, str(SCRIPT), "accumulate", "--world-size", "2",
                                "--steps", "1000", "--hidden", "256"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True, preexec_fn=_sigint_as_in_a_terminal)
    deadline = time.monotonic() + 60
    while not _children(process.pid) and time.monotonic() < deadline:
        time.sleep(0.0005)
    assert _children(process.pid), "no rank started"
    os.kill(process.pid, how)
    assert process.wait(timeout=30) == (-9 if how == signal.SIGKILL else 130)
    # Every process the script started, ranks forked after the signal included, is in its session.
    deadline = time.monotonic() + 10
    while _in_session(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _in_session(process.pid) == []


# The script run as its own command line, a Ctrl-C arriving while it imports what its ranks
# will share (PREIMPORTS), before any rank starts.
INTERRUPTED_IMPORTING = """
import importlib, runpy, sys
real = importlib.import_module
def import_module(name, *args):
    if name == "torch._dynamo":
        raise KeyboardInterrupt
    return real(name, *args)
importlib.import_module = import_module
sys.argv = [sys.argv[1], "zero", "--world-size", "2"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_ctrl_c_before_any_rank_starts_is_said_in_one_line() -> None:
    run = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORTING, str(SCRIPT)],
                         capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout) == (130, ""), run.stderr
    assert run.stderr.splitlines() == ["distributed_demos.py zero: interrupted; no rank is left "
                                       "running"]


def _in_session(session: int) -> list[int]:
    """The live processes of Linux session ``session`` (not zombies)."""
    pids = (int(path.name) for path in Path("/proc").glob("[0-9]*"))
    return [pid for pid in pids if (fields := _stat(pid)) and fields[0] != "Z"
            and int(fields[3]) == session]


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command's name (state, ppid, pgrp, session, ...);
    none for a process gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _state(pid: int) -> str:
    return (_stat(pid) or ["gone"])[0]


# A notebook's kernel as Jupyter runs it: the leader of its own process group, which the stop
# button interrupts with a SIGINT to the whole group.
RUNNER = """
import sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from solutions.parallel_processes import DemoInterrupted, run_demo
try:
    run_demo("accumulate", 2, {{"steps": 1000, "hidden": 256}}, script=Path({script!r}),
             timeout={timeout})
except DemoInterrupted as error:
    print("|".join(error._render_traceback_()))
    sys.exit(3)
except RuntimeError as error:
    print(error)
    sys.exit(4)
"""


def _run_until_ranks_start(timeout: float) -> tuple[subprocess.Popen, set[int]]:
    """Start the runner; return it and its descendants (the script and 2 ranks) once they
    run."""
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER.format(repo=str(Path(__file__).parent.parent),
                                             script=str(SCRIPT), timeout=timeout)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_sigint_as_in_a_terminal)
    deadline = time.monotonic() + 60
    started: set[int] = set()
    while len(started) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
        started = _children(runner.pid)
    assert len(started) >= 3, "the script and its ranks did not start"
    return runner, started


def _alive(pids: set[int], within: float = 10.0) -> list[int]:
    """Those of ``pids`` still running after ``within`` seconds (the measurements' server ends
    on the signal Linux sends when its kernel dies, a moment after it)."""
    deadline = time.monotonic() + within
    while True:
        alive = [pid for pid in pids if Path(f"/proc/{pid}").exists() and _state(pid) != "Z"]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="counts processes in Linux's /proc")
def test_an_interrupted_measurement_stops_every_process_and_says_so_in_one_line() -> None:
    runner, started = _run_until_ranks_start(timeout=120)
    time.sleep(1.0)  # into the measurement
    os.killpg(runner.pid, signal.SIGINT)  # the stop button
    out, err = runner.communicate(timeout=60)
    assert runner.returncode == 3, (out, err)
    assert out.splitlines() == ["\x1b[0;31mKeyboardInterrupt\x1b[0m: distributed_demos.py "
                                "accumulate interrupted; the 3 processes were stopped"]
    assert "Traceback" not in err
    assert _alive(started) == []  # the server, the measurement and both ranks are gone


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="counts processes in Linux's /proc")
def test_a_measurement_past_its_timeout_is_stopped_with_every_rank() -> None:
    # The ranks start within seconds; the measurement would run well past the limit (it ran
    # past a limit of 20 s too, which cost the suite 8 s more of a busy core).
    runner, started = _run_until_ranks_start(timeout=12)
    out, _ = runner.communicate(timeout=90)
    assert runner.returncode == 4 and "ran past 12 s and was stopped" in out
    assert _alive(started) == []


def test_an_interruption_is_shown_as_one_line() -> None:
    error = DemoInterrupted("distributed_demos.py allreduce interrupted; the 3 processes were "
                            "stopped")
    assert error._render_traceback_() == [f"\x1b[0;31mKeyboardInterrupt\x1b[0m: {error}"]
    assert not isinstance(error, KeyboardInterrupt)  # else the checks cell's handler shows it


def test_run_demo_returns_the_scripts_result_and_names_a_failure(tmp_path: Path) -> None:
    result = run_demo("allreduce", 2, {"sizes": [4096, 8192], "repeats": 1, "backend": "gloo"},
                      script=SCRIPT)
    assert [r["bytes"] for r in result["results"]] == [4096, 8192] and result["correct"]
    with pytest.raises(RuntimeError, match=r"distributed_demos.py allreduce failed \(exit 2\)"):
        run_demo("allreduce", 2, {"sizes": [6]}, script=SCRIPT)
    missing = tmp_path / "distributed_demos.py"
    with pytest.raises(RuntimeError, match="failed"):
        run_demo("allreduce", 2, script=missing)


@pytest.mark.skipif(sys.platform != "linux", reason="the measurements' server forks (Linux)")
def test_measurements_fork_from_one_server_until_the_script_changes(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """One server per script imports torch once and forks each measurement; a script edited
    since gets a server of its own; where there is no fork (FORK_SERVER off) each measurement
    is a fresh process, with the same result."""
    import shutil

    from solutions import parallel_processes

    script = tmp_path / "distributed_demos.py"
    shutil.copyfile(SCRIPT, script)
    options = {"sizes": [4096], "repeats": 1, "backend": "gloo"}
    try:
        first = run_demo("allreduce", 2, options, script=script)
        server = parallel_processes.demo_server(script)
        assert server is not None and server.usable()
        second = run_demo("allreduce", 2, options, script=script)
        assert parallel_processes.demo_server(script) is server  # the same process served both
        assert first["correct"] and second["correct"]
        os.utime(script, ns=(time.time_ns(), time.time_ns() + 10**9))  # edited
        assert not server.usable()
        third = run_demo("allreduce", 2, options, script=script)
        assert third["correct"] and parallel_processes.demo_server(script) is not server
        assert server.process.poll() is not None  # the old one was stopped
        monkeypatch.setattr(parallel_processes, "FORK_SERVER", False)
        assert parallel_processes.demo_server(script) is None
        alone = run_demo("allreduce", 2, options, script=script)
        assert [r["bytes"] for r in alone["results"]] == [4096] and alone["correct"]
    finally:
        for each in parallel_processes._SERVERS.values():
            each.close()
        parallel_processes._SERVERS.clear()


@pytest.mark.skipif(sys.platform != "linux", reason="the measurements' server forks (Linux)")
def test_a_measurement_cannot_ask_for_a_server() -> None:
    """``serve`` is not a measurement the server runs: a request for it fails in one line."""
    with pytest.raises(RuntimeError, match="a measurement cannot be a server"):
        run_demo("serve", 2, script=SCRIPT)


# ---------------------------------------------------------------- the given helpers


@given(st.floats(1e-6, 1e-3), st.floats(1e8, 1e11), st.integers(2, 8))
def test_the_fit_recovers_alpha_and_beta_from_times_of_the_model(alpha, beta, n) -> None:
    sizes = [4096 * 4**k for k in range(8)]
    seconds = [2 * (n - 1) * alpha + 2 * (n - 1) / n * size / beta for size in sizes]
    fitted_alpha, fitted_beta = fit_alpha_beta(sizes, seconds, n)
    # an exact line through eight points: only the rounding of the sums is left
    assert math.isclose(fitted_alpha, alpha, rel_tol=1e-6)
    assert math.isclose(fitted_beta, beta, rel_tol=1e-6)


def test_the_fit_takes_a_negative_intercept_as_no_latency() -> None:
    sizes = [1e5, 1e6, 1e7]
    # a line with a negative intercept: 1 GB/s less 10 us
    alpha, beta = fit_alpha_beta(sizes, [size / 1e9 - 1e-5 for size in sizes], 2)
    assert alpha == 0.0 and 1e9 < beta < 1.1e9
    with pytest.raises(ValueError, match="at least two different sizes"):
        fit_alpha_beta([1e3, 1e3], [1e-3, 2e-3], 2)
    with pytest.raises(ValueError, match="at least 2 ranks"):
        fit_alpha_beta([1e3, 1e6], [1e-3, 2e-3], 1)


@given(st.floats(1e-6, 1e-3), st.floats(1e8, 1e11), st.integers(2, 8), st.integers(0, 4),
       st.floats(2, 20))
def test_one_size_slowed_down_moves_the_fit_little(alpha, beta, n, slowed, factor) -> None:
    """A size whose fastest call other work slowed down by up to 20 times (the sweep's worst
    on a busy machine): the least-absolute-deviations fit goes through the other four. Where
    the sweep spans both regimes, as the lesson's does: the latency and the bytes take equal
    time (at n alpha beta) between its second size and its fourth."""
    sizes = [4096 * 8**k for k in range(5)]
    assume(sizes[1] <= n * alpha * beta <= sizes[3])
    seconds = [2 * (n - 1) * alpha + 2 * (n - 1) / n * size / beta for size in sizes]
    seconds[slowed] *= factor
    fitted_alpha, fitted_beta = fit_alpha_beta(sizes, seconds, n)
    # four exact points of five: the fit is exact up to its iterations' tolerance
    assert math.isclose(fitted_alpha, alpha, rel_tol=1e-3, abs_tol=1e-3 * alpha)
    assert math.isclose(fitted_beta, beta, rel_tol=1e-3)


def _results(seconds: list[float]) -> list[dict]:
    """Sweep results around ``seconds``: the spread of a busy machine, one size far off."""
    return [{"bytes": 4096 * 8**k, "seconds_min": t, "seconds_q1": 1.1 * t,
             "seconds_median": 1.5 * t, "seconds_q3": 9 * t} for k, t in enumerate(seconds)]


def test_the_sweeps_legend_hides_no_point() -> None:
    import matplotlib.pyplot as plt

    seconds = [3e-4, 3.2e-4, 4e-4, 1.2e-3, 2.5e-2]
    fig, ax = plt.subplots(figsize=(8.4, 5.6))
    draw_allreduce_sweep(ax, _results(seconds), 1.5e-4, 2e9, 2, "gloo, 2 processes")
    fig.tight_layout()
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    axes = ax.get_window_extent(renderer)
    assert not legend.overlaps(axes)  # below the axes, where no point is drawn
    low, high = ax.get_ylim()
    assert low <= min(seconds) and 9 * max(seconds) <= high  # every point and bar is shown
    # the figure fits the 840-pixel output area of a 1280x720 JupyterLab
    assert fig.get_tightbbox(renderer).width * fig.dpi <= 840
    plt.close(fig)


def test_the_ring_pictures_title_is_no_wider_than_its_panels() -> None:
    import matplotlib.pyplot as plt

    fig = draw_ring(4)
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)
    panels = [ax.get_window_extent(renderer) for ax in fig.axes]
    assert min(p.x0 for p in panels) <= title.x0 and title.x1 <= max(p.x1 for p in panels)
    plt.close(fig)


@given(st.integers(1, 12))
def test_the_ring_schedule_sends_one_chunk_per_rank_per_step_and_ends_complete(n) -> None:
    steps = ring_schedule(n)
    assert len(steps) == 2 * (n - 1)
    for sends in steps:
        assert sorted(s for s, _, _ in sends) == list(range(n))  # every rank sends once
        assert all(r == (s + 1) % n for s, r, _ in sends)  # to its neighbour
    counts = ring_contributions(n)
    assert counts[0] == [[1] * n for _ in range(n)]
    assert counts[-1] == [[n] * n for _ in range(n)]
    # after the reduce-scatter each rank holds one complete chunk, (r + 1) % n
    assert all(counts[n - 1][r][(r + 1) % n] == n for r in range(n))


@given(st.integers(1, 8), st.integers(1, 12), st.sampled_from(["gpipe", "1f1b"]))
def test_the_pictured_schedule_respects_its_dependencies_and_idles_as_narayanan_says(
        p, m, schedule) -> None:
    tasks = pipeline_schedule(p, m, schedule)
    assert len(tasks) == 2 * p * m
    share = idle_share(tasks, p)
    assert math.isclose(share, float(Fraction(p - 1, m + p - 1)), abs_tol=1e-12)
    end = {(stage, kind, i): e for stage, kind, i, _, e in tasks}
    for stage, kind, i, start, _ in tasks:  # nothing starts before its input exists
        if kind == "F" and stage:
            assert start >= end[(stage - 1, "F", i)]
        if kind == "B":
            assert start >= end[(stage + 1, "B", i)] if stage < p - 1 else \
                start >= end[(stage, "F", i)]
    if schedule == "1f1b":  # at most p micro-batches between forward and backward on stage 0
        in_flight = max(sum(1 for s, k, i, st_, _ in tasks if s == 0 and k == "F" and st_ <= t)
                        - sum(1 for s, k, i, _, e in tasks if s == 0 and k == "B" and e <= t)
                        for t in range(max(e for *_, e in tasks)))
        assert in_flight <= p


@given(st.integers(0, 10**15), st.integers(1, 64))
def test_largest_fitting_is_the_last_n_that_fits(budget, per_item) -> None:
    def bytes_of(n: int) -> int:
        return n * per_item + 7

    largest = largest_fitting(bytes_of, budget)
    if bytes_of(1) > budget:
        assert largest == 0
    else:
        assert bytes_of(largest) <= budget < bytes_of(largest + 1)


def test_spawned_ranks_work_as_nccls_would_be_started(monkeypatch) -> None:
    """NCCL's ranks are spawned, not forked (CUDA cannot be used in a forked child of a process
    that asked CUDA anything): the spawned path runs here on gloo, the only backend a machine
    without GPUs has."""
    monkeypatch.syspath_prepend(str(LESSON.folder))
    import distributed_demos

    assert distributed_demos.start_method("nccl") == "spawn"
    monkeypatch.setattr(distributed_demos, "start_method", lambda backend: "spawn")
    result = distributed_demos.launch("allreduce", {"sizes": [4096], "repeats": 1}, 2, "gloo")
    assert result["correct"]
