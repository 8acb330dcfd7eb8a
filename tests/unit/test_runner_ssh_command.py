"""The ssh lines ``hpcdl run`` starts ranks with: ``--`` ends ssh's options, so no host name is read as one;
a host name starting with '-' is refused before it reaches ssh or mpirun; the host-key policy is the
user's ssh configuration unless --ssh-host-key-policy says otherwise (no key trusted on first use)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from hpcdl.cli.main import app
from hpcdl.runner.errors import LaunchError
from hpcdl.runner.hosts import parse_hostfile, parse_hosts_arg
from hpcdl.runner.procs import SshOptions


def test_the_host_comes_after_the_end_of_options() -> None:
    argv = SshOptions(port=2222, identity_file=Path("/k/id")).argv("node1")
    assert argv[:2] == ["ssh", "-T"] and argv[-2:] == ["--", "node1"]
    assert argv[argv.index("-p") + 1] == "2222" and argv.index("-p") < argv.index("--")


def test_no_host_key_policy_by_default_and_the_chosen_one_otherwise() -> None:
    assert not any("StrictHostKeyChecking" in arg for arg in SshOptions().argv("node1"))
    for policy in ("yes", "accept-new", "no"):
        options = SshOptions(host_key_policy=policy).options()
        assert options[options.index(f"StrictHostKeyChecking={policy}") - 1] == "-o"


@pytest.mark.parametrize("host", ["-oProxyCommand", "-Eoutput", "-v"])
def test_a_host_name_starting_with_a_dash_is_refused(host: str, tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="host names do not start with '-'"):
        parse_hosts_arg(f"{host}:2")
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{host} slots=2\n")
    with pytest.raises(LaunchError, match="host names do not start with '-'"):
        parse_hostfile(hostfile)


def test_an_unknown_host_key_policy_is_refused() -> None:
    done = CliRunner().invoke(app, ["run", "-np", "1", "--ssh-host-key-policy", "sometimes", "true"])
    assert done.exit_code != 0 and "choose one of yes, accept-new, no" in done.output
