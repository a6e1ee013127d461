# The guest page-table walker (halite/save/ptwalk.c), tested alone against page
# tables the test builds in a plain buffer. Included from
# tests/save/CMakeLists.txt; CMAKE_CURRENT_LIST_DIR (this file's directory)
# rather than CMAKE_CURRENT_SOURCE_DIR, so it works from any includer.
halite_test(test_ptwalk
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ptwalk.c ${CMAKE_SOURCE_DIR}/halite/save/ptwalk.c
  LIBS halite_common PkgConfig::CMOCKA
  LABELS "save;quick"
  TIMEOUT 120)
target_include_directories(test_ptwalk PRIVATE ${CMAKE_SOURCE_DIR}/halite/save)
