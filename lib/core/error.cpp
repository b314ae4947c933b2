#include "core/error.h"

namespace trainer {

namespace {
std::string join_problems(const std::string& source, const std::vector<std::string>& problems) {
  std::string text;
  for (size_t i = 0; i < problems.size(); ++i) {
    if (i) text += '\n';
    text += source.empty() ? problems[i] : source + ": " + problems[i];
  }
  return text;
}
}  // namespace

std::string prefix_lines(const std::string& text, const std::string& prefix) {
  std::string out = prefix;
  for (char c : text) {
    out += c;
    if (c == '\n') out += prefix;
  }
  return out;
}

RecipeError::RecipeError(std::string source, std::vector<std::string> problems)
    : UserError(join_problems(source, problems)), source_(std::move(source)), problems_(std::move(problems)) {}

}  // namespace trainer
