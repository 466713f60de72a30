#include "packtrain/runtime/data/fingerprint.h"

#include "packtrain/base/fnv1a.h"
#include "packtrain/runtime/data/dataset.h"
#include "packtrain/runtime/data/labelled_texts.h"
#include "packtrain/runtime/data/run_data.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace packtrain::runtime {

uint64_t tensor_fingerprint(std::initializer_list<at::Tensor> tensors) {
  Fnv1a hash;
  for (const at::Tensor& t : tensors) {
    const at::Tensor c = t.cpu().contiguous();
    hash.add(c.data_ptr(), c.nbytes());
  }
  return hash.value();
}

namespace {
// Every row of a loaded data set: features and targets (float64).
uint64_t rows_fingerprint(const Dataset& data) {
  return tensor_fingerprint({data.features.to(at::kDouble), data.targets.to(at::kDouble)});
}
}  // namespace

uint64_t fingerprint(const SplitData& data, bool with_shape) {
  Fnv1a hash;
  const uint64_t rows = rows_fingerprint(data.all);
  hash.add(&rows, sizeof rows);
  for (const std::vector<int64_t>* part : {&data.split.train, &data.split.validation, &data.split.test}) {
    const int64_t n = static_cast<int64_t>(part->size());
    hash.add(&n, sizeof n).add(part->data(), part->size() * sizeof(int64_t));
  }
  // A table's sample is its row (its width is in the rows' bytes already): only a
  // multi-dimensional sample's shape is added, so tables keep their fingerprints.
  const std::vector<int64_t>& shape = data.all.sample_shape;
  if (with_shape && shape.size() > 1) {
    const int64_t dims = static_cast<int64_t>(shape.size());
    hash.add("sample shape").add(&dims, sizeof dims).add(shape.data(), shape.size() * sizeof(int64_t));
  }
  return hash.value();
}

uint64_t fingerprint(const LabelledTexts& texts) {
  Fnv1a hash;
  for (size_t i = 0; i < texts.size(); ++i) {
    const int64_t label = texts.labels[i], bytes = static_cast<int64_t>(texts.texts[i].size());
    hash.add(&label, sizeof label).add(&bytes, sizeof bytes).add(texts.texts[i]);
  }
  return hash.value();
}

std::string fingerprint_hex(uint64_t fingerprint) { return fmt::format("{:016x}", fingerprint); }

}  // namespace packtrain::runtime
