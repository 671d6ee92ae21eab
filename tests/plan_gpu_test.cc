// Accelerator specs (gpu.h, src/plan/gpu.cc): the checked reader of a spec's JSON, field by field;
// the shipped specs by name and by file stem; a user's --gpu-spec file.
#include "tessera/gpu.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "test_support.h"

namespace tessera {
namespace {

using testing::TempDir;

const char* const kFields[] = {"memory_bytes", "hbm_bytes_per_s", "dense_bf16_flops", "dense_fp8_flops"};

// A valid spec with `field` set to the raw JSON `value` ("" leaves it out).
std::string Spec(const std::string& field = "", const std::string& value = "") {
  std::vector<std::pair<std::string, std::string>> f{{"name", "\"X-1\""},
                                                     {"description", "\"a test part\""},
                                                     {"memory_bytes", "80000000000"},
                                                     {"hbm_bytes_per_s", "3350000000000"},
                                                     {"dense_bf16_flops", "989000000000000"},
                                                     {"dense_fp8_flops", "1979000000000000"}};
  std::string out = "{";
  bool seen = false;
  for (auto& [k, v] : f) {
    std::string val = v;
    if (k == field) {
      seen = true;
      if (value.empty()) continue;
      val = value;
    }
    out += (out.size() > 1 ? ", " : "") + ("\"" + k + "\": ") + val;
  }
  if (!seen && !field.empty() && !value.empty()) out += ", \"" + field + "\": " + value;
  return out + "}";
}

void ExpectRefused(const Result<GpuSpec>& r, StatusCode code, const std::string& field, const std::string& context) {
  ASSERT_FALSE(r.ok()) << context;
  EXPECT_EQ(r.status().code(), code) << context << ": " << r.status().ToString();
  EXPECT_EQ(r.status().field(), field) << context << ": " << r.status().ToString();
  EXPECT_EQ(r.status().ToString().find('\n'), std::string::npos) << r.status().ToString();
}

TEST(GpuSpecFromJson, ReadsEveryField) {
  Result<GpuSpec> s = GpuSpecFromJson(Spec(), "x.json");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->name, "X-1");
  EXPECT_EQ(s->description, "a test part");
  EXPECT_EQ(s->memory_bytes, 80000000000ULL);
  EXPECT_EQ(s->hbm_bytes_per_s, 3350000000000ULL);
  EXPECT_EQ(s->dense_bf16_flops, 989000000000000ULL);
  EXPECT_EQ(s->dense_fp8_flops, 1979000000000000ULL);
  // The description is optional (absent or null); unknown keys are ignored.
  s = GpuSpecFromJson(Spec("description", ""), "x");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->description, "");
  s = GpuSpecFromJson(Spec("description", "null"), "x");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->description, "");
  EXPECT_TRUE(GpuSpecFromJson(Spec("vendor_note", "[1, 2]"), "x").ok());
}

TEST(GpuSpecFromJson, EachFigureMustBeAPositiveIntegerOfAtMostTenToTheEighteenth) {
  for (const char* f : kFields) {
    // 10^18 is the largest accepted: two figures' product, 10^36, stays below 2^127 (~1.7e38).
    Result<GpuSpec> top = GpuSpecFromJson(Spec(f, "1000000000000000000"), "x");
    ASSERT_TRUE(top.ok()) << f << ": " << top.status().ToString();
    EXPECT_TRUE(GpuSpecFromJson(Spec(f, "1"), "x").ok()) << f;
    ExpectRefused(GpuSpecFromJson(Spec(f, "1000000000000000001"), "x"), StatusCode::kInvalidArgument, f, "10^18+1");
    ExpectRefused(GpuSpecFromJson(Spec(f, "18446744073709551615"), "x"), StatusCode::kInvalidArgument, f, "2^64-1");
    // Past 64 bits the parser gives a float: refused, not wrapped.
    ExpectRefused(GpuSpecFromJson(Spec(f, "18446744073709551616"), "x"), StatusCode::kInvalidArgument, f, "2^64");
    for (const char* bad : {"0", "-1", "1.5", "1e12", "\"80\"", "true", "[1]", "{}"}) {
      ExpectRefused(GpuSpecFromJson(Spec(f, bad), "x"), StatusCode::kInvalidArgument, f, bad);
    }
    ExpectRefused(GpuSpecFromJson(Spec(f, ""), "x"), StatusCode::kInvalidArgument, f, "missing");
    ExpectRefused(GpuSpecFromJson(Spec(f, "null"), "x"), StatusCode::kInvalidArgument, f, "null");
  }
}

TEST(GpuSpecFromJson, NameAndDescriptionAreBoundedPrintableStrings) {
  ExpectRefused(GpuSpecFromJson(Spec("name", ""), "x"), StatusCode::kInvalidArgument, "name", "missing");
  ExpectRefused(GpuSpecFromJson(Spec("name", "\"\""), "x"), StatusCode::kInvalidArgument, "name", "empty");
  ExpectRefused(GpuSpecFromJson(Spec("name", "7"), "x"), StatusCode::kInvalidArgument, "name", "number");
  const std::string n200(200, 'n');
  Result<GpuSpec> ok = GpuSpecFromJson(Spec("name", "\"" + n200 + "\""), "x");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->name, n200);
  for (const char* field : {"name", "description"}) {
    ExpectRefused(GpuSpecFromJson(Spec(field, "\"" + std::string(201, 'n') + "\""), "x"), StatusCode::kInvalidArgument,
                  field, "201 characters");
    ExpectRefused(GpuSpecFromJson(Spec(field, "\"a\\nb\""), "x"), StatusCode::kInvalidArgument, field, "newline");
    ExpectRefused(GpuSpecFromJson(Spec(field, "\"a\\u0000b\""), "x"), StatusCode::kInvalidArgument, field, "NUL");
    ExpectRefused(GpuSpecFromJson(Spec(field, "[\"a\"]"), "x"), StatusCode::kInvalidArgument, field, "list");
  }
  // Bytes at or above 0x20 are kept (UTF-8 included).
  Result<GpuSpec> utf8 = GpuSpecFromJson(Spec("description", "\"H\xc3\xa9 \\u00e9\""), "x");
  ASSERT_TRUE(utf8.ok()) << utf8.status().ToString();
  EXPECT_EQ(utf8->description, "H\xc3\xa9 \xc3\xa9");
}

TEST(GpuSpecFromJson, TheWholeTextIsCheckedFirst) {
  for (const char* bad : {"", "[]", "42", "\"H200\"", "{", "{\"name\": \"x\",}", "null"}) {
    ExpectRefused(GpuSpecFromJson(bad, "spec.json"), StatusCode::kInvalidArgument, "gpu-spec", bad);
  }
  Result<GpuSpec> r = GpuSpecFromJson("[]", "my-spec.json");
  EXPECT_NE(r.status().message().find("my-spec.json"), std::string::npos) << r.status().ToString();
  // 64 KiB is the limit: a valid spec padded with spaces to exactly 65536 bytes is read; one
  // byte more is refused before it is parsed.
  std::string padded = Spec();
  padded.append(65536 - padded.size(), ' ');
  EXPECT_TRUE(GpuSpecFromJson(padded, "x").ok());
  padded.push_back(' ');
  ExpectRefused(GpuSpecFromJson(padded, "x"), StatusCode::kOutOfRange, "gpu-spec", "65537 bytes");
  // The deepest nesting 64 KiB holds, inside an ignored key: read, no crash.
  const std::string deep = std::string(32000, '[') + std::string(32000, ']');
  EXPECT_TRUE(GpuSpecFromJson(Spec("x", deep), "x").ok());
}

TEST(LoadGpu, ShippedSpecsByNameOrStemInAnyCase) {
  const std::vector<std::string> names = GpuNames();
  EXPECT_EQ(names, (std::vector<std::string>{"B200", "H100-80G", "H200-141G", "MI300X"}));
  for (const std::string& n : names) {
    Result<GpuSpec> s = LoadGpu(n);
    ASSERT_TRUE(s.ok()) << n << ": " << s.status().ToString();
    EXPECT_EQ(s->name, n);
    std::string lower = n;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    Result<GpuSpec> l = LoadGpu(lower);  // the stem of data/gpus/<lower>.json too
    ASSERT_TRUE(l.ok()) << lower;
    EXPECT_EQ(l->name, n);
    // The embedded copy equals the file in the tree, read as a user's --gpu-spec file.
    Result<GpuSpec> f = LoadGpuSpecFile(std::string(TESSERA_TEST_DATA) + "/../../data/gpus/" + lower + ".json");
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(f->name, s->name);
    EXPECT_EQ(f->memory_bytes, s->memory_bytes);
    EXPECT_EQ(f->hbm_bytes_per_s, s->hbm_bytes_per_s);
    EXPECT_EQ(f->dense_bf16_flops, s->dense_bf16_flops);
    EXPECT_EQ(f->dense_fp8_flops, s->dense_fp8_flops);
  }
  // H200 SXM's datasheet figures (data/gpus/README.md): 141 GB, 4.8 TB/s, 989.5 dense BF16
  // TFLOP/s, twice that in FP8.
  Result<GpuSpec> h = LoadGpu("h200-141G");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->memory_bytes, 141000000000ULL);
  EXPECT_EQ(h->hbm_bytes_per_s, 4800000000000ULL);
  EXPECT_EQ(h->dense_bf16_flops, 989500000000000ULL);
  EXPECT_EQ(h->dense_fp8_flops, 2 * h->dense_bf16_flops);
}

TEST(LoadGpu, UnknownNamesListTheKnownOnesOnOneLine) {
  for (std::string bad : {"A100", "", "H200", "h200-141g.json", "H200-141G "}) {
    Result<GpuSpec> r = LoadGpu(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_EQ(r.status().field(), "gpu");
    EXPECT_NE(r.status().message().find("known: B200, H100-80G, H200-141G, MI300X"), std::string::npos)
        << r.status().ToString();
  }
  // A hostile name: control characters shown as '?', at most 40 characters of it echoed.
  std::string hostile = "evil\n\x1b[2Jname" + std::string(1000, 'z');
  Result<GpuSpec> r = LoadGpu(hostile);
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().ToString();
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"evil?\?[2Jname" + std::string(27, 'z') + "\""), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 200u) << msg;
}

TEST(LoadGpuSpecFile, ReadsARegularFileAndRefusesTheRest) {
  TempDir dir;
  const std::string good = dir.Write("part.json", Spec());
  Result<GpuSpec> s = LoadGpuSpecFile(good);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->name, "X-1");
  // A bad field inside the file is named as the field, not as the file.
  Result<GpuSpec> bad = LoadGpuSpecFile(dir.Write("bad.json", Spec("dense_fp8_flops", "0")));
  ExpectRefused(bad, StatusCode::kInvalidArgument, "dense_fp8_flops", "zero in a file");
  ExpectRefused(LoadGpuSpecFile(dir.path() + "/missing.json"), StatusCode::kIoError, "gpu-spec", "missing");
  ExpectRefused(LoadGpuSpecFile(dir.path()), StatusCode::kInvalidArgument, "gpu-spec", "a directory");
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ExpectRefused(LoadGpuSpecFile(fifo), StatusCode::kInvalidArgument, "gpu-spec", "a FIFO (must not block)");
  // Larger than 64 KiB on disk: refused before it is read (a sparse 1 GiB file).
  const std::string big = dir.Write("big.json", "");
  ASSERT_EQ(truncate(big.c_str(), off_t{1} << 30), 0);
  ExpectRefused(LoadGpuSpecFile(big), StatusCode::kOutOfRange, "gpu-spec", "1 GiB");
  // A link is followed to a regular file (as a hub snapshot links config files).
  const std::string link = dir.path() + "/link.json";
  std::filesystem::create_symlink(good, link);
  EXPECT_TRUE(LoadGpuSpecFile(link).ok());
}

}  // namespace
}  // namespace tessera
