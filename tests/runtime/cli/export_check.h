// One check two CLI tests share: plain PyTorch (scripts/load_packtrain_export.py on an
// export) predicts what `packtrain predict` predicts from the checkpoint.
#pragma once

#include <string>

namespace packtrain::cli_testing {

// Predicts the rows of `input_csv` (features only) with `packtrain predict CKPT` and
// with the loader script on EXPORTED, writing both CSVs into `dir`, and expects
// the two ensemble means (each CSV's first column) to agree to float32 rounding.
// Skips the caller's test when no Python with torch was found (call it last).
void expect_export_predicts_as_packtrain(const std::string& ckpt, const std::string& exported,
                                         const std::string& input_csv, int rows, const std::string& dir);

}  // namespace packtrain::cli_testing
