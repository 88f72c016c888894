#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Keeps the hand-written man pages in docs/man honest.

  check_man.py SOURCE_DIR pages
      1. every page renders with `groff -man -ww -z` without a single
         warning, and its .TH names the file (name and section);
      2. airs-memd.conf.5 documents exactly the keys of the shipped
         config/airs-memd.conf (commented `#key = value` lines included),
         each under its own [section], with the shipped default written
         exactly as the shipped file writes it;
      3. libairs.3 names every function include/airs/airs.h declares, and
         names no airs_* identifier the header does not have.
  check_man.py SOURCE_DIR cli AIRSCTL AIRS_MEMD
      4. every subcommand `airsctl --help` lists has its subsection in
         airsctl.1, every option of airsctl and of each subcommand is
         described (the subcommand's under its own subsection), and every
         option airsctl.1 describes exists;
      5. every option `airs-memd --help` prints is described in airs-memd.8
         and every option described there exists;
      6. `airs-memd --check-config` on the shipped file prints the same
         sections and keys as the shipped file lists, with the same
         defaults (so the shipped file, and with it the page, follows the
         code).
Pages are checked as rendered text (a key in a roff comment does not count).
Exit status: 0 all good, 1 a check failed (each failure is printed), 77 a
tool is missing (groff: package groff-base).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def render(page):
    """The page as plain text, lines wide enough never to break a tag."""
    r = subprocess.run(["groff", "-man", "-Tascii", "-P-cbou", "-rLL=300n", "-rHY=0", page],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"groff could not render {page}: {r.stderr.strip()}")
    return r.stdout


def sections(text, indent):
    """Splits rendered text into {heading: [lines]} for headings at `indent`
    spaces (0: .SH, 3: .SS)."""
    out, cur = {}, None
    pat = re.compile(r"^ {%d}(\S.*?)\s*$" % indent)
    for line in text.splitlines():
        m = pat.match(line)
        if m:
            cur = m.group(1)
            out.setdefault(cur, [])
        elif cur is not None:
            out[cur].append(line)
    return out


def tags(lines):
    """The tag lines of .TP paragraphs directly under a section (7 spaces)."""
    return [l[7:] for l in lines if re.match(r"^ {7}\S", l)]


# ---- 1. rendering ----------------------------------------------------------

def check_render(man_dir):
    pages = sorted(f for f in os.listdir(man_dir) if re.search(r"\.[1-8]$", f))
    for want in ("airs-memd.8", "airsctl.1", "airs-memd.conf.5"):
        if want not in pages:
            fail(f"docs/man/{want} is missing")
    for p in pages:
        path = os.path.join(man_dir, p)
        r = subprocess.run(["groff", "-man", "-ww", "-z", "-Tutf8", path], capture_output=True, text=True)
        if r.returncode != 0 or r.stderr.strip():
            fail(f"{p}: groff -man -ww warns (fix the roff):\n{r.stderr.rstrip()}")
        name, sect = p.rsplit(".", 1)
        th = next((l for l in open(path, encoding="utf-8") if l.startswith(".TH ")), None)
        want = f".TH {name.upper().replace('-', chr(92) + '-')} {sect} "
        if th is None or not th.startswith(want):
            fail(f"{p}: .TH line should start with '{want}', is {th!r}")
    return pages


# ---- 2. configuration keys -------------------------------------------------

def shipped_config(path):
    """{section: {key: value text}} from the shipped file, commented or not."""
    conf, sect = {}, None
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        m = re.match(r"^\[([a-z]+)\]\s*$", line)
        if m:
            sect = m.group(1)
            conf[sect] = {}
            continue
        m = re.match(r"^#?([a-z][a-z0-9_]*) = (.*?)\s*$", line)
        if m:
            if sect is None:
                fail(f"{path}: key {m.group(1)} outside a [section]")
                continue
            conf[sect][m.group(1)] = m.group(2)
    return conf


def check_conf_page(page, conf):
    doc = {}
    subs = sections("\n".join(sections(render(page), 0).get("SECTIONS AND KEYS", [])), 3)
    for heading, lines in subs.items():
        m = re.match(r"^\[([a-z]+)\]$", heading)
        if not m:
            continue
        keys = doc.setdefault(m.group(1), {})
        for t in tags(lines):
            km = re.match(r"^([a-z][a-z0-9_]*) \((.*)\)$", t)
            if not km:
                continue
            dm = re.search(r"default: (.*)$", km.group(2))
            keys[km.group(1)] = dm.group(1) if dm else None
    if not doc:
        fail(f"{page}: no [section] subsections under SECTIONS AND KEYS")
    for sect, keys in conf.items():
        if sect not in doc:
            fail(f"{page}: section [{sect}] of the shipped configuration is not documented")
            continue
        for k, v in keys.items():
            if k not in doc[sect]:
                fail(f"{page}: [{sect}] {k} (in the shipped configuration) is not documented under [{sect}]")
            elif doc[sect][k] != v:
                fail(f"{page}: [{sect}] {k}: the page says default: {doc[sect][k]}, "
                     f"the shipped configuration says {v}")
    for sect, keys in doc.items():
        for k in keys:
            if k not in conf.get(sect, {}):
                fail(f"{page}: documents [{sect}] {k}, which the shipped configuration does not have")


# ---- 3. the C API ----------------------------------------------------------

def check_lib_page(page, header):
    text = render(page)
    htext = open(header, encoding="utf-8").read()
    funcs = set(re.findall(r"\b(airs_[a-z0-9_]+)\s*\(", htext))
    if len(funcs) < 10:
        fail(f"{header}: found only {len(funcs)} functions; the pattern is out of date")
    for f in sorted(funcs):
        if not re.search(r"\b%s\b" % f, text):
            fail(f"{os.path.basename(page)}: {f} (declared in airs.h) is not described")
    known = set(re.findall(r"\b(airs_[a-z0-9_]+)\b", htext))
    for ident in sorted(set(re.findall(r"\b(airs_[a-z0-9_]+)\b", text)) - known):
        fail(f"{os.path.basename(page)}: names {ident}, which airs.h does not declare")


# ---- 4./5. command-line options ---------------------------------------------

def run_help(argv):
    r = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        fail(f"{' '.join(argv)} --help exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def help_block(text, title):
    """Lines of a CLI11 help block ("Options:", "Subcommands:")."""
    out, inside = [], False
    for line in text.splitlines():
        if re.match(r"^\S", line):
            inside = line.strip() == title
            continue
        if inside and line.strip():
            out.append(line)
    return out


def help_options(text):
    opts = set()
    for line in help_block(text, "Options:"):
        m = re.match(r"^\s+(-\S+)", line)
        if m:
            opts.update(o for o in m.group(1).split(",") if o.startswith("-"))
    if not opts:
        fail("no options found in --help output; the parser of CLI11's help is out of date:\n" + text)
    return opts


def described(lines):
    """Options named at the start of the .TP tags of a block of the page."""
    out = set()
    for t in tags(lines):
        if t.startswith("-"):
            out.update(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", t))
    return out


def check_options(page, where, in_help, lines):
    doc = described(lines)
    for o in sorted(in_help - doc):
        fail(f"{page}: {where}: option {o} (in --help) is not described")
    for o in sorted(doc - in_help):
        fail(f"{page}: {where}: describes option {o}, which --help does not list")


def check_airsctl(page, airsctl):
    text = render(page)
    top = sections(text, 0)
    top_help = run_help([airsctl])
    subs = [re.match(r"^\s+(\S+)", l).group(1) for l in help_block(top_help, "Subcommands:")]
    if len(subs) < 5:
        fail(f"airsctl --help lists only {subs}; the parser of CLI11's help is out of date")
    check_options(os.path.basename(page), "GLOBAL OPTIONS", help_options(top_help), top.get("GLOBAL OPTIONS", []))
    cmds = sections("\n".join(top.get("COMMANDS", [])), 3)
    by_name = {h.split()[0]: lines for h, lines in cmds.items()}
    for s in subs:
        if s not in by_name:
            fail(f"{os.path.basename(page)}: subcommand '{s}' (in airsctl --help) has no subsection under COMMANDS")
            continue
        # -h/--help is every subcommand's; the page says so once, globally.
        opts = help_options(run_help([airsctl, s])) - {"-h", "--help"}
        check_options(os.path.basename(page), f"COMMANDS/{s}", opts, by_name[s])
        if not re.search(r"^\s+%s\b" % re.escape(s), "\n".join(top.get("SYNOPSIS", [])), re.M):
            fail(f"{os.path.basename(page)}: subcommand '{s}' is not in the SYNOPSIS")
    for name in by_name:
        if name not in subs:
            fail(f"{os.path.basename(page)}: documents subcommand '{name}', which airsctl --help does not list")


def check_daemon(page, daemon):
    top = sections(render(page), 0)
    check_options(os.path.basename(page), "OPTIONS", help_options(run_help([daemon])), top.get("OPTIONS", []))


# ---- 6. the shipped file against the code ------------------------------------

def normalise(v):
    """Durations to microseconds and sizes to bytes, so "2s" == "2000ms"."""
    if isinstance(v, str):
        m = re.fullmatch(r"(\d+) ?(us|ms|s|m|min|h)", v)
        if m:
            mul = {"us": 1, "ms": 10**3, "s": 10**6, "m": 6 * 10**7, "min": 6 * 10**7, "h": 36 * 10**8}
            return ("duration_us", int(m.group(1)) * mul[m.group(2)])
        m = re.fullmatch(r"(\d+) ?(B|K|k|KiB|M|MiB|G|GiB|T|TiB)", v)
        if m:
            return int(m.group(1)) * 1024 ** "BKMGT".index(m.group(2)[0].upper())
    return v


def check_effective(daemon, conf_path, conf):
    try:
        import tomllib
    except ImportError:
        fail("python3 >= 3.11 (tomllib) is needed to compare `airs-memd --check-config` with the shipped file")
        return
    with tempfile.TemporaryDirectory() as empty:
        r = subprocess.run([daemon, "--check-config", "--config", conf_path, "--config-dir", empty],
                           capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        fail(f"airs-memd --check-config on the shipped file exited {r.returncode}: {r.stderr.strip()}")
        return
    effective = tomllib.loads(r.stdout)
    shipped = tomllib.loads("\n".join(f"[{s}]\n" + "\n".join(f"{k} = {v}" for k, v in keys.items())
                                      for s, keys in conf.items()))
    for sect in sorted(set(effective) | set(shipped)):
        e, s = effective.get(sect, {}), shipped.get(sect, {})
        for k in sorted(set(e) - set(s)):
            fail(f"config/airs-memd.conf: [{sect}] {k} exists in the code (--check-config) but is not listed")
        for k in sorted(set(s) - set(e)):
            fail(f"config/airs-memd.conf: [{sect}] {k} is listed but --check-config does not print it")
        for k in sorted(set(s) & set(e)):
            if normalise(s[k]) != normalise(e[k]):
                fail(f"config/airs-memd.conf: [{sect}] {k}: shipped default {s[k]!r}, the code's default {e[k]!r}")


def main():
    if len(sys.argv) < 3 or sys.argv[2] not in ("pages", "cli"):
        print(__doc__)
        return 2
    src, mode = sys.argv[1], sys.argv[2]
    if shutil.which("groff") is None:
        print("SKIP: groff is not installed (Debian package groff-base; scripts/deps.sh installs it)")
        return 77
    man = os.path.join(src, "docs", "man")
    conf_path = os.path.join(src, "config", "airs-memd.conf")
    conf = shipped_config(conf_path)
    if sum(len(k) for k in conf.values()) < 30:
        fail(f"{conf_path}: found only {sum(len(k) for k in conf.values())} keys; the pattern is out of date")
    if mode == "pages":
        pages = check_render(man)
        check_conf_page(os.path.join(man, "airs-memd.conf.5"), conf)
        if "libairs.3" in pages:
            check_lib_page(os.path.join(man, "libairs.3"), os.path.join(src, "include", "airs", "airs.h"))
    else:
        airsctl, daemon = sys.argv[3], sys.argv[4]
        for b in (airsctl, daemon):
            if not os.access(b, os.X_OK):
                fail(f"{b} is not built (cmake --build build --target airsctl airs-memd)")
        if not failures:
            check_airsctl(os.path.join(man, "airsctl.1"), airsctl)
            check_daemon(os.path.join(man, "airs-memd.8"), daemon)
            check_effective(daemon, conf_path, conf)
    if failures:
        print(f"{len(failures)} problem(s) in the man pages (docs/man)")
        return 1
    print("man pages: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
