"""What one submission may use: memory, CPU, processes, files, time, output."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one submission may use."""

    memory_bytes: int = 6 * 2**30  # the kernel's memory (and address space: torch maps a lot)
    cpu_seconds: int = 600
    processes: int = 256  # threads count too
    file_bytes: int = 64 * 2**20
    open_files: int = 512
    scratch_bytes: int = 256 * 2**20  # the kernel's /tmp and working folder, in memory
    private_bytes: int = 64 * 2**20  # its /run/ctc: sockets and probe replies
    cpus: float = 1.0  # CPU time per second of wall clock, where a cgroup can enforce it
    cell_seconds: int = 60
    notebook_seconds: int = 300
    output_bytes: int = 2 * 2**20  # per notebook, beyond it outputs are dropped
    message_bytes: int = 32 * 2**20  # one kernel message; a larger one disconnects the kernel
    # Draw matplotlib's figures into the graded copy (and so its feedback page). Off, each
    # figure leaves its one-line repr instead: drawing was 1.3 to 2.6 s of the 3.7 to 8 s a
    # lesson's hand-in took to grade on a 2-core machine, for plots the student's own notebook
    # already has.
    plots: bool = False
