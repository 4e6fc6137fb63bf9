"""The backend-identity check (tests.harness.identity) passes where backends agree and counts a
planted bug."""

from __future__ import annotations

import pytest

from specdec_kernels import native
from specdec_kernels.exactness import block_traversal_law as btl
from tests.harness import identity


def _job(case_name: str, method: str, api: str) -> identity.Job:
    index = [c.name for c in btl.STEP_CASES].index(case_name)
    return identity.Job(index, method, api)


def test_jobs_cover_every_step_case_and_method():
    todo = identity.jobs()
    assert {j.case for j in todo} == set(range(len(btl.STEP_CASES)))
    assert {(j.method, j.api) for j in todo} == set(identity.CHAIN_APIS)
    assert {j.method for j in identity.jobs(("traversal",))} == {"traversal"}


@pytest.mark.skipif(not native.has_device("cpu"), reason="specdec_kernels._C not built (pip install -e .)")
@pytest.mark.slow
def test_the_cpu_backend_is_identical_on_every_job(capsys):
    assert identity.main(["--backend", "cpu", "--device", "cpu", "--n", "256", "--seeds", "11,12"]) == 0
    out = capsys.readouterr().out
    assert f"{len(identity.jobs())} jobs, 0 with differences" in out


@pytest.mark.parametrize("bug,case,method,api", [
    ("traversal_reversed_siblings", "w3d2-iid-t1", "traversal", "tree"),
    ("block_first_failure", "chain4-iid-t0.8-k3-p0.9", "block", "chain"),
])
@pytest.mark.slow
def test_a_planted_bug_is_counted(bug, case, method, api):
    job = _job(case, method, api)
    assert identity.differences(job, "reference", "cpu", 2048, 11) == 0
    assert identity.differences(job, "reference", "cpu", 2048, 11, bug=bug) > 0


@pytest.mark.parametrize("argv,message", [
    (["--seeds", "a"], "--seeds must be a comma list"),
    (["--methods", "tree"], "--methods must name"),
    (["--n", "0"], "--n and --workers"),
    (["--backend", "fast", "--device", "cpu"], "--backend 'fast' is not available on cpu"),
    (["--device", "gpu0"], "--device"),
])
def test_bad_arguments_get_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        identity.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
