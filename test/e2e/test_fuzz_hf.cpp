// Fuzzing the files trainer reads that are not checkpoint manifests: a real Hugging Face export
// (config.json, model.safetensors, model.safetensors.index.json) mutated class by class and at
// random, fed through `trainer run` with model.init_from and `trainer validate` with
// model.hf_config; token files through `trainer data inspect`. Every bad input must end in exit 2
// with the file named; never a signal, never a hang, and never a file read from outside the model
// directory (a weight_map entry naming a real model elsewhere is refused, not loaded).
// TRAINER_FUZZ_RUNS sets the number of random mutations (default 24).
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "process.h"

using namespace trainer::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::vector<std::string> kEnv = {"OMP_NUM_THREADS=1"};

std::string tiny() { return source_dir() + "/recipes/tiny-llama.json"; }

// One export of tiny-llama (2 layers, 1 step), made once per process and only read afterwards.
const std::string& hf_export() {
  static TempDir dir;
  static std::string hf;
  if (hf.empty()) {
    const auto trained = run_process({trainer_binary(), "run", tiny(), "--set", "model.num_hidden_layers=2", "--set",
                                      "training.steps=1", "--set", "checkpoint.dir=" + dir.path() + "/ck"},
                                     300, kEnv);
    INFO(trained.err);
    REQUIRE(trained.exit_code == 0);
    const auto exported = run_process({trainer_binary(), "ckpt", "export", dir.path() + "/ck", "--hf", dir.path() + "/hf"});
    INFO(exported.err);
    REQUIRE(exported.exit_code == 0);
    hf = dir.path() + "/hf";
  }
  return hf;
}

// A safetensors file taken apart: its header and the bytes after it.
struct Safetensors {
  json header;
  std::string data;
};

Safetensors split(const std::string& bytes) {
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  return {json::parse(bytes.substr(8, length)), bytes.substr(8 + length)};
}

std::string join(const std::string& header_text, const std::string& data, std::optional<uint64_t> length = {}) {
  const uint64_t field = length.value_or(header_text.size());
  return std::string(reinterpret_cast<const char*>(&field), 8) + header_text + data;
}

// Counts of what the runs ended in, printed as one line per test case.
struct Tally {
  int runs = 0, signals = 0, hangs = 0;
  std::map<int, int> exits;
  void add(const ProcessResult& r) {
    ++runs;
    if (r.timed_out) ++hangs;
    else if (r.signal) ++signals;
    else ++exits[r.exit_code];
  }
  std::string line(const std::string& what) const {
    std::string codes;
    for (const auto& [code, count] : exits) codes += " exit " + std::to_string(code) + ": " + std::to_string(count) + ";";
    return what + ": " + std::to_string(runs) + " runs;" + codes + " signals: " + std::to_string(signals) +
           "; hangs: " + std::to_string(hangs);
  }
};

// Bad input: exit 2 naming `named`, no signal, no hang.
void check_refused(const ProcessResult& r, const std::string& what, const std::string& named, Tally& tally) {
  tally.add(r);
  INFO(what << "\nstderr: " << r.err);
  CHECK(!r.timed_out);
  CHECK(r.signal == 0);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find(named) != std::string::npos);
}

// Directories of mutated copies of the export.
class Variants {
 public:
  Variants() : source_(hf_export()) {
    const std::string bytes = read_file(source_ + "/model.safetensors");
    original_ = split(bytes);
    for (const auto& [name, entry] : original_.header.items())
      if (name != "__metadata__") names_.push_back(name);
  }
  const Safetensors& original() const { return original_; }
  const std::vector<std::string>& names() const { return names_; }

  // A fresh model directory holding config.json and, unless `weights` is null, model.safetensors.
  std::string make(const std::optional<std::string>& weights) {
    const std::string dir = root_.path() + "/v" + std::to_string(++count_);
    fs::create_directories(dir);
    fs::copy_file(source_ + "/config.json", dir + "/config.json");
    if (weights) write(dir + "/model.safetensors", *weights);
    return dir;
  }
  static void write(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  const std::string& root() const { return root_.path(); }

 private:
  std::string source_;
  Safetensors original_;
  std::vector<std::string> names_;
  TempDir root_;
  int count_ = 0;
};

ProcessResult run_init_from(const std::string& dir) {
  return run_process({trainer_binary(), "run", tiny(), "--set", "model.num_hidden_layers=2", "--set", "training.steps=1",
                      "--set", "model.init_from=" + dir},
                     60, kEnv);
}

using Mutation = std::function<void(json& header, std::string& data, const std::string& tensor)>;

// The classes of damage, each applied to one tensor's record (or the file around it).
const std::vector<std::pair<std::string, Mutation>>& header_mutations() {
  static const std::vector<std::pair<std::string, Mutation>> list = {
      {"data_offsets []", [](json& h, std::string&, const std::string& t) { h[t]["data_offsets"] = json::array(); }},
      {"data_offsets [begin]",
       [](json& h, std::string&, const std::string& t) { h[t]["data_offsets"] = {h[t]["data_offsets"][0]}; }},
      {"data_offsets as strings",
       [](json& h, std::string&, const std::string& t) {
         h[t]["data_offsets"] = {h[t]["data_offsets"][0].dump(), h[t]["data_offsets"][1].dump()};
       }},
      {"data_offsets negative", [](json& h, std::string&, const std::string& t) { h[t]["data_offsets"][0] = -8; }},
      {"data_offsets outside the file",
       [](json& h, std::string& d, const std::string& t) {
         h[t]["data_offsets"] = {h[t]["data_offsets"][0].get<uint64_t>() + d.size(),
                                 h[t]["data_offsets"][1].get<uint64_t>() + d.size()};
       }},
      {"data_offsets overflowing 64 bits",
       [](json& h, std::string&, const std::string& t) {
         h[t]["data_offsets"] = {uint64_t(18446744073709551000ull), h[t]["data_offsets"][1]};
       }},
      {"data_offsets [0, 2^64-1]",
       [](json& h, std::string&, const std::string& t) { h[t]["data_offsets"] = {0, UINT64_MAX}; }},
      {"overlapping another tensor",
       [](json& h, std::string&, const std::string& t) {
         // Moved onto the first bytes of the data, where another tensor lies (or it already starts).
         const uint64_t size = h[t]["data_offsets"][1].get<uint64_t>() - h[t]["data_offsets"][0].get<uint64_t>();
         h[t]["data_offsets"] = {8, 8 + size};
       }},
      {"dtype a number", [](json& h, std::string&, const std::string& t) { h[t]["dtype"] = 32; }},
      {"dtype unknown", [](json& h, std::string&, const std::string& t) { h[t]["dtype"] = "F8_E4M3"; }},
      {"same-width wrong dtype I32", [](json& h, std::string&, const std::string& t) { h[t]["dtype"] = "I32"; }},
      {"shape a string", [](json& h, std::string&, const std::string& t) { h[t]["shape"] = "128"; }},
      {"shape empty", [](json& h, std::string&, const std::string& t) { h[t]["shape"] = json::array(); }},
      {"shape negative", [](json& h, std::string&, const std::string& t) { h[t]["shape"][0] = -1; }},
      {"shape overflowing 64 bits",
       [](json& h, std::string&, const std::string& t) { h[t]["shape"] = {4294967296ull, 4294967296ull, 16}; }},
      {"shape 2^62 elements", [](json& h, std::string&, const std::string& t) { h[t]["shape"] = {4611686018427387904ull}; }},
      {"entry a list", [](json& h, std::string&, const std::string& t) { h[t] = {1, 2, 3}; }},
      {"entry without dtype", [](json& h, std::string&, const std::string& t) { h[t].erase("dtype"); }},
      {"__metadata__ a number", [](json& h, std::string&, const std::string&) { h["__metadata__"] = 5; }},
      {"__metadata__ value an object",
       [](json& h, std::string&, const std::string&) { h["__metadata__"]["format"] = {{"a", 1}}; }},
      {"trailing bytes", [](json&, std::string& d, const std::string&) { d += "0123"; }},
      {"data truncated", [](json&, std::string& d, const std::string&) { d.resize(d.size() - 3); }},
      {"a tensor removed from the header (a gap)", [](json& h, std::string&, const std::string& t) { h.erase(t); }},
  };
  return list;
}

}  // namespace

TEST_CASE("fuzz hf: each class of damaged model.safetensors header is exit 2 naming the file", "[fuzz]") {
  Variants variants;
  Tally tally;
  const auto& original = variants.original();
  // The unchanged copy loads: the failures below come from the mutations.
  {
    const std::string dir = variants.make(join(original.header.dump(), original.data));
    const auto r = run_init_from(dir);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
  // A tensor in the middle of the data, so that "outside" and "overlap" move it somewhere else.
  const std::string tensor = variants.names()[variants.names().size() / 2];
  for (const auto& [what, mutate] : header_mutations()) {
    json header = original.header;
    std::string data = original.data;
    mutate(header, data, tensor);
    const std::string dir = variants.make(join(header.dump(), data));
    const auto r = run_init_from(dir);
    check_refused(r, what + " (tensor " + tensor + ")", dir + "/model.safetensors", tally);
    if (what == "same-width wrong dtype I32")
      CHECK(r.err.find("tensor " + tensor + " is stored as I32; Hugging Face weights must be floating point") !=
            std::string::npos);
    if (what == "data_offsets []")
      CHECK(r.err.find("tensor " + tensor + ": data_offsets [] must be two integers >= 0") != std::string::npos);
  }
  WARN(tally.line("safetensors header classes"));
}

TEST_CASE("fuzz hf: header lengths nesting and special files in the model directory are exit 2", "[fuzz]") {
  Variants variants;
  Tally tally;
  const auto& original = variants.original();
  const std::string text = original.header.dump();
  // The length field: -1, huge, one byte short (reads every tensor one byte off) and one long.
  for (const uint64_t length : {UINT64_MAX, uint64_t(1) << 40, uint64_t(text.size() - 1), uint64_t(text.size() + 1)}) {
    const std::string dir = variants.make(join(text, original.data, length));
    check_refused(run_init_from(dir), "header length " + std::to_string(length), dir + "/model.safetensors", tally);
  }
  {
    // A million levels of nesting in __metadata__.
    json header = original.header;
    header.erase("__metadata__");
    std::string deep = header.dump();
    deep.pop_back();
    deep += ",\"__metadata__\":{\"x\":" + std::string(1000000, '[') + std::string(1000000, ']') + "}}";
    const std::string dir = variants.make(join(deep, original.data));
    check_refused(run_init_from(dir), "deep __metadata__", dir + "/model.safetensors", tally);
  }
  {
    // A FIFO and a link to /dev/zero in place of model.safetensors.
    const std::string fifo_dir = variants.make(std::nullopt);
    REQUIRE(::mkfifo((fifo_dir + "/model.safetensors").c_str(), 0600) == 0);
    check_refused(run_init_from(fifo_dir), "FIFO model.safetensors", fifo_dir + "/model.safetensors", tally);
    const std::string zero_dir = variants.make(std::nullopt);
    fs::create_symlink("/dev/zero", zero_dir + "/model.safetensors");
    check_refused(run_init_from(zero_dir), "/dev/zero model.safetensors", zero_dir + "/model.safetensors", tally);
    const std::string index_dir = variants.make(std::nullopt);
    REQUIRE(::mkfifo((index_dir + "/model.safetensors.index.json").c_str(), 0600) == 0);
    check_refused(run_init_from(index_dir), "FIFO index", index_dir + "/model.safetensors.index.json", tally);
    // init_from naming a file, not a directory.
    check_refused(run_init_from(zero_dir + "/config.json"), "init_from a file", zero_dir + "/config.json", tally);
  }
  WARN(tally.line("header lengths, nesting, special files"));
}

TEST_CASE("fuzz hf: weight_map entries outside the model directory are refused - never read", "[fuzz]") {
  Variants variants;
  Tally tally;
  const auto& original = variants.original();
  const std::string weights = join(original.header.dump(), original.data);
  // A complete, valid model elsewhere: loading it would succeed, so only the refusal gives exit 2.
  const std::string elsewhere = variants.make(weights);
  const auto with_index = [&](const std::function<json(const std::string& tensor)>& file_of) {
    const std::string dir = variants.make(weights);
    json index = {{"metadata", {{"total_size", original.data.size()}}}, {"weight_map", json::object()}};
    for (const auto& name : variants.names()) index["weight_map"][name] = file_of(name);
    Variants::write(dir + "/model.safetensors.index.json", index.dump(2));
    return dir;
  };
  {
    // The control: an index naming the file inside the directory loads.
    const auto r = run_init_from(with_index([](const std::string&) { return json("model.safetensors"); }));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
  const std::string last = variants.names().back();
  const std::vector<std::pair<std::string, std::function<json(const std::string&)>>> cases = {
      {"/etc/passwd", [&](const std::string& t) { return json(t == last ? "/etc/passwd" : "model.safetensors"); }},
      {"../x", [&](const std::string& t) { return json(t == last ? "../x" : "model.safetensors"); }},
      {"a real model outside by relative path",
       [&](const std::string&) { return json("../" + fs::path(elsewhere).filename().string() + "/model.safetensors"); }},
      {"a real model outside by absolute path", [&](const std::string&) { return json(elsewhere + "/model.safetensors"); }},
      {"..", [&](const std::string& t) { return json(t == last ? ".." : "model.safetensors"); }},
      {"a number", [&](const std::string& t) { return t == last ? json(7) : json("model.safetensors"); }},
      {"a missing file", [&](const std::string& t) { return json(t == last ? "nothere.safetensors" : "model.safetensors"); }},
  };
  for (const auto& [what, file_of] : cases) {
    const std::string dir = with_index(file_of);
    check_refused(run_init_from(dir), "weight_map " + what, dir + "/", tally);
  }
  {
    const std::string dir = variants.make(weights);
    Variants::write(dir + "/model.safetensors.index.json", R"({"weight_map": ["model.safetensors"]})");
    check_refused(run_init_from(dir), "weight_map a list", dir + "/model.safetensors.index.json", tally);
  }
  WARN(tally.line("weight_map"));
}

TEST_CASE("fuzz hf: random damage to the header is exit 0 or 2 - never a signal or hang", "[fuzz]") {
  Variants variants;
  Tally tally;
  const auto& original = variants.original();
  const char* env = std::getenv("TRAINER_FUZZ_RUNS");
  const int runs = env ? std::atoi(env) : 24;
  std::mt19937_64 random(44);
  int refused = 0;
  for (int run = 0; run < runs; ++run) {
    json header = original.header;
    std::string data = original.data;
    std::string text;
    std::string what;
    if (run % 2 == 0) {
      // A class from the list on a random tensor: always refused.
      const auto& [name, mutate] = header_mutations()[random() % header_mutations().size()];
      const std::string tensor = variants.names()[random() % variants.names().size()];
      mutate(header, data, tensor);
      text = header.dump();
      what = name + " (tensor " + tensor + ")";
    } else {
      // Bytes of the header text replaced: some changes are harmless (a digit of the metadata).
      text = header.dump();
      for (int flips = 1 + int(random() % 4); flips > 0; --flips) {
        const char pool[] = "{}[]\",:0123456789-eE. aFIBU";
        text[random() % text.size()] = pool[random() % (sizeof(pool) - 1)];
      }
      what = "bytes replaced: " + text.substr(0, 200);
    }
    const std::string dir = variants.make(join(text, data));
    const auto r = run_init_from(dir);
    tally.add(r);
    INFO(what << "\nstderr: " << r.err);
    CHECK(!r.timed_out);
    CHECK(r.signal == 0);
    CHECK((r.exit_code == 0 || r.exit_code == 2));
    if (run % 2 == 0) CHECK(r.exit_code == 2);
    if (r.exit_code == 2) {
      ++refused;
      CHECK(r.err.find(dir) != std::string::npos);
    }
  }
  WARN(tally.line("random header damage"));
  CHECK(refused >= runs / 2);
}

TEST_CASE("fuzz hf: damaged config.json for model.hf_config is exit 2 naming the file and field", "[fuzz]") {
  Variants variants;
  Tally tally;
  const json config = json::parse(read_file(hf_export() + "/config.json"));
  // A recipe that takes its whole model from the config.
  json recipe = json::parse(read_file(tiny()));
  const auto with_config = [&](const std::string& config_text) {
    const std::string dir = variants.make(std::nullopt);
    Variants::write(dir + "/config.json", config_text);
    recipe["model"] = {{"hf_config", dir + "/config.json"}};
    Variants::write(dir + "/recipe.json", recipe.dump());
    return dir;
  };
  const auto changed = [&](const std::string& key, const json& value) {
    json c = config;
    c[key] = value;
    return c.dump();
  };
  {
    const auto r = run_process({trainer_binary(), "validate", with_config(config.dump()) + "/recipe.json"});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"deep nesting", "{\"vocab_size\": " + std::string(1000000, '[') + std::string(1000000, ']') + "}",
       "JSON nested deeper"},
      {"num_hidden_layers 1e9", changed("num_hidden_layers", 1000000000), "model.num_hidden_layers=1000000000 exceeds"},
      {"hidden_size 2^40", changed("hidden_size", int64_t(1) << 40), "model.hidden_size"},
      {"vocab_size 2^40", changed("vocab_size", int64_t(1) << 40), "model.vocab_size"},
      {"head_dim 7", changed("head_dim", 7), "model.head_dim=7 is odd"},
      {"vocab_size a string", changed("vocab_size", "x"), "model.vocab_size"},
      {"model_type a number", changed("model_type", 5), "model_type 5"},
      {"rope_scaling a list", changed("rope_scaling", json::array({1})), "rope_scaling"},
      {"not an object", "[1, 2]", "expected a JSON object"},
      {"truncated", config.dump().substr(0, 40), "malformed JSON"},
  };
  for (const auto& [what, text, message] : cases) {
    const std::string dir = with_config(text);
    const auto r = run_process({trainer_binary(), "validate", dir + "/recipe.json"}, 30);
    check_refused(r, what, dir + "/config.json", tally);
    CHECK(r.err.find(message) != std::string::npos);
  }
  {
    // `run` with a billion layers: refused before anything is built (it hung before).
    const std::string dir = with_config(changed("num_hidden_layers", 1000000000));
    check_refused(run_process({trainer_binary(), "run", dir + "/recipe.json", "--set", "training.steps=1"}, 30, kEnv),
                  "run with 1e9 layers", "model.num_hidden_layers", tally);
    // Mixtral-shaped: its MoE layer list must not be built either.
    json moe = config;
    moe["model_type"] = "mixtral";
    moe["num_local_experts"] = 4;
    moe["num_experts_per_tok"] = 2;
    moe["num_hidden_layers"] = 1000000000;
    const std::string moe_dir = with_config(moe.dump());
    check_refused(run_process({trainer_binary(), "validate", moe_dir + "/recipe.json"}, 30), "mixtral with 1e9 layers",
                  "model.num_hidden_layers", tally);
  }
  {
    // A FIFO and /dev/zero as config.json; a deeply nested recipe.
    const std::string fifo_dir = variants.make(std::nullopt);
    fs::remove(fifo_dir + "/config.json");
    REQUIRE(::mkfifo((fifo_dir + "/config.json").c_str(), 0600) == 0);
    recipe["model"] = {{"hf_config", fifo_dir + "/config.json"}};
    Variants::write(fifo_dir + "/recipe.json", recipe.dump());
    check_refused(run_process({trainer_binary(), "validate", fifo_dir + "/recipe.json"}, 30), "FIFO config.json",
                  fifo_dir + "/config.json", tally);
    const std::string zero_dir = variants.make(std::nullopt);
    fs::remove(zero_dir + "/config.json");
    fs::create_symlink("/dev/zero", zero_dir + "/config.json");
    recipe["model"] = {{"hf_config", zero_dir}};
    Variants::write(zero_dir + "/recipe.json", recipe.dump());
    check_refused(run_process({trainer_binary(), "validate", zero_dir + "/recipe.json"}, 30), "/dev/zero config.json",
                  zero_dir + "/config.json", tally);
    Variants::write(zero_dir + "/deep.json", "{\"model\": " + std::string(1000000, '{'));
    check_refused(run_process({trainer_binary(), "validate", zero_dir + "/deep.json"}, 30), "deep recipe",
                  zero_dir + "/deep.json", tally);
  }
  WARN(tally.line("config.json"));
}

TEST_CASE("fuzz hf: FIFOs devices directories and bad headers as token files are exit 2 naming them", "[fuzz]") {
  TempDir dir;
  Tally tally;
  const auto inspect = [&](const std::string& path) {
    return run_process({trainer_binary(), "data", "inspect", path, "--vocab-size", "256"}, 20);
  };
  // A valid trainer token dataset (written by the binary's own writer through prepare_data is not
  // needed: the format is documented byte by byte): 4 tokens in 1 document.
  const auto token_bin = [](uint64_t count, uint64_t largest, size_t tokens) {
    std::string b = "TRAINTOK";
    const uint32_t version = 1, bytes = 2;
    b.append(reinterpret_cast<const char*>(&version), 4);
    b.append(reinterpret_cast<const char*>(&bytes), 4);
    b.append(reinterpret_cast<const char*>(&count), 8);
    b.append(reinterpret_cast<const char*>(&largest), 8);
    for (size_t i = 0; i < tokens; ++i) b += std::string("\x05\x00", 2);
    return b;
  };
  std::string idx = "TRAINIDX";
  for (const uint32_t v : {1u, 0u}) idx.append(reinterpret_cast<const char*>(&v), 4);
  for (const uint64_t v : {uint64_t(1), uint64_t(4), uint64_t(0), uint64_t(4)}) idx.append(reinterpret_cast<const char*>(&v), 8);
  dir.write("ok.bin", token_bin(4, 5, 4));
  dir.write("ok.idx", idx);
  {
    const auto r = inspect(dir.path() + "/ok");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
  dir.write("fifo.idx", idx);
  REQUIRE(::mkfifo((dir.path() + "/fifo.bin").c_str(), 0600) == 0);
  check_refused(inspect(dir.path() + "/fifo"), "FIFO .bin", dir.path() + "/fifo.bin", tally);
  dir.write("fifoidx.bin", token_bin(4, 5, 4));
  REQUIRE(::mkfifo((dir.path() + "/fifoidx.idx").c_str(), 0600) == 0);
  check_refused(inspect(dir.path() + "/fifoidx"), "FIFO .idx", dir.path() + "/fifoidx", tally);
  REQUIRE(::mkfifo((dir.path() + "/shard.bin").c_str(), 0600) == 0);
  check_refused(inspect(dir.path() + "/shard.bin"), "FIFO shard", dir.path() + "/shard.bin", tally);
  dir.write("zero.idx", idx);
  fs::create_symlink("/dev/zero", dir.path() + "/zero.bin");
  check_refused(inspect(dir.path() + "/zero"), "/dev/zero .bin", dir.path() + "/zero.bin", tally);
  check_refused(inspect("/dev/zero"), "/dev/zero", "/dev/zero", tally);
  fs::create_directories(dir.path() + "/sub");
  check_refused(inspect(dir.path() + "/sub"), "a directory", dir.path() + "/sub", tally);
  dir.write("short.bin", token_bin(4, 5, 4).substr(0, 10));
  dir.write("short.idx", idx);
  check_refused(inspect(dir.path() + "/short"), "truncated header", dir.path() + "/short.bin", tally);
  // Token counts whose byte size overflows 64 bits, or that exceed the file.
  for (const uint64_t count : {UINT64_MAX, uint64_t(1) << 63, uint64_t(5)}) {
    const std::string name = "count" + std::to_string(count % 1000);
    dir.write(name + ".bin", token_bin(count, 5, 4));
    dir.write(name + ".idx", idx);
    check_refused(inspect(dir.path() + "/" + name), "token count " + std::to_string(count),
                  dir.path() + "/" + name + ".bin", tally);
  }
  // A document count whose offsets overflow 64 bits.
  std::string bad_idx = idx;
  const uint64_t documents = UINT64_MAX / 8;
  std::memcpy(bad_idx.data() + 16, &documents, 8);
  dir.write("docs.bin", token_bin(4, 5, 4));
  dir.write("docs.idx", bad_idx);
  check_refused(inspect(dir.path() + "/docs"), "document count overflow", dir.path() + "/docs.idx", tally);
  WARN(tally.line("token files"));
}

TEST_CASE("ckpt export refused before writing - an earlier export stays whole and FILE is exit 2", "[fuzz]") {
  // Shared experts cannot be exported: the refusal must leave the good export in place as it was.
  TempDir dir;
  const std::string good = hf_export();
  const std::string out = dir.path() + "/hf";
  fs::copy(good, out);
  const std::string config_before = read_file(out + "/config.json");
  const std::string weights_before = read_file(out + "/model.safetensors");
  const auto trained = run_process({trainer_binary(), "run", source_dir() + "/recipes/tiny-moe.json", "--set",
                                    "model.num_hidden_layers=1", "--set", "model.moe.num_shared_experts=1", "--set",
                                    "training.steps=1", "--set", "checkpoint.dir=" + dir.path() + "/ck"},
                                   300, kEnv);
  INFO(trained.err);
  REQUIRE(trained.exit_code == 0);
  const auto refused = run_process({trainer_binary(), "ckpt", "export", dir.path() + "/ck", "--hf", out});
  INFO(refused.err);
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find("shared experts") != std::string::npos);
  CHECK(read_file(out + "/config.json") == config_before);
  CHECK(read_file(out + "/model.safetensors") == weights_before);
  // --hf naming a regular file: exit 2 with a message, not "internal error".
  const std::string file = dir.write("not_a_dir", "x");
  const auto to_file = run_process({trainer_binary(), "ckpt", "export", fs::path(good).parent_path().string() + "/ck",
                                    "--hf", file});
  INFO(to_file.err);
  CHECK(to_file.exit_code == 2);
  CHECK(to_file.err.find(file + ": exists and is not a directory") != std::string::npos);
  CHECK(read_file(file) == "x");
}

TEST_CASE("ckpt export whose writing fails leaves an earlier export whole - no new file mixed in", "[fuzz]") {
  TempDir dir;
  const std::string good = hf_export();
  const std::string out = dir.path() + "/hf";
  fs::copy(good, out);
  // The earlier export's config differs from what this export writes, so a replaced one shows.
  Variants::write(out + "/config.json", read_file(good + "/config.json") + "\n");
  const std::string config_before = read_file(out + "/config.json");
  const std::string weights_before = read_file(out + "/model.safetensors");
  // The weights' temporary name is taken by a directory: that write fails after config.json's.
  fs::create_directories(out + "/model.safetensors.tmp");
  Variants::write(out + "/model.safetensors.tmp/keep", "x");
  const auto failed = run_process({trainer_binary(), "ckpt", "export", fs::path(good).parent_path().string() + "/ck",
                                   "--hf", out});
  INFO(failed.err);
  CHECK(failed.exit_code != 0);
  CHECK(failed.signal == 0);
  CHECK(failed.err.find(out + "/model.safetensors.tmp") != std::string::npos);
  CHECK(read_file(out + "/config.json") == config_before);
  CHECK(read_file(out + "/model.safetensors") == weights_before);
  CHECK_FALSE(fs::exists(out + "/config.json.tmp"));
  // Once the obstacle is gone the same export goes through.
  fs::remove_all(out + "/model.safetensors.tmp");
  const auto ok = run_process({trainer_binary(), "ckpt", "export", fs::path(good).parent_path().string() + "/ck",
                               "--hf", out});
  INFO(ok.err);
  CHECK(ok.exit_code == 0);
  CHECK(read_file(out + "/config.json") == read_file(good + "/config.json"));
  CHECK(read_file(out + "/model.safetensors") == weights_before);
}
