"""`make mutation`: mutmut over the gates and the other decision-making code, with the fast tests only.

Mutates the functions scripts/mutation.yaml lists (setup.cfg holds mutmut's own settings: the files it may
mutate and the fast tests it runs), then prints the score per module, every surviving mutant with its diff, and
the equivalent mutants accepted by the exclusion list with their reasons. Exits 1 when a gate module keeps a
surviving mutant the list does not name, or when the list names a mutant that no longer exists.

    .venv/bin/python scripts/mutation.py                       # every target
    .venv/bin/python scripts/mutation.py --module settings/config.py
"""
from __future__ import annotations

import argparse
import configparser
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TARGETS_FILE = ROOT / "scripts" / "mutation.yaml"
MUTANTS_DIR = ROOT / "mutants"
# Statuses that mean a test noticed the mutant (a timeout is an infinite loop the tests ran into).
DETECTED = {"killed", "timeout", "segfault", "caught by type check"}


@dataclass
class Mutant:
    name: str
    module: str  # file path, e.g. components/gates/anomalies.py
    function: str  # e.g. read_anomalies or ModelRepository.set_label
    status: str
    diff: str = ""

    @property
    def change(self) -> tuple[list[str], list[str]]:
        """The mutated lines: (removed, added), stripped of indentation."""
        lines = self.diff.splitlines()[2:]  # past the ---/+++ header
        removed = [line[1:].strip() for line in lines if line.startswith("-")]
        added = [line[1:].strip() for line in lines if line.startswith("+")]
        return removed, added


def dotted(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def mutant_glob(module: str, function: str) -> str:
    """mutmut's name pattern for the mutants of one function (`Class.method` for a method, `*` for all)."""
    if function == "*":
        return f"{dotted(module)}.*"
    if "." in function:
        cls, method = function.split(".", 1)
        return f"{dotted(module)}.x\u01c1{cls}\u01c1{method}__mutmut_*"
    return f"{dotted(module)}.x_{function}__mutmut_*"


def function_of(name: str) -> str:
    """`read_anomalies` from components.gates.anomalies.x_read_anomalies__mutmut_3 (Class.method for methods)."""
    mangled = name.rsplit(".", 1)[1].rsplit("__mutmut_", 1)[0]
    if mangled.startswith("x\u01c1"):
        cls, method = mangled[2:].split("\u01c1", 1)
        return f"{cls}.{method}"
    return mangled.removeprefix("x_")


def load_targets() -> dict:
    spec = yaml.safe_load(TARGETS_FILE.read_text())
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    allowed = {line.strip() for line in parser.get("mutmut", "only_mutate").splitlines() if line.strip()}
    missing = sorted(set(spec["targets"]) - allowed)
    if missing:
        sys.exit(f"{', '.join(missing)} must also be listed under only_mutate in setup.cfg's [mutmut] section.")
    # mutmut copies and mutates only files below source_paths: a target outside them silently gets no mutant at all.
    roots = [line.strip().rstrip("/") + "/" for line in parser.get("mutmut", "source_paths").splitlines()
             if line.strip()]
    unreached = sorted(module for module in spec["targets"] if not module.startswith(tuple(roots)))
    if unreached:
        sys.exit(f"{', '.join(unreached)} lie outside setup.cfg's [mutmut] source_paths: add their folders there.")
    return spec


def run_mutmut(globs: list[str]) -> None:
    """Runs mutmut from scratch (cached results would hide changes to the tests), streaming its progress."""
    shutil.rmtree(MUTANTS_DIR, ignore_errors=True)
    command = [str(Path(sys.executable).parent / "mutmut"), "run", *globs]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as mutmut:
        assert mutmut.stdout is not None
        for line in mutmut.stdout:
            # The per-mutant list at the end is printed below, sorted by module, with diffs.
            if line.startswith("Mutant results"):
                break
            sys.stdout.write(line)
            sys.stdout.flush()
        for _ in mutmut.stdout:
            pass
    if mutmut.returncode:
        sys.exit(f"mutmut failed (exit code {mutmut.returncode}); see its output above.")


def collect(spec: dict, globs: list[str]) -> list[Mutant]:
    """Every mutant of the targets with its status, and the diff of those that were not detected."""
    os.chdir(ROOT)
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    mutants = []
    for module in spec["targets"]:
        meta = MUTANTS_DIR / f"{module}.meta"
        if not meta.exists():
            continue
        for name, exit_code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in globs):
                continue
            mutant = Mutant(name, module, function_of(name), status_by_exit_code[exit_code])
            if mutant.status not in DETECTED:
                mutant.diff = get_diff_for_mutant(name, path=module)
            mutants.append(mutant)
    return mutants


def match_equivalents(mutants: list[Mutant], equivalents: list[dict]) -> tuple[dict[str, dict], list[dict]]:
    """Undetected mutants the list names (by module, function and the mutated lines), and entries that match none."""
    matched: dict[str, dict] = {}
    stale = []
    for entry in equivalents:
        removed = [line.strip() for line in entry["removed"]]
        added = [line.strip() for line in entry["added"]]
        hits = [m for m in mutants if m.module == entry["module"] and m.function == entry["function"]
                and m.status not in DETECTED and m.change == (removed, added)]
        if not hits:
            stale.append(entry)
        for mutant in hits:
            matched[mutant.name] = entry
    return matched, stale


def report(spec: dict, mutants: list[Mutant], seconds: float) -> int:
    matched, stale = match_equivalents(mutants, spec.get("equivalent") or [])
    gates = set(spec["gate_modules"])
    print(f"\n{'module':<40}{'mutants':>8}{'killed':>8}{'equiv.':>8}{'alive':>7}{'score':>8}")
    survivors = []
    for module in spec["targets"]:
        own = [m for m in mutants if m.module == module]
        killed = sum(m.status in DETECTED for m in own)
        equivalent = sum(m.name in matched for m in own)
        alive = [m for m in own if m.status not in DETECTED and m.name not in matched]
        survivors += alive
        scored = len(own) - equivalent
        score = f"{100 * killed / scored:.1f}%" if scored else "-"
        label = module + (" (gate)" if module in gates else "")
        print(f"{label:<40}{len(own):>8}{killed:>8}{equivalent:>8}{len(alive):>7}{score:>8}")
    total = len(mutants) - len(matched)
    killed = sum(m.status in DETECTED for m in mutants)
    print(f"{'all':<40}{len(mutants):>8}{killed:>8}{len(matched):>8}{len(survivors):>7}"
          f"{100 * killed / max(total, 1):>7.1f}%")
    print(f"mutation run: {seconds:.0f} s")

    if survivors:
        print(f"\n{len(survivors)} surviving mutants (add a test that fails on each, or, when no test can tell it "
              "from the original, list it under `equivalent` in scripts/mutation.yaml with the reason):")
        for mutant in survivors:
            print(f"\n{mutant.name}: {mutant.status}\n{mutant.diff}")
    if matched:
        print(f"\n{len(matched)} equivalent mutants (scripts/mutation.yaml):")
        for name, entry in sorted(matched.items()):
            print(f"  {name}: {entry['reason']}")
    for entry in stale:
        print(f"\nstale entry in scripts/mutation.yaml, no undetected mutant matches it: {entry['module']} "
              f"{entry['function']}: -{entry['removed']} +{entry['added']}")
    failing = [m for m in survivors if m.module in gates]
    if failing or stale:
        print(f"\nFAILED: {len(failing)} surviving mutants in the gate modules, {len(stale)} stale exclusions.")
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--module", action="append", help="only this target file (repeatable)")
    args = parser.parse_args()
    spec = load_targets()
    if args.module:
        unknown = sorted(set(args.module) - set(spec["targets"]))
        if unknown:
            sys.exit(f"not a target in scripts/mutation.yaml: {', '.join(unknown)}")
        spec["targets"] = {m: f for m, f in spec["targets"].items() if m in args.module}
        spec["equivalent"] = [e for e in spec.get("equivalent") or [] if e["module"] in args.module]
    globs = [mutant_glob(module, f) for module, functions in spec["targets"].items() for f in functions]
    started = time.monotonic()
    run_mutmut(globs)
    seconds = time.monotonic() - started
    return report(spec, collect(spec, globs), seconds)


if __name__ == "__main__":
    sys.exit(main())
