// The API's bodies (serve_frame.cc): strict JSON, framed bodies refused naming the field.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "serve_internal.h"
#include "serve_test_support.h"
#include "tessera_tools/serve.h"

namespace tessera {
namespace {

using namespace serve_test;  // NOLINT(google-build-using-namespace): the serve tests' helpers

// Issue 27's low items in the API's JSON: a BOM or a NUL byte is refused; an unknown key is
// named by at most 64 of its bytes, control bytes never echoed raw.
TEST(ServeApi, JsonIsStrictAndUnknownKeysAreBounded) {
  ServeConfig c;
  c.model = "tiny-mla";
  c.capacity_blocks = 32;
  c.max_requests = 8;
  c.events_enabled = false;
  std::vector<std::string> warnings;
  Result<std::unique_ptr<ServeCore>> made = ServeCore::Create(c, &warnings);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ServeCore& core = **made;
  const std::string ok = "{\"tokens\":[1,2,3]}";
  EXPECT_EQ(FieldOf(core.Handle("/v1/admit", "\xEF\xBB\xBF" + ok)), "body");
  EXPECT_EQ(FieldOf(core.Handle("/v1/admit", ok + std::string(1, '\0'))), "body");
  EXPECT_EQ(FieldOf(core.Handle("/v1/free", "{\"request\":0}" + std::string(1, '\0'))), "body");
  EXPECT_EQ(core.manager().live_requests(), 0u);
  const std::string big(1 << 20, 'k');
  std::pair<int, std::string> r = core.Handle("/v1/admit", "{\"tokens\":[1],\"" + big + "\":1}");
  EXPECT_EQ(r.first, 400);
  EXPECT_LT(r.second.size(), 400u) << "the key is echoed unbounded";
  EXPECT_EQ(FieldOf(r).substr(0, 64), std::string(64, 'k'));
  r = core.Handle("/v1/admit", "{\"tokens\":[1],\"\\u001b[31mred\":1}");
  EXPECT_EQ(r.first, 400);
  EXPECT_EQ(nlohmann::json::parse(r.second)["error"].get<std::string>().find('\x1b'), std::string::npos) << r.second;
  EXPECT_EQ(core.Handle("/v1/admit", ok).first, 200);  // the strict parser still takes JSON
}

TEST(ServeEngineKv, BadFramesAreRefusedNamingTheFieldAndChangeNothing) {
  std::vector<std::string> warnings;
  ServeConfig core_config = EngineConfig();
  core_config.http_max_body_bytes = 300000;  // tiny-mla: a block of 64 x 4,608 bytes fits, 72 tokens do not
  Result<std::unique_ptr<ServeCore>> made = ServeCore::Create(core_config, &warnings);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ServeCore& core = **made;
  const uint64_t rb = core.record_bytes();
  ASSERT_GT(rb, 0u);
  // One live request, with a block written, so a step has somewhere to go.
  const std::string prompt = "{\"tokens\":" + Tokens(1, 70) + "}";
  std::pair<int, std::string> ok = core.Handle("/v1/admit", Frame(prompt, RandomBytes(70 * rb, 1)));
  ASSERT_EQ(ok.first, 200) << ok.second;
  const std::string before = ManagerState(core);

  struct Case {
    std::string path, body, field;
  };
  const std::string step = "{\"requests\":[0],\"counts\":[2],\"tokens\":[7,8]}";
  const std::vector<Case> cases = {
      {"/v1/admit", "TKV1", "body"},                                                       // shorter than the frame
      {"/v1/admit", Frame(prompt, RandomBytes(70 * rb - 1, 2)), "records"},                // one byte short
      {"/v1/admit", Frame(prompt, RandomBytes(70 * rb + 1, 2)), "records"},                // one byte long
      {"/v1/admit", Frame(prompt, ""), "records"},                                         // none
      {"/v1/admit", Frame(prompt, RandomBytes(70 * rb, 2), 0), "header_length"},           // zero
      {"/v1/admit", Frame(prompt, RandomBytes(70 * rb, 2), 0xffffffff), "header_length"},  // huge
      {"/v1/admit", Frame(prompt, "", static_cast<int64_t>(prompt.size()) + 1), "header_length"},  // past the end
      {"/v1/admit", Frame("{\"tokens\":[1,2", RandomBytes(2 * rb, 2)), "header"},                  // malformed JSON
      {"/v1/admit", Frame("{\"tokens\":[1],\"x\":1}", RandomBytes(rb, 2)), "x"},                   // unknown field
      {"/v1/admit", Frame("{\"tokens\":[]}", ""), "tokens"},
      {"/v1/step", Frame(step, RandomBytes(2 * rb - 1, 3)), "records"},
      {"/v1/step", Frame(step, RandomBytes(3 * rb, 3)), "records"},
      {"/v1/step", Frame("{\"requests\":[0],\"counts\":[3],\"tokens\":[7,8]}", RandomBytes(2 * rb, 3)), "tokens"},
      {"/v1/step", step, "records"},  // engine KV: a step without records writes nothing
  };
  for (const Case& c : cases) {
    std::pair<int, std::string> r = core.Handle(c.path, c.body);
    EXPECT_EQ(r.first, 400) << c.field << ": " << r.second;
    EXPECT_EQ(FieldOf(r), c.field) << r.second;
    EXPECT_EQ(ManagerState(core), before) << c.field;
  }
  // The same step, framed right, goes through.
  std::pair<int, std::string> r = core.Handle("/v1/step", Frame(step, RandomBytes(2 * rb, 3)));
  ASSERT_EQ(r.first, 200) << r.second;
  EXPECT_EQ(nlohmann::json::parse(r.second)["codes"][0], "ok");
  EXPECT_EQ(core.manager().Tokens(RequestId{0}), 72u);
  // Reads: one block is always served; a batch past http.max_body_bytes is refused, naming count.
  ASSERT_GT(72 * rb, core_config.http_max_body_bytes);
  ASSERT_LE(64 * rb, core_config.http_max_body_bytes);
  bool binary = false;
  EXPECT_EQ(core.HandleGet("/v1/requests/0/blocks/0", &binary).first, 200);
  EXPECT_EQ(FieldOf(core.HandleGet("/v1/requests/0/blocks/0?count=2", &binary)), "count");

  // Synthetic KV refuses frames (its bytes are its own).
  ServeConfig sc = EngineConfig();
  sc.kv_engine = false;
  Result<std::unique_ptr<ServeCore>> synthetic = ServeCore::Create(sc, &warnings);
  ASSERT_TRUE(synthetic.ok());
  r = (*synthetic)->Handle("/v1/admit", Frame(prompt, RandomBytes(70 * rb, 1)));
  EXPECT_EQ(r.first, 400);
  EXPECT_EQ(FieldOf(r), "body");
  EXPECT_EQ((*synthetic)->manager().live_requests(), 0u);
}

// ParseFrame alone: the header and the records are split where the length says, and each
// length error names its field.
TEST(ServeFrame, ParseSplitsAtTheHeaderLengthAndNamesEachBadLength) {
  const std::string body = Frame("{\"a\":1}", "RECORDS");  // the frame's views point into it
  Result<serve_detail::Frame> f = serve_detail::ParseFrame(body);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->header, "{\"a\":1}");
  EXPECT_EQ(f->records, "RECORDS");
  const std::string empty = Frame("{}", "");
  f = serve_detail::ParseFrame(empty);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->records, "");
  auto field = [](const std::string& framed) {
    Result<serve_detail::Frame> r = serve_detail::ParseFrame(framed);
    return r.ok() ? std::string("ok") : r.status().field();
  };
  EXPECT_EQ(field("TKV1"), "body");                                // shorter than magic + length
  EXPECT_EQ(field(std::string("TKV2\x02\0\0\0{}", 10)), "magic");  // not "TKV1"
  EXPECT_EQ(field(Frame("{}", "", 0)), "header_length");           // zero
  EXPECT_EQ(field(Frame("{}", "", 65537)), "header_length");       // past the bound
  EXPECT_EQ(field(Frame("{}", "xy", 5)), "header_length");         // past the end of the body
  EXPECT_EQ(field(Frame("{}", "xyz", 5)), "ok");                   // exactly to the end
  EXPECT_TRUE(serve_detail::IsFramed(Frame("{}", "")));
  EXPECT_FALSE(serve_detail::IsFramed("{\"tokens\":[1]}"));
}

// The JSON helpers: strict unsigned types, bounds, defaults, and the field named.
TEST(ServeFrame, JsonFieldsAreStrictAndNamed) {
  const nlohmann::json j = nlohmann::json::parse(R"({"n":7,"neg":-1,"big":4294967296,"a":[1,2],"s":"x"})");
  EXPECT_EQ(serve_detail::UintField(j, "n", 10, std::nullopt).value(), 7u);
  EXPECT_EQ(serve_detail::UintField(j, "missing", 10, 3).value(), 3u);
  EXPECT_EQ(serve_detail::UintField(j, "missing", 10, std::nullopt).status().field(), "missing");
  EXPECT_EQ(serve_detail::UintField(j, "neg", 10, std::nullopt).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(serve_detail::UintField(j, "n", 6, std::nullopt).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(serve_detail::U32Array(j, "a").value(), (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(serve_detail::U32Array(nlohmann::json::parse(R"({"a":[4294967296]})"), "a").status().field(), "a");
  EXPECT_EQ(serve_detail::U64Array(j, "s").status().field(), "s");
  EXPECT_TRUE(serve_detail::OnlyKeys(j, {"n", "neg", "big", "a", "s"}).ok());
  EXPECT_EQ(serve_detail::OnlyKeys(j, {"n", "neg", "big", "s"}).field(), "a");
  EXPECT_EQ(serve_detail::OnlyKeys(nlohmann::json::array(), {"n"}).field(), "body");
  EXPECT_EQ(serve_detail::HttpStatusOf(StatusCode::kOutOfBlocks), 503);
  EXPECT_EQ(serve_detail::HttpStatusOf(StatusCode::kFailedPrecondition), 409);
  EXPECT_EQ(serve_detail::HttpStatusOf(StatusCode::kOutOfRange), 400);
  EXPECT_EQ(serve_detail::HttpStatusOf(StatusCode::kInternal), 500);
}
}  // namespace
}  // namespace tessera
