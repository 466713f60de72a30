// One user-error type (base/user_error.h): the layers' own names for bad input are
// UserErrors, so the CLI maps them to status 2 and Python to ValueError in one place;
// a failed write and a failed collective are not (status 1: not the input's fault).
// cli::UsageError, which the library cannot see, is checked where main catches it
// (a static_assert in runtime/cli/main.cpp) and end to end (exit_codes_cli_test.cpp).
#include "packtrain/base/user_error.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/distributed/collective_error.h"
#include "packtrain/runtime/io/checkpoint_file.h"
#include "packtrain/runtime/trainers/ensemble/hyperparameter_sweep.h"

#include <gtest/gtest.h>

#include <type_traits>

namespace packtrain {
namespace {

TEST(UserError, DataErrorAndTheLibrarysBadInputAreUserErrors) {
  EXPECT_THROW(throw runtime::DataError("bad.csv:3:2: 'x5' is not a number"), UserError);
  // Bad input found deeper in the library (was std::invalid_argument: "internal error").
  runtime::SweepGrid no_rates;  // an empty learning-rate axis
  no_rates.weight_decay = {0.0};
  no_rates.seeds = 2;
  EXPECT_THROW(runtime::sweep_options(runtime::EnsembleTrainerOptions(), no_rates), UserError);
  EXPECT_THROW(runtime::best_configuration({}), UserError);
}

TEST(UserError, WriteAndCollectiveErrorsAreNot) {
  static_assert(!std::is_base_of_v<UserError, runtime::WriteError>);
  static_assert(!std::is_base_of_v<UserError, runtime::distributed::CollectiveError>);
  bool caught_as_user_error = false;
  try {
    throw runtime::WriteError("out.csv: No space left on device");
  } catch (const UserError&) {
    caught_as_user_error = true;
  } catch (const runtime::WriteError&) {
  }
  EXPECT_FALSE(caught_as_user_error);
}

}  // namespace
}  // namespace packtrain
