// Array directories and .npz archives as data sets: the two layouts, the sample
// shape, the own train / test split through load_split_data, the bundled optdigits
// and mnist1d by name, and what is refused.
#include "packtrain/runtime/data/array_dataset.h"
#include "packtrain/runtime/data/fingerprint.h"
#include "packtrain/runtime/data/npy_file.h"
#include "packtrain/runtime/data/run_data.h"
#include "tests/runtime/data/data_error_message.h"
#include "tests/runtime/data/npy_bytes.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <zip.h>

#include <filesystem>
#include <map>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
namespace pt = packtrain::testing;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

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

// The same bytes in another sample shape are other data: a checkpoint's fingerprint
// catches (20, 2, 3) saved again as (20, 3, 2); one recorded before shapes were
// fingerprinted still matches the same rows.
TEST_F(ArrayDirectory, TheSampleShapeIsPartOfTheFingerprint) {
  write_pair("", 20);
  const DataArgs a = args();
  const SplitData before = load_split_data(a);
  std::vector<float> x;
  for (int64_t r = 0; r < 20; ++r) {
    for (int e = 0; e < 6; ++e) x.push_back(static_cast<float>(r * 10 + e));
  }
  write("features.npy", pt::npy("<f4", "(20, 3, 2)", pt::raw_bytes(x)));
  const SplitData after = load_split_data(a);
  ASSERT_TRUE(at::equal(before.all.features, after.all.features));  // the same values, row for row
  EXPECT_NE(before.fingerprint, after.fingerprint);
  RunDescription run;
  run.data = a;
  run.data_fingerprint = fingerprint_hex(before.fingerprint);
  EXPECT_THAT(error_of([&] { check_same_data(run, after, "train anew"); }),
              HasSubstr("the data, its sample shape or its split changed"));
  run.data_fingerprint = fingerprint_hex(fingerprint(before, /*with_shape=*/false));
  EXPECT_TRUE(check_same_data(run, before, "train anew"));
}

// --split numbers a UCI directory's standard splits: given for rows split by
// fractions it would be silently ignored, so it is refused.
TEST_F(ArrayDirectory, ANumberedSplitOfRowsSplitByFractionsIsRefused) {
  write_pair("", 20);
  DataArgs a = args();
  a.split = 3;
  EXPECT_THAT(error_of([&] { load_split_data(a); }),
              HasSubstr("--split 3: only a UCI-format directory has numbered splits"));
}

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
              HasSubstr(": test samples of shape (6), training samples of shape (2, 3)"));
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

// An .npz archive written with libzip as np.savez (stored) or np.savez_compressed
// (deflated) writes one: a NAME.npy member per array.
class NpzArchive : public ArrayDirectory {
 protected:
  std::string archive(const std::vector<std::pair<std::string, std::string>>& members, bool deflate = true) {
    const fs::path file = dir_ / "arrays.npz";
    int code = 0;
    zip_t* zip = zip_open(file.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &code);
    EXPECT_NE(zip, nullptr) << code;
    for (const auto& [name, bytes] : members) {
      zip_source_t* source = zip_source_buffer(zip, bytes.data(), bytes.size(), 0);
      const zip_int64_t index = zip_file_add(zip, name.c_str(), source, ZIP_FL_OVERWRITE);
      EXPECT_GE(index, 0) << zip_strerror(zip);
      zip_set_file_compression(zip, static_cast<zip_uint64_t>(index), deflate ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0);
    }
    EXPECT_EQ(zip_close(zip), 0);
    return file.string();
  }
  DataArgs npz_args(const std::string& file) const {
    DataArgs a;
    a.data = file;
    return a;
  }
  const std::string features_ =
      pt::npy("<f4", "(4, 1, 3)", pt::raw_bytes(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  const std::string labels_ = pt::npy("<i8", "(4,)", pt::raw_bytes(std::vector<int64_t>{0, 1, 0, 1}));
};

TEST_F(NpzArchive, StoredOrDeflatedMembersLoadLikeADirectory) {
  for (const bool deflate : {false, true}) {
    const std::string file = archive({{"features.npy", features_}, {"labels.npy", labels_}}, deflate);
    const std::map<std::string, NpyArray> arrays = read_npz(file);
    ASSERT_EQ(arrays.size(), 2u);
    EXPECT_THAT(arrays.at("features").shape, ElementsAre(4, 1, 3));
    DataArgs a = npz_args(file);
    a.val_fraction = 0;
    a.test_fraction = 0.25;
    const SplitData data = load_split_data(a);
    EXPECT_EQ(data.all.name, "arrays");
    EXPECT_THAT(data.all.sample_shape, ElementsAre(1, 3));
    EXPECT_EQ(data.all.features[3][2].item<double>(), 11);
    EXPECT_EQ(data.split.test.size(), 1u);
  }
  // train_ and test_ arrays: its own split
  const std::string file = archive({{"train_features.npy", features_},
                                    {"train_labels.npy", labels_},
                                    {"test_features.npy", features_},
                                    {"test_labels.npy", labels_}});
  DataArgs a = npz_args(file);
  a.val_fraction = 0;
  const SplitData data = load_split_data(a);
  EXPECT_EQ(data.split.train.size(), 4u);
  EXPECT_EQ(data.split.test.size(), 4u);
}

TEST_F(NpzArchive, RefusalsNameTheArchiveAndTheMember) {
  const std::string truncated = pt::npy("<f4", "(4, 1, 3)", pt::raw_bytes(std::vector<float>{0, 1}));
  const std::string bad = archive({{"features.npy", truncated}, {"labels.npy", labels_}});
  EXPECT_THAT(error_of([&] { load_split_data(npz_args(bad)); }),
              HasSubstr("arrays.npz[features.npy]: truncated: shape (4, 1, 3) of <f4 needs 48 data bytes"));
  const std::string no_labels = archive({{"features.npy", features_}});
  EXPECT_THAT(error_of([&] { load_split_data(npz_args(no_labels)); }),
              HasSubstr("arrays.npz: no array 'labels' (it holds: features)"));
  const std::string other = archive({{"features.npy", features_}, {"notes.txt", "hello"}});
  EXPECT_THAT(error_of([&] { read_npz(other); }), HasSubstr("arrays.npz: member 'notes.txt' is not a .npy array"));
  const std::string mismatch =
      archive({{"features.npy", features_},
               {"labels.npy", pt::npy("<i8", "(3,)", pt::raw_bytes(std::vector<int64_t>{0, 1, 2}))}});
  EXPECT_THAT(error_of([&] { load_split_data(npz_args(mismatch)); }),
              HasSubstr("arrays.npz[labels.npy]: 3 labels for the 4 rows of"));
  packtrain::testing::write_bytes(dir_ / "plain.npz", "not a zip archive");
  EXPECT_THAT(error_of([&] { read_npz(dir_ / "plain.npz"); }),
              HasSubstr("plain.npz: not a readable .npz (zip) archive: Not a zip archive"));
  DataArgs with_target = npz_args(archive({{"features.npy", features_}, {"labels.npy", labels_}}));
  with_target.target = "1";
  EXPECT_THAT(error_of([&] { load_split_data(with_target); }),
              HasSubstr("an .npz archive's features and labels are its arrays"));
}

// Archives written by hand to lie: two members of one name (NumPy keeps the last, a
// reader of the first would train on other data), and a directory entry whose size
// is not the member's.
TEST_F(NpzArchive, TwoMembersOfOneNameAndALyingSizeAreRefused) {
  const std::string other = pt::npy("<f4", "(4, 1, 3)", pt::raw_bytes(std::vector<float>(12, 7.0f)));
  const std::string file = archive({{"features.npy", features_}, {"featurez.npy", other}, {"labels.npy", labels_}});
  std::string bytes = pt::read_bytes(file);
  for (size_t at = bytes.find("featurez.npy"); at != std::string::npos; at = bytes.find("featurez.npy", at)) {
    bytes[at + 7] = 's';  // both the local header's name and the central directory's
  }
  pt::write_bytes(file, bytes);
  EXPECT_THAT(error_of([&] { read_npz(file); }),
              HasSubstr("arrays.npz: the archive holds two members named 'features.npy'"));

  const std::string stored = archive({{"features.npy", features_}, {"labels.npy", labels_}}, /*deflate=*/false);
  std::string lying = pt::read_bytes(stored);
  // labels.npy's uncompressed size (+16) in its central directory record (PK\1\2; the
  // size at byte 24) and its local header (PK\3\4; at byte 22).
  const size_t central = lying.rfind("labels.npy", lying.size()) - 46, local = lying.find("labels.npy") - 30;
  ASSERT_EQ(lying.substr(central, 4), std::string("PK\1\2"));
  ASSERT_EQ(lying.substr(local, 4), std::string("PK\3\4"));
  for (const size_t field : {central + 24, local + 22}) lying[field] = static_cast<char>(lying[field] + 16);
  pt::write_bytes(stored, lying);
  const std::string error = error_of([&] { read_npz(stored); });
  EXPECT_THAT(error, AllOf(HasSubstr("arrays.npz"), Not(HasSubstr("No error")))) << error;
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
