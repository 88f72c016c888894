// SPDX-License-Identifier: Apache-2.0
// Writer → reader round trips: every field the writer puts in comes back.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <random>

#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"
#include "unit/gguf/test_util.hpp"
#include "util/units.hpp"

namespace airs::gguf {
namespace {

using testing::parse_bytes;

TEST(GgufTypes, TableMatchesTsv) {
  EXPECT_EQ(type_traits(12).name, "q4_K");
  EXPECT_EQ(type_traits(12).block_size, 256U);
  EXPECT_EQ(type_traits(12).type_size, 144U);
  EXPECT_EQ(type_traits(8).type_size, 34U);
  EXPECT_EQ(type_traits(30).name, "bf16");
  EXPECT_EQ(type_traits(42).name, "q2_0");
  EXPECT_EQ(type_traits(4).status, TypeStatus::kDeprecated);
  EXPECT_EQ(type_traits(37).status, TypeStatus::kRemoved);
  EXPECT_EQ(type_traits(43).status, TypeStatus::kUnknown);
  for (uint32_t i = 0; i < kTypeCount; ++i) EXPECT_EQ(type_traits(i).id, i);
  EXPECT_EQ(type_id_by_name("q4_K"), 12U);
  EXPECT_FALSE(type_id_by_name("DEPRECATED").has_value());
}

TEST(GgufRoundTrip, DefaultModelEveryField) {
  ModelSpec s;
  s.seed = 42;
  auto plan = plan_model(s);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  auto bytes = render_model(*plan);
  ASSERT_TRUE(bytes.ok());
  auto f = parse_bytes(*bytes);
  ASSERT_TRUE(f.ok()) << f.error().message;

  EXPECT_EQ(f->version, 3U);
  EXPECT_EQ(f->alignment, 32U);
  EXPECT_EQ(f->data_offset, plan->data_offset);
  EXPECT_EQ(f->data_offset % 32, 0U);
  EXPECT_EQ(f->file_size, plan->file_size);
  EXPECT_EQ(f->architecture, "llama");
  EXPECT_EQ(f->n_layers, 4U);
  EXPECT_EQ(f->n_kv, 17U);
  EXPECT_EQ(f->metadata.size(), 17U);
  EXPECT_EQ(f->find("general.name")->as_string(), "airs-synthetic");
  EXPECT_EQ(f->find("llama.feed_forward_length")->as_uint(), 1536U);
  EXPECT_EQ(f->find("llama.context_length")->as_uint(), 4096U);
  EXPECT_EQ(f->find("llama.attention.layer_norm_rms_epsilon")->type, ValueType::kFloat32);
  EXPECT_EQ(std::get<float>(f->find("llama.attention.layer_norm_rms_epsilon")->scalar), 1e-5F);
  EXPECT_EQ(std::get<bool>(f->find("tokenizer.ggml.add_bos_token")->scalar), true);
  const MetaValue* toks = f->find("tokenizer.ggml.tokens");
  ASSERT_NE(toks, nullptr);
  ASSERT_EQ(toks->type, ValueType::kArray);
  EXPECT_EQ(toks->array.elem_type, ValueType::kString);
  ASSERT_EQ(toks->array.count, 64U);
  ASSERT_TRUE(toks->array.loaded);
  EXPECT_EQ(std::get<std::string>(toks->array.items[1]), "<s>");
  EXPECT_EQ(std::get<std::string>(toks->array.items[63]), "<0x3C>");

  ASSERT_EQ(f->tensors.size(), plan->tensors.size());
  ASSERT_EQ(f->tensors.size(), 2U + 9 * 4 + 1);
  for (size_t i = 0; i < f->tensors.size(); ++i) {
    const auto& t = f->tensors[i];
    const auto& p = plan->tensors[i];
    EXPECT_EQ(t.name, p.name);
    EXPECT_EQ(t.type_id, p.type_id);
    EXPECT_EQ(t.type_name, type_traits(p.type_id).name);
    EXPECT_EQ(t.dims, p.dims);
    EXPECT_EQ(t.offset, p.offset);
    EXPECT_EQ(t.nbytes, p.nbytes);
    EXPECT_EQ(f->find_tensor(t.name), i);
  }
  // Mixed scheme as documented.
  EXPECT_EQ(f->tensors[0].type_name, "q4_K");
  EXPECT_EQ(f->tensors[*f->find_tensor("blk.0.attn_norm.weight")].type_name, "f32");
  EXPECT_EQ(f->tensors[*f->find_tensor("blk.2.attn_v.weight")].type_name, "q8_0");
  EXPECT_EQ(f->tensors[*f->find_tensor("blk.2.ffn_up.weight")].type_name, "q4_0");
  EXPECT_EQ(f->tensors[*f->find_tensor("output.weight")].type_name, "f16");
  const auto& q = f->tensors[*f->find_tensor("blk.3.attn_q.weight")];
  EXPECT_EQ(q.dims, (std::vector<uint64_t>{512, 512}));
  EXPECT_EQ(q.nbytes, 512U / 256 * 144 * 512);
  EXPECT_EQ(q.layer, 3);
  EXPECT_EQ(q.slot, LayerSlot::kBlock);
  EXPECT_EQ(f->tensors[0].layer, -1);
  EXPECT_EQ(f->tensors.back().layer, 4);

  ASSERT_TRUE(f->geometry.has_value());
  const ModelGeometry& g = *f->geometry;
  EXPECT_EQ(g.block_count, 4U);
  EXPECT_EQ(g.head_count, 4U);
  EXPECT_EQ(g.head_count_kv, 2U);
  EXPECT_EQ(g.embedding_length, 512U);
  EXPECT_EQ(g.key_length, 128U);
  EXPECT_EQ(g.value_length, 128U);
  EXPECT_EQ(g.context_length, 4096U);
  // 2 × n_layer × n_head_kv × head_dim × 2 bytes = 2 × 4 × 2 × 128 × 2.
  EXPECT_EQ(kv_bytes_per_token(g, KvType::kF16), 4096U);
  // 4 layers × 2 heads × (4 + 4) blocks × 34 bytes.
  EXPECT_EQ(kv_bytes_per_token(g, KvType::kQ8_0), 2176U);
}

TEST(GgufRoundTrip, LoadOrderIsEmbeddingBlocksNormOutput) {
  ModelSpec s;
  s.n_layers = 3;
  auto plan = plan_model(s);
  ASSERT_TRUE(plan.ok());
  // Shuffle the tensor order in the file: load order must not depend on it.
  Builder b;
  b.header(3, plan->tensors.size(), 0);
  std::vector<size_t> idx(plan->tensors.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::reverse(idx.begin(), idx.end());
  uint64_t rel = 0;
  for (size_t i : idx) {
    const auto& t = plan->tensors[i];
    b.tensor_info(t.name, t.dims, t.type_id, rel);
    rel = *round_up(rel + t.nbytes, 32);
  }
  b.pad_to(32).zeros(rel);
  auto f = parse_bytes(b.take());
  ASSERT_TRUE(f.ok()) << f.error().message;
  std::vector<std::string> order;
  for (uint32_t i : f->load_order) order.push_back(f->tensors[i].name);
  ASSERT_EQ(order.size(), 2U + 9 * 3 + 1);
  EXPECT_EQ(order.front(), "token_embd.weight");
  EXPECT_EQ(order[order.size() - 2], "output_norm.weight");
  EXPECT_EQ(order.back(), "output.weight");
  int64_t last_layer = -1;
  for (size_t r = 0; r < f->load_order.size(); ++r) {
    const auto& t = f->tensors[f->load_order[r]];
    EXPECT_EQ(t.load_rank, r);
    EXPECT_GE(t.layer, last_layer) << t.name;
    last_layer = t.layer;
  }
  EXPECT_EQ(f->n_layers, 3U);  // no metadata: from the highest blk.N
}

TEST(GgufRoundTrip, EveryMetadataValueType) {
  Builder b;
  b.header(2, 0, 15);
  b.kv_scalar("u8", Scalar{uint8_t{200}}).kv_scalar("i8", Scalar{int8_t{-5}});
  b.kv_scalar("u16", Scalar{uint16_t{60000}}).kv_scalar("i16", Scalar{int16_t{-30000}});
  b.kv_scalar("u32", Scalar{uint32_t{4000000000U}}).kv_scalar("i32", Scalar{int32_t{-2000000000}});
  b.kv_scalar("f32", Scalar{1.5F}).kv_scalar("bool", Scalar{true}).kv_scalar("str", Scalar{std::string("héllo")});
  b.kv_scalar("u64", Scalar{uint64_t{1} << 60}).kv_scalar("i64", Scalar{int64_t{-1} << 60});
  b.kv_scalar("f64", Scalar{-2.25});
  const std::vector<uint32_t> u32s{1, 2, 3};
  const std::vector<float> f32s{0.5F, -1.0F};
  const std::vector<std::string> strs{"a", "", "ccc"};
  b.kv_array_u32("arr.u32", u32s).kv_array_f32("arr.f32", f32s).kv_array_str("arr.str", strs);
  auto bytes = b.take();
  auto f = parse_bytes(bytes);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->version, 2U);
  EXPECT_EQ(std::get<uint8_t>(f->find("u8")->scalar), 200);
  EXPECT_EQ(std::get<int8_t>(f->find("i8")->scalar), -5);
  EXPECT_EQ(std::get<uint16_t>(f->find("u16")->scalar), 60000);
  EXPECT_EQ(std::get<int16_t>(f->find("i16")->scalar), -30000);
  EXPECT_EQ(std::get<uint32_t>(f->find("u32")->scalar), 4000000000U);
  EXPECT_EQ(std::get<int32_t>(f->find("i32")->scalar), -2000000000);
  EXPECT_EQ(std::get<float>(f->find("f32")->scalar), 1.5F);
  EXPECT_EQ(std::get<bool>(f->find("bool")->scalar), true);
  EXPECT_EQ(f->find("str")->as_string(), "héllo");
  EXPECT_EQ(std::get<uint64_t>(f->find("u64")->scalar), uint64_t{1} << 60);
  EXPECT_EQ(std::get<int64_t>(f->find("i64")->scalar), int64_t{-1} << 60);
  EXPECT_EQ(std::get<double>(f->find("f64")->scalar), -2.25);
  EXPECT_EQ(f->find("i8")->as_uint(), std::nullopt);
  EXPECT_EQ(f->find("u16")->as_uint(), 60000U);
  EXPECT_EQ(f->find("u8")->type, ValueType::kUint8);
  EXPECT_EQ(f->find("f64")->type, ValueType::kFloat64);
  const auto& a = f->find("arr.str")->array;
  ASSERT_EQ(a.items.size(), 3U);
  EXPECT_EQ(std::get<std::string>(a.items[2]), "ccc");
  EXPECT_EQ(std::get<std::string>(a.items[1]), "");
  EXPECT_EQ(a.byte_size, 3 * 8 + 4U);
  EXPECT_EQ(std::get<float>(f->find("arr.f32")->array.items[1]), -1.0F);
  EXPECT_EQ(std::get<uint32_t>(f->find("arr.u32")->array.items[2]), 3U);
  EXPECT_EQ(f->data_offset, *round_up(bytes.size(), 32));
  EXPECT_TRUE(f->tensors.empty());
  EXPECT_FALSE(f->geometry.has_value());
}

TEST(GgufRoundTrip, LongArraysStayOnDiskUntilLoaded) {
  Builder b;
  b.header(3, 0, 2);
  std::vector<std::string> vocab;
  for (int i = 0; i < 5000; ++i) vocab.push_back("tok" + std::to_string(i));
  std::vector<uint32_t> ids(5000);
  std::iota(ids.begin(), ids.end(), 7U);
  b.kv_array_str("tokenizer.ggml.tokens", vocab).kv_array_u32("ids", ids);
  auto bytes = b.take();
  MemorySource src(bytes);
  auto f = parse(src);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const ArrayValue& a = f->find("tokenizer.ggml.tokens")->array;
  EXPECT_FALSE(a.loaded);
  EXPECT_TRUE(a.items.empty());
  EXPECT_EQ(a.count, 5000U);
  auto items = load_array(src, a);
  ASSERT_TRUE(items.ok()) << items.error().message;
  ASSERT_EQ(items->size(), 5000U);
  EXPECT_EQ(std::get<std::string>((*items)[4999]), "tok4999");
  auto nums = load_array(src, f->find("ids")->array);
  ASSERT_TRUE(nums.ok());
  EXPECT_EQ(std::get<uint32_t>((*nums)[4999]), 5006U);
}

TEST(GgufRoundTrip, ShortArraysPastTheEagerBudgetStayOnDisk) {
  // Many short arrays would cost one Scalar (~40 bytes) per 1-byte element:
  // past max_eager_bytes they are left on disk and still load on request.
  Builder b;
  b.header(3, 0, 3);
  const std::vector<uint32_t> nums(100, 5);
  b.kv_array_u32("a", nums).kv_array_u32("b", nums).kv_array_u32("c", nums);
  auto bytes = b.take();
  MemorySource src(bytes);
  ParseLimits lim;
  lim.max_eager_bytes = 2 * 100 * sizeof(Scalar);
  auto f = parse(src, lim);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_TRUE(f->find("a")->array.loaded);
  EXPECT_TRUE(f->find("b")->array.loaded);
  const ArrayValue& c = f->find("c")->array;
  EXPECT_FALSE(c.loaded);
  EXPECT_TRUE(c.items.empty());
  auto items = load_array(src, c);
  ASSERT_TRUE(items.ok()) << items.error().message;
  ASSERT_EQ(items->size(), 100U);
  EXPECT_EQ(std::get<uint32_t>((*items)[99]), 5U);
}

TEST(GgufRoundTrip, StringArrayOverTheEagerBudgetMidwayStaysOnDisk) {
  Builder b;
  b.header(3, 0, 2);
  const std::vector<std::string> strs(3, std::string(100, 'x'));
  b.kv_array_str("s", strs).kv_u32("after", 9);
  auto bytes = b.take();
  MemorySource src(bytes);
  ParseLimits lim;
  lim.max_eager_bytes = 3 * sizeof(Scalar) + 150;  // the Scalars and one and a half strings
  auto f = parse(src, lim);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const ArrayValue& a = f->find("s")->array;
  EXPECT_FALSE(a.loaded);
  EXPECT_TRUE(a.items.empty());
  EXPECT_EQ(a.count, 3U);
  EXPECT_EQ(f->find("after")->as_uint(), 9U);  // the cursor skipped the rest exactly
  auto items = load_array(src, a);
  ASSERT_TRUE(items.ok()) << items.error().message;
  ASSERT_EQ(items->size(), 3U);
  EXPECT_EQ(std::get<std::string>((*items)[2]), std::string(100, 'x'));
}

TEST(GgufRoundTrip, VersionTwoAndAlignments) {
  for (uint32_t version : {2U, 3U}) {
    for (uint32_t align : {1U, 8U, 32U, 64U, 4096U, 65536U}) {
      ModelSpec s;
      s.version = version;
      s.alignment = align;
      s.n_layers = 1;
      auto plan = plan_model(s);
      ASSERT_TRUE(plan.ok());
      auto bytes = render_model(*plan);
      ASSERT_TRUE(bytes.ok());
      auto f = parse_bytes(*bytes);
      ASSERT_TRUE(f.ok()) << f.error().message;
      EXPECT_EQ(f->version, version);
      EXPECT_EQ(f->alignment, align);
      EXPECT_EQ(f->data_offset % align, 0U);
      for (const auto& t : f->tensors) EXPECT_EQ((t.offset - f->data_offset) % align, 0U) << t.name;
    }
  }
}

TEST(GgufRoundTrip, OneGiBAlignmentIsAccepted) {
  Builder b;
  b.header(3, 2, 1).kv_u32("general.alignment", uint32_t{1} << 30);
  b.tensor_info("a", std::vector<uint64_t>{256}, 0, 0);
  b.tensor_info("b", std::vector<uint64_t>{256}, 0, uint64_t{1} << 30);
  testing::SparseSource src(b.take(), (uint64_t{2} << 30) + 1024);
  auto f = parse(src);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->alignment, uint32_t{1} << 30);
  EXPECT_EQ(f->data_offset, uint64_t{1} << 30);
  EXPECT_EQ(f->tensors[1].offset, uint64_t{2} << 30);
}

TEST(GgufWriter, ExpectedBytesMatchRenderForAnyRange) {
  ModelSpec s;
  s.seed = 7;
  s.alignment = 64;
  auto plan = plan_model(s);
  ASSERT_TRUE(plan.ok());
  auto full = render_model(*plan);
  ASSERT_TRUE(full.ok());
  std::mt19937_64 rng(1);
  for (int i = 0; i < 500; ++i) {
    const uint64_t off = rng() % plan->file_size;
    const uint64_t len = std::min<uint64_t>(rng() % 9000, plan->file_size - off);
    std::vector<std::byte> got(len);
    ASSERT_TRUE(expected_file_bytes(*plan, off, got).ok());
    ASSERT_TRUE(std::equal(got.begin(), got.end(), full->begin() + static_cast<std::ptrdiff_t>(off)))
        << "range " << off << "+" << len;
  }
  std::vector<std::byte> past(2);
  EXPECT_FALSE(expected_file_bytes(*plan, plan->file_size - 1, past).ok());
  // Tensor data really is the seeded stream, and differs between seeds.
  const auto& t = plan->tensors[5];
  std::vector<std::byte> direct(100);
  fill_tensor_bytes(7, 5, 13, direct);
  EXPECT_TRUE(std::equal(direct.begin(), direct.end(), full->begin() + static_cast<std::ptrdiff_t>(t.offset + 13)));
  std::vector<std::byte> other(100);
  fill_tensor_bytes(8, 5, 13, other);
  EXPECT_NE(direct, other);
  // Padding between header and data is zero.
  for (uint64_t o = plan->header.size(); o < plan->data_offset; ++o) EXPECT_EQ((*full)[o], std::byte{0});
}

TEST(GgufWriter, FillTensorBytesIsSplitInvariant) {
  std::vector<std::byte> whole(1000);
  fill_tensor_bytes(3, 9, 5, whole);
  for (size_t cut : {1U, 3U, 8U, 11U, 999U}) {
    std::vector<std::byte> a(cut), b(1000 - cut);
    fill_tensor_bytes(3, 9, 5, a);
    fill_tensor_bytes(3, 9, 5 + cut, b);
    a.insert(a.end(), b.begin(), b.end());
    EXPECT_EQ(a, whole) << cut;
  }
}

TEST(GgufWriter, SpecForSizeApproachesTarget) {
  ModelSpec base;
  for (auto [layers, target] : {std::pair{2ULL, 16 * kMiB}, std::pair{16ULL, 256 * kMiB}, std::pair{16ULL, kGiB},
                                std::pair{32ULL, 4 * kGiB}}) {
    base.n_layers = layers;
    auto s = spec_for_size(base, target);
    ASSERT_TRUE(s.ok()) << s.error().message;
    auto plan = plan_model(*s);
    ASSERT_TRUE(plan.ok());
    const double ratio = static_cast<double>(plan->file_size) / static_cast<double>(target);
    EXPECT_GT(ratio, 0.85) << target;
    EXPECT_LT(ratio, 1.15) << target;
  }
}

TEST(GgufWriter, RejectsImpossibleSpecs) {
  ModelSpec s;
  s.n_head_kv = 3;
  ASSERT_FALSE(plan_model(s).ok());
  EXPECT_NE(plan_model(s).error().message.find("n_head 4 is not a multiple of n_head_kv 3"), std::string::npos);
  s = {};
  s.alignment = 48;
  ASSERT_FALSE(plan_model(s).ok());
  EXPECT_EQ(plan_model(s).error().code, EINVAL);
  s = {};
  s.n_embd = 384;
  s.type_override = [](std::string_view name, uint32_t t) { return name == "blk.0.ffn_norm.weight" ? 12U : t; };
  auto p = plan_model(s);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("'blk.0.ffn_norm.weight' cannot be type q4_K with ne0 = 384"), std::string::npos)
      << p.error().message;
}

TEST(GgufWriter, TensorNbytesRejectsWrapInNe0) {
  EXPECT_FALSE(tensor_nbytes(0, std::vector<uint64_t>{uint64_t{1} << 62}).has_value());         // f32: 2^64
  EXPECT_FALSE(tensor_nbytes(28, std::vector<uint64_t>{uint64_t{1} << 61, 1}).has_value());     // f64: 2^64
  EXPECT_EQ(tensor_nbytes(0, std::vector<uint64_t>{(uint64_t{1} << 62) - 1}), UINT64_MAX - 3);  // just fits
}

TEST(GgufWriter, TokenizerItWritesIsConsistent) {
  // Plain: tokens and scores of one length, bos only when there is a token 1.
  for (uint64_t written : {0U, 1U, 2U, 64U}) {
    ModelSpec s;
    s.n_layers = 1;
    s.n_vocab_tokens_written = written;
    auto plan = plan_model(s);
    ASSERT_TRUE(plan.ok());
    auto f = parse_bytes(*render_model(*plan));
    ASSERT_TRUE(f.ok()) << written << ": " << f.error().message;
    EXPECT_EQ(f->find("tokenizer.ggml.tokens")->array.count, written);
    EXPECT_EQ(f->find("tokenizer.ggml.scores")->array.count, written);
    EXPECT_EQ(f->find("tokenizer.ggml.bos_token_id") != nullptr, written > 1) << written;
  }
  // llama-compatible: scores and token types per token, special ids in range.
  ModelSpec s;
  s.n_layers = 1;
  s.llama_compatible = true;
  s.n_vocab = 300;
  auto plan = plan_model(s);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  auto f = parse_bytes(*render_model(*plan));
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->find("tokenizer.ggml.tokens")->array.count, 300U);
  EXPECT_EQ(f->find("tokenizer.ggml.scores")->array.count, 300U);
  EXPECT_EQ(f->find("tokenizer.ggml.token_type")->array.count, 300U);
  EXPECT_EQ(f->find("tokenizer.ggml.token_type")->array.elem_type, ValueType::kInt32);
  EXPECT_EQ(f->find("tokenizer.ggml.eos_token_id")->as_uint(), 2U);
}

TEST(GgufFileIo, WrittenFileReadsBackByteForByte) {
  ModelSpec s;
  s.seed = 99;
  auto plan = plan_model(s);
  ASSERT_TRUE(plan.ok());
  char tmpl[] = "/tmp/airs-gguf-test-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ::close(fd);
  const std::string path = tmpl;
  ASSERT_TRUE(write_model_file(*plan, path).ok());
  auto src = FdSource::open(path);
  ASSERT_TRUE(src.ok()) << src.error().message;
  EXPECT_EQ(src->size(), plan->file_size);
  std::vector<std::byte> disk(plan->file_size);
  ASSERT_TRUE(src->read(0, disk.data(), disk.size()).ok());
  EXPECT_EQ(disk, *render_model(*plan));
  auto f = parse(*src);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->tensors.size(), plan->tensors.size());
  std::byte one{};
  EXPECT_EQ(src->read(plan->file_size, &one, 1).error().code, EBADMSG);
  ::unlink(path.c_str());
  EXPECT_EQ(FdSource::open(path).error().code, ENOENT);
}

TEST(GgufScale, HundredThousandTensors) {
  constexpr uint32_t kN = 100000;
  Builder b;
  b.header(3, kN, 2).kv_str("general.architecture", "llama").kv_u32("llama.block_count", kN / 10);
  b.tensor_info("token_embd.weight", std::vector<uint64_t>{8}, 0, 0);
  for (uint32_t i = 1; i + 1 < kN; ++i) {
    b.tensor_info(fmt::format("blk.{}.w{}", (i - 1) / 10, (i - 1) % 10), std::vector<uint64_t>{8}, 0,
                  uint64_t{i} * 32);
  }
  b.tensor_info("output.weight", std::vector<uint64_t>{8}, 0, uint64_t{kN - 1} * 32);
  b.pad_to(32).zeros(uint64_t{kN} * 32);
  auto f = parse_bytes(b.take());
  ASSERT_TRUE(f.ok()) << f.error().message;
  ASSERT_EQ(f->tensors.size(), kN);
  EXPECT_EQ(f->n_layers, kN / 10);
  EXPECT_EQ(f->tensors[12345].name, "blk.1234.w4");
  EXPECT_EQ(f->tensors[12345].layer, 1234);
  EXPECT_EQ(f->tensors[12345].offset, f->data_offset + 12345 * 32);
  EXPECT_EQ(f->find_tensor("blk.9999.w7"), kN - 2);
  EXPECT_EQ(f->tensors[f->load_order.back()].name, "output.weight");
  EXPECT_EQ(f->tensors[f->load_order.front()].name, "token_embd.weight");
}

}  // namespace
}  // namespace airs::gguf
