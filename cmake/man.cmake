# SPDX-License-Identifier: MIT
#
# One man page from the program's own texts (cmake -P, at build time):
#
#   cmake -DPROG=path/to/halite-inspect -DNAME=halite-inspect -DVERSION=0.1.0
#         -DH2M=man/halite-inspect.h2m -DHELP2MAN=/usr/bin/help2man
#         -DOUT=build/man/halite-inspect.1 -P cmake/man.cmake
#
# help2man makes the page from `PROG --help`; the subcommands it cannot see
# are found in that text (below) and each one's `PROG SUB --help` becomes a COMMANDS
# section, in an include file written next to OUT. The hand-written sections
# help2man cannot know (NAME, EXIT STATUS, FILES, ENVIRONMENT, SEE ALSO) are
# in H2M. So the --help texts stay the one source of every option.
#
# --version-string: the page must build whether or not PROG --version exists
# and whatever it prints around the number.
foreach(v PROG NAME VERSION H2M HELP2MAN OUT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "man.cmake: -D${v}= is required")
  endif()
endforeach()

execute_process(COMMAND ${PROG} --help OUTPUT_VARIABLE top RESULT_VARIABLE rc
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR top STREQUAL "")
  message(FATAL_ERROR "${NAME} --help exited ${rc} (it must print its usage on "
                      "stdout and exit 0, docs/cli.md): ${err}")
endif()

# CMake lists split on ';' and will not split inside [...]: neither may count
# in the text, which is only scanned here, never written out from this copy.
string(REPLACE ";" " " scan "${top}")
string(REPLACE "[" "<" scan "${scan}")
string(REPLACE "]" ">" scan "${scan}")
string(REPLACE "\n" ";" lines "${scan}")

set(listed "")
set(in_usage "")
set(indented "")
set(in_list FALSE)
foreach(l IN LISTS lines)
  if(l MATCHES "^[Cc]ommands:")
    set(in_list TRUE)
  elseif(in_list AND l STREQUAL "")
    set(in_list FALSE)
  elseif(in_list AND l MATCHES "^  ([a-z][a-z0-9-]*)( |$)")
    list(APPEND listed ${CMAKE_MATCH_1})
  endif()
  if(l MATCHES "^ *([Uu]sage: *)?${NAME} ([a-z][a-z0-9-]*)( |$)")
    list(APPEND in_usage ${CMAKE_MATCH_2})
  endif()
  if(l MATCHES "^  ([a-z][a-z0-9-]*)   *[^ -]")
    list(APPEND indented ${CMAKE_MATCH_1})
  endif()
endforeach()
# A "Commands:" list; else "PROG SUB ..." usage lines; else, for a usage
# with COMMAND, its indented "  name   what it does" lines.
if(listed)
  set(subs ${listed})
elseif(in_usage)
  set(subs ${in_usage})
elseif(scan MATCHES "COMMAND")
  set(subs ${indented})
endif()
list(REMOVE_DUPLICATES subs)
list(REMOVE_ITEM subs help)

# Preformatted, every line led by \& so that none is taken for a request
# (. '), an include section ([NAME]) or a help2man pattern (/re/).
set(cmds "")
foreach(sub IN LISTS subs)
  execute_process(COMMAND ${PROG} ${sub} --help OUTPUT_VARIABLE text RESULT_VARIABLE rc
                  ERROR_QUIET)
  if(text STREQUAL top)
    continue() # one help for all: already the page's DESCRIPTION and OPTIONS
  endif()
  if(NOT rc EQUAL 0 OR text STREQUAL "")
    message(WARNING "${NAME} ${sub} --help exited ${rc}: left out of ${NAME}.1")
    continue()
  endif()
  string(REPLACE "\\" "\\e" text "${text}")
  string(REGEX REPLACE "\n+$" "" text "${text}")
  string(REPLACE "\n" "\n\\&" text "${text}")
  string(APPEND cmds ".SS \"${NAME} ${sub}\"\n.nf\n\\&${text}\n.fi\n")
endforeach()

get_filename_component(outdir ${OUT} DIRECTORY)
set(gen ${outdir}/${NAME}.commands.h2m)
# COMMANDS first: help2man puts sections it does not know in include order.
set(includes "")
if(cmds)
  file(WRITE ${gen} "[COMMANDS]\nEach command's own \\fB--help\\fR:\n${cmds}")
  list(APPEND includes --include=${gen})
else()
  file(REMOVE ${gen})
endif()
list(APPEND includes --include=${H2M})

execute_process(
  COMMAND ${HELP2MAN} --no-info --section=1 --version-string=${VERSION}
          --source=Halite --manual=Halite ${includes}
          --output=${OUT} ${PROG}
  RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  file(REMOVE ${OUT})
  message(FATAL_ERROR "help2man ${NAME}: ${err}")
endif()
