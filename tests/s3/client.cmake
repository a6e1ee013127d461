# halite_s3 and halite-inspect push/pull: included from tests/CMakeLists.txt
# (or from tests/s3/CMakeLists.txt: the paths are this file's own).
#
# s3_unit needs no store. The others run against a real S3 store that
# scripts/object-store.sh starts in a temporary directory (run_with_store.sh);
# they skip (77) when it cannot start, unless HALITE_REQUIRE_S3=1.
set(S3_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})

halite_test(s3_unit SOURCES ${S3_TEST_DIR}/test_s3_unit.c
  LIBS halite_s3 PkgConfig::CMOCKA LABELS "s3;unit;quick" TIMEOUT 60)

add_executable(s3_client_test ${S3_TEST_DIR}/test_s3_client.c)
target_link_libraries(s3_client_test PRIVATE halite_s3)
# Each against the default store (radosgw) and against SeaweedFS (run_with_store.sh).
foreach(store IN ITEMS default seaweedfs)
  if(store STREQUAL default)
    set(sfx "")
    set(labels s3)
    set(env "HALITE_OBJECT_STORE=${CMAKE_SOURCE_DIR}/scripts/object-store.sh")
  else()
    set(sfx _${store})
    set(labels "s3;${store}")
    set(env "HALITE_OBJECT_STORE=${CMAKE_SOURCE_DIR}/scripts/object-store-${store}.sh;HALITE_STORE_REQUIRE=HALITE_REQUIRE_SEAWEEDFS")
  endif()
  add_test(NAME s3_client${sfx}
    COMMAND bash ${S3_TEST_DIR}/run_with_store.sh ${CMAKE_SOURCE_DIR}
            $<TARGET_FILE:s3_client_test>)
  add_test(NAME s3_push_pull${sfx}
    COMMAND bash ${S3_TEST_DIR}/run_with_store.sh ${CMAKE_SOURCE_DIR}
            bash ${S3_TEST_DIR}/test_push_pull.sh $<TARGET_FILE:halite-inspect>
            ${CMAKE_SOURCE_DIR})
  set_tests_properties(s3_client${sfx} s3_push_pull${sfx} PROPERTIES LABELS "${labels}"
                       TIMEOUT 300 SKIP_RETURN_CODE 77 ENVIRONMENT "${env}")
endforeach()

# A snapshot read straight from the store (halite/src/io_s3.c): the reader's
# requests at open, a lazy restore of the synthetic guest, a replaced object,
# a missing key; and halite-inspect on an s3:// URL against the local file.
add_executable(s3_read_test ${S3_TEST_DIR}/test_s3_read.c)
target_link_libraries(s3_read_test PRIVATE halite_restore halite_save halite_synth halite_s3)
add_test(NAME s3_read
  COMMAND bash ${S3_TEST_DIR}/run_with_store.sh ${CMAKE_SOURCE_DIR} $<TARGET_FILE:s3_read_test>)
add_test(NAME s3_read_inspect
  COMMAND bash ${S3_TEST_DIR}/run_with_store.sh ${CMAKE_SOURCE_DIR}
          bash ${S3_TEST_DIR}/test_s3_read_inspect.sh $<TARGET_FILE:halite-inspect>
          ${CMAKE_SOURCE_DIR})
set_tests_properties(s3_read s3_read_inspect PROPERTIES LABELS s3 TIMEOUT 300
                     SKIP_RETURN_CODE 77
                     ENVIRONMENT "HALITE_OBJECT_STORE=${CMAKE_SOURCE_DIR}/scripts/object-store.sh;HALITE_S3_PROXY=${CMAKE_SOURCE_DIR}/bench/s3_proxy.py")
# The reads against the second store too (its ETags, ranges and If-Match).
add_test(NAME s3_read_seaweedfs
  COMMAND bash ${S3_TEST_DIR}/run_with_store.sh ${CMAKE_SOURCE_DIR} $<TARGET_FILE:s3_read_test>)
set_tests_properties(s3_read_seaweedfs PROPERTIES LABELS "s3;seaweedfs" TIMEOUT 300
                     SKIP_RETURN_CODE 77
                     ENVIRONMENT "HALITE_OBJECT_STORE=${CMAKE_SOURCE_DIR}/scripts/object-store-seaweedfs.sh;HALITE_STORE_REQUIRE=HALITE_REQUIRE_SEAWEEDFS;HALITE_S3_PROXY=${CMAKE_SOURCE_DIR}/bench/s3_proxy.py")

# halite-qemu restore from s3:// of the QEMU test guest; skips without QEMU,
# the guest image or root, as the qemu label does.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_test(NAME s3_read_qemu
  COMMAND bash ${S3_TEST_DIR}/run_with_store.sh ${CMAKE_SOURCE_DIR}
          ${Python3_EXECUTABLE} ${S3_TEST_DIR}/test_s3_read_qemu.py ${CMAKE_SOURCE_DIR}
          $<TARGET_FILE:halite-qemu> $<TARGET_FILE:halite-inspect>)
set_tests_properties(s3_read_qemu PROPERTIES LABELS "s3;qemu" TIMEOUT 600 SKIP_RETURN_CODE 77
                     RUN_SERIAL TRUE
                     ENVIRONMENT "HALITE_OBJECT_STORE=${CMAKE_SOURCE_DIR}/scripts/object-store.sh")

# A snapshot's frozen disk pushed beside it, pulled, and restored on a host
# that has neither (the host's cache of disks, a second restore without a
# disk GET, a damaged cached copy fetched again); requests counted through
# bench/s3_proxy.py.
add_test(NAME s3_disks_qemu
  COMMAND bash ${S3_TEST_DIR}/run_with_store.sh ${CMAKE_SOURCE_DIR}
          ${Python3_EXECUTABLE} ${S3_TEST_DIR}/test_s3_disks_qemu.py ${CMAKE_SOURCE_DIR}
          $<TARGET_FILE:halite-qemu> $<TARGET_FILE:halite-inspect>)
set_tests_properties(s3_disks_qemu PROPERTIES LABELS "s3;qemu" TIMEOUT 600 SKIP_RETURN_CODE 77
                     RUN_SERIAL TRUE
                     ENVIRONMENT "HALITE_OBJECT_STORE=${CMAKE_SOURCE_DIR}/scripts/object-store.sh")

# bench/s3_proxy.py (the remote benchmark's latency and outage proxy) on real
# GETs through it: the added RTT per request, counts, outages reset and stall.
add_test(NAME s3_proxy
  COMMAND bash ${S3_TEST_DIR}/run_with_store.sh ${CMAKE_SOURCE_DIR}
          ${Python3_EXECUTABLE} ${S3_TEST_DIR}/test_s3_proxy.py ${CMAKE_SOURCE_DIR})
set_tests_properties(s3_proxy PROPERTIES LABELS s3 TIMEOUT 180 SKIP_RETURN_CODE 77
                     ENVIRONMENT "HALITE_OBJECT_STORE=${CMAKE_SOURCE_DIR}/scripts/object-store.sh")
