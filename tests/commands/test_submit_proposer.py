"""``kernelab submit --proposer``: the choice travels with the problem in its sidecar, and the
daemon's loop takes it over ``[jobs] proposers`` (``port --proposer`` over both)."""

from __future__ import annotations

from kernelabd.config import Config
from kernelabd.service.converge import Limits
from tests.conftest import EXAMPLES


def test_submit_writes_the_proposers_into_the_sidecar_it_drops(kit):
    kit.cli("submit", "--proposer", "template", "--proposer", "tune",
            str(EXAMPLES / "softmax.py"), str(EXAMPLES / "softmax.toml"))
    sidecar = (kit.home.inbox / "softmax.toml").read_text()
    assert sidecar.startswith('proposers = ["template", "tune"]\n')
    assert sidecar.endswith((EXAMPLES / "softmax.toml").read_text()), "the given sidecar is kept"
    assert (EXAMPLES / "softmax.toml").read_text().count("proposers") == 0, "the source is untouched"
    kit.cli("submit", "--proposer", "tune", str(EXAMPLES / "gelu_gate.py"))
    assert (kit.home.inbox / "gelu_gate.toml").read_text() == 'proposers = ["tune"]\n'


def test_submit_refuses_an_agent_that_is_not_configured(kit):
    out = kit.cli("submit", "--proposer", "agents.local", str(EXAMPLES / "softmax.py"), check=False)
    assert out.returncode == 2 and "no [agents.local] table" in out.stderr
    assert not (kit.home.inbox / "softmax.py").exists()


def test_the_sidecars_proposers_win_over_the_config_and_port_over_both():
    sidecar = 'proposers = ["agents.local", "tune"]\n[sizes.cuda]\ndim = 8\n'
    assert Limits.for_job({}, Config(), sidecar).proposers == ["agents.local", "tune"]
    assert Limits.for_job({"proposers": ["template"]}, Config(), sidecar).proposers == ["template"]
    assert Limits.for_job({}, Config(), None).proposers == Config().jobs.proposers


def test_a_sidecar_with_malformed_proposers_is_a_clear_error(tmp_path):
    import pytest

    from kernelabd.harness.problem import ProblemError, load_sidecar

    side = tmp_path / "k.toml"
    side.write_text("proposers = [1]\n")
    with pytest.raises(ProblemError, match="proposers must be a non-empty list of proposer names"):
        load_sidecar(side)
