#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Counts the results of every test stage of scripts/test.sh.

Each stage leaves a JUnit file (ctest --output-junit) in the results
directory, named STAGE.xml; a VM guest's own ctest leaves its file there too
(tests/vm/run-vm.sh copies it back as vm-NAME.xml). A stage that could not
run at all leaves STAGE.missing with one line saying why: it counts as one
failed test, so a stage that never ran is never a silent pass.

Prints the skipped tests with their reasons, the failed tests each with the
first lines of its failure (the assertion and its values: the part of a long
log a reader needs first), one line per stage, and last: "N passed, N
failed, N skipped". A skipped test is not a passed test: ctest's own
percentage counts it as passed, this does not.

Exit status: 0 when nothing failed, 1 otherwise.

  scripts/tally.py RESULTS_DIR
"""
import pathlib
import re
import sys
import xml.etree.ElementTree as ET

# gtest prints "FILE:LINE: Skipped" then the message, then a blank line;
# our shell tests print "SKIP: reason"; ctest notes the skip rule it matched.
GTEST_SKIP = re.compile(r": Skipped\n(.*?)(?:\n\n|\n\[  SKIPPED \]|$)", re.S)
SHELL_SKIP = re.compile(r"^(?:SKIP|SKIPPED)[:!]? +(.*)$", re.M)


def skip_reason(case):
    out = (case.findtext("system-out") or "").strip()
    m = GTEST_SKIP.search(out)
    if m and m.group(1).strip():
        return " ".join(m.group(1).split())
    m = SHELL_SKIP.search(out)
    if m:
        return m.group(1).strip()
    last = [line for line in out.splitlines() if line.strip()]
    if last:
        return last[-1].strip()[:200]
    sk = case.find("skipped")
    return sk.get("message", "no reason given") if sk is not None else "no reason given"


GTEST_FAILURE = re.compile(r"^.*: Failure$", re.M)


def failure_excerpt(case, lines=6):
    """The first failed assertion with the lines that follow it (gtest), else
    the last lines of the output (a shell test's own words)."""
    out = case.findtext("system-out") or ""
    m = GTEST_FAILURE.search(out)
    text = out[m.start():] if m else out
    kept = [line.rstrip()[:240] for line in text.splitlines() if line.strip()]
    return kept[:lines] if m else kept[-lines:]


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    results = pathlib.Path(sys.argv[1])
    stages = []
    skipped, failed = [], []
    totals = [0, 0, 0]
    for f in sorted(results.glob("*.missing")):
        why = f.read_text().strip() or "no result"
        failed.append((f.stem, "(stage)", why, []))
        stages.append((f.stem, 0, 1, 0))
        totals[1] += 1
    for f in sorted(results.glob("*.xml")):
        stage = f.stem
        try:
            root = ET.parse(f).getroot()
        except ET.ParseError as e:
            failed.append((stage, "(junit)", f"unreadable {f.name}: {e}", []))
            stages.append((stage, 0, 1, 0))
            totals[1] += 1
            continue
        p = fl = sk = 0
        for case in root.iter("testcase"):
            name = case.get("name", "?")
            status = case.get("status", "")
            if case.find("failure") is not None or case.find("error") is not None or status == "fail":
                fl += 1
                failed.append((stage, name, "", failure_excerpt(case)))
            elif case.find("skipped") is not None or status in ("notrun", "disabled"):
                sk += 1
                skipped.append((stage, name, skip_reason(case)))
            else:
                p += 1
        stages.append((stage, p, fl, sk))
        totals[0] += p
        totals[1] += fl
        totals[2] += sk
    if skipped:
        print(f"skipped ({len(skipped)}), each with its reason:")
        for stage, name, why in skipped:
            print(f"  SKIPPED [{stage}] {name}: {why}")
    if failed:
        print(f"failed ({len(failed)}):")
        for stage, name, why, excerpt in failed:
            print(f"  FAILED [{stage}] {name}{': ' + why if why else ''}")
            for line in excerpt:
                print(f"      {line}")
    print("by stage:")
    for stage, p, fl, sk in stages:
        print(f"  {stage:<28} {p:5d} passed {fl:4d} failed {sk:4d} skipped")
    print(f"{totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main())
