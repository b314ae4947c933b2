#include "parallel/context/document_mask.h"

#include <ATen/ATen.h>

namespace trainer::parallel {

at::Tensor document_block_mask(const at::Tensor& ids, const at::Tensor& query_positions,
                               const at::Tensor& key_positions, int64_t window) {
  const at::Tensor query_documents = ids.index_select(1, query_positions), key_documents = ids.index_select(1, key_positions);
  const at::Tensor distance = query_positions.unsqueeze(1) - key_positions.unsqueeze(0);  // [Lq, Lk]
  at::Tensor seen = distance.ge(0);
  if (window > 0) seen.logical_and_(distance.lt(window));
  return (query_documents.unsqueeze(2) == key_documents.unsqueeze(1)).logical_and_(seen).unsqueeze(1);
}

}  // namespace trainer::parallel
