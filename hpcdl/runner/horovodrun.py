"""horovodrun compatibility: the flags (and ``--config-file`` keys) of Horovod 0.28's ``horovodrun`` that
``hpcdl run`` accepts but that change nothing here, each with the reason, so that command lines and
config files written for Horovod run unchanged and say what they lost."""

from __future__ import annotations

from collections.abc import Iterable

# key (the flag with '_' for '-', as in horovodrun's config file) -> (value type, why it has no effect)
NO_EFFECT: dict[str, tuple[type, str]] = {
    "disable_cache": (
        bool,
        "hpcdl run keeps no cache of host checks between runs (horovodrun keeps its ssh and NIC checks "
        "for 60 minutes)",
    ),
    "autotune_bayes_opt_max_samples": (
        int,
        "hpcdl's autotuner tries each knob's candidate values in turn, without Bayesian optimisation",
    ),
    "autotune_gaussian_process_noise": (
        float,
        "hpcdl's autotuner tries each knob's candidate values in turn, without a Gaussian process",
    ),
    "mpi_threads_disable": (
        bool,
        "hpcdl initialises MPI only for --transport mpi, and then needs MPI_THREAD_MULTIPLE",
    ),
    "thread_affinity": (
        int,
        "hpcdl's engine thread moves to the core of the thread that submits work by itself",
    ),
    "ccl_bgt_affinity": (int, "hpcdl has no oneCCL backend"),
    "log_with_timestamp": (
        bool,
        "hpcdl's runtime messages carry no timestamp; --prefix-output-with-timestamp stamps every line",
    ),
}


# The flags of a key where it has several (a negated form, an old alias).
_FLAGS = {
    "mpi_threads_disable": "--[no-]mpi-threads-disable",
    "log_with_timestamp": "--log-with[out]-timestamp (--[no-]log-hide-timestamp)",
    "ccl_bgt_affinity": "ccl_bgt_affinity (config file)",
}


def no_effect_notes(given: Iterable[str]) -> list[str]:
    """One line per horovodrun-only setting that was given."""
    notes = []
    for key in given:
        flag = _FLAGS.get(key, "--" + key.replace("_", "-"))
        notes.append(f"{flag} has no effect here: {NO_EFFECT[key][1]}")
    return notes
