#pragma once
// docs/recipe.md's key tables, made from the schema (and so from recipe.h's keys() tables). The
// document holds one generated block per section between two marker lines:
//   <!-- generated: keys of SECTION (...) -->
//   | key | type | default | meaning |
//   ...
//   <!-- end of generated keys -->
// A unit test fails when the document differs from what update_reference_doc makes of it;
// scripts/update_recipe_docs rewrites it.
#include <string>
#include <vector>

namespace trainer::recipe {

// The markdown table of one section ("model", "model.moe"): the section's own row, then one row per
// direct member (a sub-section is one row; it has its own table).
std::string key_table(const std::string& section);

// `document` with every generated block replaced by the current table of its section. Throws
// std::invalid_argument for a block without its end marker or naming an unknown section.
std::string update_reference_doc(const std::string& document);

// The sections with no generated block in `document`.
std::vector<std::string> sections_without_table(const std::string& document);

}  // namespace trainer::recipe
