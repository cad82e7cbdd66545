#!/usr/bin/env bash
# Install aioloader as a user and a packager would, in fresh venvs, and check what they get:
#   1. `CC=false pip install .` (no compiler, no extras) installs, warns once, reads files;
#      gs:// then fails with one line naming aioloader[gcs]
#   2. `pip wheel .` gives an abi3 wheel with its three extensions, py.typed, no C sources;
#      `CC=false pip wheel .` gives a py3-none-any wheel (Root-Is-Purelib: true, no .so),
#      which installs and reads files
#   3. `python -m build`, as `make wheels` runs it: the sdist holds LICENSE, CHANGELOG, the C
#      sources and the tests with their helpers, and the wheel built from it is abi3
#   4. `pip install '.[testing]'` and a user's own pytest test with local_gcs() passes
#   5. the sdist's own tests run from it (hashing, footer, extras, testing package)
# Needs python3.11 and the package registry; ~3-5 min. Not part of `make test`: run it with
# `make packaging-check` (or `bash tests/support/packaging_check.sh`) before a release.
set -euo pipefail

PY=${PYTHON:-python3.11}
SRC=$(cd "$(dirname "$0")/../.." && pwd)  # the repository root (this is tests/support/)
WORK=$(mktemp -d /tmp/aioloader-pkgcheck.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
START=$SECONDS
step() { printf '\n== %s (%ss)\n' "$1" $((SECONDS - START)); }
fail() { echo "FAIL: $*" >&2; exit 1; }

# A clean copy of the working tree (tracked and new files, nothing ignored: no built .so).
mkdir "$WORK/src"
(cd "$SRC" && git ls-files -co --exclude-standard -z | xargs -0 tar -cf - --) | tar -xf - -C "$WORK/src"

step "1. CC=false pip install . (no compiler, no extras)"
$PY -m venv "$WORK/bare"
CC=false "$WORK/bare/bin/pip" install -q "$WORK/src"
ls "$WORK"/bare/lib/python3*/site-packages/aioloader/arrayrecord/*.so 2>/dev/null \
    && fail "an extension was built with CC=false"
cd "$WORK"
"$WORK/bare/bin/python" - <<'EOF' 2>"$WORK/bare.err"
import aioloader as al
with al.ArrayRecordWriter("x.array_record") as w:
    for i in range(100):
        w.write(b"record %d" % i)
src = al.ArrayRecordSource("x.array_record")
got = [src[0], src[99]]
assert got == [b"record 0", b"record 99"], got
print("read back", got, "version", al.__version__)
EOF
grep -c "C extension for HighwayHash is not built" "$WORK/bare.err" | grep -qx 1 \
    || { cat "$WORK/bare.err"; fail "expected exactly one slow-hashing warning"; }
set +e
"$WORK/bare/bin/aioloader" inspect gs://bucket/x.array_record 2>"$WORK/gs.err"
rc=$?
set -e
cat "$WORK/gs.err"
# The slow-hashing warning comes first (this install has no extension); then one line.
[ "$rc" = 1 ] && ! grep -q Traceback "$WORK/gs.err" \
    && tail -n 1 "$WORK/gs.err" | grep -q "^aioloader inspect: gs://.*pip install 'aioloader\[gcs\]'" \
    || fail "gs:// without the gcs extra: want one line naming aioloader[gcs] (rc $rc)"

step "2. pip wheel . (with a compiler)"
"$WORK/bare/bin/pip" wheel -q --no-deps -w "$WORK/wheels" "$WORK/src"
WHEEL=$(ls "$WORK"/wheels/aioloader-*.whl)
echo "$(basename "$WHEEL")"
case "$WHEEL" in *-cp311-abi3-*.whl) ;; *) fail "not an abi3 wheel: $WHEEL" ;; esac
"$WORK/bare/bin/python" - "$WHEEL" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for want in ("aioloader/py.typed", "aioloader/arrayrecord/_highwayhash.abi3.so",
             "aioloader/arrayrecord/_footer.abi3.so", "aioloader/arrayrecord/_onerecords.abi3.so"):
    assert want in names, want
assert not [n for n in names if n.endswith(".c")], "C sources in the wheel"
assert any(n.endswith("licenses/LICENSE") for n in names), "no LICENSE in the wheel"
EOF

step "2b. CC=false pip wheel . (no compiler): a pure wheel, tagged so"
rm -rf "$WORK/src/build"  # (step 2's objects would be reused)
CC=false "$WORK/bare/bin/pip" wheel -q --no-deps -w "$WORK/pure" "$WORK/src"
PURE=$(ls "$WORK"/pure/aioloader-*.whl)
echo "$(basename "$PURE")"
case "$PURE" in *-py3-none-any.whl) ;; *) fail "a wheel without extensions is not py3-none-any: $PURE" ;; esac
"$WORK/bare/bin/python" - "$PURE" <<'EOF'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = z.namelist()
assert not [n for n in names if n.endswith((".so", ".pyd"))], "native code in a pure wheel"
wheel = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
assert "Root-Is-Purelib: true" in wheel and "Tag: py3-none-any" in wheel, wheel
EOF
$PY -m venv "$WORK/pure-venv"
"$WORK/pure-venv/bin/pip" install -q "$PURE"
(cd "$WORK" && "$WORK/pure-venv/bin/python" -W ignore::RuntimeWarning -c \
    "import aioloader as al; assert al.ArrayRecordSource('x.array_record')[99] == b'record 99'")

step "3. python -m build (make wheels): the sdist and the wheel built from it"
"$WORK/bare/bin/pip" install -q build
rm -rf "$WORK/src/build"
"$WORK/bare/bin/python" -m build -q --outdir "$WORK/dist" "$WORK/src" >/dev/null
SDIST=$(ls "$WORK"/dist/aioloader-*.tar.gz)
echo "$(basename "$SDIST") $(basename "$(ls "$WORK"/dist/aioloader-*.whl)")"
ls "$WORK"/dist/aioloader-*-cp311-abi3-*.whl >/dev/null || fail "make wheels' wheel is not abi3"
LIST=$(tar -tzf "$SDIST")
for want in LICENSE CHANGELOG.md aioloader/py.typed aioloader/arrayrecord/_highwayhash.c \
            aioloader/arrayrecord/_footer.c aioloader/arrayrecord/_onerecords.c \
            tests/conftest.py tests/support/procs.py \
            tests/support/arrayrecord_util.py tests/arrayrecord/test_hashing.py; do
    grep -q "^aioloader-[^/]*/$want\$" <<<"$LIST" || fail "sdist lacks $want"
done
grep -q '\.so$' <<<"$LIST" && fail "sdist holds a built .so"

step "4. pip install '.[testing]' and a user's test with local_gcs()"
$PY -m venv "$WORK/user"
"$WORK/user/bin/pip" install -q "$WORK/src[testing]" pytest
mkdir "$WORK/userproj"
cat >"$WORK/userproj/test_mine.py" <<'EOF'
import aioloader as al
from aioloader.testing import local_gcs


def test_my_pipeline_reads_from_a_bucket(tmp_path):
    path = tmp_path / "train.array_record"
    with al.ArrayRecordWriter(str(path)) as w:
        for i in range(64):
            w.write(b"%d" % i)
    with local_gcs() as gcs:
        url = gcs.upload(path, "train.array_record")
        ds = al.Dataset.from_arrayrecord(url, storage_options=gcs.storage_options)
        it = ds.loader()
        try:
            got = sorted(int(r) for r in it)
        finally:
            it.close()
    assert got == list(range(64))
EOF
(cd "$WORK/userproj" && "$WORK/user/bin/python" -m pytest -q -p no:cacheprovider test_mine.py)

step "5. the sdist's own tests, run from the unpacked sdist"
tar -xzf "$SDIST" -C "$WORK"
SD=$(ls -d "$WORK"/aioloader-*/)
"$WORK/user/bin/pip" install -q -e "$SD[testing]" pytest-asyncio pytest-timeout hypothesis psutil
(cd "$SD" && "$WORK/user/bin/python" -m pytest -q -p no:cacheprovider \
    tests/arrayrecord/test_hashing.py tests/arrayrecord/test_footer.py tests/tools/test_extras.py tests/io/test_testing_gcs.py)

step "all packaging checks passed"
