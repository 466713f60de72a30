// Splits (seeded, carved, read from index files, checked) and the data set entry
// point: bundled names, UCI directories, table files and their column choices.
#include "packtrain/runtime/data/data_split.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/dataset.h"
#include "packtrain/runtime/data/uci_dataset.h"
#include "tests/runtime/data/data_error_message.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Files in a fresh directory per test. Cleaned up file by file: libtorch.so
// exports a broken std::filesystem::remove_all that interposes on libstdc++'s.
class TempFiles : public ::testing::Test {
 protected:
  fs::path write(const std::string& name, const std::string& text) {
    const fs::path file = dir_ / name;
    std::ofstream(file, std::ios::binary) << text;
    return file;
  }
  packtrain::testing::ScopedTempDir temp_{"packtrain_split"};
  const fs::path dir_ = temp_.path();
};

// A spec with the other fields at their defaults (designated initializers that
// leave fields out trip -Wmissing-field-initializers).
DatasetSpec spec(std::string path, std::vector<std::string> features = {}, std::string target = "",
                 HeaderMode header = HeaderMode::kDetect) {
  DatasetSpec out;
  out.path = std::move(path);
  out.features = std::move(features);
  out.target = std::move(target);
  out.format.header = header;
  return out;
}

bool is_sorted_set(const std::vector<int64_t>& v) {
  return std::adjacent_find(v.begin(), v.end(), std::greater_equal<>()) == v.end();
}

// --- split_by_fractions -------------------------------------------------------

TEST(SplitByFractions, SizesDisjointSortedAndCovering) {
  const DataSplit split = split_by_fractions(100, 0.1, 0.2, 7);
  EXPECT_EQ(split.train.size(), 70u);
  EXPECT_EQ(split.validation.size(), 10u);
  EXPECT_EQ(split.test.size(), 20u);
  EXPECT_NO_THROW(check_split(split, 100));
  std::set<int64_t> all(split.train.begin(), split.train.end());
  all.insert(split.validation.begin(), split.validation.end());
  all.insert(split.test.begin(), split.test.end());
  EXPECT_EQ(all.size(), 100u);
  EXPECT_EQ(*all.begin(), 0);
  EXPECT_EQ(*all.rbegin(), 99);
  EXPECT_TRUE(is_sorted_set(split.train) && is_sorted_set(split.validation) && is_sorted_set(split.test));
}

TEST(SplitByFractions, RoundsAndKeepsAtLeastOneRow) {
  const DataSplit rounded = split_by_fractions(1030, 0.1, 0.1, 0);  // 103 each
  EXPECT_EQ(rounded.test.size(), 103u);
  EXPECT_EQ(rounded.validation.size(), 103u);
  const DataSplit tiny = split_by_fractions(10, 0.01, 0.01, 0);  // 0.1 rows round up to 1
  EXPECT_EQ(tiny.test.size(), 1u);
  EXPECT_EQ(tiny.validation.size(), 1u);
  EXPECT_EQ(tiny.train.size(), 8u);
  const DataSplit none = split_by_fractions(10, 0.0, 0.3, 0);
  EXPECT_TRUE(none.validation.empty());
  EXPECT_EQ(none.test.size(), 3u);
}

TEST(SplitByFractions, SameSeedSameSplitOtherSeedOther) {
  const DataSplit a = split_by_fractions(200, 0.1, 0.2, 42);
  const DataSplit b = split_by_fractions(200, 0.1, 0.2, 42);
  const DataSplit c = split_by_fractions(200, 0.1, 0.2, 43);
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.validation, b.validation);
  EXPECT_EQ(a.test, b.test);
  EXPECT_NE(a.test, c.test);
  EXPECT_NE(a.validation, c.validation);
}

TEST(SplitByFractions, DoesNotTouchTorchsGenerator) {
  at::manual_seed(5);
  const double expected = at::rand({1}, at::kDouble).item<double>();
  at::manual_seed(5);
  split_by_fractions(50, 0.2, 0.2, 1);
  EXPECT_EQ(at::rand({1}, at::kDouble).item<double>(), expected);
}

TEST(SplitByFractions, RejectsBadFractions) {
  EXPECT_THAT(error_of([] { split_by_fractions(100, -0.1, 0.2, 0); }),
              HasSubstr("validation fraction -0.1 is outside [0, 1)"));
  EXPECT_THAT(error_of([] { split_by_fractions(100, 0.1, 1.0, 0); }), HasSubstr("test fraction 1 is outside [0, 1)"));
  EXPECT_THAT(error_of([] { split_by_fractions(100, 0.1, NAN, 0); }), HasSubstr("test fraction nan is outside [0, 1)"));
  EXPECT_THAT(error_of([] { split_by_fractions(100, 0.5, 0.5, 0); }), HasSubstr("sum to 1 or more"));
  // Fractions fine, but rounding up to one row each leaves nothing to train on.
  EXPECT_THAT(error_of([] { split_by_fractions(2, 0.3, 0.3, 0); }),
              HasSubstr("2 rows leave no training rows after 1 validation and 1 test rows"));
}

// --- carve_validation ---------------------------------------------------------

TEST(CarveValidation, MovesASeededFractionOfTrain) {
  DataSplit split;
  for (int64_t r = 0; r < 100; ++r) (r % 10 == 0 ? split.test : split.train).push_back(r);  // 90 train, 10 test
  const std::vector<int64_t> original_train = split.train;
  DataSplit again = split;
  carve_validation(split, 0.1, 3);
  EXPECT_EQ(split.validation.size(), 9u);
  EXPECT_EQ(split.train.size(), 81u);
  EXPECT_EQ(split.test.size(), 10u);
  EXPECT_TRUE(is_sorted_set(split.train) && is_sorted_set(split.validation));
  EXPECT_NO_THROW(check_split(split, 100));
  std::vector<int64_t> rejoined = split.train;
  rejoined.insert(rejoined.end(), split.validation.begin(), split.validation.end());
  std::sort(rejoined.begin(), rejoined.end());
  EXPECT_EQ(rejoined, original_train);  // validation came out of train, test untouched

  carve_validation(again, 0.1, 3);
  EXPECT_EQ(again.validation, split.validation);
  DataSplit other = DataSplit{original_train, {}, {}};
  carve_validation(other, 0.1, 4);
  EXPECT_NE(other.validation, split.validation);
}

TEST(CarveValidation, ZeroFractionIsANoOpAndEmptyingTrainIsAnError) {
  DataSplit split{{1, 2, 3}, {}, {0}};
  carve_validation(split, 0.0, 0);
  EXPECT_THAT(split.train, ElementsAre(1, 2, 3));
  EXPECT_TRUE(split.validation.empty());
  DataSplit single{{5}, {}, {0}};
  EXPECT_THAT(error_of([&] { carve_validation(single, 0.1, 0); }),
              HasSubstr("of 1 training rows leaves none to train on"));
}

// --- check_split --------------------------------------------------------------

TEST(CheckSplit, NamesOverlapsDuplicatesAndRange) {
  EXPECT_THAT(error_of([] {
                check_split({{0, 1, 3}, {}, {2, 3}}, 5);
              }),
              HasSubstr("split: row 3 is in both train and test"));
  EXPECT_THAT(error_of([] { check_split({{0}, {1, 4}, {4}}, 5); }), HasSubstr("row 4 is in both validation and test"));
  EXPECT_THAT(error_of([] { check_split({{0, 2, 2}, {}, {}}, 5); }), HasSubstr("row 2 appears twice in train"));
  EXPECT_THAT(error_of([] { check_split({{0, 5}, {}, {}}, 5); }), HasSubstr("train row 5 is out of range [0, 5)"));
  EXPECT_THAT(error_of([] {
                check_split({{0}, {}, {-1}}, 5, "x.csv");
              }),
              HasSubstr("x.csv: test row -1 is out of range"));
}

// --- read_index_file ----------------------------------------------------------

TEST_F(TempFiles, ReadIndexFileReadsWhitespaceSeparatedIntegers) {
  EXPECT_THAT(read_index_file(write("i.txt", "3 1\n\n  2\t0\n"), 4), ElementsAre(3, 1, 2, 0));
}

TEST_F(TempFiles, ReadIndexFileErrorsNameFileAndEntry) {
  EXPECT_THAT(error_of([&] { read_index_file(write("i.txt", "0\n1\n4\n"), 4); }),
              HasSubstr("i.txt: index 4.000000 (entry 3) is not an integer in [0, 4)"));
  EXPECT_THAT(error_of([&] { read_index_file(write("i.txt", "-1\n"), 4); }),
              HasSubstr("(entry 1) is not an integer in [0, 4)"));
  EXPECT_THAT(error_of([&] { read_index_file(write("i.txt", "1 2.5\n"), 4); }), HasSubstr("index 2.500000 (entry 2)"));
  EXPECT_THAT(error_of([&] { read_index_file(write("i.txt", "1\nx\n"), 4); }), HasSubstr("i.txt: index 'x' (entry 2)"));
  EXPECT_THAT(error_of([&] { read_index_file(write("i.txt", "\n"), 4); }), HasSubstr("i.txt: empty file"));
  EXPECT_THAT(error_of([&] { read_index_file(dir_ / "absent.txt", 4); }), HasSubstr("absent.txt: cannot open file"));
}

// --- load_dataset and uci_split -----------------------------------------------

TEST(LoadDataset, BundledNameLoadsConcrete) {
  const Dataset data = load_dataset(spec("concrete"));
  EXPECT_EQ(data.name, "concrete");
  EXPECT_EQ(data.source, bundled_data_dir() / "concrete");
  EXPECT_EQ(data.features.sizes(), (c10::IntArrayRef{1030, 8}));
  EXPECT_EQ(data.targets.sizes(), (c10::IntArrayRef{1030, 1}));
  EXPECT_THAT(data.feature_names, ElementsAre("0", "1", "2", "3", "4", "5", "6", "7"));
  EXPECT_EQ(data.target_name, "8");
  EXPECT_EQ(data.uci_splits, 20);
}

TEST(LoadDataset, UciDirectoryMatchesLoadUci) {
  const fs::path dir = bundled_data_dir() / "yacht";
  const Dataset data = load_dataset(spec(dir.string() + "/"));  // a trailing slash still names it "yacht"
  const RegressionData uci = load_uci(dir);
  EXPECT_EQ(data.name, "yacht");
  EXPECT_TRUE(packtrain::testing::all_equal(data.features, uci.features));
  EXPECT_TRUE(packtrain::testing::all_equal(data.targets, uci.targets));
}

TEST(LoadDataset, WineQualityIsBundledWithIntegerScores) {
  const Dataset data = load_dataset(spec("wine-quality-red"));
  EXPECT_EQ(data.features.sizes(), (c10::IntArrayRef{1599, 11}));
  EXPECT_EQ(data.targets.min().item<double>(), 3.0);
  EXPECT_EQ(data.targets.max().item<double>(), 8.0);
  EXPECT_TRUE(at::equal(data.targets, data.targets.round()));
  const DataSplit split = uci_split(data, 0);
  EXPECT_EQ(split.train.size(), 1439u);
  EXPECT_EQ(split.test.size(), 160u);
}

TEST(LoadDataset, UnknownNameListsTheBundledSets) {
  const std::string error = error_of([] { load_dataset(spec("concret")); });
  EXPECT_THAT(error, HasSubstr("concret: no such file or directory, nor a bundled data set"));
  EXPECT_THAT(
      error,
      HasSubstr("bostonHousing, concrete, energy, kin8nm, mnist1d, naval-propulsion-plant, optdigits, power-plant, "
                "protein-tertiary-structure, wine-quality-red, yacht"));
  EXPECT_THAT(error_of([] { load_dataset(DatasetSpec{}); }), HasSubstr("no data set given"));
}

TEST(LoadDataset, UciDirectoryRejectsColumnChoices) {
  EXPECT_THAT(error_of([] { load_dataset(spec("concrete", {}, "8")); }),
              HasSubstr("concrete: a UCI-format directory takes its columns from index_features.txt"));
}

TEST(UciSplit, MatchesTheIndexFilesAndChecksRange) {
  const Dataset data = load_dataset(spec("concrete"));
  const DataSplit split = uci_split(data, 3);
  const SplitIndices files = load_uci_split(data.source, 3, 1030);
  EXPECT_EQ(split.train, files.train);
  EXPECT_EQ(split.test, files.test);
  EXPECT_TRUE(split.validation.empty());
  EXPECT_EQ(split.train.size(), 927u);
  EXPECT_NO_THROW(check_split(split, 1030));
  EXPECT_THAT(error_of([&] { uci_split(data, 20); }),
              HasSubstr("split 20 out of range: the data set has splits 0..19"));
  EXPECT_THAT(error_of([&] { uci_split(data, -1); }), HasSubstr("split -1 out of range"));
}

TEST(Subset, SelectsRowsKeepsNamesDropsStandardSplits) {
  const Dataset data = load_dataset(spec("yacht"));
  const Dataset part = subset(data, {5, 0, 7});
  EXPECT_EQ(part.features.size(0), 3);
  EXPECT_TRUE(packtrain::testing::all_equal(part.features[0], data.features[5]));
  EXPECT_TRUE(packtrain::testing::all_equal(part.targets[2], data.targets[7]));
  EXPECT_EQ(part.feature_names, data.feature_names);
  EXPECT_FALSE(part.uci_splits.has_value());
}

class TableDataset : public TempFiles {
 protected:
  fs::path csv() {
    return write("wine.csv", "alcohol,acidity,\"sugar, g/l\",quality\n9.4,0.7,1.9,5\n9.8,0.88,2.6,6\n");
  }
  Dataset load(std::vector<std::string> features, std::string target = "") {
    return load_dataset(spec(csv().string(), std::move(features), std::move(target)));
  }
};

TEST_F(TableDataset, DefaultsToLastColumnAsTargetAndTheRestAsFeatures) {
  const Dataset data = load({});
  EXPECT_EQ(data.name, "wine");
  EXPECT_EQ(data.source, dir_ / "wine.csv");
  EXPECT_THAT(data.feature_names, ElementsAre("alcohol", "acidity", "sugar, g/l"));
  EXPECT_EQ(data.target_name, "quality");
  EXPECT_TRUE(packtrain::testing::all_equal(data.targets, at::tensor({5.0, 6.0}, at::kDouble).view({2, 1})));
  EXPECT_EQ(data.features[1][2].item<double>(), 2.6);
  EXPECT_FALSE(data.uci_splits.has_value());
  EXPECT_THAT(error_of([&] { uci_split(data, 0); }), HasSubstr("wine.csv: no standard splits"));
}

TEST_F(TableDataset, ColumnsByNameIndexAndNegativeIndex) {
  const Dataset data = load({"sugar, g/l", "0"}, "-1");
  EXPECT_THAT(data.feature_names, ElementsAre("sugar, g/l", "alcohol"));
  EXPECT_TRUE(packtrain::testing::all_equal(data.features, at::tensor({1.9, 9.4, 2.6, 9.8}, at::kDouble).view({2, 2})));
  const Dataset by_index = load({"-4"}, "1");  // alcohol predicts acidity
  EXPECT_EQ(by_index.target_name, "acidity");
  EXPECT_THAT(by_index.feature_names, ElementsAre("alcohol"));
  // Without a target named, every column but the last is a feature.
  const Dataset target_first = load({}, "alcohol");
  EXPECT_THAT(target_first.feature_names, ElementsAre("acidity", "sugar, g/l", "quality"));
}

TEST_F(TableDataset, ColumnChoiceErrors) {
  EXPECT_THAT(error_of([&] {
                load({"alcohol", "quality"});
              }),
              HasSubstr("wine.csv: column 'quality' is both the target and a feature"));
  EXPECT_THAT(error_of([&] { load({"alcohol", "0"}); }), HasSubstr("column 'alcohol' is chosen twice as a feature"));
  EXPECT_THAT(error_of([&] { load({"sugar"}); }),
              HasSubstr("wine.csv: unknown column 'sugar' (columns: alcohol, acidity, sugar, g/l, quality)"));
  EXPECT_THAT(error_of([&] { load({}, "9"); }), HasSubstr("wine.csv: column index 9 out of range"));
  const fs::path one = write("one.csv", "y\n1\n2\n");
  EXPECT_THAT(error_of([&] { load_dataset(spec(one.string())); }),
              HasSubstr("one.csv: the only column, 'y', is the target"));
}

TEST_F(TableDataset, BadCellsAndFormatOptionsReachTheUser) {
  const fs::path bad = write("bad.tsv", "x\ty\n1\t2\n3\tNA\n");
  EXPECT_THAT(error_of([&] { load_dataset(spec(bad.string())); }),
              HasSubstr("bad.tsv:3:2: non-numeric cell 'NA' in column 'y'"));
  // Forced header-less reading of a headed file: the header row is data and fails to parse.
  EXPECT_THAT(error_of([&] { load_dataset(spec(bad.string(), {}, "", HeaderMode::kNo)); }),
              HasSubstr("bad.tsv:1:1: non-numeric cell 'x' in column '0'"));
}

TEST_F(TableDataset, APathIsNeverABundledName) {
  EXPECT_THAT(error_of([] { load_dataset(spec("no_such_dir/concrete")); }),
              HasSubstr("no_such_dir/concrete: no such file or directory"));
}

TEST_F(TempFiles, DirectoryWithoutDataTxtIsNotADataSet) {
  EXPECT_THAT(error_of([&] { load_dataset(spec(dir_.string())); }),
              HasSubstr(dir_.string() + ": not a UCI-format data set directory (no data.txt)"));
}

TEST_F(TempFiles, DataDirEnvironmentVariableWins) {
  const char* old = std::getenv("PACKTRAIN_DATA_DIR");
  const std::string saved = old ? old : "";
  ::setenv("PACKTRAIN_DATA_DIR", dir_.c_str(), 1);
  EXPECT_EQ(bundled_data_dir(), dir_);
  EXPECT_THAT(error_of([] { load_dataset(spec("concrete")); }), HasSubstr("bundled in " + dir_.string() + ": none"));
  if (old)
    ::setenv("PACKTRAIN_DATA_DIR", saved.c_str(), 1);
  else
    ::unsetenv("PACKTRAIN_DATA_DIR");
}

}  // namespace
}  // namespace packtrain::runtime
