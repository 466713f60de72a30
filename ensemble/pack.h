// Between packs and standalone LibTorch models: build the standalone model that
// member i of a pack equals, pack K standalone models, unpack member i.
#pragma once

#include "packtrain/ensemble/packed_mlp.h"

#include <torch/nn/modules/container/sequential.h>

#include <vector>

namespace packtrain::ensemble {

// The torch::nn::Sequential that member `member` of PackedMLP(options) equals:
// Linear -> [LayerNorm] -> activation -> [Dropout], depth times, then Linear,
// built with plain torch::nn modules after seeding the default generator with
// member_seed(options.seed(), member), then cast to options' dtype and device.
// (It reseeds the global generator: a test and benchmark helper.)
torch::nn::Sequential make_standalone_mlp(const PackedMLPOptions& options, int64_t member);

// Copies member `member` of `pack` into a new standalone Sequential of the same
// shape (on the pack's device and dtype).
torch::nn::Sequential unpack(const PackedMLP& pack, int64_t member);

// Packs standalone models of the shape `options` describes (options.members() is
// set to models.size()) into a new pack; throws naming the first parameter whose
// shape does not match.
PackedMLP pack(const std::vector<torch::nn::Sequential>& models, PackedMLPOptions options);

}  // namespace packtrain::ensemble
