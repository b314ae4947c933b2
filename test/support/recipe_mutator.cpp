#include "recipe_mutator.h"

#include <cmath>
#include <functional>

namespace trainer::test {

namespace {
// Every path to a value in the document, as JSON pointers.
void collect(const nlohmann::json& node, const nlohmann::json::json_pointer& at,
             std::vector<nlohmann::json::json_pointer>& out) {
  if (!at.empty()) out.push_back(at);
  if (node.is_object())
    for (const auto& [k, v] : node.items()) collect(v, at / k, out);
  else if (node.is_array())
    for (size_t i = 0; i < node.size(); ++i) collect(node[i], at / i, out);
}
}  // namespace

nlohmann::json RecipeMutator::random_value() {
  switch (pick(12)) {
    case 0: return nullptr;
    case 1: return true;
    case 2: return "bf16";
    case 3: return std::string(pick(3) ? "x" : std::string(300, 'z'));
    case 4: return static_cast<int64_t>(pick(10)) - 3;
    case 5: return 1e300;
    case 6: return -0.5;
    case 7: return nlohmann::json::array({1, "two", nullptr});
    case 8: return nlohmann::json::object({{"a", 1}});
    case 9: return int64_t(1) << 62;
    case 10: return std::numeric_limits<int64_t>::min();
    default: return nlohmann::json::array();
  }
}

nlohmann::json RecipeMutator::perturb(const nlohmann::json& number) {
  const double v = number.get<double>();
  switch (pick(9)) {
    case 0: return -v;
    case 1: return 0;
    case 2: return number.is_number_integer() ? nlohmann::json(number.get<int64_t>() + 1) : nlohmann::json(v + 1);
    case 3: return v * 1000;
    case 4: return v / 3;
    case 5: return int64_t(1) << 62;
    case 6: return 3;
    case 7: return 4096;
    default: return 7;
  }
}

std::string RecipeMutator::garble(std::string text) {
  const int edits = 1 + static_cast<int>(pick(4));
  for (int i = 0; i < edits && !text.empty(); ++i) {
    const size_t at = pick(text.size());
    switch (pick(4)) {
      case 0: text[at] = static_cast<char>(pick(256)); break;
      case 1: text.erase(at, 1 + pick(8)); break;
      case 2: text.insert(at, 1, "{}[],:\"\\0\xff"[pick(11)]); break;
      default: text.resize(at); break;
    }
  }
  return text;
}

MutatedRecipe RecipeMutator::mutate(const nlohmann::json& recipe, const std::vector<std::string>& schema_paths) {
  MutatedRecipe out;
  nlohmann::json doc = recipe;
  const int mutations = 1 + static_cast<int>(pick(3));
  bool garbage = false;
  for (int m = 0; m < mutations; ++m) {
    std::vector<nlohmann::json::json_pointer> paths;
    collect(doc, nlohmann::json::json_pointer(), paths);
    const int kind = static_cast<int>(pick(6));
    if (paths.empty() && kind <= 2) continue;
    const auto target = paths.empty() ? nlohmann::json::json_pointer() : paths[pick(paths.size())];
    switch (kind) {
      case 0:  // delete a key or element
        doc[target.parent_pointer()].erase(doc[target.parent_pointer()].is_object()
                                               ? doc[target.parent_pointer()].find(target.back())
                                               : doc[target.parent_pointer()].begin());
        out.description += "delete " + target.to_string() + "; ";
        break;
      case 1:  // swap the type
        doc[target] = random_value();
        out.description += "retype " + target.to_string() + "; ";
        break;
      case 2:  // perturb a number (or retype a non-number)
        doc[target] = doc[target].is_number() ? perturb(doc[target]) : random_value();
        out.description += "perturb " + target.to_string() + "; ";
        break;
      case 3:  // unknown key
      {
        auto parent = paths.empty() ? nlohmann::json::json_pointer() : target.parent_pointer();
        if (!doc[parent].is_object()) parent = nlohmann::json::json_pointer();
        if (doc.is_object()) doc[parent]["mystery_key"] = 1;
      }
        out.description += "unknown key; ";
        break;
      case 4: {  // --set of a random schema key
        const std::string path = schema_paths[pick(schema_paths.size())];
        const std::string value = pick(3) ? random_value().dump() : "word";
        out.overrides.push_back(path + "=" + value);
        out.description += "--set " + out.overrides.back() + "; ";
        break;
      }
      default:
        garbage = true;
        break;
    }
  }
  out.text = doc.dump(2);
  if (garbage) {
    out.text = garble(out.text);
    out.description += "garbage bytes; ";
  }
  return out;
}

}  // namespace trainer::test
