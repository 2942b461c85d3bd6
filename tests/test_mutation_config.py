"""`make mutation` reaches every gate module: mutmut's own file walk (setup.cfg's source_paths and only_mutate) yields
each file scripts/mutation.yaml lists, and mutmut's mutator makes mutants of each function listed there. A folder
missing from source_paths once left rollout/ and settings/ with no mutant at all while their scores looked empty."""
import io
from pathlib import Path

import pytest
import yaml
from mutmut.__main__ import write_all_mutants_to_file
from mutmut.configuration import reset_config
from mutmut.utils.file_utils import walk_mutatable_files

from scripts.mutation import function_of

ROOT = Path(__file__).resolve().parent.parent
SPEC = yaml.safe_load((ROOT / "scripts" / "mutation.yaml").read_text())


@pytest.fixture(scope="module")
def mutatable() -> set[str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        reset_config()
        try:
            return {str(path) for path in walk_mutatable_files()}
        finally:
            reset_config()


@pytest.mark.parametrize("module", SPEC["gate_modules"])
def test_each_gate_module_is_a_target(module):
    assert module in SPEC["targets"], f"{module} is a gate module but scripts/mutation.yaml names no function of it"


@pytest.mark.parametrize("module", sorted(SPEC["targets"]))
def test_mutmut_walks_and_mutates_each_target(module, mutatable):
    assert module in mutatable, f"mutmut never walks {module}: setup.cfg's [mutmut] source_paths leaves it out"
    mutated = write_all_mutants_to_file(out=io.StringIO(), source=(ROOT / module).read_text(), filename=Path(module))
    functions = {function_of(f"{module}.{name}") for name in mutated.mutant_names}
    wanted = set(SPEC["targets"][module])
    missing = sorted(wanted - functions) if wanted != {"*"} else ([] if functions else ["*"])
    assert not missing, f"mutmut makes no mutant of {missing} in {module}"
