"""The `mlops` entry point ends its process without the interpreter's teardown, but otherwise as sys.exit would: with
the command's status, after other non-daemon threads finish, after the atexit handlers, with the console flushed.
Subprocesses: the entry point ends the process that calls it."""
import subprocess
import sys
from pathlib import Path

# A host program's own additions that a plain exit would honour: an atexit handler, a thread still writing, output
# left in the stdout buffer of a pipe.
PROLOGUE = """
import atexit, sys, threading, time
from pathlib import Path

atexit.register(lambda: Path({atexit_file!r}).write_text("atexit ran"))

def late_writer():
    time.sleep(0.5)
    Path({thread_file!r}).write_text("thread finished")

threading.Thread(target=late_writer).start()
print("buffered, no newline", end="")
sys.argv = ["mlops", *{args!r}]
from pipeline.cli import console_main
console_main()
raise SystemExit("console_main returned")
"""


def run_entry_point(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    atexit_file, thread_file = tmp_path / "atexit.txt", tmp_path / "thread.txt"
    code = PROLOGUE.format(atexit_file=str(atexit_file), thread_file=str(thread_file), args=list(args))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    return result, atexit_file, thread_file


def test_the_entry_point_exits_with_the_commands_status_after_what_an_exit_owes(tmp_path):
    result, atexit_file, thread_file = run_entry_point(tmp_path, "run", "--set", "trainig.train_steps=1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("config error: ") and "trainig" in result.stderr
    assert result.stdout == "buffered, no newline"
    assert atexit_file.read_text() == "atexit ran"
    assert thread_file.read_text() == "thread finished"


def test_the_entry_point_exits_zero_after_a_successful_command(tmp_path):
    result, atexit_file, thread_file = run_entry_point(tmp_path, "versions", "--set", f"output_root={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("buffered, no newline")
    assert atexit_file.exists() and thread_file.exists()


def test_python_dash_m_runs_the_entry_point(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", "--set", "trainig.train_steps=1"],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("config error: ")
