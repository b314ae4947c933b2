#pragma once
// Short renderings of quantities for the console line: they round, so never parse them back
// (the metrics file keeps the exact numbers).
#include <cstdint>
#include <string>

namespace trainer::metrics {

// Bytes in binary units with one decimal: "512 B", "1.5 KiB", "123.4 MiB", "2.0 GiB", "1.1 TiB".
std::string format_bytes(int64_t bytes);

// A rate or count with a decimal suffix: "950", "12.3k", "4.56M", "1.23G" (three significant digits
// from 1k up).
std::string format_count(double value);

// A duration as H:MM:SS ("0:00:41", "27:03:09"); negative or non-finite values print as "-".
std::string format_duration(double seconds);

}  // namespace trainer::metrics
