// SPDX-License-Identifier: Apache-2.0
// ExpertLayout on mixture-of-experts models from the GGUF writer, their
// extents as the daemon makes them (daemon/extents.hpp): each unit's
// (layer, expert) slices, checked against the tensor table byte by byte.
#include "pager/expert_layout.hpp"

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "daemon/extents.hpp"
#include "gguf/byte_source.hpp"
#include "gguf/gguf.hpp"
#include "gguf/writer.hpp"

namespace airs::pager {
namespace {

struct Moe {
  gguf::File file;
  std::vector<Extent> extents;
};

// `experts` 0: a dense model.
Moe moe(const std::string& arch, uint64_t experts) {
  gguf::ModelSpec spec;
  spec.architecture = arch;
  spec.n_layers = 3;
  spec.n_embd = 256;
  spec.n_ff = 256;
  spec.n_vocab = 300;
  spec.n_expert = experts;
  spec.n_expert_used = experts > 0 ? 2 : 0;
  spec.types = gguf::TypeScheme::kF32;
  auto plan = gguf::plan_model(spec);
  EXPECT_TRUE(plan) << plan.error().message;
  auto bytes = gguf::render_model(*plan);
  EXPECT_TRUE(bytes);
  const gguf::MemorySource src(*bytes);
  auto f = gguf::parse(src);
  EXPECT_TRUE(f) << f.error().message;
  Moe m{std::move(f).value(), {}};
  m.extents = daemon::extents_of(m.file);
  return m;
}

bool expert_tensor(const std::string& name) { return name.find("_exps.weight") != std::string::npos; }

// Units [first, last] a byte range covers.
std::set<uint32_t> units_of_range(uint64_t off, uint64_t len, uint64_t unit) {
  std::set<uint32_t> s;
  for (uint64_t u = off / unit; u <= (off + len - 1) / unit; ++u) s.insert(static_cast<uint32_t>(u));
  return s;
}

TEST(ExpertLayout, TheDaemonsExtentsCutEachExpertTensorIntoOneSlicePerExpert) {
  for (const std::string arch : {"llama", "qwen3moe"}) {
    const Moe m = moe(arch, 8);
    uint64_t expert_tensors = 0;
    for (const auto& t : m.file.tensors) {
      std::vector<const Extent*> slices;
      for (const Extent& e : m.extents)
        if (e.offset >= t.offset && e.offset < t.offset + t.nbytes && e.access == Access::Expert) slices.push_back(&e);
      if (!expert_tensor(t.name)) {
        EXPECT_TRUE(slices.empty()) << t.name << " is dense";
        continue;
      }
      ++expert_tensors;
      ASSERT_EQ(slices.size(), 8U) << t.name;
      // Expert e is bytes [e·n/8, (e+1)·n/8) of the tensor, of its own layer.
      for (uint32_t e = 0; e < 8; ++e) {
        EXPECT_EQ(slices[e]->offset, t.offset + e * (t.nbytes / 8)) << t.name;
        EXPECT_EQ(slices[e]->length, t.nbytes / 8) << t.name;
        EXPECT_EQ(slices[e]->expert, e);
        EXPECT_EQ(slices[e]->layer, static_cast<uint32_t>(t.layer));
        EXPECT_EQ(slices[e]->load_rank, static_cast<uint32_t>(t.layer) + 1);
      }
    }
    EXPECT_EQ(expert_tensors, 9U) << arch << ": gate, up and down of 3 layers";
  }
}

// Against a brute force from the tensor table: every unit's experts, every
// expert's units, and which units are the experts' alone.
TEST(ExpertLayout, EachUnitKnowsTheExpertSlicesItHolds) {
  const Moe m = moe("qwen3moe", 8);
  // 96 KiB: a slice (256 KiB) spans 2.67 units, so there are inner units of
  // one expert and edge units two experts share; 1 MiB: 4 experts a unit.
  for (const uint64_t unit : {uint64_t{96} << 10, uint64_t{1} << 20}) {
    const ExpertLayout l(m.extents, m.file.file_size, unit);
    ASSERT_EQ(l.key_count(), 24U);
    EXPECT_EQ(l.layers(), 3U);
    const uint64_t units = (m.file.file_size + unit - 1) / unit;
    std::vector<std::set<uint32_t>> keys(units);
    std::vector<bool> dense(units, false);
    std::vector<std::set<uint32_t>> units_of(l.key_count());
    for (uint32_t u : units_of_range(0, m.file.data_offset, unit)) dense[u] = true;
    for (const auto& t : m.file.tensors) {
      if (!expert_tensor(t.name)) {
        for (uint32_t u : units_of_range(t.offset, t.nbytes, unit)) dense[u] = true;
        continue;
      }
      for (uint32_t e = 0; e < 8; ++e) {
        const auto k = l.find({static_cast<uint32_t>(t.layer), e});
        ASSERT_TRUE(k);
        for (uint32_t u : units_of_range(t.offset + e * (t.nbytes / 8), t.nbytes / 8, unit)) {
          keys[u].insert(*k);
          units_of[*k].insert(u);
        }
      }
    }
    uint32_t expert_units = 0;
    for (uint32_t u = 0; u < units; ++u) {
      EXPECT_EQ(std::set<uint32_t>(l.keys_of(u).begin(), l.keys_of(u).end()), keys[u]) << "unit " << u;
      EXPECT_EQ(l.expert_unit(u), !keys[u].empty() && !dense[u]) << "unit " << u;
      expert_units += l.expert_unit(u) ? 1U : 0U;
    }
    EXPECT_GT(expert_units, 0U);
    uint32_t widest = 0;
    for (uint32_t k = 0; k < l.key_count(); ++k) {
      EXPECT_EQ(std::set<uint32_t>(l.units_of(k).begin(), l.units_of(k).end()), units_of[k]) << "key " << k;
      EXPECT_TRUE(std::is_sorted(l.units_of(k).begin(), l.units_of(k).end()));
      widest = std::max(widest, static_cast<uint32_t>(units_of[k].size()));
    }
    EXPECT_EQ(l.widest(), widest);
  }
}

TEST(ExpertLayout, ATouchBelongsToTheExpertWhoseByteItIsOrToTheOnlyOneInItsUnit) {
  const Moe m = moe("llama", 8);
  const uint64_t unit = 96 << 10;
  const ExpertLayout l(m.extents, m.file.file_size, unit);
  const auto& t = m.file.tensors[*m.file.find_tensor("blk.1.ffn_up_exps.weight")];
  const uint64_t slice = t.nbytes / 8;
  const uint32_t k3 = *l.find({1, 3}), k4 = *l.find({1, 4});
  // Every byte of the tensor belongs to its expert; the byte before and
  // after belong to none of this tensor's.
  for (uint64_t off = t.offset; off < t.offset + t.nbytes; off += 4093)
    EXPECT_EQ(l.key_at(off), l.find({1, static_cast<uint32_t>((off - t.offset) / slice)}));
  EXPECT_EQ(l.key_at(t.offset + 3 * slice + slice - 1), k3);
  EXPECT_EQ(l.key_at(t.offset + 4 * slice), k4);
  // The unit where expert 3 ends and 4 begins: which one is touched needs
  // the byte; a unit inside expert 3's slice is its alone.
  const auto edge = static_cast<uint32_t>((t.offset + 4 * slice) / unit);
  ASSERT_EQ(l.keys_of(edge), (std::vector<uint32_t>{k3, k4}));
  const uint64_t b = t.offset + 4 * slice;  // expert 4's first byte
  EXPECT_EQ(l.expert_of_touch(edge, 0, UINT64_MAX), std::nullopt) << "the whole unit: either";
  EXPECT_EQ(l.expert_of_touch(edge, b - 4096, b), k3);
  EXPECT_EQ(l.expert_of_touch(edge, b, b + 4096), k4);
  EXPECT_EQ(l.expert_of_touch(edge, b - 32, b + 32), std::nullopt) << "a page across the boundary: either";
  const auto inner = static_cast<uint32_t>((t.offset + 3 * slice + slice / 2) / unit);
  ASSERT_EQ(l.keys_of(inner), (std::vector<uint32_t>{k3}));
  EXPECT_EQ(l.expert_of_touch(inner, 0, UINT64_MAX), k3);
  // A range outside the touched unit is clipped to it.
  EXPECT_EQ(l.expert_of_touch(inner, t.offset, t.offset + 1), k3);
  // Units of dense tensors belong to no expert.
  const auto& router = m.file.tensors[*m.file.find_tensor("blk.1.ffn_gate_inp.weight")];
  const auto ru = static_cast<uint32_t>((router.offset + router.nbytes / 2) / unit);
  if (l.keys_of(ru).empty()) {
    EXPECT_EQ(l.expert_of_touch(ru, 0, UINT64_MAX), std::nullopt);
  }
  EXPECT_FALSE(l.expert_unit(ru));
  // A unit that holds one expert's bytes and a dense tensor's: only a touch
  // of the expert's bytes names it. The rest (and the whole unit) is the
  // dense part every token reads: naming the expert there counted it, and
  // read its slices, on every token's touch of the dense tensor.
  uint32_t mixed_units = 0;
  for (uint32_t u = 0; u * unit < m.file.file_size; ++u) {
    if (l.keys_of(u).size() != 1 || l.expert_unit(u)) continue;
    ++mixed_units;
    const uint32_t k = l.keys_of(u).front();
    std::optional<uint64_t> dense_byte, expert_byte;
    for (uint64_t off = uint64_t{u} * unit; off < (uint64_t{u} + 1) * unit; off += 32) {
      const auto at = l.key_at(off);
      if (!at && !dense_byte) dense_byte = off;
      if (at == k && !expert_byte) expert_byte = off;
    }
    ASSERT_TRUE(dense_byte && expert_byte) << "unit " << u;
    EXPECT_EQ(l.expert_of_touch(u, *dense_byte, *dense_byte + 1), std::nullopt) << "unit " << u;
    EXPECT_EQ(l.expert_of_touch(u, 0, UINT64_MAX), std::nullopt) << "unit " << u;
    EXPECT_EQ(l.expert_of_touch(u, *expert_byte, *expert_byte + 1), k) << "unit " << u;
  }
  EXPECT_GT(mixed_units, 0U) << "no unit holds an expert's bytes and a dense tensor's: nothing tested";
  // Expert 3's units: its three slices' (gate, up, down), edges included.
  std::set<uint32_t> want;
  for (const char* name : {"blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight"}) {
    const auto& x = m.file.tensors[*m.file.find_tensor(name)];
    for (uint32_t u : units_of_range(x.offset + 3 * (x.nbytes / 8), x.nbytes / 8, unit)) want.insert(u);
  }
  EXPECT_EQ(std::set<uint32_t>(l.units_of(k3).begin(), l.units_of(k3).end()), want);
}

TEST(ExpertLayout, ADenseModelHasNoExperts) {
  const Moe m = moe("llama", 0);
  EXPECT_TRUE(std::none_of(m.extents.begin(), m.extents.end(), [](const Extent& e) { return e.access == Access::Expert; }));
  const ExpertLayout l(m.extents, m.file.file_size, uint64_t{64} << 10);
  EXPECT_TRUE(l.empty());
  EXPECT_FALSE(l.expert_unit(0));
  EXPECT_TRUE(l.keys_of(0).empty());
}

}  // namespace
}  // namespace airs::pager
