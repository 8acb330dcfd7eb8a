"""Reading what qsub/qstat (PBS, Cobalt), bsub/bjobs (LSF) and flux batch/jobs print.

No PBS, Cobalt, LSF or Flux server can run here, so these take the commands' documented output forms.
"""

from __future__ import annotations

import pytest

from hpcdl.schedulers import SchedulerError
from hpcdl.schedulers.cobalt import parse_cobalt_qstat, parse_cobalt_qsub_answer
from hpcdl.schedulers.flux import parse_flux_batch_answer, parse_flux_jobs
from hpcdl.schedulers.lsf import parse_bjobs, parse_bsub_answer
from hpcdl.schedulers.pbs import parse_qstat_full, parse_qsub_answer

QSTAT_FULL = """Job Id: 1234[].pbs01
    Job_Name = train
    Job_Owner = alice@login1
    job_state = B
    queue = prod
    array_indices_submitted = 0-1

Job Id: 1234[0].pbs01
    Job_Name = train
    job_state = X
    Exit_status = 0

Job Id: 1234[1].pbs01
    Job_Name = train
    job_state = R
"""


def test_pbs_answers() -> None:
    assert parse_qsub_answer("1234.pbs01\n") == "1234.pbs01"
    assert parse_qsub_answer("1234[].pbs01\n") == "1234[].pbs01"
    states = parse_qstat_full("1234[].pbs01", QSTAT_FULL)
    assert [(s.job_id, s.state, s.native) for s in states] == [
        ("1234[].pbs01", "RUNNING", "B"),
        ("1234[0].pbs01", "COMPLETED", "X"),
        ("1234[1].pbs01", "RUNNING", "R"),
    ]
    with pytest.raises(SchedulerError, match="holds no PBS job id"):
        parse_qsub_answer("qsub: Unknown resource Resource_List.gpus")
    with pytest.raises(SchedulerError, match="no job_state"):
        parse_qstat_full("9", "qstat: Unknown Job Id 9.pbs01")


def test_lsf_answers() -> None:
    assert parse_bsub_answer("Job <4242> is submitted to queue <batch>.\n") == "4242"
    states = parse_bjobs("4243", "4243|1|DONE\n4243|2|RUN\n4243|3|PEND\n")
    assert [(s.job_id, s.state) for s in states] == [
        ("4243[1]", "COMPLETED"),
        ("4243[2]", "RUNNING"),
        ("4243[3]", "PENDING"),
    ]
    assert parse_bjobs("4244", "4244|0|EXIT\n")[0].state == "FAILED"
    with pytest.raises(SchedulerError, match="holds no job id"):
        parse_bsub_answer("Project must be specified. Job not submitted.")


def test_flux_answers() -> None:
    assert parse_flux_batch_answer("ƒ2B1tWRbq\n") == "ƒ2B1tWRbq"
    states = parse_flux_jobs("x", "ƒ2B1tWRbq|RUN|\nƒ3aZ|INACTIVE|TIMEOUT\nƒ4b|SCHED|\n")
    assert [(s.job_id, s.state) for s in states] == [
        ("ƒ2B1tWRbq", "RUNNING"),
        ("ƒ3aZ", "TIMEOUT"),
        ("ƒ4b", "PENDING"),
    ]
    with pytest.raises(SchedulerError, match="not one job id"):
        parse_flux_batch_answer("flux-batch: ERROR: Unable to connect to Flux\nno instance")


def test_cobalt_answers() -> None:
    assert parse_cobalt_qsub_answer('Job routed to queue "debug-cache-quad".\n123456\n') == "123456"
    listing = "JobID: 123456\n    User           : alice\n    State          : running\n"
    assert parse_cobalt_qstat("123456", listing)[0].state == "RUNNING"
    with pytest.raises(SchedulerError, match=r"read 99\.cobaltlog"):
        parse_cobalt_qstat("99", "")
