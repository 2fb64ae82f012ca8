"""CI's chaos soak: a short seeded run against vmpool (no violation, every fault kind at
least once, the warm pools' checkouts, give-backs and on-demand claims all exercised)
and one against the reference of the seed's design (violations found).

The long run is by hand: ``make chaos SECONDS=... SEED=...`` or
``python tests/chaos/soak.py --requests 10000 --seed 7`` (docs/reliability.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from soak import FAULT_KINDS, SoakOptions, SoakReport, run_soak

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, target: str, seconds: float, seed: int) -> SoakReport:
    opts = SoakOptions(
        seconds=seconds,
        seed=seed,
        target=target,
        rate=6.0,
        fault_gap_s=(1.5, 3.0),
        settle_timeout_s=120.0,
        workdir=str(tmp_path / target),
    )
    return run_soak(opts)


def test_soak_vmpool_has_no_violation_under_every_fault(tmp_path: Path) -> None:
    report = _run(tmp_path, "vmpool", 45, seed=11)
    text = "\n".join(report.lines())
    assert report.violation_count == 0, text
    for kind in FAULT_KINDS["vmpool"]:
        assert report.faults.get(kind, 0) >= 1, f"no {kind} fault:\n{text}"
    assert report.requests >= 100, text
    # the warm pools moved: checkouts, give-backs, requests served from ready VMs
    for op in ("checkout:checked_out", "giveback:given_back", "request_vm:claimed_from_warm"):
        assert report.warm_ops.get(op, 0) >= 1, f"no {op}:\n{text}"
    assert report.clone_slots["peak"] <= report.clone_slots["limit"], text


def test_soak_catches_the_seed_design(tmp_path: Path) -> None:
    report = _run(tmp_path, "seed-reference", 30, seed=11)
    text = "\n".join(report.lines())
    assert report.violation_count > 0, text
