#include "model/tensor_storage.h"

#include <c10/core/StorageImpl.h>

namespace trainer::model {

void release_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

void allocate_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t bytes = size_t(t.storage_offset() + t.numel()) * t.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

bool has_storage(const at::Tensor& t) { return t.numel() == 0 || t.storage().nbytes() > 0; }

}  // namespace trainer::model
