#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs scripts/tally.py on JUnit files written the way ctest writes them
and checks what it prints and its exit status: a skipped test is counted
as skipped (never as passed) with its reason, a stage that left only a
.missing file is one failure naming why, and a failed test is printed with
its first failed assertion.

  check_tally.py PATH/TO/tally.py
"""
import pathlib
import subprocess
import sys
import tempfile


def case(name, status, out, marker=""):
    """One <testcase> as ctest --output-junit writes it."""
    return (f'\t<testcase name="{name}" classname="{name}" time="0.01" status="{status}">\n'
            f'{marker}\t\t<system-out>{out}</system-out>\n\t</testcase>\n')


PASSED = case("unit.A.Passes", "run", "[ RUN      ] A.Passes\n[       OK ] A.Passes (0 ms)\n")
SKIPPED = case("integration.B.NeedsAThrottle", "notrun",
               "[ RUN      ] B.NeedsAThrottle\n/src/tests/b_test.cpp:12: Skipped\n"
               "no io.max on this kernel: the throttle cannot hold reads\n\n[  SKIPPED ] B.NeedsAThrottle (1 ms)\n",
               '\t\t<skipped message="Disabled"/>\n')
FAILED = case("integration.C.FiresInTime", "fail",
              "[ RUN      ] C.FiresInTime\na line printed before the failure\n/src/tests/c_test.cpp:99: Failure\n"
              "Value of: fired\n  Actual: false\nExpected: true\nno event within 30 s\n\n"
              "[  FAILED  ] C.FiresInTime (3000 ms)\n",
              '\t\t<failure message="Failed"/>\n')


def junit(*cases):
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="(empty)" tests="%d">\n%s</testsuite>\n'
            % (len(cases), "".join(cases)))


def run(tally, files):
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            (pathlib.Path(d) / name).write_text(text)
        p = subprocess.run([sys.executable, tally, d], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout


def expect(cond, what, out):
    if not cond:
        print(f"FAIL: {what}\n--- tally printed:\n{out}---")
        sys.exit(1)


def main():
    tally = sys.argv[1]
    # Everything passed or skipped: exit 0, and the skip is not a pass.
    rc, out = run(tally, {"plain.xml": junit(PASSED, SKIPPED)})
    lines = out.strip().splitlines()
    expect(rc == 0, f"exit status {rc} with nothing failed, 0 expected", out)
    expect(lines[-1] == "1 passed, 0 failed, 1 skipped", f"last line {lines[-1]!r}", out)
    expect("  SKIPPED [plain] integration.B.NeedsAThrottle: no io.max on this kernel: the throttle cannot hold reads" in lines,
           "the skip is listed with its stage and its reason", out)

    # A failure, and a stage that never ran.
    rc, out = run(tally, {"plain.xml": junit(PASSED, FAILED),
                          "asan.missing": "the build of build-asan failed (exit 1), see build-asan.log\n"})
    lines = out.strip().splitlines()
    expect(rc == 1, f"exit status {rc} with failures, 1 expected", out)
    expect(lines[-1] == "1 passed, 2 failed, 0 skipped", f"last line {lines[-1]!r}", out)
    expect("  FAILED [asan] (stage): the build of build-asan failed (exit 1), see build-asan.log" in lines,
           "a stage that never ran is a failure naming why", out)
    at = lines.index("  FAILED [plain] integration.C.FiresInTime")
    expect(lines[at + 1].strip() == "/src/tests/c_test.cpp:99: Failure" and lines[at + 2].strip() == "Value of: fired"
           and "no event within 30 s" in out and "a line printed before the failure" not in out,
           "the failed test is followed by its assertion, from the failure on", out)
    expect(any(l.startswith("  plain ") and l.split()[1:] == ["1", "passed", "1", "failed", "0", "skipped"] for l in lines),
           "the plain stage's own line counts 1 passed, 1 failed", out)
    print("tally: skips apart from passes with their reasons, a missing stage and a failure with its assertion")


if __name__ == "__main__":
    main()
