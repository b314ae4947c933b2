#pragma once
// Giving a tensor's memory back and taking it again while the tensor object, its shape and every
// view of it stay (ZeRO-3 keeps parameters this way: whole only while gathered). A tensor without
// its storage must not be read or written until allocate_storage.
#include <ATen/core/Tensor.h>

namespace trainer::model {

void release_storage(const at::Tensor& t);
// Allocates (uninitialised) memory for all of t's elements from the allocator that made it.
void allocate_storage(const at::Tensor& t);
bool has_storage(const at::Tensor& t);

}  // namespace trainer::model
