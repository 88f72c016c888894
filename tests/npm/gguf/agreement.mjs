// SPDX-License-Identifier: Apache-2.0
// Cross-checks airs' GGUF reader against an independent parser, the npm
// package @huggingface/gguf (version pinned by package-lock.json). For each
// spec: airs-mkmodel writes a model, airs-gguf-dump --json prints our tensor
// table, @huggingface/gguf reads the same file; names, types, dims and
// absolute offsets must agree exactly.
//
// usage: node agreement.mjs --mkmodel PATH --dump PATH --work DIR
import { execFileSync } from "node:child_process";
import { mkdirSync, rmSync } from "node:fs";
import path from "node:path";
import { gguf, GGMLQuantizationType } from "@huggingface/gguf";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
for (const k of ["mkmodel", "dump", "work"]) {
  if (!args[k]) {
    console.error(`agreement.mjs: --${k} is required`);
    process.exit(2);
  }
}
mkdirSync(args.work, { recursive: true });

const specs = [
  { name: "mixed-default", argv: ["--types", "mixed"] },
  { name: "f16-align64", argv: ["--types", "f16", "--alignment", "64", "--layers", "2"] },
  { name: "q4K-align4096", argv: ["--types", "q4_K", "--alignment", "4096", "--layers", "3", "--embd", "768", "--heads", "6", "--heads-kv", "2", "--ff", "2048"] },
  { name: "q8_0-v2", argv: ["--types", "q8_0", "--gguf-version", "2", "--layers", "2"] },
  { name: "q4_0-align1", argv: ["--types", "q4_0", "--alignment", "1", "--layers", "1"] },
  { name: "f32-small", argv: ["--types", "f32", "--layers", "1", "--embd", "64", "--heads", "2", "--heads-kv", "1", "--ff", "96", "--vocab", "50"] },
  { name: "mixed-fallback", argv: ["--types", "mixed", "--embd", "96", "--heads", "3", "--heads-kv", "1", "--ff", "160", "--vocab", "77", "--alignment", "16"] },
  { name: "mixed-sized-64M-align64K", argv: ["--size", "64M", "--layers", "8", "--alignment", "65536"] },
];

let failures = 0;
function fail(spec, msg) {
  console.error(`FAIL ${spec}: ${msg}`);
  failures++;
}

for (const spec of specs) {
  const file = path.join(args.work, `${spec.name}.gguf`);
  execFileSync(args.mkmodel, ["--out", file, "--seed", "5", ...spec.argv], { stdio: ["ignore", "ignore", "inherit"] });
  const ours = JSON.parse(execFileSync(args.dump, ["--json", file], { encoding: "utf8", maxBuffer: 64 << 20 }));
  const theirs = await gguf(file, { allowLocalFile: true });
  const md = theirs.metadata;

  const dataOffset = Number(theirs.tensorDataOffset);
  if (ours.data_offset !== dataOffset) fail(spec.name, `data_offset ours ${ours.data_offset} theirs ${dataOffset}`);
  if (ours.version !== md.version) fail(spec.name, `version ours ${ours.version} theirs ${md.version}`);
  if (ours.alignment !== Number(md["general.alignment"] ?? 32)) fail(spec.name, `alignment ours ${ours.alignment} theirs ${md["general.alignment"]}`);
  if (ours.architecture !== md["general.architecture"]) fail(spec.name, `architecture ours ${ours.architecture} theirs ${md["general.architecture"]}`);
  if (ours.tensors.length !== theirs.tensorInfos.length) {
    fail(spec.name, `tensor count ours ${ours.tensors.length} theirs ${theirs.tensorInfos.length}`);
    continue;
  }
  let mismatches = 0;
  ours.tensors.forEach((t, i) => {
    const o = theirs.tensorInfos[i];
    const theirType = GGMLQuantizationType[o.dtype];
    const theirDims = o.shape.map((d) => Number(d));
    const theirOffset = dataOffset + Number(o.offset);  // theirs is relative to the data section
    const problems = [];
    if (t.name !== o.name) problems.push(`name ${t.name} vs ${o.name}`);
    if (theirType === undefined || t.type.toUpperCase() !== theirType) problems.push(`type ${t.type} vs ${theirType} (${o.dtype})`);
    if (JSON.stringify(t.dims) !== JSON.stringify(theirDims)) problems.push(`dims ${JSON.stringify(t.dims)} vs ${JSON.stringify(theirDims)}`);
    if (t.offset !== theirOffset) problems.push(`offset ${t.offset} vs ${theirOffset}`);
    if (problems.length) {
      mismatches++;
      fail(spec.name, `tensor[${i}]: ${problems.join("; ")}`);
    }
  });
  const types = [...new Set(ours.tensors.map((t) => t.type))].sort().join(",");
  console.log(`${mismatches ? "FAIL" : "ok  "} ${spec.name}: ${ours.tensors.length} tensors agree (types ${types}, alignment ${ours.alignment}, data_offset ${ours.data_offset}, ${ours.file_size} bytes)`);
  rmSync(file);
}

if (failures) {
  console.error(`${failures} disagreement(s) between airs and @huggingface/gguf`);
  process.exit(1);
}
console.log(`airs and @huggingface/gguf agree on all ${specs.length} models`);
