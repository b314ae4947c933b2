#pragma once
// Small files that must be on disk before the next step relies on them (a manifest, `latest`, an
// export's config.json and index): written whole and fsynced, the directory fsynced after renames.
#include <string>

namespace trainer::checkpoint {

// fsyncs a file or directory; a path that cannot be opened is skipped (best effort, as before a
// rename the data itself was already synced).
void fsync_path(const std::string& path);

// Creates (or truncates) `path`, writes `text` and fsyncs it. Throws std::runtime_error naming the
// file when the write fails.
void write_text_synced(const std::string& path, const std::string& text);

}  // namespace trainer::checkpoint
