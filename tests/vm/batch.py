#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A ctest selection run as one gtest process per test binary: a VM guest's
selection, and the arm64 unit tests under qemu-user (scripts/cross-arm64.sh,
where a process spends about 0.1 s of emulated start-up before its first
test).

Under TCG a process costs a second or more before its first test: the
dynamic linking of a test binary, its static set-up, a suite's set-up (the
pager suites write a 64 MiB model). ctest starts one process per test. In
the 6.1 guest four binaries of its selection took 188 s one process per
test and 130 s one process per binary (the pager's: 86 s and 50 s). So a
guest runs each binary once, with its selected tests as one --gtest_filter,
and the results are turned back into one JUnit entry per test, named as
ctest names it, for scripts/tally.py.

What ctest would do stays:
- the selection is ctest's own (the same -L/-R/-E/-FS, read back with
  --show-only=json-v1), each test's command, working directory and timeout;
- RUN_SERIAL tests run with nothing beside them, one binary at a time; the
  others run up to JOBS binaries at a time;
- a test that skips (GTEST_SKIP, or a program's SKIP_RETURN_CODE) is
  skipped, with its reason;
- a process that dies (a crash, a timeout) fails the test it was running
  and every test of its binary it had not reached, each saying so: no
  result is ever made up, and nothing is run again.
A test thus shares its process with the tests of its binary before it, as
gtest's own runner has it; the host's stages run each test alone.

  batch.py plan BUILD RESULTS TIMEOUT JOBS [ctest selection args...]
      writes RESULTS/batch.sh (POSIX sh, run in the guest or here) and
      RESULTS/batch.json; exit 2 when ctest selects nothing
  batch.py junit RESULTS
      RESULTS/batch/gN.log and gN.rc into RESULTS/junit.xml; prints the
      output of each failed test and a summary; exit 0 when no test failed,
      8 otherwise
"""
import json
import pathlib
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET

FILTER = "--gtest_filter="


def props_of(test):
    return {p["name"]: p["value"] for p in test.get("properties", [])}


def exe_of(cmd, build):
    """The test binary's name (a cross build's commands start with the emulator)."""
    inside = [c for c in cmd if c.startswith(build.rstrip("/") + "/")]
    return pathlib.Path(inside[0] if inside else cmd[0]).name


def plan(build, results, timeout, jobs, selection):
    out = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1", *selection],
                         check=True, capture_output=True, text=True).stdout
    tests = json.loads(out)["tests"]
    if not tests:
        print(f"batch.py: ctest selects no test in {build}", file=sys.stderr)
        return 2
    groups, by_key = [], {}
    selected = {t["name"] for t in tests}
    for t in tests:
        cmd = t.get("command") or []
        p = props_of(t)
        unsupported = [k for k in ("FIXTURES_SETUP", "FIXTURES_CLEANUP", "ENVIRONMENT",
                                   "PASS_REGULAR_EXPRESSION", "FAIL_REGULAR_EXPRESSION", "WILL_FAIL") if k in p]
        # An order among selected tests (a DEPENDS on one outside the
        # selection, such as a fixture's set-up run on the host, orders nothing).
        unsupported += ["DEPENDS"] if set(p.get("DEPENDS", [])) & selected else []
        if unsupported or not cmd:
            # Nothing in the guests' selections has these; a test that does
            # would need ctest's own ordering or checks.
            print(f"batch.py: {t['name']}: {', '.join(unsupported) or 'no command'}: not supported in a batch",
                  file=sys.stderr)
            return 2
        filters = [a for a in cmd if a.startswith(FILTER)]
        serial = bool(p.get("RUN_SERIAL"))
        wd = p.get("WORKING_DIRECTORY", build)
        secs = int(float(p.get("TIMEOUT", timeout)))
        if len(filters) == 1:
            base = [a for a in cmd if not a.startswith(FILTER)]
            key = (tuple(base), wd, serial)
            g = by_key.get(key)
            if g is None:
                g = by_key[key] = {"cmd": base, "exe": exe_of(cmd, build), "wd": wd, "serial": serial, "tests": [],
                                   "timeout": 0}
                groups.append(g)
            g["tests"].append({"name": t["name"], "gtest": filters[0][len(FILTER):]})
            g["timeout"] += secs
        else:  # not a gtest test: alone, as ctest runs it (its exit code is its result)
            groups.append({"cmd": cmd, "exe": exe_of(cmd, build), "wd": wd, "serial": serial,
                           "tests": [{"name": t["name"], "gtest": None}], "timeout": secs,
                           "skip_rc": p.get("SKIP_RETURN_CODE")})
    res = pathlib.Path(results)
    (res / "batch").mkdir(parents=True, exist_ok=True)
    lines = ["#!/bin/sh", "# The guest's tests, one process per test binary (tests/vm/batch.py).",
             f"cd {shlex.quote(str(res))} || exit 1"]

    def run_line(g):
        cmd = list(g["cmd"])
        if g["tests"][0]["gtest"] is not None:
            cmd.append(FILTER + ":".join(t["gtest"] for t in g["tests"]))
        log = res / "batch" / f"g{g['id']}"
        return (f"(cd {shlex.quote(g['wd'])} && exec timeout -k 10 {g['timeout']} "
                f"{' '.join(shlex.quote(c) for c in cmd)}) > {shlex.quote(str(log))}.log 2>&1; "
                f"echo $? > {shlex.quote(str(log))}.rc; echo \"==> {g['exe']} ({len(g['tests'])} tests) ended, "
                f"exit $(cat {shlex.quote(str(log))}.rc)\"")

    for i, g in enumerate(groups):
        g["id"] = i
    parallel = [g for g in groups if not g["serial"]]
    for lane in (parallel[k::jobs] for k in range(jobs)):
        if lane:
            lines += ["("] + ["  " + run_line(g) for g in lane] + [") &"]
    lines.append("wait")
    lines += [run_line(g) for g in groups if g["serial"]]
    (res / "batch.sh").write_text("\n".join(lines) + "\n")
    (res / "batch.sh").chmod(0o755)
    (res / "batch.json").write_text(json.dumps(groups, indent=1))
    n = sum(len(g["tests"]) for g in groups)
    print(f"batch: {n} tests in {len(groups)} processes ({len(parallel)} of them up to {jobs} at a time)")
    return 0


# Anywhere in a line: a child process's output without its newline can
# precede gtest's marker.
END = re.compile(r"\[ +(OK|FAILED|SKIPPED) +\] (\S+)(?: \((\d+) ms\))?")
RUN = re.compile(r"\[ RUN +\] (\S+)")


def parse_log(text):
    """gtest's output, test by test: name -> (status, ms, output)."""
    done, cur, buf = {}, None, []
    for line in text.splitlines():
        m = RUN.search(line)
        if m:
            cur, buf = m.group(1), [line]
            continue
        if cur is not None:
            buf.append(line)
            m = END.search(line)
            if m and m.group(2) == cur:
                done[cur] = (m.group(1), int(m.group(3) or 0), "\n".join(buf))
                cur, buf = None, []
    return done, cur, "\n".join(buf)


def junit(results):
    res = pathlib.Path(results)
    groups = json.loads((res / "batch.json").read_text())
    suite = ET.Element("testsuite", name="vm-batch")
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failed_out = []
    for g in groups:
        log_path, rc_path = res / "batch" / f"g{g['id']}.log", res / "batch" / f"g{g['id']}.rc"
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        rc = rc_path.read_text().strip() if rc_path.exists() else None
        exe = g["exe"]
        how = ("never started (the guest ended first)" if rc is None and not text else
               "did not end (the guest ended first)" if rc is None else
               "was stopped by its timeout" if rc in ("124", "137") else f"exited {rc}")
        if g["tests"][0]["gtest"] is None:  # a test of its own: its exit code is its result
            t = g["tests"][0]
            skip_rc = g.get("skip_rc")
            status = ("OK" if rc == "0" else
                      "SKIPPED" if skip_rc is not None and rc == str(skip_rc) else "FAILED")
            done = {t["name"]: (status, 0, text)}
        else:
            done, running, running_out = parse_log(text)
        for t in g["tests"]:
            key = t["gtest"] if t["gtest"] is not None else t["name"]
            case = ET.SubElement(suite, "testcase", name=t["name"], classname=t["name"])
            if key in done:
                status, ms, out = done[key]
            elif t["gtest"] is not None and key == running:
                status, ms, out = "FAILED", 0, (running_out + f"\n==> the process of {exe} {how} in this test")
            else:
                status, ms, out = "FAILED", 0, f"==> not run: the process of {exe} {how} before this test"
            case.set("time", f"{ms / 1000:.3f}")
            if status == "OK":
                case.set("status", "run")
                counts["passed"] += 1
            elif status == "SKIPPED":
                case.set("status", "notrun")
                ET.SubElement(case, "skipped", message="skipped")
                counts["skipped"] += 1
            else:
                case.set("status", "fail")
                ET.SubElement(case, "failure", message="Failed")
                counts["failed"] += 1
                failed_out.append((t["name"], out))
            ET.SubElement(case, "system-out").text = out
        # A process that failed with every one of its tests passed (a crash at
        # exit, a suite's tear-down): a failure of its own.
        if rc not in (None, "0") and g["tests"][0]["gtest"] is not None and \
                all(done.get(t["gtest"], ("FAILED",))[0] in ("OK", "SKIPPED") for t in g["tests"]):
            name = f"{exe} (its process, after its tests)"
            case = ET.SubElement(suite, "testcase", name=name, classname=name, time="0", status="fail")
            ET.SubElement(case, "failure", message="Failed")
            tail = "\n".join(text.splitlines()[-40:])
            ET.SubElement(case, "system-out").text = tail + f"\n==> the process {how}"
            counts["failed"] += 1
            failed_out.append((name, tail))
    total = sum(counts.values())
    suite.set("tests", str(total))
    suite.set("failures", str(counts["failed"]))
    suite.set("skipped", str(counts["skipped"]))
    ET.ElementTree(suite).write(res / "junit.xml", encoding="UTF-8", xml_declaration=True)
    for name, out in failed_out:
        print(f"==> FAILED {name}:\n{out}\n")
    print(f"batch: {total} tests, {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped, in {len(groups)} processes")
    return 8 if counts["failed"] else 0


def main(argv):
    if len(argv) >= 5 and argv[0] == "plan":
        return plan(argv[1], argv[2], int(argv[3]), max(1, int(argv[4])), argv[5:])
    if len(argv) == 2 and argv[0] == "junit":
        return junit(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
