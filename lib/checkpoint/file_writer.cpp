#include "checkpoint/file_writer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace trainer::checkpoint {

namespace {

constexpr size_t kAlignment = FileWriter::kAlignment;
constexpr size_t kChunk = size_t(16) << 20;  // bytes per staging buffer
constexpr size_t kBuffers = 3;               // one filling, one being written, one spare

std::runtime_error io_error(const std::string& path, const char* what) {
  return std::runtime_error(fmt::format("{}: {} failed: {}", path, what, std::strerror(errno)));
}

void write_all_at(int fd, const char* data, size_t size, off_t offset, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error(path, "write");
    }
    if (n == 0) throw std::runtime_error(fmt::format("{}: write wrote nothing (disk full?)", path));
    data += n;
    size -= size_t(n);
    offset += n;
  }
}

// The pieces as one byte stream, copied out in order.
class PieceReader {
 public:
  explicit PieceReader(const std::vector<FileWriter::Piece>& pieces) : pieces_(pieces) {}
  // Copies up to `size` bytes into `out`; returns how many (0 at the end).
  size_t copy_to(char* out, size_t size) {
    size_t done = 0;
    while (done < size && index_ < pieces_.size()) {
      const auto& p = pieces_[index_];
      const size_t n = std::min(size - done, p.size - offset_);
      std::memcpy(out + done, static_cast<const char*>(p.data) + offset_, n);
      done += n;
      offset_ += n;
      if (offset_ == p.size) {
        ++index_;
        offset_ = 0;
      }
    }
    return done;
  }

 private:
  const std::vector<FileWriter::Piece>& pieces_;
  size_t index_ = 0, offset_ = 0;
};

FileChecksum write_buffered(int fd, const std::string& path, const std::vector<FileWriter::Piece>& pieces) {
  FileChecksum sum;
  std::thread checksum([&] {
    for (const auto& p : pieces) sum.crc32 = crc32_update(sum.crc32, p.data, p.size);
  });
  std::exception_ptr failure;
  try {
    off_t offset = 0;
    for (const auto& p : pieces) {
      write_all_at(fd, static_cast<const char*>(p.data), p.size, offset, path);
      offset += off_t(p.size);
    }
    sum.bytes = uint64_t(offset);
  } catch (...) {
    failure = std::current_exception();
  }
  checksum.join();
  if (failure) std::rethrow_exception(failure);
  return sum;
}

}  // namespace

struct FileWriter::Staging {
  std::vector<char*> buffers;
  ~Staging() {
    for (char* b : buffers) std::free(b);
  }
};

FileWriter::FileWriter(bool direct) : staging_(std::make_unique<Staging>()), direct_(direct) {}
FileWriter::~FileWriter() = default;

int FileWriter::open_file(const std::string& path) {
  int fd = direct_ ? ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644) : -1;
  last_direct_ = fd >= 0;
  if (fd < 0 && (!direct_ || errno == EINVAL)) fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw io_error(path, "create");
  return fd;
}

FileChecksum FileWriter::write_aligned(const std::string& path, void* image, size_t size) {
  if (reinterpret_cast<uintptr_t>(image) % kAlignment != 0)
    throw std::logic_error(fmt::format("{}: write_aligned needs a buffer aligned to {} bytes", path, kAlignment));
  const int fd = open_file(path);
  FileChecksum sum;
  sum.bytes = size;
  std::thread checksum([&] { sum.crc32 = crc32_update(0, image, size); });
  std::exception_ptr failure;
  try {
    if (last_direct_) {
      const size_t padded = (size + kAlignment - 1) / kAlignment * kAlignment;
      std::memset(static_cast<char*>(image) + size, 0, padded - size);
      write_all_at(fd, static_cast<const char*>(image), padded, 0, path);
      if (::ftruncate(fd, off_t(size)) != 0) throw io_error(path, "truncate");
    } else {
      write_all_at(fd, static_cast<const char*>(image), size, 0, path);
    }
    if (::fsync(fd) != 0) throw io_error(path, "fsync");
  } catch (...) {
    failure = std::current_exception();
  }
  checksum.join();
  if (::close(fd) != 0 && !failure) failure = std::make_exception_ptr(io_error(path, "close"));
  if (failure) std::rethrow_exception(failure);
  return sum;
}

FileChecksum FileWriter::write(const std::string& path, const std::vector<Piece>& pieces) {
  const int fd = open_file(path);
  FileChecksum sum;
  std::exception_ptr failure;
  try {
    if (!last_direct_) {
      sum = write_buffered(fd, path, pieces);
    } else {
      if (staging_->buffers.empty())
        for (size_t i = 0; i < kBuffers; ++i) {
          void* b = nullptr;
          if (::posix_memalign(&b, kAlignment, kChunk) != 0) throw std::bad_alloc();
          staging_->buffers.push_back(static_cast<char*>(b));
        }
      // This thread fills buffers (copy + CRC) and a writer thread writes them, in order.
      struct Filled {
        size_t buffer, bytes;
        off_t offset;
      };
      std::mutex mutex;
      std::condition_variable changed;
      std::deque<Filled> to_write;
      std::deque<size_t> free_buffers;
      for (size_t i = 0; i < kBuffers; ++i) free_buffers.push_back(i);
      bool done = false;
      std::exception_ptr write_failure;
      std::thread writer([&] {
        for (;;) {
          Filled f;
          {
            std::unique_lock lock(mutex);
            changed.wait(lock, [&] { return !to_write.empty() || done; });
            if (to_write.empty()) return;
            f = to_write.front();
            to_write.pop_front();
          }
          std::exception_ptr error;
          try {
            // O_DIRECT writes whole blocks: the last one is padded and cut off by ftruncate below.
            const size_t padded = (f.bytes + kAlignment - 1) / kAlignment * kAlignment;
            std::memset(staging_->buffers[f.buffer] + f.bytes, 0, padded - f.bytes);
            write_all_at(fd, staging_->buffers[f.buffer], padded, f.offset, path);
          } catch (...) {
            error = std::current_exception();
          }
          {
            std::lock_guard lock(mutex);
            if (error && !write_failure) write_failure = error;
            free_buffers.push_back(f.buffer);
          }
          changed.notify_all();
        }
      });
      PieceReader reader(pieces);
      off_t offset = 0;
      for (;;) {
        size_t buffer;
        {
          std::unique_lock lock(mutex);
          changed.wait(lock, [&] { return !free_buffers.empty(); });
          buffer = free_buffers.front();
          free_buffers.pop_front();
          if (write_failure) break;
        }
        const size_t n = reader.copy_to(staging_->buffers[buffer], kChunk);
        if (n == 0) break;
        sum.crc32 = crc32_update(sum.crc32, staging_->buffers[buffer], n);
        {
          std::lock_guard lock(mutex);
          to_write.push_back({buffer, n, offset});
        }
        changed.notify_all();
        offset += off_t(n);
      }
      {
        std::lock_guard lock(mutex);
        done = true;
      }
      changed.notify_all();
      writer.join();
      if (write_failure) std::rethrow_exception(write_failure);
      if (::ftruncate(fd, offset) != 0) throw io_error(path, "truncate");
      sum.bytes = uint64_t(offset);
    }
    if (::fsync(fd) != 0) throw io_error(path, "fsync");
  } catch (...) {
    failure = std::current_exception();
  }
  if (::close(fd) != 0 && !failure) failure = std::make_exception_ptr(io_error(path, "close"));
  if (failure) std::rethrow_exception(failure);
  return sum;
}

}  // namespace trainer::checkpoint
