# SPDX-License-Identifier: MIT
# What the S3 shell tests share, sourced after their arguments are read:
#   . "$ROOT/tests/s3/lib.sh" HALITE_INSPECT ROOT PREFIX
# sets B (a key prefix of this run's own under HALITE_TEST_BUCKET, so a
# bucket used before holds nothing it reads) and SEED (HALITE_TEST_SEED or
# random, printed), skips without python3, brings in the inspect tests'
# helpers ($T removed at exit, fail, expect, js, eq, gen) and has().
B=${HALITE_TEST_BUCKET:?run under run_with_store.sh}/$3-$$-$RANDOM
SEED=${HALITE_TEST_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}
echo "seed $SEED (HALITE_TEST_SEED)"
command -v python3 >/dev/null || { echo "SKIP: needs python3"; exit 77; }
. "$2/tests/inspect/lib.sh" "$1" python3 "$2/tests/inspect"

has() { # FILE TEXT
	grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "$1 lacks '$2'"; }
}
