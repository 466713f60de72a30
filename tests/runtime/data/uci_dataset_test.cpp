// The UCI reader on the bundled data and on broken files; the standardizer.
#include "packtrain/runtime/data/uci_dataset.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/dataset.h"
#include "packtrain/runtime/data/standardizer.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include <unistd.h>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path data_dir() {
  const char* env = std::getenv("PACKTRAIN_DATA_DIR");
  return env ? fs::path(env) : fs::path(PACKTRAIN_SOURCE_DATA_DIR);
}

TEST(UciDataset, LoadsBundledConcreteWithItsSplits) {
  const RegressionData data = load_uci(data_dir() / "concrete");
  EXPECT_EQ(data.features.sizes(), (c10::IntArrayRef{1030, 8}));
  EXPECT_EQ(data.targets.sizes(), (c10::IntArrayRef{1030, 1}));
  // Compressive strength in MPa lies in [2.33, 82.6] (data/README.md).
  EXPECT_NEAR(data.targets.min().item<double>(), 2.33, 0.01);
  EXPECT_NEAR(data.targets.max().item<double>(), 82.6, 0.01);
  EXPECT_EQ(uci_split_count(data_dir() / "concrete"), 20);
  const SplitIndices split = load_uci_split(data_dir() / "concrete", 0, 1030);
  EXPECT_EQ(split.train.size(), 927u);
  EXPECT_EQ(split.test.size(), 103u);
}

class BrokenData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("packtrain_uci_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    write("index_features.txt", "0\n1\n");
    write("index_target.txt", "2\n");
  }
  // Not fs::remove_all: libtorch.so exports its own std::filesystem::remove_all,
  // which interposes on libstdc++'s and crashes. Plain unlink/rmdir of what we wrote.
  void TearDown() override {
    for (const std::string& name : written_) std::remove((dir_ / name).c_str());
    ::rmdir(dir_.c_str());
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    written_.push_back(name);
  }
  std::vector<std::string> written_;
  std::string error_of() {
    try {
      load_uci(dir_);
    } catch (const DataError& e) {
      return e.what();
    }
    return "no error";
  }
  fs::path dir_;
};

TEST_F(BrokenData, RaggedRowNamesFileAndLine) {
  write("data.txt", "1 2 3\n4 5\n");
  EXPECT_THAT(error_of(), HasSubstr("data.txt:2: ragged row: 2 columns, the first row has 3"));
}

TEST_F(BrokenData, NonNumericCellNamesLineAndColumn) {
  write("data.txt", "1 2 3\n4 x5 6\n");
  EXPECT_THAT(error_of(), HasSubstr("data.txt:2:2: non-numeric cell 'x5'"));
}

TEST_F(BrokenData, NonFiniteValue) {
  write("data.txt", "1 2 3\n4 nan 6\n");
  EXPECT_THAT(error_of(), HasSubstr("data.txt:2:2: non-finite value 'nan'"));
}

TEST_F(BrokenData, EmptyAndMissingFiles) {
  write("data.txt", "\n\n");
  EXPECT_THAT(error_of(), HasSubstr("data.txt: empty file"));
  fs::remove(dir_ / "data.txt");
  EXPECT_THAT(error_of(), HasSubstr("data.txt: cannot open file"));
}

TEST_F(BrokenData, ColumnIndexOutOfRange) {
  write("data.txt", "1 2\n3 4\n");
  EXPECT_THAT(error_of(), HasSubstr("index_target.txt: index 2.000000 (entry 1) is not an integer in [0, 2)"));
}

TEST_F(BrokenData, BlankLinesAndLeadingWhitespaceAreFine) {
  write("data.txt", "  1\t2  3\n\n 4 5 6\n\n");
  const RegressionData data = load_uci(dir_);
  EXPECT_EQ(data.features.sizes(), (c10::IntArrayRef{2, 2}));
  EXPECT_EQ(data.targets[1][0].item<double>(), 6.0);
}

TEST(Standardizer, FitsTrainingStatisticsAndGuardsConstantColumns) {
  const at::Tensor x = at::tensor({1.0, 5.0, 3.0, 5.0, 5.0, 5.0}, at::kDouble).view({3, 2});
  const Standardizer s = Standardizer::fit(x);
  EXPECT_DOUBLE_EQ(s.mean[0].item<double>(), 3.0);
  EXPECT_DOUBLE_EQ(s.std[1].item<double>(), 1.0);  // constant column: divisor 1
  const at::Tensor z = s.transform(x);
  EXPECT_NEAR(z.select(1, 0).std(false).item<double>(), 1.0, 1e-12);
  EXPECT_TRUE(packtrain::testing::all_close(s.inverse(z), x, 1e-12));
}

// Every file a data directory's load reads is listed, so an output inside the
// folder cannot replace one (runtime/cli/output_paths.h).
TEST(DatasetFiles, ListEachFileADirectoryLoadReads) {
  const packtrain::testing::ScopedTempDir arrays_dir("dataset_files_arrays"), uci_dir("dataset_files_uci");
  const fs::path arrays = arrays_dir.path(), uci = uci_dir.path();
  const auto write_text = [](const fs::path& path, const std::string& text) { std::ofstream(path) << text; };
  for (const char* name : {"features.npy", "labels.npy", "notes.txt"}) write_text(arrays / name, "x");
  for (const char* name : {"data.txt", "index_features.txt", "index_target.txt", "n_splits.txt", "index_train_0.txt",
                           "index_test_0.txt", "model.ckpt"}) {
    write_text(uci / name, "x");
  }
  const auto names = [](const std::vector<fs::path>& files) {
    std::vector<std::string> out;
    for (const fs::path& f : files) out.push_back(f.filename().string());
    std::sort(out.begin(), out.end());
    return out;
  };
  EXPECT_EQ(names(dataset_files(arrays.string())), (std::vector<std::string>{"features.npy", "labels.npy"}));
  EXPECT_EQ(names(dataset_files(uci.string())),
            (std::vector<std::string>{"data.txt", "index_features.txt", "index_target.txt", "index_test_0.txt",
                                      "index_train_0.txt", "n_splits.txt"}));
  EXPECT_EQ(dataset_files((uci / "data.txt").string()), std::vector<fs::path>{uci / "data.txt"});
  EXPECT_TRUE(dataset_files((uci / "absent").string()).empty());
}

}  // namespace
}  // namespace packtrain::runtime
