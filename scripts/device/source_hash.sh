# source_hash: a short hash of the sources a build is made from (run in the
# repository root). bundle.sh records it in the bundle; phase.sh compares, and warns
# when the tree it runs in differs from the sources the bundle was built from.
source_hash() {
  local dirs=() d
  for d in base benchmarks cmake ensemble examples graphs profiling runtime tests include python; do
    [[ -d "$d" ]] && dirs+=("$d")
  done
  { find "${dirs[@]}" -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \
        -o -name 'CMakeLists.txt' -o -name '*.cmake' -o -name '*.in' \) -not -path '*/__pycache__/*' -print0 \
      | LC_ALL=C sort -z | xargs -0 sha1sum; sha1sum CMakeLists.txt; } | sha1sum | cut -c1-12
}
