"""What a batch script tells a preemptible training through its environment (standard library only, so that
``hpcdl submit`` can write these names without loading the training side).

Every value can also be given to :func:`hpcdl.checkpoint.run` as an argument, which wins.
"""

from __future__ import annotations

# Directory of the job's checkpoints; the next run of the job (requeued, or submitted again) resumes from it.
PATH_ENV = "HPCDL_CHECKPOINT"
# Comma-separated signal names that ask the job to checkpoint and stop (the scheduler's warning signal).
SIGNALS_ENV = "HPCDL_CHECKPOINT_SIGNALS"
DEFAULT_SIGNALS = ("USR2", "TERM")
# Shell command rank 0 runs once the checkpoint of a stopped job is complete, e.g. to requeue it.
REQUEUE_ENV = "HPCDL_CHECKPOINT_REQUEUE"
# Exit status of every rank after that checkpoint (a site may requeue jobs that exit with it).
EXIT_CODE_ENV = "HPCDL_CHECKPOINT_EXIT_CODE"
DEFAULT_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): a temporary failure; running again will go on
# The scheduler's id of the job, recorded in the checkpoint's history (``hpcdl jobs`` reads it).
JOB_ID_ENV = "HPCDL_JOB_ID"
