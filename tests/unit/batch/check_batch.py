#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs tests/vm/batch.py junit on the logs and exit codes of a batch (one
process per test binary) and checks, through scripts/tally.py, how each
test is counted: a gtest test by its own marker, a test whose process died
in it or before it as failed (never as passed, never run again), and a
program's own exit code (SKIP_RETURN_CODE is a skip with the program's
reason; any other code but 0 a failure).

  check_batch.py PATH/TO/batch.py PATH/TO/tally.py
"""
import json
import pathlib
import subprocess
import sys
import tempfile

GTEST_LOG = """[==========] Running 4 tests from 1 test suite.
[ RUN      ] S.Passes
[       OK ] S.Passes (3 ms)
[ RUN      ] S.Skips
/src/s_test.cpp:12: Skipped
no io.max on this kernel: the throttle cannot hold reads

[  SKIPPED ] S.Skips (1 ms)
[ RUN      ] S.Crashes
about to touch the unit
"""

GROUPS = [
    {"id": 0, "exe": "s_tests", "tests": [{"name": "unit.S.Passes", "gtest": "S.Passes"},
                                          {"name": "unit.S.Skips", "gtest": "S.Skips"},
                                          {"name": "unit.S.Crashes", "gtest": "S.Crashes"},
                                          {"name": "unit.S.NeverReached", "gtest": "S.NeverReached"}]},
    {"id": 1, "exe": "check.py", "tests": [{"name": "unit.program.passes", "gtest": None}], "skip_rc": "77"},
    {"id": 2, "exe": "check_man.py", "tests": [{"name": "unit.program.skips", "gtest": None}], "skip_rc": "77"},
    {"id": 3, "exe": "other.sh", "tests": [{"name": "unit.program.77WithoutASkipCode", "gtest": None}]},
    {"id": 4, "exe": "check.py", "tests": [{"name": "unit.program.fails", "gtest": None}], "skip_rc": "77"},
]
LOGS = {0: (GTEST_LOG, "139"), 1: ("all good\n", "0"), 2: ("SKIP: man is not installed\n", "77"),
        3: ("nothing to do\n", "77"), 4: ("FAIL: a page without a NAME section\n", "1")}


def main():
    batch, tally = sys.argv[1], sys.argv[2]
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        res = pathlib.Path(tmp) / "batch-results"
        (res / "batch").mkdir(parents=True)
        (res / "batch.json").write_text(json.dumps(GROUPS))
        for gid, (log, rc) in LOGS.items():
            (res / "batch" / f"g{gid}.log").write_text(log)
            (res / "batch" / f"g{gid}.rc").write_text(rc + "\n")
        j = subprocess.run([sys.executable, batch, "junit", str(res)], capture_output=True, text=True)
        if j.returncode != 8:
            problems.append(f"batch.py junit exited {j.returncode}, expected 8 (tests failed):\n{j.stdout}{j.stderr}")
        stage = pathlib.Path(tmp) / "results"
        stage.mkdir()
        (stage / "arm64.xml").write_bytes((res / "junit.xml").read_bytes())
        t = subprocess.run([sys.executable, tally, str(stage)], capture_output=True, text=True)
        out = t.stdout
        expect = [
            "2 passed, 4 failed, 2 skipped",
            "no io.max on this kernel: the throttle cannot hold reads",
            "man is not installed",
            "unit.S.Crashes",
            "the process of s_tests exited 139 in this test",
            "unit.S.NeverReached",
            "not run: the process of s_tests exited 139 before this test",
            "unit.program.77WithoutASkipCode",
            "unit.program.fails",
        ]
        for e in expect:
            if e not in out:
                problems.append(f"tally's output lacks {e!r}")
        for name in ("unit.S.Passes", "unit.program.passes"):
            if f"FAILED {name}" in j.stdout:
                problems.append(f"{name} was reported failed")
    if problems:
        print("\n".join(problems))
        print("--- tally output:\n" + out)
        return 1
    print("batch.py counts each test as its process left it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
