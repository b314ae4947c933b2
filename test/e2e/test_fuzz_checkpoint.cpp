// Fuzzing the checkpoints trainer reads: real checkpoints (one process, and two ranks with ZeRO-1
// so that flat fragments exist) are copied, damaged the way failing disks and hand edits damage
// them (empty and short arrays, wrong types, huge and overflowing shapes, missing tensors, paths
// out of the directory, FIFOs and devices, a `latest` pointing elsewhere, deep nesting), and fed to
// `ckpt inspect`, `ckpt export` and `run` resuming from a path and with resume=auto. Every one
// must exit 2 naming the file, never die of a signal or hang, and never open anything outside the
// checkpoint: a valid copy of the checkpoint lies beside it as bait, watched with inotify.
// TRAINER_FUZZ_RUNS sets the number of random mutations (default 24).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <limits>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <tuple>

#include "process.h"

using namespace trainer::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kStep = "step-00000002";

std::vector<std::string> model_overrides() {
  return {"--set", "model.num_hidden_layers=1", "--set", "training.seq_len=32", "--set", "optimizer.warmup_steps=1"};
}

// The checkpoints every case starts from, made once per test binary run.
struct Bases {
  TempDir dir;
  std::string single, zero1;  // checkpoint directories (their latest is step 2)
};

void make_bases(Bases& made) {
  made.single = made.dir.path() + "/single";
  made.zero1 = made.dir.path() + "/zero1";
  for (const auto& [ck, extra] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {made.single, {}}, {made.zero1, {"--nproc-per-node", "2", "--set", "parallel.zero=1"}}}) {
    std::vector<std::string> argv = {trainer_binary(), "run", source_dir() + "/recipes/tiny-llama.json", "--set",
                                     "training.steps=2", "--set", "checkpoint.dir=" + ck};
    for (const auto& a : model_overrides()) argv.push_back(a);
    for (const auto& a : extra) argv.push_back(a);
    const auto r = run_process(argv, 120, {"OMP_NUM_THREADS=1"});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
}

const Bases& bases() {
  static Bases b;
  static const bool made = (make_bases(b), true);
  (void)made;
  return b;
}

// Counts opens and reads under a directory tree (inotify watches each directory in it).
class OpenWatch {
 public:
  explicit OpenWatch(const std::string& root) : fd_(inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    if (fd_ < 0) return;
    inotify_add_watch(fd_, root.c_str(), IN_OPEN | IN_ACCESS);
    for (const auto& entry : fs::recursive_directory_iterator(root))
      if (entry.is_directory()) inotify_add_watch(fd_, entry.path().c_str(), IN_OPEN | IN_ACCESS);
  }
  ~OpenWatch() {
    if (fd_ >= 0) close(fd_);
  }
  bool works() const { return fd_ >= 0; }
  // Events since the last call.
  int events() {
    int count = 0;
    alignas(inotify_event) char buffer[16384];
    ssize_t n;
    while (fd_ >= 0 && (n = read(fd_, buffer, sizeof(buffer))) > 0)
      for (char* at = buffer; at < buffer + n; at += sizeof(inotify_event) + reinterpret_cast<inotify_event*>(at)->len)
        ++count;
    return count;
  }

 private:
  int fd_;
};

// A damaged copy: W/ck (the checkpoint: latest and step-00000002) and W/bait (a valid copy of the
// same checkpoint outside it, which the mutations point at and nothing may open).
struct Workspace {
  TempDir dir;
  std::string ck, step, manifest_path, bait;
  json manifest;

  explicit Workspace(const std::string& base) {
    ck = dir.path() + "/ck";
    bait = dir.path() + "/bait";
    step = ck + "/" + kStep;
    manifest_path = step + "/manifest.json";
    for (const auto& to : {ck, bait}) {
      fs::create_directories(to);
      fs::copy(base + "/latest", to + "/latest");
      fs::copy(base + "/" + kStep, to + "/" + kStep, fs::copy_options::recursive);
    }
    std::ifstream in(manifest_path);
    manifest = json::parse(in);
  }
  void save() const { std::ofstream(manifest_path, std::ios::trunc) << manifest.dump(1); }
  json& tensor(const std::string& name) { return manifest.at("tensors").at(name); }
  // A file of the step directory replaced by something else.
  std::string replace(const std::string& file) const {
    const std::string path = step + "/" + file;
    fs::remove(path);
    return path;
  }
};

// The commands a checkpoint goes through; each returns the process result.
enum class Command { Inspect, Export, ResumePath, ResumeAuto };
const char* command_name(Command c) {
  switch (c) {
    case Command::Inspect: return "ckpt inspect";
    case Command::Export: return "ckpt export";
    case Command::ResumePath: return "run checkpoint.resume=PATH";
    default: return "run checkpoint.resume=auto";
  }
}

ProcessResult run_command(Command c, const Workspace& w) {
  const std::string tiny = source_dir() + "/recipes/tiny-llama.json";
  std::vector<std::string> argv = {trainer_binary()};
  switch (c) {
    case Command::Inspect: argv.insert(argv.end(), {"ckpt", "inspect", w.ck}); break;
    case Command::Export: argv.insert(argv.end(), {"ckpt", "export", w.ck, "--hf", w.dir.path() + "/hf"}); break;
    case Command::ResumePath:
    case Command::ResumeAuto: {
      const std::string out = w.dir.path() + "/out";
      argv.insert(argv.end(), {"run", tiny, "--set", "training.steps=3", "--set",
                               "checkpoint.dir=" + (c == Command::ResumeAuto ? w.ck : out)});
      if (c == Command::ResumePath) argv.insert(argv.end(), {"--set", "checkpoint.resume=" + w.ck});
      for (const auto& a : model_overrides()) argv.push_back(a);
      break;
    }
  }
  return run_process(argv, 30, {"OMP_NUM_THREADS=1"});
}

// runs, exit codes, signals, hangs and opens outside the checkpoint, printed at the end of a case.
struct Tally {
  int runs = 0, signals = 0, hangs = 0, outside = 0;
  std::map<int, int> exits;
  void add(const ProcessResult& r, int opened) {
    ++runs;
    if (r.signal) ++signals;
    if (r.timed_out) ++hangs;
    if (!r.signal && !r.timed_out) ++exits[r.exit_code];
    outside += opened;
  }
  std::string text(const std::string& what) const {
    std::ostringstream s;
    s << what << ": " << runs << " runs; exit codes";
    for (const auto& [code, n] : exits) s << " " << code << ": " << n;
    s << "; signals " << signals << ", hangs " << hangs << ", opens outside the checkpoint " << outside;
    return s.str();
  }
};

// A damage that every reader must refuse, and what its message must contain besides the file.
struct Damage {
  std::string description;
  bool zero1 = false;                 // damage the two-rank ZeRO-1 checkpoint (flat fragments)
  std::function<std::string(Workspace&)> apply;  // returns the file the message must name
  std::string expected;               // a part of the message (the JSON path and the problem)
};

// Runs `command` on the damaged workspace and checks a clean refusal naming `file`.
void expect_refused(Command command, Workspace& w, OpenWatch& watch, const std::string& file, const std::string& expected,
                    Tally& tally) {
  watch.events();
  const auto r = run_command(command, w);
  const int opened = watch.events();
  tally.add(r, opened);
  INFO(command_name(command) << "\nstdout: " << r.out.substr(0, 2000) << "\nstderr: " << r.err.substr(0, 4000));
  CHECK_FALSE(r.timed_out);
  CHECK(r.signal == 0);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find(file) != std::string::npos);
  CHECK(r.err.find(expected) != std::string::npos);
  CHECK(r.err.find("internal error") == std::string::npos);
  CHECK(opened == 0);
}

void run_damages(const std::vector<Damage>& damages, const std::string& what) {
  Tally tally;
  int rotation = 0;
  for (const auto& d : damages) {
    Workspace w(d.zero1 ? bases().zero1 : bases().single);
    OpenWatch watch(w.bait);
    const std::string file = d.apply(w);
    INFO(d.description);
    expect_refused(Command::Inspect, w, watch, file, d.expected, tally);
    const Command others[] = {Command::ResumePath, Command::Export, Command::ResumeAuto};
    expect_refused(others[rotation++ % 3], w, watch, file, d.expected, tally);
    if (!watch.works()) WARN("inotify unavailable: opens outside the checkpoint not watched");
  }
  WARN(tally.text(what));
  CHECK(tally.signals == 0);
  CHECK(tally.hangs == 0);
  CHECK(tally.outside == 0);
}

// A 2-D parameter with one shard, a tensor with flat fragments (ZeRO-1), and their paths.
const std::string kWeight = "model.layers.0.mlp.up_proj.weight";
std::string tensor_path(const std::string& name) { return "tensors.\"" + name + "\""; }

// The first tensor of the ZeRO-1 checkpoint stored as flat fragments, most fragments first.
std::string flat_tensor(const json& manifest) {
  std::string best;
  size_t most = 0;
  for (const auto& [name, record] : manifest.at("tensors").items()) {
    size_t flats = 0;
    for (const auto& s : record.at("shards")) flats += s.contains("flat_range");
    if (flats > most) {
      most = flats;
      best = name;
    }
  }
  return best;
}

// Sets a manifest field and saves; the message must name the manifest and `path: problem`.
Damage field(const std::string& description, std::function<void(json&)> edit, const std::string& expected,
             bool zero1 = false) {
  return {description, zero1, [edit](Workspace& w) {
            edit(w.manifest);
            w.save();
            return w.manifest_path;
          },
          expected};
}

// Sets a field of the 2-D weight's shard; `expected` follows its path "tensors."NAME".shards[0]".
Damage weight_shard(const std::string& key, json value, const std::string& expected) {
  return field("shard " + key + " = " + value.dump(),
               [key, value](json& m) { m["tensors"][kWeight]["shards"][0][key] = value; },
               tensor_path(kWeight) + ".shards[0]" + expected);
}

Damage flat_range(json value, const std::string& expected) {
  return {"flat_range = " + value.dump(), true,
          [value](Workspace& w) {
            const std::string name = flat_tensor(w.manifest);
            for (auto& s : w.tensor(name)["shards"])
              if (s.contains("flat_range")) {
                s["flat_range"] = value;
                break;
              }
            w.save();
            return w.manifest_path;
          },
          expected};
}

Damage without(const std::string& name, const std::string& expected) {
  return field("no tensor " + name, [name](json& m) { m["tensors"].erase(name); }, expected);
}

}  // namespace

TEST_CASE("fuzz: damaged manifest fields are exit 2 naming the manifest and the field", "[fuzz]") {
  const json huge = json::array({1000000, 1000000});
  const std::vector<Damage> damages = {
      weight_shard("offsets", json::array(), ".offsets: 0 values for a 2-D tensor"),
      weight_shard("offsets", json::array({0}), ".offsets: 1 value for a 2-D tensor"),
      weight_shard("shape", json::array(), ".shape: 0 values for a 2-D tensor"),
      weight_shard("shape", json::array({352}), ".shape: 1 value for a 2-D tensor"),
      weight_shard("offsets", "x", ".offsets: \"x\" (a string); expected a list"),
      weight_shard("shape", json::object(), ".shape: {} (an object)"),
      weight_shard("offsets", json::array({-1, 0}), ".offsets[0]: -1 (an integer); expected a non-negative integer"),
      weight_shard("offsets", json::array({1, 0}), ": the slice at offsets [1, 0] with shape [352, 128] does not lie inside"),
      weight_shard("file", "../../bait/" + kStep + "/shard-00000.safetensors", ".file: \"../../bait/"),
      weight_shard("key", "nope", ": shard-00000.safetensors has no tensor \"nope\""),
      flat_range(json::array(), "flat_range: 0 values for a range"),
      flat_range(json::array({0}), "flat_range: 1 value for a range"),
      flat_range(json::array({0, 1, 2}), "flat_range: 3 values for a range"),
      flat_range(json::array({10, 5}), "flat_range: [10, 5); expected 0 <= begin <= end"),
      flat_range(json::array({0, 1000000000}), "expected 0 <= begin <= end"),
      flat_range(json::array({"a", 1}), "flat_range[0]: \"a\" (a string)"),
      flat_range(json::array({0, 1}), "flat_range fragments of the slice"),
      field("dtype 7", [](json& m) { m["tensors"][kWeight]["dtype"] = 7; },
            tensor_path(kWeight) + ".dtype: 7 (an integer); expected a string"),
      field("dtype X", [](json& m) { m["tensors"][kWeight]["dtype"] = "X"; },
            tensor_path(kWeight) + ".dtype: \"X\" is not a dtype trainer writes"),
      field("dtype of another width", [](json& m) { m["tensors"][kWeight]["dtype"] = "BFloat16"; },
            "shard-00000.safetensors stores \"" + kWeight + "\" as Float, the manifest's dtype is BFloat16"),
      field("global_shape a string", [](json& m) { m["tensors"][kWeight]["global_shape"] = "big"; },
            tensor_path(kWeight) + ".global_shape: \"big\" (a string)"),
      field("global_shape overflows", [](json& m) { m["tensors"][kWeight]["global_shape"] = {1ll << 40, 1ll << 40}; },
            "has more elements than any tensor can hold"),
      field("global_shape negative", [](json& m) { m["tensors"][kWeight]["global_shape"] = {-1, 128}; },
            ".global_shape[0]: -1"),
      field("shard shape [1e6, 1e6] (4 TB)",
            [huge](json& m) {
              m["tensors"][kWeight]["global_shape"] = huge;
              m["tensors"][kWeight]["shards"][0]["shape"] = huge;
            },
            "holds \"" + kWeight + "\" with shape [352, 128], but the manifest's shape is [1000000, 1000000]"),
      field("a shard overlapping another",
            [](json& m) {
              json half = m["tensors"][kWeight]["shards"][0];
              half["shape"] = {176, 128};
              m["tensors"][kWeight]["shards"].push_back(half);
            },
            ".shards: shards[0] and shards[1] overlap"),
      field("a whole slice also as a flat fragment",
            [](json& m) {
              json flat = m["tensors"][kWeight]["shards"][0];
              flat["flat_range"] = {0, 10};
              m["tensors"][kWeight]["shards"].push_back(flat);
            },
            ".shards[1]: holds part of the slice that shards[0] holds whole"),
      field("shards an object", [](json& m) { m["tensors"][kWeight]["shards"] = json::object(); },
            tensor_path(kWeight) + ".shards: {} (an object)"),
      field("a shard in an unlisted file", [](json& m) { m["tensors"][kWeight]["shards"][0]["file"] = "shard-00009.safetensors"; },
            ".file: \"shard-00009.safetensors\" is not among the manifest's files"),
      field("tensors a list", [](json& m) { m["tensors"] = json::array(); }, "tensors: [] (a list); expected an object"),
      field("step -10", [](json& m) { m["step"] = -10; }, "step: -10 (an integer); expected an integer from 0 to 1099511627776"),
      field("step 2^41", [](json& m) { m["step"] = 1ll << 41; }, "step: 2199023255552 (an integer); expected an integer from 0"),
      // Before: resumed, and the next checkpoint held consumed_samples -9223372036854775793.
      field("consumed_samples 2^63 - 1", [](json& m) { m["consumed_samples"] = std::numeric_limits<int64_t>::max(); },
            "consumed_samples: 9223372036854775807 (an integer); expected an integer from 0 to 9007199254740992"),
      field("step 2.5", [](json& m) { m["step"] = 2.5; }, "step: 2.5 (a number)"),
      field("consumed_samples -1", [](json& m) { m["consumed_samples"] = -1; }, "consumed_samples: -1"),
      field("version 7", [](json& m) { m["version"] = 7; }, "version: 7; this trainer reads checkpoint format version 1 only"),
      field("format", [](json& m) { m["format"] = "safetensors"; }, "format: \"safetensors\" (a string); expected \"trainer-checkpoint\""),
      field("no extra", [](json& m) { m.erase("extra"); }, "extra: missing"),
      field("recipe a string", [](json& m) { m["recipe"] = "tiny"; }, "recipe: \"tiny\" (a string); expected an object"),
  };
  run_damages(damages, "damaged manifest fields");
}

TEST_CASE("fuzz: file entries outside the step directory - special files - a bad latest are exit 2", "[fuzz]") {
  const auto files_name = [](const std::string& name) {
    return field("files[0].name = " + name, [name](json& m) { m["files"][0]["name"] = name; },
                 "files[0].name: " + json(name).dump() + "; expected the name of a shard file directly inside");
  };
  const auto latest = [](const std::string& description, std::function<void(Workspace&)> make, const std::string& expected) {
    return Damage{description, false,
                  [make](Workspace& w) {
                    fs::remove(w.ck + "/latest");
                    make(w);
                    return w.ck + "/latest";
                  },
                  expected};
  };
  const auto text = [](const std::string& content) {
    return [content](Workspace& w) { std::ofstream(w.ck + "/latest") << content; };
  };
  const std::vector<Damage> damages = {
      files_name("/etc/passwd"),
      files_name("../x"),
      files_name(".."),
      files_name("sub/shard-00000.safetensors"),
      files_name(""),
      Damage{"files[0].name = the bait's absolute path", false,
             [](Workspace& w) {
               w.manifest["files"][0]["name"] = w.bait + "/" + kStep + "/shard-00000.safetensors";
               w.save();
               return w.manifest_path;
             },
             "files[0].name: "},
      field("files[0].bytes -1", [](json& m) { m["files"][0]["bytes"] = -1; }, "files[0].bytes: -1"),
      field("files[0].crc32 2^32", [](json& m) { m["files"][0]["crc32"] = 1ll << 32; },
            "files[0].crc32: 4294967296 (an integer); expected an integer from 0 to 4294967295"),
      field("files[0].bytes a string", [](json& m) { m["files"][0]["bytes"] = "1"; }, "files[0].bytes: \"1\" (a string)"),
      field("files an object", [](json& m) { m["files"] = json::object(); }, "files: {} (an object)"),
      field("a file listed twice", [](json& m) { m["files"].push_back(m["files"][0]); }, "files[1].name: \"shard-00000.safetensors\" is listed twice"),
      Damage{"the shard a FIFO", false,
             [](Workspace& w) {
               const std::string path = w.replace("shard-00000.safetensors");
               REQUIRE(mkfifo(path.c_str(), 0644) == 0);
               return path;
             },
             "not a regular file (a FIFO)"},
      Damage{"the shard a link to /dev/zero", false,
             [](Workspace& w) {
               const std::string path = w.replace("shard-00000.safetensors");
               fs::create_symlink("/dev/zero", path);
               return path;
             },
             "not a regular file (a character device)"},
      Damage{"the shard a directory", false,
             [](Workspace& w) {
               const std::string path = w.replace("shard-00000.safetensors");
               fs::create_directories(path);
               return path;
             },
             "not a regular file (a directory)"},
      Damage{"the manifest a FIFO", false,
             [](Workspace& w) {
               const std::string path = w.replace("manifest.json");
               REQUIRE(mkfifo(path.c_str(), 0644) == 0);
               return path;
             },
             "not a regular file (a FIFO)"},
      Damage{"a manifest nested 100,000 levels deep", false,
             [](Workspace& w) {
               std::string deep = w.manifest.dump();
               deep.pop_back();
               deep += ",\"deep\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
               std::ofstream(w.manifest_path, std::ios::trunc) << deep;
               return w.manifest_path;
             },
             "JSON nested deeper than"},
      latest("latest ../bait/step", text("../bait/" + kStep + "\n"), "holds \"../bait/" + kStep + "\", not the name of a step directory"),
      latest("latest an absolute path", [](Workspace& w) { std::ofstream(w.ck + "/latest") << w.bait + "/" + kStep; },
             "not the name of a step directory inside"),
      latest("latest step/../../bait", text(kStep + "/../../bait/" + kStep), "not the name of a step directory"),
      latest("latest a FIFO", [](Workspace& w) { REQUIRE(mkfifo((w.ck + "/latest").c_str(), 0644) == 0); },
             "not a regular file (a FIFO)"),
      latest("latest a link to /dev/zero", [](Workspace& w) { fs::create_symlink("/dev/zero", w.ck + "/latest"); },
             "not a regular file (a character device)"),
      latest("latest 1 MB", text(std::string(1 << 20, 's')), "bytes, more than the 4096 bytes"),
      latest("latest empty", text(""), "holds \"\", not the name of a step directory"),
  };
  run_damages(damages, "paths, special files and latest");
}

TEST_CASE("fuzz: missing tensors - optimizer state included - are exit 2 naming the tensor", "[fuzz]") {
  // Before: a checkpoint without an optimizer.exp_avg tensor resumed (exit 0) with zero moments.
  const std::string moment = "optimizer.exp_avg.model.norm.weight";
  const std::vector<Damage> damages = {
      without(moment, "no tensor " + moment),
      without("optimizer.exp_avg_sq." + kWeight, "no tensor optimizer.exp_avg_sq." + kWeight),
      without("optimizer.step.model.embed_tokens.weight", "no tensor optimizer.step.model.embed_tokens.weight"),
      without("model.norm.weight", "no tensor model.norm.weight"),
  };
  // inspect names what is missing too (a different sentence: it does not know the model).
  Tally tally;
  int rotation = 0;
  for (const auto& d : damages) {
    Workspace w(bases().single);
    OpenWatch watch(w.bait);
    d.apply(w);
    INFO(d.description);
    const std::string name = d.expected.substr(std::string("no tensor ").size());
    expect_refused(Command::Inspect, w, watch, w.manifest_path, "tensors: no " + name, tally);
    expect_refused(rotation++ % 2 ? Command::ResumeAuto : Command::ResumePath, w, watch, w.ck, "checkpoint has " + d.expected,
                   tally);
  }
  // Master weights: required of a bf16 checkpoint's parameters, not of an fp32 one's (the
  // parameters are the master weights): the fp32 checkpoint resumes in bf16.
  Workspace w(bases().single);
  const auto r = run_process({trainer_binary(), "run", source_dir() + "/recipes/tiny-llama.json", "--set", "training.steps=3",
                              "--set", "training.dtype=bf16", "--set", "checkpoint.dir=" + w.dir.path() + "/out", "--set",
                              "checkpoint.resume=" + w.ck, "--set", "model.num_hidden_layers=1", "--set",
                              "training.seq_len=32", "--set", "optimizer.warmup_steps=1"},
                             60, {"OMP_NUM_THREADS=1"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("resumed from " + w.step) != std::string::npos);
  WARN(tally.text("missing tensors"));
}

TEST_CASE("a latest naming a step directory that was removed warns and takes the newest committed one", "[fuzz]") {
  Workspace w(bases().single);
  std::ofstream(w.ck + "/latest", std::ios::trunc) << "step-00000099\n";
  const auto r = run_process({trainer_binary(), "ckpt", "inspect", w.ck}, 30);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("warning: " + w.ck + "/latest names step-00000099, which holds no committed checkpoint") !=
        std::string::npos);
  CHECK(r.out.find("checkpoint " + w.step) != std::string::npos);
}

TEST_CASE("a checkpoint of another model size names the recipe values that differ and the ways forward", "[fuzz]") {
  const std::string ck = bases().single;
  TempDir out;
  for (const auto& [set, differs] : std::vector<std::pair<std::string, std::string>>{
           {"model.num_hidden_layers=2", "model.num_hidden_layers: 1 -> 2"},
           {"model.intermediate_size=256", "model.intermediate_size: 352 -> 256"}}) {
    std::vector<std::string> argv = {trainer_binary(), "run", source_dir() + "/recipes/tiny-llama.json", "--set",
                                     "training.steps=3", "--set", "checkpoint.dir=" + out.path() + "/ck", "--set",
                                     "checkpoint.resume=" + ck};
    for (const auto& a : model_overrides()) argv.push_back(a);
    argv.insert(argv.end(), {"--set", set});
    const auto r = run_process(argv, 60, {"OMP_NUM_THREADS=1"});
    INFO(set << "\n" << r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(ck + "/" + kStep) != std::string::npos);
    CHECK(r.err.find("the checkpoint was saved from another model: its recipe differs in 1 model value") != std::string::npos);
    CHECK(r.err.find(differs) != std::string::npos);
    CHECK(r.err.find("set checkpoint.resume=none or another checkpoint.dir") != std::string::npos);
    CHECK(r.err.find("trainer ckpt export " + ck + "/" + kStep + " --hf OUT") != std::string::npos);
  }
}

TEST_CASE("ckpt export reads the manifest's recipe as a recipe file - damage is exit 2 naming the key", "[fuzz]") {
  // Before: 0 heads without head_dim divided by zero (SIGFPE), a string size was "internal error"
  // (exit 1), and so was a checkpoint written before parallel.dp_shard existed.
  const std::vector<std::tuple<std::string, std::function<void(json&)>, int, std::string>> cases = {
      {"0 heads, no head_dim",
       [](json& r) {
         r["model"]["num_attention_heads"] = 0;
         r["model"].erase("head_dim");
       },
       2, "manifest.json: recipe.model.num_attention_heads: found 0"},
      {"hidden_size a string", [](json& r) { r["model"]["hidden_size"] = "x"; }, 2,
       "manifest.json: recipe.model.hidden_size: found \"x\" (a string)"},
      {"a key added since (parallel.dp_shard)", [](json& r) { r["parallel"].erase("dp_shard"); }, 0, ""},
  };
  for (const auto& [description, edit, exit_code, expected] : cases) {
    Workspace w(bases().single);
    edit(w.manifest["recipe"]);
    w.save();
    const auto r = run_command(Command::Export, w);
    INFO(description << "\n" << r.err);
    CHECK(r.signal == 0);
    CHECK(r.exit_code == exit_code);
    CHECK(r.err.find(expected) != std::string::npos);
    if (exit_code == 0) CHECK(fs::exists(w.dir.path() + "/hf/config.json"));
  }
}

namespace {

// Random damage to one value of the manifest (a tensor record, a file entry or a top-level field).
struct Mutator {
  std::mt19937_64 rng;
  explicit Mutator(uint64_t seed) : rng(seed) {}
  size_t below(size_t n) { return n == 0 ? 0 : size_t(rng() % n); }

  json value(const Workspace& w) {
    switch (below(16)) {
      case 0: return json::array();
      case 1: return json::array({int64_t(below(1000))});
      case 2: return -1;
      case 3: return std::numeric_limits<uint64_t>::max();
      case 4: return std::numeric_limits<int64_t>::max();
      case 5: return "x";
      case 6: return nullptr;
      case 7: return json::object();
      case 8: return 2.5;
      case 9: return true;
      case 10: return json::array({1000000, 1000000});
      case 11: return json::array({0, 1, 2});
      case 12: return "../../bait/" + kStep + "/shard-00000.safetensors";
      case 13: return w.bait + "/" + kStep + "/shard-00001.safetensors";
      case 14: return "/dev/zero";
      default: return int64_t(below(100000));
    }
  }

  // Picks a node: a random path down from a random tensor, file or top-level field.
  std::string mutate(Workspace& w) {
    json& m = w.manifest;
    if (!m.is_object()) return "(the manifest is no longer an object)";
    json* node = &m;
    std::string path;
    const size_t where = below(10);
    const bool tensors = m.contains("tensors") && m["tensors"].is_object() && !m["tensors"].empty();
    if (where < 7 && tensors) {
      auto it = m["tensors"].begin();
      std::advance(it, below(m["tensors"].size()));
      path = "tensors." + it.key();
      node = &it.value();
    } else if (where < 9 && m.contains("files")) {
      path = "files";
      node = &m["files"];
    }
    // Walk down a few levels, sometimes stopping early.
    for (int depth = 0; depth < 4 && (node->is_object() || node->is_array()) && !node->empty() && below(4) != 0; ++depth) {
      if (node->is_array()) {
        const size_t i = below(node->size());
        path += "[" + std::to_string(i) + "]";
        node = &(*node)[i];
      } else {
        auto it = node->begin();
        std::advance(it, below(node->size()));
        path += "." + it.key();
        node = &it.value();
      }
    }
    const size_t op = below(8);
    if (op == 0 && node->is_array() && !node->empty()) {
      node->erase(node->size() - 1);
      return path + ": last element removed";
    }
    if (op == 1 && node->is_object() && !node->empty()) {
      auto it = node->begin();
      std::advance(it, below(node->size()));
      const std::string key = it.key();
      node->erase(key);
      return path + "." + key + ": removed";
    }
    if (op == 2 && node->is_number_integer()) {
      *node = node->get<int64_t>() + (below(2) ? 1 : -1);
      return path + ": off by one";
    }
    *node = value(w);
    return path + " = " + node->dump();
  }
};

}  // namespace

TEST_CASE("fuzz: random manifest damage - inspect export and resume exit 0 or 2 and agree - never crash or hang", "[fuzz]") {
  const char* env = std::getenv("TRAINER_FUZZ_RUNS");
  const int runs = env ? std::atoi(env) : 24;
  Tally tally;
  int refused = 0;
  for (int i = 0; i < runs; ++i) {
    Mutator mutator(4400 + uint64_t(i));
    Workspace w(i % 2 ? bases().zero1 : bases().single);
    OpenWatch watch(w.bait);
    std::string what;
    for (size_t k = 0, n = 1 + mutator.below(2); k < n; ++k) what += (k ? "; " : "") + mutator.mutate(w);
    w.save();
    INFO("run " << i << ": " << what);
    const Command other = std::array{Command::ResumePath, Command::Export, Command::ResumeAuto}[size_t(i) % 3];
    int inspect_exit = -1;
    for (const Command c : {Command::Inspect, other}) {
      watch.events();
      const auto r = run_command(c, w);
      const int opened = watch.events();
      tally.add(r, opened);
      INFO(command_name(c) << "\nstderr: " << r.err.substr(0, 3000));
      CHECK_FALSE(r.timed_out);
      CHECK(r.signal == 0);
      CHECK((r.exit_code == 0 || r.exit_code == 2));
      CHECK(r.err.find("internal error") == std::string::npos);
      CHECK(opened == 0);
      if (r.exit_code == 2) CHECK(r.err.find(w.ck) != std::string::npos);
      if (c == Command::Inspect) inspect_exit = r.exit_code;
      // What a resume refuses, inspect refuses too.
      if (c != Command::Inspect && c != Command::Export && r.exit_code == 2) CHECK(inspect_exit == 2);
      refused += c == Command::Inspect && r.exit_code == 2;
    }
  }
  WARN(tally.text("random manifest damage") << "; inspect refused " << refused << " of " << runs);
  CHECK(tally.signals == 0);
  CHECK(tally.hangs == 0);
  CHECK(tally.outside == 0);
  if (runs >= 10) CHECK(refused > runs / 2);
}
