#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The layer graph of airs-memd, enforced: every #include "<dir>/..." in
src/ and daemon/ must go to the file's own layer or one it may use. A new
crossing fails the build's unit tests; change ALLOWED here (and say why in
the commit) when the architecture really changes.

Usage: check_layers.py SOURCE_DIR
"""
import os
import re
import sys

# layer -> layers it may include. `airs` is the installed client API
# (include/airs), `dbus_gen` the proxies/adaptors generated from the XML.
ALLOWED = {
    "util": set(),
    "wire": {"util"},                                   # the layouts daemon and clients share (pages, request words)
    "sys": {"util"},                                    # the only layer that makes syscalls
    "probe": {"util", "sys"},
    "gguf": {"util"},                                   # pure: parse and write GGUF (file_io: the byte source)
    "policy": {"util"},                                 # pure: (state, request, now) -> plan
    "kv": {"util", "policy"},                           # pure: the block allocator
    "config": {"util", "sys"},                          # TOML -> validated structs; reads its files through sys
    "infer": {"util", "gguf", "airs"},                  # pure compute; its KV backend uses the C API
    "pool": {"util", "sys"},
    "pager": {"util", "sys", "pool", "wire"},
    "pressure": {"util", "sys", "policy"},
    "dbus": {"util", "dbus_gen"},                      # proxies.hpp: typed calls over the generated proxies
    "client": {"util", "sys", "dbus", "airs", "wire"},  # libairs (lazy mapping, touch guard)
    "preload": {"airs", "client", "wire"},                     # client: the cooperative touch guard it chains signals to
    "airsctl": {"util", "sys", "dbus", "gguf", "airs"},
    "daemon": {"util", "sys", "probe", "gguf", "policy", "kv", "config", "pool", "pager", "pressure", "dbus",
               "dbus_gen", "wire"},
}

# Programs that live beside a library and may reach one layer further.
FILE_EXCEPTIONS = {
    "src/gguf/file_io.cpp": {"sys"},
    "src/gguf/file_io.hpp": {"sys"},
    "src/gguf/content_id.cpp": {"sys"},           # the I/O half (airs_gguf_io): reads the file
    "src/gguf/gguf_dump_main.cpp": {"airsctl"},   # the JSON dump for the npm agreement test
    "src/gguf/mkmodel_main.cpp": {"sys"},
    "src/client/demo_main.cpp": {"gguf"},         # the quick start's demo client checks bytes against the file
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z_]+)/', re.M)


def layer_of(rel):
    parts = rel.split("/")
    return "daemon" if parts[0] == "daemon" else parts[1]


def main():
    top = sys.argv[1]
    bad = []
    seen = 0
    for root in ("src", "daemon"):
        for dirpath, _, files in os.walk(os.path.join(top, root)):
            for f in files:
                if not f.endswith((".cpp", ".hpp", ".h", ".c")):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, top)
                layer = layer_of(rel)
                if layer not in ALLOWED:
                    bad.append(f"{rel}: layer '{layer}' is not in the layer graph (tests/unit/layers/check_layers.py)")
                    continue
                allowed = ALLOWED[layer] | FILE_EXCEPTIONS.get(rel, set()) | {layer}
                with open(path, encoding="utf-8") as fh:
                    for n, m in enumerate(INCLUDE.finditer(fh.read())):
                        seen += 1
                        if m.group(1) not in allowed:
                            bad.append(f"{rel}: includes {m.group(1)}/ — layer '{layer}' may use only "
                                       f"{', '.join(sorted(allowed - {layer})) or 'nothing'}")
    for b in bad:
        print(b)
    print(f"{seen} includes checked, {len(bad)} layer crossings")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
