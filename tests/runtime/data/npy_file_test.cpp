// The .npy reader: the dtypes and header forms it reads, features flattened in C
// order with their sample shape, labels as class indices, every error it reports
// (each naming the file), and the bundled optdigits and mnist1d arrays.
#include "packtrain/runtime/data/npy_file.h"
#include "packtrain/runtime/data/dataset.h"
#include "tests/runtime/data/data_error_message.h"
#include "tests/runtime/data/npy_bytes.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include <cmath>
#include <filesystem>
#include <limits>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
using packtrain::testing::npy;
using packtrain::testing::npy_with_dictionary;
using packtrain::testing::raw_bytes;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class NpyFile : public ::testing::Test {
 protected:
  fs::path write(const std::string& name, const std::string& bytes) {
    return packtrain::testing::write_bytes(dir_ / name, bytes);
  }
  std::string read_error(const std::string& bytes) {
    const fs::path file = write("a.npy", bytes);
    return error_of([&] { read_npy(file); });
  }
  // Features (2, 3) float32 0..5 and the given labels file bytes.
  std::string pair_error(const std::string& features, const std::string& labels) {
    const fs::path f = write("features.npy", features), l = write("labels.npy", labels);
    return error_of([&] { read_npy_features_and_labels(f, l); });
  }
  const std::string six_floats_ = npy("<f4", "(2, 3)", raw_bytes(std::vector<float>{0, 1, 2, 3, 4, 5}));
  packtrain::testing::ScopedTempDir temp_{"packtrain_npy"};
  const fs::path dir_ = temp_.path();
};

TEST_F(NpyFile, ReadsImagesFlattenedInCOrderWithTheirSampleShape) {
  std::vector<float> pixels(2 * 1 * 2 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = 0.5f * static_cast<float>(i);
  const fs::path f = write("features.npy", npy("<f4", "(2, 1, 2, 3)", raw_bytes(pixels)));
  const fs::path l = write("labels.npy", npy("<i8", "(2,)", raw_bytes(std::vector<int64_t>{3, 7})));
  const NpyFeaturesAndLabels data = read_npy_features_and_labels(f, l);
  EXPECT_THAT(data.sample_shape, ElementsAre(1, 2, 3));
  EXPECT_TRUE(packtrain::testing::all_equal(data.features, at::arange(12, at::kDouble).mul(0.5).reshape({2, 6})));
  EXPECT_EQ(data.labels.scalar_type(), at::kLong);
  EXPECT_TRUE(packtrain::testing::all_equal(data.labels, at::tensor({int64_t{3}, int64_t{7}})));
}

TEST_F(NpyFile, ReadsEveryAcceptedDtype) {
  const at::Tensor expected = at::tensor({0.0, 1.0, 250.0}, at::kDouble);
  const std::vector<std::pair<std::string, std::string>> files{
      {"<f4", raw_bytes(std::vector<float>{0, 1, 250})},   {"<f8", raw_bytes(std::vector<double>{0, 1, 250})},
      {"<i8", raw_bytes(std::vector<int64_t>{0, 1, 250})}, {"<i4", raw_bytes(std::vector<int32_t>{0, 1, 250})},
      {"|u1", raw_bytes(std::vector<uint8_t>{0, 1, 250})}, {"<u1", raw_bytes(std::vector<uint8_t>{0, 1, 250})}};
  for (const auto& [descr, data] : files) {
    const NpyArray a = read_npy(write("a.npy", npy(descr, "(3,)", data)));
    EXPECT_THAT(a.shape, ElementsAre(3)) << descr;
    EXPECT_TRUE(packtrain::testing::all_equal(a.values, expected)) << descr;
  }
}

TEST_F(NpyFile, ReadsVersion2And3HeadersAnyKeyOrderAndEitherQuote) {
  const std::string data = raw_bytes(std::vector<double>{1.5, -2});
  EXPECT_THAT(read_npy(write("a.npy", npy("<f8", "(2,)", data, 2))).shape, ElementsAre(2));
  EXPECT_THAT(read_npy(write("a.npy", npy("<f8", "(1, 2)", data, 3))).shape, ElementsAre(1, 2));
  const NpyArray a = read_npy(
      write("a.npy", npy_with_dictionary("{\"shape\": (2,1), \"fortran_order\": False, \"descr\": \"<f8\"}", data)));
  EXPECT_THAT(a.shape, ElementsAre(2, 1));
  EXPECT_TRUE(packtrain::testing::all_equal(a.values, at::tensor({1.5, -2.0}, at::kDouble).reshape({2, 1})));
}

TEST_F(NpyFile, EmptyArrayReadsWithItsShape) {
  EXPECT_THAT(read_npy(write("a.npy", npy("<f4", "(0, 5)", ""))).shape, ElementsAre(0, 5));
}

TEST_F(NpyFile, MalformedHeadersAreNamed) {
  const std::string data = raw_bytes(std::vector<float>{1});
  EXPECT_THAT(read_error("not a numpy file at all"),
              AllOf(HasSubstr("a.npy: not a .npy file"), HasSubstr("\\x93NUMPY")));
  std::string version4 = npy("<f4", "(1,)", data);
  version4[6] = 4;
  EXPECT_THAT(read_error(version4), HasSubstr("a.npy: .npy format version 4.0 is not read"));
  std::string long_header = npy("<f4", "(1,)", data);
  long_header[8] = '\xff';
  long_header[9] = '\x7f';
  EXPECT_THAT(read_error(long_header), HasSubstr("a.npy: truncated .npy header: it says 32767 bytes"));
  EXPECT_THAT(read_error(npy_with_dictionary("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", data)),
              AllOf(HasSubstr("a.npy: malformed .npy header: expected '}'"), HasSubstr("(header: {'descr'")));
  EXPECT_THAT(read_error(npy_with_dictionary("{'descr': '<f4', 'fortran_order': False}", data)),
              HasSubstr("a.npy: malformed .npy header: no 'shape' key"));
  EXPECT_THAT(read_error(npy_with_dictionary("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", data)),
              HasSubstr("malformed .npy header: expected True or False"));
  EXPECT_THAT(read_error(npy_with_dictionary("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", data)),
              HasSubstr("malformed .npy header: unknown key 'x'"));
  EXPECT_THAT(read_error(npy("<f4", "(-1,)", data)), HasSubstr("malformed .npy header: expected a dimension"));
  EXPECT_THAT(read_error(npy("<f4", "(1.5,)", data)), HasSubstr("malformed .npy header: expected ')'"));
  EXPECT_THAT(read_error(npy_with_dictionary("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", data)),
              HasSubstr("malformed .npy header: text after the closing '}'"));
  // A header's control bytes (a newline, a terminal escape) are quoted, never echoed raw.
  const std::string hostile = read_error(
      npy_with_dictionary("{'descr': '<f4',\n\x1b[31m 'fortran_order': False, 'shape': (1,)} \x1b]0;x\x07", data));
  EXPECT_THAT(hostile, AllOf(HasSubstr("\\x1b[31m"), HasSubstr("\\x0a"), HasSubstr("\\x07")));
  EXPECT_EQ(hostile.find_first_of("\n\x1b\x07"), std::string::npos) << hostile;
}

TEST_F(NpyFile, UnsupportedLayoutsAndDtypesSayWhatIsRead) {
  const std::string data = raw_bytes(std::vector<float>{1, 2});
  EXPECT_THAT(read_error(npy_with_dictionary("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 1), }", data)),
              AllOf(HasSubstr("a.npy: the array is in Fortran order"), HasSubstr("np.ascontiguousarray")));
  EXPECT_THAT(read_error(npy(">f4", "(2,)", data)),
              AllOf(HasSubstr("a.npy: dtype '>f4' is not read"), HasSubstr("big-endian"), HasSubstr("'<f4'")));
  EXPECT_THAT(read_error(npy("<f2", "(4,)", data)), HasSubstr("a.npy: dtype '<f2' is not read (float32 '<f4'"));
  EXPECT_THAT(read_error(npy("|O", "(2,)", data)), HasSubstr("a.npy: dtype '|O' is not read"));
  EXPECT_THAT(read_error(npy_with_dictionary("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", data)),
              HasSubstr("a.npy: a structured dtype"));
}

TEST_F(NpyFile, TruncatedAndTrailingDataAreNamedWithTheCounts) {
  const std::string five = raw_bytes(std::vector<float>{1, 2, 3, 4, 5});
  EXPECT_THAT(read_error(npy("<f4", "(2, 3)", five)),
              HasSubstr("a.npy: truncated: shape (2, 3) of <f4 needs 24 data bytes, the file has 20"));
  EXPECT_THAT(
      read_error(npy("<f4", "(2, 2)", five)),
      HasSubstr("a.npy: bytes left over after the array: shape (2, 2) of <f4 needs 16 data bytes, the file has 20"));
  // A shape whose byte count overflows 64 bits is truncated, not a wrapped-around match.
  EXPECT_THAT(
      read_error(npy("<f8", "(4294967296, 4294967296, 16)", five)),
      HasSubstr("a.npy: truncated: shape (4294967296, 4294967296, 16) of <f8 needs more than the 20 data bytes"));
}

TEST_F(NpyFile, NonFiniteOrHugeFeaturesAreNamedByRowAndElement) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::string labels = npy("<i8", "(2,)", raw_bytes(std::vector<int64_t>{0, 1}));
  EXPECT_THAT(pair_error(npy("<f4", "(2, 3)", raw_bytes(std::vector<float>{0, 1, 2, 3, 4, nan})), labels),
              HasSubstr("features.npy: row 1, element 2 of 3: value nan is not finite"));
  EXPECT_THAT(pair_error(npy("<f4", "(2, 3)", raw_bytes(std::vector<float>{0, -inf, 2, 3, 4, 5})), labels),
              HasSubstr("features.npy: row 0, element 1 of 3: value -inf is not finite"));
  EXPECT_THAT(pair_error(npy("<f8", "(2, 1)", raw_bytes(std::vector<double>{1e300, 0})), labels),
              HasSubstr("features.npy: row 0, element 0 of 1: value 1e+300 is beyond float32's range"));
}

TEST_F(NpyFile, LabelsMustBeOneClassIndexPerRow) {
  EXPECT_THAT(pair_error(six_floats_, npy("<i8", "(2,)", raw_bytes(std::vector<int64_t>{0, -1}))),
              HasSubstr("labels.npy: row 1: label -1 is out of range (class indices are 0 to 16777216)"));
  EXPECT_THAT(pair_error(six_floats_, npy("<i8", "(2,)", raw_bytes(std::vector<int64_t>{int64_t{1} << 25, 0}))),
              HasSubstr("labels.npy: row 0: label 33554432 is out of range"));
  EXPECT_THAT(pair_error(six_floats_, npy("<f4", "(2,)", raw_bytes(std::vector<float>{1, 2.5f}))),
              HasSubstr("labels.npy: row 1: label 2.5 is not a whole number"));
  EXPECT_THAT(pair_error(six_floats_, npy("<f8", "(2,)", raw_bytes(std::vector<double>{NAN, 0}))),
              HasSubstr("labels.npy: row 0: label nan is not a whole number"));
  EXPECT_THAT(
      pair_error(six_floats_, npy("<i8", "(2, 1)", raw_bytes(std::vector<int64_t>{0, 1}))),
      AllOf(HasSubstr("labels.npy: labels of shape (2, 1): expected one dimension"), HasSubstr("labels.reshape(-1)")));
  EXPECT_THAT(pair_error(six_floats_, npy("<i8", "(3,)", raw_bytes(std::vector<int64_t>{0, 1, 2}))),
              AllOf(HasSubstr("labels.npy: 3 labels for the 2 rows of"), HasSubstr("features.npy")));
  // Whole numbers in any accepted dtype are labels.
  const NpyFeaturesAndLabels ok = [&] {
    const fs::path f = write("features.npy", six_floats_);
    const fs::path l = write("labels.npy", npy("|u1", "(2,)", raw_bytes(std::vector<uint8_t>{9, 4})));
    return read_npy_features_and_labels(f, l);
  }();
  EXPECT_TRUE(packtrain::testing::all_equal(ok.labels, at::tensor({int64_t{9}, int64_t{4}})));
}

TEST_F(NpyFile, FeaturesNeedRowsAndAtLeastOneMoreAxis) {
  const std::string labels = npy("<i8", "(2,)", raw_bytes(std::vector<int64_t>{0, 1}));
  EXPECT_THAT(pair_error(npy("<f4", "(2,)", raw_bytes(std::vector<float>{0, 1})), labels),
              HasSubstr("features.npy: features of shape (2,): expected a row axis and at least one more"));
  EXPECT_THAT(pair_error(npy("<f4", "(0, 3)", ""), labels),
              HasSubstr("features.npy: features of shape (0, 3): no rows"));
  EXPECT_THAT(pair_error(npy("<f4", "(2, 0)", ""), labels),
              HasSubstr("features.npy: features of shape (2, 0): no elements in a sample"));
}

TEST_F(NpyFile, MissingOrNonRegularFilesAreRefusedLikeTables) {
  EXPECT_THAT(error_of([&] { read_npy(dir_ / "missing.npy"); }),
              AllOf(HasSubstr("missing.npy: cannot open file"), HasSubstr("a .npy file was expected")));
  EXPECT_THAT(error_of([&] { read_npy(dir_); }), HasSubstr("is a directory, not a .npy file"));
}

// The bundled arrays as numpy reports them: shapes from np.load(f).shape, label
// counts from np.bincount(np.load(f)) — computed once, with numpy 2.4.6, on the
// files scripts/make_image_sets.py wrote (data/optdigits/README.md and
// data/mnist1d/README.md list the same). Data facts, not results.
TEST(BundledArrays, ShapesAndLabelCountsAreNumpys) {
  const fs::path data = bundled_data_dir();
  const auto counts = [](const at::Tensor& labels) {
    const at::Tensor c = at::bincount(labels);
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  };
  const NpyFeaturesAndLabels digits =
      read_npy_features_and_labels(data / "optdigits" / "features.npy", data / "optdigits" / "labels.npy");
  EXPECT_THAT(digits.features.sizes(), ElementsAre(1797, 64));
  EXPECT_THAT(digits.sample_shape, ElementsAre(1, 8, 8));
  EXPECT_THAT(counts(digits.labels), ElementsAre(178, 182, 177, 183, 181, 182, 181, 179, 174, 180));
  // Grey levels 0..16, whole numbers.
  EXPECT_EQ(digits.features.min().item<double>(), 0);
  EXPECT_EQ(digits.features.max().item<double>(), 16);
  EXPECT_TRUE(digits.features.eq(digits.features.round()).all().item<bool>());

  const NpyFeaturesAndLabels train =
      read_npy_features_and_labels(data / "mnist1d" / "train_features.npy", data / "mnist1d" / "train_labels.npy");
  const NpyFeaturesAndLabels test =
      read_npy_features_and_labels(data / "mnist1d" / "test_features.npy", data / "mnist1d" / "test_labels.npy");
  EXPECT_THAT(train.features.sizes(), ElementsAre(4000, 40));
  EXPECT_THAT(train.sample_shape, ElementsAre(1, 40));
  EXPECT_THAT(test.features.sizes(), ElementsAre(1000, 40));
  EXPECT_THAT(counts(train.labels), ElementsAre(398, 396, 411, 394, 394, 402, 401, 404, 402, 398));
  EXPECT_THAT(counts(test.labels), ElementsAre(102, 104, 89, 106, 106, 98, 99, 96, 98, 102));
}

}  // namespace
}  // namespace packtrain::runtime
