#include "tests/runtime/cli/export_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <vector>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {

namespace {
// The first column of a CSV with a header (the ensemble mean).
std::vector<double> first_column(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  std::vector<double> out;
  while (std::getline(in, line)) out.push_back(std::stod(line.substr(0, line.find(','))));
  return out;
}
}  // namespace

void expect_export_predicts_as_packtrain(const std::string& ckpt, const std::string& exported,
                                         const std::string& input_csv, int rows, const std::string& dir) {
  if (test_python().empty()) {
    GTEST_SKIP() << "no Python with torch and numpy was found at configure time (set PACKTRAIN_TEST_PYTHON)";
  }
  const std::string cpp_csv = dir + "/export_check_cpp.csv", py_csv = dir + "/export_check_py.csv";
  const Result predicted = run("predict " + ckpt + " " + input_csv + " -o " + cpp_csv);
  ASSERT_EQ(predicted.status, 0) << predicted.out;
  const Result py = run_command(test_python() + " " + source_dir() + "/scripts/load_packtrain_export.py " + exported +
                                " " + input_csv + " > " + py_csv);
  ASSERT_EQ(py.status, 0) << py.out;
  const std::vector<double> cpp = first_column(read_file(cpp_csv));
  const std::vector<double> python = first_column(read_file(py_csv));
  ASSERT_EQ(cpp.size(), static_cast<size_t>(rows));
  ASSERT_EQ(python.size(), static_cast<size_t>(rows));
  for (size_t i = 0; i < cpp.size(); ++i) EXPECT_NEAR(python[i], cpp[i], 1e-4 * std::abs(cpp[i]) + 1e-6) << i;
}

}  // namespace packtrain::cli_testing
