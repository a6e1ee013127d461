# The ptrace injection of halite-qemu (halite/qemu/inject.c), tested
# alone against a multi-threaded child of its own: no QEMU needed, but root
# (or ptrace and userfaultfd rights over a child). Exit 77 when the kernel or
# the rights say no. Included from tests/qemu/CMakeLists.txt;
# CMAKE_CURRENT_LIST_DIR, so it works from any includer.
# Not under ThreadSanitizer: the injector is single-threaded (nothing for
# TSan to check), and TSan's runtime in the traced child defers its signal
# handlers past the syscalls the test watches and upsets its raw-syscall
# threads, so the child's view of signals and registers is TSan's, not the
# kernel's. The release and ASan+UBSan builds run it.
if(HALITE_SANITIZE MATCHES "thread")
  return()
endif()
add_executable(test_inject
  ${CMAKE_SOURCE_DIR}/halite/qemu/inject.c
  ${CMAKE_SOURCE_DIR}/halite/qemu/inject_code.c
  ${CMAKE_SOURCE_DIR}/halite/qemu/inject_util.c
  ${CMAKE_CURRENT_LIST_DIR}/test_inject.c)
target_include_directories(test_inject PRIVATE ${CMAKE_SOURCE_DIR}/halite/qemu)
target_link_libraries(test_inject PRIVATE Threads::Threads)
add_test(NAME qemu_inject COMMAND test_inject)
set_tests_properties(qemu_inject PROPERTIES LABELS "qemu" TIMEOUT 120 SKIP_RETURN_CODE 77)
