# Sourced by gpu_check.sh and gpu_train_sweep.sh: a payload split into parts of under 64 MiB, each
# carried by one device call and staged into $STASH, which outlives the calls while the machine
# stays up. The caller sets PARTS (the parts' folder in the repository), STASH and PART_NAME (the
# parts are $PART_NAME.part0, .part1, ...; SHA256SUMS lists each part and the joined WHOLE).

# Copy the parts present in $PARTS (and SHA256SUMS) to the stash.
stage() {
    mkdir -p "$STASH"
    local f got=0
    for f in "$PARTS"/"$PART_NAME".part* "$PARTS"/SHA256SUMS; do
        [ -f "$f" ] || continue
        cp -f "$f" "$STASH/" && got=$((got + 1))
    done
    echo "staged $got file(s) from $PARTS into $STASH; the stash holds: $(cd "$STASH" && ls | tr '\n' ' ')"
}

# Are all parts in the stash, with their checksums? Prints what is missing.
parts_complete() {
    [ -f "$STASH/SHA256SUMS" ] || { echo "no SHA256SUMS in $STASH: carry $PARTS/SHA256SUMS"; return 1; }
    local missing
    missing=$(awk '$2 != "WHOLE" {print $2}' "$STASH/SHA256SUMS" | while read -r p; do [ -f "$STASH/$p" ] || echo "$p"; done)
    if [ -n "$missing" ]; then
        echo "missing in $STASH: $missing (carry each part from $PARTS with --stage; a machine started afresh has none)"
        return 1
    fi
    (cd "$STASH" && grep -v ' WHOLE$' SHA256SUMS | sha256sum -c --quiet) || { echo "a part's checksum differs"; return 1; }
    local whole
    whole=$(cat "$STASH"/"$PART_NAME".part* | sha256sum | cut -d' ' -f1)
    grep -q "^$whole  WHOLE$" "$STASH/SHA256SUMS" || { echo "the joined parts' checksum differs"; return 1; }
    echo "parts: checksums ok"
}

# xz -dc, or Python's lzma where xz is not installed.
unxz_stream() {
    if command -v xz >/dev/null 2>&1; then xz -dc; else "$PYTHON" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer, 1 << 20)'; fi
}
