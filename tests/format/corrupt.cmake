# Hostile input and golden files (included from tests/format/CMakeLists.txt).
#
#   test_corrupt  every damage docs/format.md names, refused with its exact code
#   test_golden   the committed files in tests/golden/ still read, field by field
#   golden_gen    writes those files; run once per format version, never again
#                 (see tests/golden/README.md). Built, not a test.

halite_test(test_corrupt SOURCES test_corrupt.c corrupt_util.c
  LIBS halite_format PkgConfig::XXHASH PkgConfig::CMOCKA LABELS "format;quick" TIMEOUT 120)

halite_test(test_golden SOURCES test_golden.c
  LIBS halite_format PkgConfig::XXHASH PkgConfig::CMOCKA LABELS "format;quick" TIMEOUT 60
  ARGS ${CMAKE_SOURCE_DIR}/tests/golden)

add_executable(golden_gen golden_gen.c)
target_link_libraries(golden_gen PRIVATE halite_format)
target_include_directories(golden_gen PRIVATE ${CMAKE_SOURCE_DIR}/tests)

# Format 1.1's chunked index: lazy reads, refusal by 1.0, damage on first use, threads.
halite_test(test_index SOURCES test_index.c corrupt_util.c
  LIBS halite_format PkgConfig::XXHASH PkgConfig::CMOCKA LABELS "format;quick" TIMEOUT 120)
