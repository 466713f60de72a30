// Array directories as data sets: the two layouts, the sample shape, the own
// train / test split through load_split_data, the bundled optdigits and mnist1d by
// name, and what is refused.
#include "packtrain/runtime/data/array_dataset.h"
#include "packtrain/runtime/data/run_data.h"
#include "tests/runtime/data/data_error_message.h"
#include "tests/runtime/data/npy_bytes.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include <filesystem>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
namespace pt = packtrain::testing;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ArrayDirectory : public ::testing::Test {
 protected:
  void write(const std::string& name, const std::string& bytes) { pt::write_bytes(dir_ / name, bytes); }
  // `rows` sequences of shape (2, 3), values r * 10 + element, labels r % 3.
  void write_pair(const std::string& prefix, int64_t rows) {
    std::vector<float> x;
    std::vector<int64_t> y;
    for (int64_t r = 0; r < rows; ++r) {
      for (int e = 0; e < 6; ++e) x.push_back(static_cast<float>(r * 10 + e));
      y.push_back(r % 3);
    }
    write(prefix + "features.npy", pt::npy("<f4", "(" + std::to_string(rows) + ", 2, 3)", pt::raw_bytes(x)));
    write(prefix + "labels.npy", pt::npy("<i8", "(" + std::to_string(rows) + ",)", pt::raw_bytes(y)));
  }
  DataArgs args() const {
    DataArgs a;
    a.data = dir_.string();
    return a;
  }
  pt::ScopedTempDir temp_{"packtrain_arrays"};
  const fs::path dir_ = temp_.path();
};

TEST_F(ArrayDirectory, FeaturesAndLabelsSplitByFractionsLikeATable) {
  write_pair("", 20);
  DataArgs a = args();
  a.test_fraction = 0.25;
  a.val_fraction = 0;
  const SplitData data = load_split_data(a);
  EXPECT_THAT(data.all.sample_shape, ElementsAre(2, 3));
  EXPECT_THAT(data.all.features.sizes(), ElementsAre(20, 6));
  EXPECT_THAT(data.all.targets.sizes(), ElementsAre(20, 1));
  EXPECT_EQ(data.all.features[4][5].item<double>(), 45);
  EXPECT_EQ(data.all.targets[4][0].item<double>(), 1);
  EXPECT_EQ(data.all.target_name, "label");
  EXPECT_THAT(data.all.feature_names, ElementsAre("0", "1", "2", "3", "4", "5"));
  EXPECT_EQ(data.split.test.size(), 5u);
  EXPECT_EQ(data.split.train.size(), 15u);
  EXPECT_THAT(data.description, HasSubstr("6 features, samples of shape (2, 3)"));
}

TEST_F(ArrayDirectory, TrainAndTestFilesAreItsOwnSplitWithValidationCarvedFromTrain) {
  write_pair("train_", 30);
  write_pair("test_", 10);
  DataArgs a = args();
  a.val_fraction = 0.1;
  const SplitData data = load_split_data(a);
  EXPECT_THAT(data.all.features.sizes(), ElementsAre(40, 6));
  EXPECT_EQ(data.split.train.size() + data.split.validation.size(), 30u);
  EXPECT_EQ(data.split.validation.size(), 3u);
  std::vector<int64_t> test(10);
  for (int64_t i = 0; i < 10; ++i) test[static_cast<size_t>(i)] = 30 + i;
  EXPECT_EQ(data.split.test, test);
  EXPECT_THAT(data.description, HasSubstr("own train / test split (27 train / 3 validation / 10 test rows"));
  // The subsets no longer carry the split (their rows are renumbered).
  EXPECT_FALSE(data.train().own_split.has_value());
  a.split = 2;
  EXPECT_THAT(error_of([&] { load_split_data(a); }),
              HasSubstr("--split 2: an array directory has one train / test split, its own"));
}

TEST_F(ArrayDirectory, RefusalsNameTheFile) {
  write_pair("train_", 4);
  write("test_features.npy", pt::npy("<f4", "(2, 6)", pt::raw_bytes(std::vector<float>(12, 1.0f))));
  write("test_labels.npy", pt::npy("<i8", "(2,)", pt::raw_bytes(std::vector<int64_t>{0, 1})));
  EXPECT_THAT(error_of([&] { load_split_data(args()); }),
              HasSubstr("test_features.npy: test samples of shape (6), training samples of shape (2, 3)"));
  write_pair("", 4);
  EXPECT_THAT(error_of([&] { load_split_data(args()); }), HasSubstr("both features.npy and train_features.npy"));
  DataArgs with_target = args();
  with_target.target = "3";
  EXPECT_THAT(error_of([&] { load_split_data(with_target); }),
              HasSubstr("an array directory's features and labels are its .npy files"));
  DataArgs one_file = args();
  one_file.data = (dir_ / "features.npy").string();
  EXPECT_THAT(error_of([&] { load_split_data(one_file); }),
              ::testing::AllOf(HasSubstr("features.npy: a .npy file is read as part of an array directory"),
                    HasSubstr("give the directory")));
}

TEST_F(ArrayDirectory, AMissingLabelsFileIsNamed) {
  write("features.npy", pt::npy("<f4", "(2, 6)", pt::raw_bytes(std::vector<float>(12, 1.0f))));
  EXPECT_THAT(error_of([&] { load_split_data(args()); }), HasSubstr("labels.npy: cannot open file"));
}

TEST(BundledArrays, LoadByNameWithTheirSplits) {
  DataArgs mnist;
  mnist.data = "mnist1d";
  mnist.val_fraction = 0.1;
  const SplitData m = load_split_data(mnist);
  EXPECT_THAT(m.all.sample_shape, ElementsAre(1, 40));
  EXPECT_EQ(m.split.train.size(), 3600u);
  EXPECT_EQ(m.split.validation.size(), 400u);
  EXPECT_EQ(m.split.test.size(), 1000u);
  EXPECT_EQ(m.split.test.front(), 4000);

  DataArgs digits;
  digits.data = "optdigits";
  const SplitData d = load_split_data(digits);
  EXPECT_THAT(d.all.sample_shape, ElementsAre(1, 8, 8));
  EXPECT_THAT(d.all.features.sizes(), ElementsAre(1797, 64));
  EXPECT_EQ(d.split.train.size() + d.split.validation.size() + d.split.test.size(), 1797u);

  // A table's sample shape is its feature count.
  DataArgs concrete;
  EXPECT_THAT(load_split_data(concrete).all.sample_shape, ElementsAre(8));
}

}  // namespace
}  // namespace packtrain::runtime
