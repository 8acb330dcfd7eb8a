"""Elastic jobs (``hpcdl run --min-np/--max-np [--host-discovery-script]``) with real workers that fail
and join, trained with ``hvd.elastic.run``: the job goes on and ends with the weights of an undisturbed
run."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from runner_helpers import hpcdl_run

pytest.importorskip("torch")

TRAIN = str(Path(__file__).with_name("elastic_train.py"))
# Runs in which a worker joins late: 0.2 s per epoch leaves it about 10 s to start (Python and torch on a
# loaded machine) before the others finish.
LONG_EPOCHS = 50


def results(stdout: str) -> dict[int, dict]:
    """Each worker's RESULT, by worker number."""
    found = {}
    for line in stdout.splitlines():
        _, sep, payload = line.partition("<stdout>:RESULT ")
        if sep:
            result = json.loads(payload)
            found[result["worker"]] = result
    return found


def undisturbed_weight(epochs: int) -> list:
    done, _ = hpcdl_run("-np", "1", "--min-np", "1", "--max-np", "1", "python", TRAIN, EPOCHS=str(epochs))
    assert done.returncode == 0, done.stderr
    return results(done.stdout)[0]["weight"]


def run_while_hosts_change(tmp_path: Path, before: str, after: str, num_proc: int):
    """Run the training with a discovery script that prints `before`, then `after` once the first round has
    committed 3 epochs (not after a fixed time: on a loaded machine the workers may take longer to start).
    (127.0.0.1 is this machine under another name: a second host to hpcdl.)"""
    hosts = tmp_path / "hosts"
    hosts.write_text(before)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    mark = tmp_path / "trained"

    def change() -> None:
        deadline = time.monotonic() + 100
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        hosts.write_text(after)

    threading.Thread(target=change, daemon=True).start()
    done, _ = hpcdl_run(
        "-np", str(num_proc), "--min-np", "2", "--max-np", "3", "--host-discovery-script", str(script),
        "python", TRAIN, timeout=120, EPOCHS=str(LONG_EPOCHS), PAUSE="0.2",
        MARK_FILE=str(mark), MARK_EPOCH="3",
    )  # fmt: skip
    return done


def test_a_failed_worker_is_dropped_and_training_goes_on() -> None:
    done, _ = hpcdl_run(
        "-np", "3", "--min-np", "2", "--max-np", "3", "python", TRAIN, timeout=120, FAIL_WORKER="2"
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "worker 2 on" in done.stderr and "exited with code 3" in done.stderr
    assert "elastic round 1: 3 worker(s)" in done.stderr and "elastic round 2: 2 worker(s)" in done.stderr
    found = results(done.stdout)
    assert sorted(found) == [0, 1]  # worker 2 never finished
    for result in found.values():
        assert result["size"] == 2 and result["epoch"] == 6 and result["sizes"] == [2, 3]
    assert found[0]["weight"] == found[1]["weight"] == undisturbed_weight(6)


@pytest.mark.slow
def test_workers_join_when_the_discovery_script_lists_a_new_host(tmp_path: Path) -> None:
    done = run_while_hosts_change(tmp_path, "localhost:2\n", "localhost:2\n127.0.0.1:1\n", 2)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "elastic round 2: 3 worker(s) (0@localhost, 1@localhost, 2@127.0.0.1)" in done.stderr
    found = results(done.stdout)
    assert sorted(found) == [0, 1, 2]
    assert [found[w]["size"] for w in range(3)] == [3, 3, 3]
    assert found[0]["sizes"] == [2, 3] and found[2]["sizes"] == [3]
    assert found[0]["weight"] == found[1]["weight"] == found[2]["weight"] == undisturbed_weight(LONG_EPOCHS)


@pytest.mark.slow
def test_a_failed_host_is_used_again_after_its_cooldown() -> None:
    done, _ = hpcdl_run(
        "-np", "3", "--min-np", "2", "--max-np", "3", "-H", "localhost:2,127.0.0.1:1",
        "--blacklist-cooldown-range", "1", "8", "python", TRAIN, timeout=120,
        FAIL_WORKER="2", EPOCHS=str(LONG_EPOCHS), PAUSE="0.2",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no new worker will start on 127.0.0.1 for 1 s (--blacklist-cooldown-range)" in done.stderr
    assert "127.0.0.1 usable again after the cooldown" in done.stderr
    assert "elastic round 2: 2 worker(s) (0@localhost, 1@localhost)" in done.stderr
    assert "elastic round 3: 3 worker(s) (0@localhost, 1@localhost, 3@127.0.0.1)" in done.stderr
    found = results(done.stdout)
    assert sorted(found) == [0, 1, 3]  # worker 2 failed; worker 3 took its host back
    assert [found[w]["size"] for w in (0, 1, 3)] == [3, 3, 3]
    assert found[0]["sizes"] == [2, 3] and found[3]["sizes"] == [3]
    assert found[0]["weight"] == found[1]["weight"] == found[3]["weight"] == undisturbed_weight(LONG_EPOCHS)


def test_without_a_cooldown_too_few_workers_fail_at_once_but_with_one_the_job_waits() -> None:
    args = ("-np", "2", "--min-np", "2", "--max-np", "2", "-H", "localhost:1,127.0.0.1:1")
    done, seconds = hpcdl_run(*args, "python", TRAIN, timeout=120, FAIL_WORKER="1", EPOCHS="12", PAUSE="0.2")
    assert done.returncode == 1 and "only 1 worker(s) left, fewer than --min-np 2" in done.stderr
    assert "--elastic-timeout" not in done.stderr and seconds < 60
    done, _ = hpcdl_run(
        *args, "--blacklist-cooldown-range", "1", "1", "python", TRAIN, timeout=120,
        FAIL_WORKER="1", EPOCHS="12", PAUSE="0.2",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "elastic round 2: 2 worker(s) (0@localhost, 2@127.0.0.1)" in done.stderr
    found = results(done.stdout)
    assert sorted(found) == [0, 2] and found[0]["weight"] == found[2]["weight"] == undisturbed_weight(12)


def test_fewer_workers_than_min_np_stop_the_job_with_the_reason() -> None:
    done, seconds = hpcdl_run(
        "-np", "2", "--min-np", "2", "--max-np", "2", "python", TRAIN, timeout=120, FAIL_WORKER="1"
    )  # fmt: skip
    assert done.returncode == 1
    assert "only 1 worker(s) left, fewer than --min-np 2" in done.stderr
    assert seconds < 60


def test_the_worker_that_failed_first_is_named_with_its_error() -> None:
    done, _ = hpcdl_run(
        "-np", "2", "--min-np", "2", "--max-np", "2", "python", TRAIN, timeout=120,
        FAIL_WORKER="1", FAIL_HOW="raise",
    )  # fmt: skip
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("hpcdl run: ")]
    assert any(
        line.startswith("hpcdl run: worker 1 on ")
        and " after its own error, ValueError: worker 1 gives up; " in line
        for line in lines
    ), lines
    first = lines.index("hpcdl run: elastic job stopped: only 1 worker(s) left, fewer than --min-np 2") + 1
    assert lines[first].startswith("hpcdl run: the first failure: worker 1 on "), lines
    assert lines[first].endswith(" failed first, with ValueError: worker 1 gives up (exited with code 1)")
    assert lines[first + 1].startswith("hpcdl run: its error (worker 1 on ")
    assert '    raise ValueError(f"worker {worker} gives up")' in done.stderr


def test_discovery_that_finds_too_few_hosts_fails_after_the_elastic_timeout(tmp_path: Path) -> None:
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:1\n")
    script.chmod(0o755)
    done, seconds = hpcdl_run(
        "--min-np", "2", "--max-np", "2", "--host-discovery-script", str(script), "--elastic-timeout", "3",
        "python", TRAIN, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "fewer than --min-np 2, for --elastic-timeout 3 s" in done.stderr
    assert seconds < 30


def test_reset_limit_stops_a_job_that_would_regroup_once_more() -> None:
    done, _ = hpcdl_run(
        "-np", "3", "--min-np", "2", "--max-np", "3", "--reset-limit", "0", "python", TRAIN,
        timeout=120, FAIL_WORKER="2",
    )  # fmt: skip
    assert done.returncode == 1
    assert "the job would need more than --reset-limit 0 new rounds" in done.stderr


@pytest.mark.slow
def test_workers_stop_when_their_host_leaves_the_discovery_output(tmp_path: Path) -> None:
    done = run_while_hosts_change(tmp_path, "localhost:2\n127.0.0.1:1\n", "localhost:2\n", 3)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "elastic round 1: 3 worker(s) (0@localhost, 1@localhost, 2@127.0.0.1)" in done.stderr
    assert "stopping worker 2: 127.0.0.1 no longer offers its slot" in done.stderr
    assert "elastic round 2: 2 worker(s) (0@localhost, 1@localhost)" in done.stderr
    found = results(done.stdout)
    assert sorted(found) == [0, 1]
    assert found[0]["size"] == found[1]["size"] == 2 and found[0]["sizes"] == [2, 3]
    assert found[0]["weight"] == found[1]["weight"] == undisturbed_weight(LONG_EPOCHS)
