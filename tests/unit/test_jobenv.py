"""The job contract (``hpcdl.jobenv``): its variables are named there only, and what it builds reads back.

The rank agent (``runner/rank_agent.py``) and the handshake (``common/handshake.py``) run from their source
on hosts where hpcdl may not be installed, so they cannot import the contract; every HPCDL_* name they
write must be one of its names.
"""

from __future__ import annotations

import re

from test_layout import ROOT, _strings

from hpcdl import jobenv
from hpcdl.common import discovery

NAMES = {value for key, value in vars(jobenv).items() if key.isupper() and isinstance(value, str)}
RUN_FROM_SOURCE = {ROOT / "hpcdl" / "runner" / "rank_agent.py", ROOT / "hpcdl" / "common" / "handshake.py"}


def test_the_contracts_variables_are_named_in_the_contract_only() -> None:
    wrong = []
    for path in sorted((ROOT / "hpcdl").rglob("*.py")):
        if path == ROOT / "hpcdl" / "jobenv.py" or path in RUN_FROM_SOURCE:
            continue
        for line, text in _strings(path):
            wrong += [
                f"{path.relative_to(ROOT)}:{line}: {name}"
                for name in NAMES
                if re.search(rf"\b{name}\b", text)
            ]
    assert wrong == []


def test_code_run_from_source_writes_the_contracts_names() -> None:
    written = set()
    for path in RUN_FROM_SOURCE:
        for _, text in _strings(path):
            written |= set(re.findall(r"\bHPCDL_[A-Z_]+\b", text))
    assert written and written <= NAMES, written - NAMES


def test_a_rendezvous_built_by_the_contract_is_where_discovery_meets() -> None:
    env = {**jobenv.rendezvous_env("10.1.2.3", 4711, "s3cret", serve=True), jobenv.HOSTNAME: "n7"}
    info = discovery.discover({**env, jobenv.RANK: "2", jobenv.SIZE: "4"})
    assert (info.rank, info.size, info.host, info.launcher) == (2, 4, "n7", "hpcdl run")
    meet = discovery.meeting(info, env)
    assert (meet.bootstrap, meet.addr, meet.ports, meet.serve, meet.secret) == (
        "tcp", "10.1.2.3", (4711,), True, "s3cret"
    )  # fmt: skip
    assert jobenv.rendezvous_env("h", 1, None, serve=False) == {
        jobenv.RENDEZVOUS_ADDR: "h", jobenv.RENDEZVOUS_PORT: "1", jobenv.RENDEZVOUS_SERVE: "0"
    }  # fmt: skip
