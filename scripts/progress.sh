# Sourced by the setup, build and test scripts: a long step prints one line before it
# runs (what it is, and about how long it takes on this project's 2-core machine) and
# one after (the seconds it took), so a first run never sits silent for minutes.
#
#   step "building the C++ project" "about 40 min on 2 cores" cmake --build --preset default

# step <what> <how long it takes here> <command> [args...]
step() {
  local what=$1 estimate=$2 start=$SECONDS rc=0
  shift 2
  echo "==> $what ($estimate) ..."
  "$@" || rc=$?
  if ((rc)); then
    echo "==> $what: FAILED (exit $rc) after $((SECONDS - start)) s" >&2
    return "$rc"
  fi
  echo "==> $what: done in $((SECONDS - start)) s"
}
