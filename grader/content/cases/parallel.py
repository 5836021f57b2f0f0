"""Hidden checks of lesson 07 (collectives, the ring, ZeRO, overlap, pipelines, tensor parallel).
See grader/content/cases/__init__.py."""

import random

from grader.content.cases import Case, raises
from grader.content.variants import Variants

# Byte counts are integers: exact. The ring's sums are exact where every value is a small
# integer (any order of addition gives the same float); the one case of fractional float32
# values allows the few units in the last place that another order of n - 1 additions moves a
# positive sum by (float32 eps 1.2e-7). Seconds, tokens and the bubble are a few products and
# quotients of floats: a correct formula written in another order (1 - m / (m + p - 1), say)
# may differ in the last bit, so they get 1e-12.
_F32 = {"rel_tol": 1e-6}
_REL = 1e-12
_7B5 = 7_500_000_000  # the ZeRO paper's figure 1: 7.5B parameters on 64 GPUs

CASES: dict[str, list[Case | str]] = {
    "collective_bytes": [
        "collective_bytes('all_reduce', 1024, 4)",
        "collective_bytes('reduce_scatter', 1024, 4)",
        "collective_bytes('all_gather', 1024, 4)",
        "collective_bytes('all_to_all', 1024, 4)",
        "collective_bytes('all_reduce', 12, 1)",  # one rank sends nothing
        "collective_bytes('all_gather', 0, 8)",
        "collective_bytes('all_gather', 3 * 2**30, 3)",
        "collective_bytes('all_reduce', 14_000_000_000, 8)",  # 7B bf16 gradients on 8 GPUs
        raises("collective_bytes('all_reduce', 10, 3)", "ValueError"),  # no 3 equal shards
        raises("collective_bytes('broadcast', 8, 2)", "ValueError"),
        raises("collective_bytes('all_reduce', -8, 2)", "ValueError"),
        raises("collective_bytes('all_reduce', 8, 0)", "ValueError"),
        raises("collective_bytes('all_reduce', 8, 2.0)", "TypeError"),
        raises("collective_bytes('all_reduce', True, 2)", "TypeError")  # not a count,
    ],
    "ring_all_reduce": [
        "ring_all_reduce([torch.arange(8.), torch.ones(8), 2 * torch.arange(8.), "
        "torch.full((8,), -3.0)])",
        "ring_all_reduce([torch.tensor([1.5, -2.0])])",  # one rank: its own tensor, 0 bytes
        "ring_all_reduce([torch.arange(6, dtype=torch.float64) * r for r in (1, -2, 5)])",
        "ring_all_reduce([torch.arange(4) + 10 * r for r in range(4)])",  # int64, 1 per chunk
        "ring_all_reduce([torch.zeros(0), torch.zeros(0)])",
        Case("ring_all_reduce([torch.linspace(0.1, 1.0, 6) * (r + 1) for r in range(3)])",
             **_F32),
        # the inputs are left as they were
        "(lambda s: (ring_all_reduce(s), s)[1])([torch.arange(4.), torch.ones(4)])",
        raises("ring_all_reduce([torch.zeros(4), torch.zeros(6)])", "ValueError"),
        raises("ring_all_reduce([torch.zeros(5), torch.zeros(5)])", "ValueError"),
        raises("ring_all_reduce([])", "ValueError"),
        raises("ring_all_reduce([torch.zeros(2, 2), torch.zeros(2, 2)])", "ValueError"),
        raises("ring_all_reduce([torch.zeros(2), torch.zeros(2, dtype=torch.float64)])",
               "ValueError"),
        raises("ring_all_reduce(torch.zeros(4))", "TypeError"),  # not a list
        # torch's meta device holds no data: another device than the CPU on any machine
        raises("ring_all_reduce([torch.zeros(2), torch.zeros(2, device='meta')])", "ValueError"),
    ],
    "zero_bytes_per_device": [
        *(f"zero_bytes_per_device({_7B5}, 64, {stage})" for stage in range(4)),
        "zero_bytes_per_device(1000, 1, 3)",
        "zero_bytes_per_device(10, 3, 3)",  # ceil(10 / 3) = 4 elements per rank
        "zero_bytes_per_device(10, 3, 1)",
        "zero_bytes_per_device(0, 8, 2)",
        "zero_bytes_per_device(7_000_000_000, 8, 2, bytes_per_param=4, bytes_per_grad=4, "
        "optimizer_bytes_per_param=8)",  # fp32 training, AdamW's m and v
        "zero_bytes_per_device(2**60 + 3, 4, 1)",  # past 2**53 a float ceiling is wrong
        raises("zero_bytes_per_device(10, 2, 4)", "ValueError"),
        raises("zero_bytes_per_device(10, 0, 1)", "ValueError"),
        raises("zero_bytes_per_device(-1, 2, 1)", "ValueError"),
        raises("zero_bytes_per_device(10, 2, 1, bytes_per_param=-1)", "ValueError"),
    ],
    "zero_comm_bytes": [
        *(f"zero_comm_bytes({_7B5}, 64, {stage})" for stage in range(4)),
        "zero_comm_bytes(10, 3, 3)",  # a flat buffer padded to 12 elements
        "zero_comm_bytes(10, 3, 2)",
        "zero_comm_bytes(10**9, 1, 3)",
        "zero_comm_bytes(70_000_000_000, 1024, 3, bytes_per_param=4)",
        raises("zero_comm_bytes(10, 2, 5)", "ValueError"),
        raises("zero_comm_bytes(10, 0, 1)", "ValueError"),
        raises("zero_comm_bytes(10.0, 2, 1)", "TypeError"),
        raises("zero_comm_bytes(-1, 2, 1)", "ValueError"),
        raises("zero_comm_bytes(10, 2, 1, bytes_per_param=-2)", "ValueError"),
    ],
    "accumulation_comm_bytes": [
        *(f"accumulation_comm_bytes({_7B5}, 64, {stage}, 16)" for stage in range(4)),
        *(f"accumulation_comm_bytes({_7B5}, 64, {stage}, 16, True)" for stage in range(4)),
        "accumulation_comm_bytes(10, 3, 3, 2)",  # a flat buffer padded to 12 elements
        "accumulation_comm_bytes(10, 3, 2, 5, bytes_per_grad=4)",  # fp32 gradients, bf16 weights
        "accumulation_comm_bytes(1000, 4, 0, 8, bytes_per_grad=4)",  # DDP's one all-reduce
        "accumulation_comm_bytes(1000, 4, 1, 3, True)",  # changes nothing for stage 1
        "accumulation_comm_bytes(1000, 1, 3, 16)",  # one rank sends nothing
        "accumulation_comm_bytes(0, 8, 3, 4)",
        "accumulation_comm_bytes(70_000_000_000, 1024, 3, 2, False, 2, 4)",
        raises("accumulation_comm_bytes(1000, 4, 3, 0)", "ValueError"),
        raises("accumulation_comm_bytes(1000, 4, 4, 2)", "ValueError"),
        raises("accumulation_comm_bytes(1000, 0, 2, 2)", "ValueError"),
        raises("accumulation_comm_bytes(1000, 4, 2, 2, bytes_per_grad=-2)", "ValueError"),
        raises("accumulation_comm_bytes(1000, 4, 2, 2.0)", "TypeError"),
        raises("accumulation_comm_bytes(1000, 4, 3, 2, keep_unsharded=1)", "TypeError"),
        raises("accumulation_comm_bytes(-1, 4, 2, 2)", "ValueError"),
    ],
    "allreduce_seconds": [
        Case("allreduce_seconds(1e9, 8, 50e9)", rel_tol=_REL),
        Case("allreduce_seconds(1e9, 8, 50e9, 5e-6)", rel_tol=_REL),
        Case("allreduce_seconds(0, 4, 1e9, 1e-5)", rel_tol=_REL),  # latency only
        "allreduce_seconds(123, 1, 1e9, 1e-3)",  # one rank: 0.0
        Case("allreduce_seconds(14e9, 1024, 50e9, 2e-5)", rel_tol=_REL),
        raises("allreduce_seconds(1e9, 8, 0)", "ValueError"),
        raises("allreduce_seconds(1e9, 8, 1e9, -1e-6)", "ValueError"),
        raises("allreduce_seconds(-1.0, 8, 1e9)", "ValueError"),
        raises("allreduce_seconds(1e9, 8.0, 1e9)", "TypeError"),
        raises("allreduce_seconds('1e9', 8, 1e9)", "TypeError"),
        raises("allreduce_seconds(math.inf, 8, 1e9)", "ValueError"),
        raises("allreduce_seconds(1e9, 8, math.inf)", "ValueError"),
        raises("allreduce_seconds(1e9, 0, 1e9)", "ValueError"),
        raises("allreduce_seconds(1e9, 8, 1e9, math.inf)", "ValueError"),
    ],
    "min_tokens_to_hide_allreduce": [
        Case("min_tokens_to_hide_allreduce(989.4e12, 450e9, 8)", rel_tol=_REL),  # NVLink
        Case("min_tokens_to_hide_allreduce(989.4e12, 50e9, 8)", rel_tol=_REL),  # one NIC
        Case("min_tokens_to_hide_allreduce(989.4e12, 50e9, 1024)", rel_tol=_REL),
        Case("min_tokens_to_hide_allreduce(1e15, 1e11, 2, bytes_per_grad=4)", rel_tol=_REL),
        "min_tokens_to_hide_allreduce(989.4e12, 450e9, 1)",  # one rank: nothing to hide
        raises("min_tokens_to_hide_allreduce(989.4e12, 450e9, 0)", "ValueError"),
        raises("min_tokens_to_hide_allreduce(989.4e12, 0, 8)", "ValueError"),
        raises("min_tokens_to_hide_allreduce(989.4e12, 450e9, 8, bytes_per_grad=2.0)",
               "TypeError"),
        raises("min_tokens_to_hide_allreduce(0.0, 450e9, 8)", "ValueError"),
        raises("min_tokens_to_hide_allreduce(989.4e12, math.inf, 8)", "ValueError"),
        raises("min_tokens_to_hide_allreduce('989.4e12', 450e9, 8)", "TypeError"),
    ],
    "pipeline_bubble_fraction": [
        "pipeline_bubble_fraction(1, 1)",
        "pipeline_bubble_fraction(1, 32)",
        "pipeline_bubble_fraction(2, 1)",  # 1/2: exact in any order
        Case("pipeline_bubble_fraction(4, 8)", rel_tol=_REL),
        Case("pipeline_bubble_fraction(8, 64)", rel_tol=_REL),
        Case("pipeline_bubble_fraction(16, 1)", rel_tol=_REL),
        raises("pipeline_bubble_fraction(0, 4)", "ValueError"),
        raises("pipeline_bubble_fraction(4, 0)", "ValueError"),
    ],
    "tensor_parallel_bytes": [
        "tensor_parallel_bytes(1, 2048, 4096, 8)",
        "tensor_parallel_bytes(8, 1024, 12288, 8)",
        "tensor_parallel_bytes(1, 1, 1, 1)",
        "tensor_parallel_bytes(2, 5, 8, 2, bytes_per_element=8)",
        "tensor_parallel_bytes(4, 512, 768, 4, 4)",
        raises("tensor_parallel_bytes(1, 16, 10, 4)", "ValueError"),  # 10 columns, 4 ranks
        raises("tensor_parallel_bytes(0, 16, 8, 2)", "ValueError"),
        raises("tensor_parallel_bytes(1, 16.0, 8, 2)", "TypeError"),
    ],
    # the graded prediction: within 5%, so the usual wrong answers all miss, for every
    # variant (VARIANTS below): B (the tensor's bytes; 33% or 25% low on 4 or 3 ranks), 2B
    # (33% or 50% high), 2(n-1)B (3 or 2 times too many), an all-gather's (n-1)/n B (half) and
    # the elements for the bytes (a quarter); 12 MiB taken as 12e6 bytes (4.6% low) passes
    "predicted_ring_bytes_per_rank": [Case("float(predicted_ring_bytes_per_rank)",
                                           rel_tol=0.05)],
}

# Each student's all-reduce for the graded prediction: ranks and float32 elements. 3 or 4 ranks (on
# 2, 2(n-1)/n B is B itself, the commonest wrong answer) and tensors of 6 to 12 MiB, no larger than
# the default's, which split into equal shards and which the notebook's gloo measurement sends in a
# few seconds on two CPU cores (most of them starting the processes), to within 1% of the count. The
# answers, 18 MiB for the default (which the lesson's cells after the prediction measure), 10,
# 13.5, 8 and 15 MiB, are more than 5% apart, so no one's passes for another (not 16 MiB: the lesson
# prints 16,777,216 elsewhere; not 12 MiB, the default's tensor, which the prediction's text gives:
# tests/test_notebooks.py). tests/test_parallel.py simulates each one's ring, and
# tests/test_parallel_demos.py measures each one on real processes.
VARIANTS = {
    "predicted_ring_bytes_per_rank": Variants(
        ("n_ranks", "n_elements"),
        ((4, 3 * 2**20), (3, 15 * 2**17), (4, 9 * 2**18), (3, 3 * 2**19), (4, 5 * 2**19)),
        "{n_ranks} ranks all-reduce a float32 tensor of {n_elements:,} elements"),
}


# Hidden inputs of each student's own (grader/content/variants.py): both exercises are integer
# counts, exact for any input, so sizes drawn anywhere in what the exercise accepts need no
# tolerance, and no answers copied from another student's checks, or written out for the fixed
# ones, pass them. tests/test_parallel.py checks them against NCCL-tests' bus factors and the
# ZeRO paper's formulas.
def _drawn_collective_bytes(rng: random.Random) -> list[str]:
    """Three collectives on 2 to 1024 ranks, of tensors that split into equal shards."""
    ops = rng.sample(("all_reduce", "reduce_scatter", "all_gather", "all_to_all"), 3)
    calls = []
    for op in ops:
        n = rng.randint(2, 1024)
        calls.append(f"collective_bytes({op!r}, {n * rng.randint(1, 2**30)}, {n})")
    return calls


def _drawn_zero_bytes_per_device(rng: random.Random) -> list[str]:
    """ZeRO stages 1, 2 and 3 (in a drawn order) of a model of 1M to 1T parameters on 2 to 4096
    ranks, which rarely split evenly (the shards round up); one in fp32 with AdamW's m and v."""
    fp32 = ", bytes_per_param=4, bytes_per_grad=4, optimizer_bytes_per_param=8"
    return [f"zero_bytes_per_device({rng.randint(10**6, 10**12)}, {rng.randint(2, 4096)}, "
            f"{stage}{fp32 if i == 2 else ''})"
            for i, stage in enumerate(rng.sample((1, 2, 3), 3))]


DRAWN = {"collective_bytes": _drawn_collective_bytes,
         "zero_bytes_per_device": _drawn_zero_bytes_per_device}
