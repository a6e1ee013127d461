# SPDX-License-Identifier: MIT
#
# Man pages, bash completion and the package's documentation files.
#
# Each installed program's man page is generated at build time from its own
# --help (and each subcommand's) by help2man (cmake/man.cmake), plus the
# sections help2man cannot know from man/PROG.h2m: the help texts stay the
# one place an option is described. A changed program rebuilds its page.
set(HALITE_MAN_PROGRAMS halite-inspect halite-qemu halite-synth halite-cloned halite-clone)

find_program(HELP2MAN help2man)
option(HALITE_MAN "Build the man pages (needs help2man)" ON)
if(HALITE_MAN AND NOT HELP2MAN)
  message(WARNING "help2man not found: no man pages (scripts/install-deps.sh installs it, "
                  "or -DHALITE_MAN=OFF)")
  set(HALITE_MAN OFF)
endif()

if(HALITE_MAN)
  set(man_pages "")
  foreach(prog IN LISTS HALITE_MAN_PROGRAMS)
    set(page ${CMAKE_BINARY_DIR}/man/${prog}.1)
    add_custom_command(OUTPUT ${page}
      COMMAND ${CMAKE_COMMAND} -DPROG=$<TARGET_FILE:${prog}> -DNAME=${prog}
              -DVERSION=${PROJECT_VERSION} -DH2M=${CMAKE_SOURCE_DIR}/man/${prog}.h2m
              -DHELP2MAN=${HELP2MAN} -DOUT=${page} -P ${CMAKE_SOURCE_DIR}/cmake/man.cmake
      DEPENDS ${prog} ${CMAKE_SOURCE_DIR}/man/${prog}.h2m ${CMAKE_SOURCE_DIR}/cmake/man.cmake
      COMMENT "Generating man page ${prog}.1"
      VERBATIM)
    list(APPEND man_pages ${page})
  endforeach()
  add_custom_target(man ALL DEPENDS ${man_pages})
  install(FILES ${man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
endif()

# Completion reads the programs' --help when it runs, so it cannot drift.
install(FILES completion/halite-inspect completion/halite-qemu
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions)

# The systemd unit's Documentation= names README.md here, and docs/ beside it
# keeps the README's docs/ paths true; Debian's name for the license is
# copyright.
install(FILES README.md CHANGELOG.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)
install(FILES LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} RENAME copyright)
