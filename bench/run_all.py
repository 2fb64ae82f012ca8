"""``make bench``: run every benchmark in bench/ and rewrite its table in docs/benchmarks.md.

    .venv/bin/python bench/run_all.py [--only NAME[,NAME]] [--dry-run]

Each benchmark script prints its machine line(s) (``# ...``) and a Markdown table; this
runner puts that output, with the exact command, between the markers
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` of docs/benchmarks.md (the prose
around the markers is the people's and stays as it is). A benchmark that fails leaves
its section unchanged and makes the runner exit 1.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"

# The end-to-end run, at the default clone limit and at one that never binds.
E2E = ["--runs", "3", "--vms", "200", "--connections", "8"]
# name -> arguments; every script in bench/ except this one (and the _* helpers) is listed.
BENCHES: dict[str, list[str]] = {
    "worker_class": ["--noop", "1000", "--requests", "200"],
    "sweep_dispatch": ["--sizes", "100,1000,5000", "--reps", "5"],
    "targets": ["--runs", "3", "--vms", "300", "--pending", "1000,10000"],
    "command_attribution": ["--vms", "300"],
    "pending_sweep": ["--only", "sweep", "--runs", "3", "--pending", "100000"],
    "targets_aof": ["--runs", "3", "--vms", "300", "--pending", "10000", "--aof"],
    "api_rps": ["--runs", "3", "--seconds", "3", "--connections", "1,16"],
    "api_instructions": ["--rounds", "100"],
    "ready_latency": ["--requests", "100", "--rate", "10", "--modes", "2:vm,0.25:vm,0.25:list"],
    "durability": ["--runs", "3", "--seconds", "3", "--clients", "1,8"],
    "idle_fleet": ["--runs", "3", "--settle", "10", "--window", "30", "--wakes", "5"],
    "durability_fleet": ["--fleet", "200", "--runs", "5"],
    "eta": ["--seconds", "120", "--load", "3.0", "--calibrate", "40"],
    "e2e": E2E,
    "e2e_clone_limit": [*E2E, "--clone-limit", "1000"],
    "e2e_steady": ["--runs", "5", "--vms", "1000", "--connections", "8"],
    "script_cost": ["--requests", "400", "--runs", "5"],
    "overload": ["--requests", "120", "--gap", "0.55"],
    "job_cost": ["--jobs", "2000", "--runs", "3"],
}
SCRIPT_OF = {
    "targets_aof": "targets",
    "pending_sweep": "targets",
    "durability_fleet": "durability",
    "e2e_clone_limit": "e2e",
    "e2e_steady": "e2e",
}


def command(name: str) -> list[str]:
    return [".venv/bin/python", f"bench/{SCRIPT_OF.get(name, name)}.py", *BENCHES[name]]


def as_markdown(output: str) -> str:
    """A script's ``# ...`` lines (machine, load) as plain paragraphs, not headings."""
    lines = []
    for line in output.strip().splitlines():
        if line.startswith("# "):
            line = f"\n{line[2:]}\n"
        lines.append(line)
    return "\n".join(lines).strip().replace("\n\n\n", "\n\n")


def section(name: str, output: str) -> str:
    cmd = " ".join(command(name))
    body = as_markdown(output)
    return f"<!-- bench:{name} -->\nCommand: `{cmd}`\n\n{body}\n<!-- /bench:{name} -->"


def rewrite(doc: str, name: str, output: str) -> str:
    pattern = re.compile(rf"<!-- bench:{name} -->.*?<!-- /bench:{name} -->", re.S)
    new = section(name, output)
    if pattern.search(doc):
        return pattern.sub(lambda _: new, doc)
    return doc.rstrip("\n") + "\n\n" + new + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    parser.add_argument("--dry-run", action="store_true", help="print, do not rewrite")
    args = parser.parse_args()
    # A module named _* is a helper of the scripts (bench/_up.py), not a benchmark.
    scripts = {p.stem for p in (ROOT / "bench").glob("[!_]*.py")} - {"run_all"}
    missing = scripts - {SCRIPT_OF.get(n, n) for n in BENCHES}
    if missing:
        print(f"bench/run_all.py: not listed in BENCHES: {sorted(missing)}", file=sys.stderr)
        return 1
    names = [n for n in args.only.split(",") if n] or list(BENCHES)
    failed = False
    for name in names:
        print(f"== {' '.join(command(name))}", flush=True)
        done = subprocess.run(command(name), cwd=ROOT, capture_output=True, text=True)
        print(done.stdout, end="")
        if done.returncode:
            print(done.stderr[-2000:], file=sys.stderr)
            failed = True
            continue
        if not args.dry_run:
            DOC.write_text(rewrite(DOC.read_text(encoding="utf-8"), name, done.stdout))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
