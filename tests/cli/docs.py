#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Documentation that cannot drift from the programs:

- a man page built for every installed program, rendered by `man -l` with
  each subcommand's --help in it;
- every long option in a program's getopt_long tables (its .c files, found
  through the CMake targets it is built from) appears in its --help, or in
  the subcommand's whose file holds the table;
- the bash completion parses, and completes subcommands, options and files
  from the programs' --help;
- LICENSE is MIT as every SPDX header says; CHANGELOG.md has the version;
- the links of README.md and docs/*.md resolve (files, and headings of
  Markdown files), and the repository paths they name exist; the README and
  docs/ use the CLI's words ("never touched");
- no tracked file points outside the repository ("../shared", a design or
  paper folder of the project's working notes);
- every function the public headers declare has a man3 page (its own or a
  .so link to the page that covers it), every page renders without a
  warning, and `cmake --install` installs every one;
- the C examples of docs/examples/ (the README's) compile against the
  public headers and link against the library built here.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

SRC = os.environ.get("HALITE_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUILD = os.environ.get("HALITE_BINARY_DIR", os.path.join(SRC, "build"))
ENV_BIN = {
    "halite-inspect": "HALITE_INSPECT_BIN", "halite-qemu": "HALITE_QEMU_BIN",
    "halite-synth": "HALITE_SYNTH_BIN", "halite-cloned": "HALITE_CLONED_BIN",
    "halite-clone": "HALITE_CLONE_BIN", "halite-bench": "HALITE_BENCH_BIN",
    "halite-cycle": "HALITE_CYCLE_BIN", "halite-bench-save": "HALITE_BENCH_SAVE_BIN",
    "halite-bench-open": "HALITE_BENCH_OPEN_BIN", "halite-trace-lackey": "HALITE_TRACE_LACKEY_BIN",
}

from checks import check, failures  # noqa: E402


def binary(prog):
    path = os.environ.get(ENV_BIN[prog])
    if path:
        return path
    found = glob.glob(os.path.join(BUILD, "**", prog), recursive=True)
    return found[0] if found else prog


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=60, **kw)


def help_text(prog, *sub):
    r = run([binary(prog), *sub, "--help"])
    return r.returncode, r.stdout


def subcommands(prog, top):
    """The subcommands PROG --help names, as cmake/man.cmake finds them."""
    listed, usage, indented, on = [], [], [], False
    for line in top.splitlines():
        if re.match(r"[Cc]ommands:", line):
            on = True
        elif on and not line.strip():
            on = False
        elif on and (m := re.match(r"  ([a-z][a-z0-9-]*)( |$)", line)):
            listed.append(m.group(1))
        if m := re.match(rf" *([Uu]sage: *)?{re.escape(prog)} ([a-z][a-z0-9-]*)( |$)", line):
            usage.append(m.group(2))
        if m := re.match(r"  ([a-z][a-z0-9-]*)   *[^ -]", line):
            indented.append(m.group(1))
    subs = listed or usage or (indented if "COMMAND" in top else [])
    return [s for s in dict.fromkeys(subs) if s != "help"]


# --- CMake: which programs are installed, and which sources make each ---

def cmake_files():
    for root, dirs, files in os.walk(SRC):
        dirs[:] = [d for d in dirs if not d.startswith((".", "build"))]
        if "CMakeLists.txt" in files:
            yield os.path.join(root, "CMakeLists.txt")


def cmake_commands(text, name):
    text = re.sub(r"#[^\n]*", "", text)
    return [m.group(1).split() for m in re.finditer(rf"\b{name}\(([^)]*)\)", text)]


def targets():
    """{target: (sources, linked targets)} and the installed programs."""
    tg, links, installed = {}, {}, []
    for cm in cmake_files():
        d = os.path.dirname(cm)
        with open(cm) as f:
            text = f.read()
        for kind in ("add_executable", "add_library"):
            for args in cmake_commands(text, kind):
                srcs = [os.path.join(d, a) for a in args[1:] if a.endswith(".c")]
                tg[args[0]] = srcs
        for args in cmake_commands(text, "target_link_libraries"):
            links.setdefault(args[0], []).extend(args[1:])
        for args in cmake_commands(text, "install"):
            if args[0] == "TARGETS":
                for a in args[1:]:
                    if a.isupper():
                        break
                    installed.append(a)
    return tg, links, [p for p in installed if p in ENV_BIN]


def sources_of(prog, tg, links):
    seen, todo, srcs = set(), [prog], []
    while todo:
        t = todo.pop()
        if t in seen or t not in tg:
            continue
        seen.add(t)
        srcs += tg[t]
        todo += links.get(t, [])
    return srcs


def option_tables(path):
    """[(table name, [long option names])] of `struct option NAME[] = {...}`."""
    with open(path) as f:
        text = f.read()
    out = []
    for m in re.finditer(r"struct option\s+(\w+)\s*\[\s*\w*\s*\]\s*=\s*\{(.*?)\n\s*\};", text, re.S):
        out.append((m.group(1), re.findall(r'\{\s*"([^"]+)"', m.group(2))))
    return out


# --- the checks ---

def test_man_pages(installed):
    mandir = os.path.join(BUILD, "man")
    for prog in installed:
        page = os.path.join(mandir, prog + ".1")
        if not check(os.path.exists(page), f"{page} built (help2man: scripts/install-deps.sh)"):
            continue
        r = run(["man", "-l", page], env=dict(os.environ, MANPAGER="cat", PAGER="cat",
                                                MANWIDTH="100", LC_ALL="C.UTF-8"))
        check(r.returncode == 0, f"man -l {prog}.1 exits 0: {r.stderr}")
        text = r.stdout
        check(re.search(rf"^NAME\n\s+{re.escape(prog)} +- +\S", text, re.M),
              f"{prog}.1 has a NAME line")
        check(re.search(r"^SEE ALSO", text, re.M), f"{prog}.1 has SEE ALSO")
        check(re.search(r"^EXIT STATUS", text, re.M), f"{prog}.1 has EXIT STATUS")
        rc, top = help_text(prog)
        for sub in subcommands(prog, top):
            src, sub_help = help_text(prog, sub)
            if sub_help == top:
                continue
            check(re.search(rf"\b{re.escape(prog)} {re.escape(sub)}\b", text),
                  f"{prog}.1 has the {sub} command")
            # The subcommand's own text, not just its name: its first option line.
            opt = re.search(r"^\s+(--[a-z][a-z0-9-]*)", sub_help, re.M)
            if opt:
                check(opt.group(1) in text.replace("\u2010", "-"),
                      f"{prog}.1 has {sub}'s {opt.group(1)}")


def test_options_documented(tg, links):
    for prog in ENV_BIN:
        if prog not in tg:
            continue
        rc, top = help_text(prog)
        check(rc == 0, f"{prog} --help exits 0 ({rc})")
        subs = subcommands(prog, top)
        helps = {"": top}
        for sub in subs:
            rc, helps[sub] = help_text(prog, sub)
            check(rc == 0, f"{prog} {sub} --help exits 0 ({rc})")
        every = "\n".join(helps.values())
        for path in sorted(set(sources_of(prog, tg, links))):
            # The subcommands a file serves: named like it (info.c,
            # cmd_save.c), or whose usage it prints (blocks.c: blocks, map).
            stem = os.path.basename(path)[:-2]
            stem = stem[4:] if stem.startswith("cmd_") else stem
            with open(path) as f:
                code = f.read()
            served = {sub for sub in subs if sub == stem or re.search(
                rf'(PROG\s*"|{re.escape(prog)}) {re.escape(sub)}\b', code)}
            where = " ".join(sorted(served)) or None
            for table, opts in option_tables(path):
                text = "\n".join(helps[x] for x in served) if served else every
                for o in opts:
                    if o == "help":  # the text itself, and every command takes it
                        continue
                    check(re.search(rf"--{re.escape(o)}\b", text),
                          f"{prog}{' ' + where if where else ''}: --{o} "
                          f"({os.path.relpath(path, SRC)}, {table}) is not in its --help")


def complete(script, words, cwd, path):
    """COMPREPLY for COMP_WORDS=words, the cursor on the last word."""
    prog = os.path.basename(script)
    fn = "_" + prog.replace("-", "_")
    sh = (f'. "{script}" || exit 3\n'
          f'COMP_WORDS=({" ".join(_q(w) for w in words)}); COMP_CWORD={len(words) - 1}\n'
          f'{fn}; printf "%s\\n" "${{COMPREPLY[@]}}"\n')
    r = run(["bash", "--norc", "--noprofile", "-c", sh], cwd=cwd,
            env=dict(os.environ, PATH=path + os.pathsep + os.environ.get("PATH", "")))
    check(r.returncode == 0, f"completion {words} runs: {r.stderr}")
    return [w for w in r.stdout.split("\n") if w]


def _q(w):
    return "'" + w.replace("'", "'\\''") + "'"


def test_completion():
    comp = os.path.join(SRC, "completion")
    for name in ("halite-inspect", "halite-qemu"):
        r = run(["bash", "-n", os.path.join(comp, name)])
        check(r.returncode == 0, f"bash -n completion/{name}: {r.stderr}")
    path = os.pathsep.join(os.path.dirname(binary(p)) for p in ("halite-inspect", "halite-qemu"))
    tmp = tempfile.mkdtemp(prefix="halite-docs.")
    try:
        for f in ("a.hlt", "b.img", "c.trace"):
            open(os.path.join(tmp, f), "w").close()
        os.mkdir(os.path.join(tmp, "dir"))
        ins = os.path.join(comp, "halite-inspect")
        qem = os.path.join(comp, "halite-qemu")
        got = complete(ins, ["halite-inspect", "ve"], tmp, path)
        check(got == ["verify"], f"halite-inspect ve -> verify: {got}")
        got = complete(ins, ["halite-inspect", "verify", "--j"], tmp, path)
        check("--json" in got and all(g.startswith("--j") for g in got),
              f"halite-inspect verify --j -> --json: {got}")
        got = complete(ins, ["halite-inspect", "help", "im"], tmp, path)
        check(got == ["import"], f"halite-inspect help im -> import: {got}")
        got = complete(ins, ["halite-inspect", "--ver"], tmp, path)
        check(got == ["--version"], f"halite-inspect --ver -> --version: {got}")
        got = complete(ins, ["halite-inspect", "info", ""], tmp, path)
        check(sorted(got) == ["a.hlt", "dir"], f"halite-inspect info: .hlt files first: {got}")
        got = complete(ins, ["halite-inspect", "import", ""], tmp, path)
        check(sorted(got) == ["a.hlt", "b.img", "c.trace", "dir"],
              f"halite-inspect import: any file (an image): {got}")
        got = complete(ins, ["halite-inspect", "import", "--order", ""], tmp, path)
        check(sorted(got) == ["physical", "random"], f"import --order's values: {got}")
        got = complete(qem, ["halite-qemu", "re"], tmp, path)
        check(got == ["restore"], f"halite-qemu re -> restore: {got}")
        got = complete(qem, ["halite-qemu", "restore", "--det"], tmp, path)
        check(got == ["--detach"], f"halite-qemu restore --det -> --detach: {got}")
        got = complete(qem, ["halite-qemu", "save", "--qmp", ""], tmp, path)
        check("b.img" in got, f"halite-qemu save --qmp SOCKET: files: {got}")
        got = complete(qem, ["halite-qemu", "restore", "a.hlt", "--", "qemu-system-x86_64",
                             "-kernel", ""], tmp, path)
        check(sorted(got) == ["a.hlt", "b.img", "c.trace", "dir"],
              f"halite-qemu restore FILE -- QEMU ...: files: {got}")
        got = complete(qem, ["halite-qemu", "restore", "a.hlt", "--", "bas"], tmp, path)
        check("bash" in got, f"halite-qemu restore FILE -- B: the QEMU binary, a command: {got}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def tracked_files():
    r = run(["git", "-C", SRC, "ls-files"])
    if r.returncode == 0 and r.stdout:
        return [os.path.join(SRC, p) for p in r.stdout.split("\n") if p]
    out = []
    for root, dirs, files in os.walk(SRC):
        dirs[:] = [d for d in dirs if not d.startswith((".", "build"))]
        out += [os.path.join(root, f) for f in files]
    return out


def test_license_changelog():
    with open(os.path.join(SRC, "LICENSE")) as f:
        lic = f.read()
    check(lic.startswith("MIT License") and "Permission is hereby granted, free of charge" in lic,
          "LICENSE is the MIT license")
    n = 0
    for path in tracked_files():
        if not os.path.isfile(path):
            continue
        try:
            with open(path, errors="replace") as f:
                head = f.read(4096)
        except OSError:
            continue
        for m in re.finditer(r"SPDX-License-Identifier:\s*([^\s*]+)", head):
            n += 1
            check(m.group(1) == "MIT", f"{os.path.relpath(path, SRC)}: SPDX {m.group(1)}, not MIT")
    check(n > 100, f"SPDX headers found ({n})")
    with open(os.path.join(SRC, "CMakeLists.txt")) as f:
        version = re.search(r"project\(halite VERSION (\d+\.\d+\.\d+)", f.read()).group(1)
    with open(os.path.join(SRC, "CHANGELOG.md")) as f:
        cl = f.read()
    check(re.search(rf"^## \[{re.escape(version)}\]", cl, re.M),
          f"CHANGELOG.md has a section for {version}")
    check(re.search(r"^## \[Unreleased\]", cl, re.M), "CHANGELOG.md has Unreleased")


def strip_code(text):
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


# Folders of the repository: a path in the docs that starts with one names
# a file or folder that must exist (build/ and the like are made, not kept).
REPO_DIRS = ("docs", "scripts", "halite", "format", "restore", "save", "tools", "tests",
             "bench", "guest", "guest-image", "man", "cmake", "completion")


def md_anchors(path):
    """The anchors GitHub gives a Markdown file's headings."""
    anchors = set()
    with open(path) as f:
        text = re.sub(r"^```.*?^```", "", f.read(), flags=re.S | re.M)
    for h in re.findall(r"^#+\s+(.*?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", h.strip().lower().replace("`", "")).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_readme():
    docs = [os.path.join(SRC, "README.md")] + sorted(glob.glob(os.path.join(SRC, "docs", "*.md")))
    # Not <halite/x.h> (an include), not a glob (io*.c), not a placeholder (NAME).
    path_re = re.compile(r"(?<![\w./<-])((?:%s)/[\w./-]*\w)(?![\w*])"
                         % "|".join(map(re.escape, REPO_DIRS)))
    for doc in docs:
        rel = os.path.relpath(doc, SRC)
        with open(doc) as f:
            text = f.read()
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            dest = os.path.normpath(os.path.join(os.path.dirname(doc), target)) if target else doc
            if not check(os.path.exists(dest), f"{rel}: link {target} resolves"):
                continue
            if anchor and dest.endswith(".md"):
                check(anchor in md_anchors(dest), f"{rel}: link {target}#{anchor} names a heading")
        for path in sorted(set(path_re.findall(text))):
            if re.search(r"\b[A-Z]{2,}\b", path):
                continue
            full = os.path.join(SRC, path)
            # A test's name (tests/save/test_save_defer) or a family's prefix
            # (tests/reliability/test_rel_) names the files that start with it.
            check(os.path.exists(full) or glob.glob(glob.escape(full) + "*"),
                  f"{rel}: {path} exists in the tree")
        if rel != "docs/cli.md":
            # The block state is "never touched", as the CLI says; code
            # (identifiers, JSON keys) keeps its own names.
            n = len(re.findall(r"untouched", strip_code(text), re.I))
            check(n == 0, f"{rel}: 'untouched' {n} times where the CLI says 'never touched'")
    with open(os.path.join(SRC, "README.md")) as f:
        readme = f.read()
    for word in ("man ", "cpack -G DEB", "bash-completion", "docs/cli.md", "`cli`"):
        check(word in readme, f"README.md mentions {word.strip()}")


# Files still pointing outside the tree, to be fixed by their owners; each
# entry must go as soon as its file is fixed (the check says so).
OUTSIDE_KNOWN = set()


def test_nothing_outside():
    """No tracked file points at the project's notes outside the repository."""
    me = os.path.relpath(os.path.abspath(__file__), SRC)
    pat = re.compile(r"\.\./shared|shared/design|papers/")
    for path in tracked_files():
        rel = os.path.relpath(path, SRC)
        if rel == me or not os.path.isfile(path):
            continue
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        hit = pat.search(text)
        if rel in OUTSIDE_KNOWN:
            check(hit, f"{rel} no longer points outside the tree: drop it from OUTSIDE_KNOWN")
        else:
            check(not hit, f"{rel}: '{hit.group(0) if hit else ''}' points outside the repository")


def api_functions():
    """name -> header of every function the public headers declare."""
    out = {}
    for h in sorted(glob.glob(os.path.join(SRC, "halite", "include", "halite", "*.h"))):
        with open(h) as f:
            text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
        for name in re.findall(r"^[A-Za-z_][\w \*]*?\b(halite_\w+)\s*\(", text, re.M):
            out[name] = os.path.basename(h)
    return out


def man_render(mandir, page):
    """Render man3/PAGE from MANDIR (as man does: .so paths are relative to it)."""
    return run(["man", "--warnings", "-l", os.path.join("man3", page)], cwd=mandir,
               env=dict(os.environ, MANPAGER="cat", PAGER="cat", MANWIDTH="80", LC_ALL="C.UTF-8"))


def test_man3():
    mandir = os.path.join(SRC, "man")
    pages = {os.path.basename(p) for p in glob.glob(os.path.join(mandir, "man3", "*.3"))}
    funcs = api_functions()
    check(len(funcs) > 50, f"public functions found in the headers ({len(funcs)})")
    check("halite.3" in pages, "man3/halite.3, the overview, exists")
    for name, header in sorted(funcs.items()):
        check(name + ".3" in pages, f"{name} ({header}) has a man3 page")
    for page in sorted(pages):
        path = os.path.join(mandir, "man3", page)
        with open(path) as f:
            text = f.read()
        name = page[:-2]
        check(name == "halite" or name in funcs, f"man3/{page} documents a function of the headers")
        if m := re.match(r"\.so man3/(\S+)\n?$", text):
            target = m.group(1)
            check(target in pages, f"man3/{page}: .so target {target} exists")
            if target in pages:
                with open(os.path.join(mandir, "man3", target)) as f:
                    check(re.search(rf"^\.SH NAME\n.*\b{re.escape(name)}\b", f.read(), re.M),
                          f"man3/{target}'s NAME lists {name}")
            continue
        for sec in ("NAME", "SYNOPSIS", "DESCRIPTION", "SEE ALSO") + (() if name == "halite" else ("RETURN VALUE",)):
            check(re.search(rf"^\.SH {sec}$", text, re.M), f"man3/{page} has {sec}")
        if shutil.which("man"):
            r = man_render(mandir, page)
            check(r.returncode == 0 and not r.stderr.strip(),
                  f"man3/{page} renders without warnings: {r.stderr.strip()}")
            check(name in r.stdout, f"man3/{page} renders its name")
    # Installed with the rest: every page lands in MANDIR/man3.
    if shutil.which("cmake") and os.path.exists(os.path.join(BUILD, "cmake_install.cmake")):
        with tempfile.TemporaryDirectory() as tmp:
            r = run(["cmake", "--install", BUILD, "--prefix", tmp])
            if check(r.returncode == 0, f"cmake --install {BUILD}: {r.stderr.strip()}"):
                found = glob.glob(os.path.join(tmp, "**", "man3"), recursive=True)
                inst = set(os.listdir(found[0])) if found else set()
                for page in sorted(pages):
                    check(page in inst, f"man3/{page} is installed")
                if found:
                    r = man_render(os.path.dirname(found[0]), "halite_restore_wait.3")
                    check(r.returncode == 0 and "halite_restore_start" in r.stdout,
                          f"an installed .so link renders its page: {r.stderr.strip()}")


def sanitize_flags():
    """-fsanitize=... when BUILD is a sanitizer build (HALITE_SANITIZE)."""
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            m = re.search(r"^HALITE_SANITIZE:STRING=(.+)$", f.read(), re.M)
    except OSError:
        return []
    return ["-fsanitize=" + m.group(1).strip()] if m and m.group(1).strip() else []


def test_examples():
    """docs/examples/*.c: what the README shows must build as a user builds it."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not check(cc, "a C compiler (cc) for docs/examples"):
        return
    lib = os.path.join(BUILD, "libhalite.so")
    examples = sorted(glob.glob(os.path.join(SRC, "docs", "examples", "*.c")))
    check(len(examples) >= 2, f"docs/examples has the restore and save examples ({len(examples)})")
    with tempfile.TemporaryDirectory() as tmp:
        for ex in examples:
            name = os.path.relpath(ex, SRC)
            cmd = [cc, "-std=c11", "-Wall", "-Wextra", "-Werror",
                   "-I" + os.path.join(SRC, "halite", "include"), ex]
            if os.path.exists(lib):
                # A sanitizer build's library needs its runtime linked in too.
                cmd += ["-o", os.path.join(tmp, "a.out"), lib] + sanitize_flags()
            else:
                cmd += ["-fsyntax-only"]
            r = run(cmd)
            check(r.returncode == 0, f"{name} compiles: {r.stderr.strip()}")


def main():
    tg, links, installed = targets()
    check(set(installed) == {"halite-inspect", "halite-qemu", "halite-synth", "halite-cloned",
                             "halite-clone"} | set(installed),
          f"installed programs found in CMake: {installed}")
    check(len(installed) >= 5, f"installed programs found in CMake: {installed}")
    if shutil.which("man"):
        test_man_pages(installed)
    else:
        check(False, "man not found (man-db: scripts/install-deps.sh)")
    test_options_documented(tg, links)
    test_completion()
    test_license_changelog()
    test_readme()
    test_nothing_outside()
    test_man3()
    test_examples()
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("docs: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
