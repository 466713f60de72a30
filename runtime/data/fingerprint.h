// Fingerprints of the data a run used. Checkpoints store them, so a resume or an
// evaluation on data that changed on disk since (edited rows, a halved file) is
// caught instead of carrying on with other data.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <string>

namespace packtrain::runtime {

struct LabelledTexts;
struct SplitData;

// FNV-1a over the bytes of the tensors (each made contiguous), in order.
uint64_t tensor_fingerprint(std::initializer_list<at::Tensor> tensors);
// Every row, which rows are train, validation and test, and — for images and
// sequences — the shape of a sample (the same bytes as (1, 2, 8) are other data than
// as (1, 4, 4)). `with_shape` false: the fingerprint checkpoints recorded before the
// shape was part of it (check_same_data accepts it for them).
uint64_t fingerprint(const SplitData& data, bool with_shape = true);
// Every sentence and label, in file order.
uint64_t fingerprint(const LabelledTexts& texts);

// 16 hex digits: how fingerprints are written into a checkpoint's JSON.
std::string fingerprint_hex(uint64_t fingerprint);

}  // namespace packtrain::runtime
