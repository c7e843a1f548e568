#!/bin/bash
# The ckpt command line: --version; "ckpt help CMD", "ckpt CMD --help" and "ckpt CMD -h" print
# that command's usage on stdout and exit 0 for every command (even with a store that does not
# exist); a wrong argument exits 2 naming the command and printing its usage; an unknown command
# exits 2 with the list of commands; errors name the store, the path and the reason.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

COMMANDS="stat fsck gc ls check export verify du"
OUT=$WORK/out
ERR=$WORK/err

# run_ckpt ARGS...: run ckpt with stdout in $OUT, stderr in $ERR; sets RC
run_ckpt() {
	timeout -k 5 30 "$CKPT" "$@" >"$OUT" 2>"$ERR"
	RC=$?
}

# shows FILE DESC FIXED-STRING: FILE contains FIXED-STRING (the file is shown on failure)
shows() {
	if grep -qF -- "$3" "$1"; then
		ok "$2"
	else
		not_ok "$2 (no '$3')"
		indent "$1"
	fi
}

# ---------------------------------------------------------------- version and the command list
run_ckpt --version
assert_eq 0 "$RC" "ckpt --version exits 0"
assert_eq 1 "$(grep -cE '^ckpt \(ckptfs\) [0-9]+\.[0-9]+' "$OUT")" "ckpt --version prints 'ckpt (ckptfs) VERSION'"

for h in help --help -h; do
	run_ckpt $h
	assert_eq 0 "$RC" "ckpt $h exits 0"
	for c in $COMMANDS; do
		shows "$OUT" "ckpt $h lists '$c'" "  $c "
	done
done

run_ckpt
assert_eq 2 "$RC" "ckpt without arguments exits 2"
shows "$ERR" "ckpt without arguments prints the usage on stderr" "usage: ckpt COMMAND"

run_ckpt frobnicate "$STORE"
assert_eq 2 "$RC" "ckpt with an unknown command exits 2"
shows "$ERR" "an unknown command is named" "unknown command 'frobnicate'"
shows "$ERR" "an unknown command gets the list of commands" "  export "

run_ckpt help frobnicate
assert_eq 2 "$RC" "ckpt help with an unknown command exits 2"
shows "$ERR" "ckpt help names the unknown command" "unknown command 'frobnicate'"

# ---------------------------------------------------------------- help for every command
for c in $COMMANDS; do
	run_ckpt help "$c"
	assert_eq 0 "$RC" "ckpt help $c exits 0"
	assert_eq "usage: ckpt $c " "$(head -n 1 "$OUT" | cut -c1-$((13 + ${#c})))" \
		"ckpt help $c starts with its usage line"
	assert_eq "" "$(cat "$ERR")" "ckpt help $c writes nothing on stderr"
	cp "$OUT" "$WORK/help_$c"
	for h in --help -h; do
		run_ckpt "$c" $h
		assert_eq 0 "$RC" "ckpt $c $h exits 0"
		check "ckpt $c $h prints the same as ckpt help $c" cmp "$OUT" "$WORK/help_$c"
	done
	# help wins over everything else on the line, a missing store included
	run_ckpt "$c" "$T_DIR/no/such/store" a b --help
	assert_eq 0 "$RC" "ckpt $c MISSING-STORE ... --help exits 0"
	check "ckpt $c MISSING-STORE ... --help prints its help" cmp "$OUT" "$WORK/help_$c"
done
shows "$WORK/help_export" "ckpt help export describes --layout" "--layout tpT_ppP"
shows "$WORK/help_check" "ckpt help check describes --tp-rules" "--tp-rules FILE"

# ---------------------------------------------------------------- wrong arguments
# usage_error DESC WANT ARGS...: ckpt ARGS... exits 2, stderr names "ckpt CMD:" (CMD = the first
# of ARGS) with the fixed string WANT, and ends with CMD's usage line; nothing on stdout
usage_error() {
	local desc=$1 want=$2 c=$3
	shift 2
	run_ckpt "$@"
	assert_eq 2 "$RC" "$desc: exit 2"
	shows "$ERR" "$desc: names the command and the problem" "ckpt $c: $want"
	assert_eq "$(head -n 1 "$WORK/help_$c")" "$(tail -n 1 "$ERR")" "$desc: prints the command's usage"
	assert_eq "" "$(cat "$OUT")" "$desc: nothing on stdout"
}

for c in $COMMANDS; do
	usage_error "ckpt $c without a store" "missing STORE" "$c"
	usage_error "ckpt $c with an unknown option" "unknown option '--frobnicate'" \
		"$c" "$STORE" --frobnicate
done
for h in help --help; do
	run_ckpt $h
	shows "$OUT" "ckpt $h lists 'prune'" "  prune "
done
run_ckpt help prune
assert_eq 0 "$RC" "ckpt help prune exits 0"
cp "$OUT" "$WORK/help_prune"
usage_error "ckpt prune without a directory" "missing DIR" prune
usage_error "ckpt prune without a rule" "give --keep-last N or --keep-every K" prune "$WORK"
usage_error "ckpt prune with --keep-last 0" "invalid --keep-last '0'" prune "$WORK" --keep-last 0
usage_error "ckpt prune with --keep-every x" "invalid --keep-every 'x'" prune "$WORK" --keep-every x
usage_error "ckpt verify with --sample 101%" "invalid --sample '101%'" verify "$STORE" --sample 101%
usage_error "ckpt verify with --sample x" "invalid --sample 'x'" verify "$STORE" --sample x
usage_error "ckpt verify with --bytes 0" "invalid --bytes '0'" verify "$STORE" --bytes 0
usage_error "ckpt verify with --json" "unknown option '--json'" verify "$STORE" --json
usage_error "ckpt stat with --progress" "unknown option '--progress'" stat "$STORE" --progress
usage_error "ckpt stat with two stores" "unexpected argument 'extra'" stat "$STORE" extra
usage_error "ckpt fsck with two stores" "unexpected argument 'extra'" fsck "$STORE" extra
usage_error "ckpt gc with two stores" "unexpected argument 'extra'" gc "$STORE" extra
usage_error "ckpt ls with two paths" "unexpected argument 'extra'" ls "$STORE" / extra
usage_error "ckpt check without a path" "missing PATH" check "$STORE"
usage_error "ckpt check with --layout" "unknown option '--layout'" check "$STORE" / --layout tp2_pp1
usage_error "ckpt check --tp-rules without a value" "option '--tp-rules' needs a value" \
	check "$STORE" / --tp-rules
usage_error "ckpt export without --layout" "option '--layout' is required" export "$STORE" / "$WORK/x"
usage_error "ckpt export without OUTDIR" "missing OUTDIR" export "$STORE" / --layout tp2_pp1
usage_error "ckpt export with a bad layout" "invalid layout 'tp0_pp1'" \
	export "$STORE" / --layout tp0_pp1 "$WORK/x"
usage_error "ckpt export with a bad --layout=" "invalid layout 'x'" \
	export "$STORE" / --layout=x "$WORK/x"
usage_error "ckpt export --layout without a value" "option '--layout' needs a value" \
	export "$STORE" / "$WORK/x" --layout

# ---------------------------------------------------------------- errors name store, path, reason
run_ckpt stat "$T_DIR/no/such/store"
assert_eq 1 "$RC" "ckpt stat on a missing store exits 1"
shows "$ERR" "ckpt stat on a missing store names it" "$T_DIR/no/such/store"

start_daemon || bail "mount $STORE"
mkdir -p "$MNT/ckpts" || fail "mkdir in the mount"
echo data >"$MNT/ckpts/plain.txt" || fail "write in the mount"
run_ckpt fsck "$STORE"
assert_eq 1 "$RC" "ckpt fsck on a mounted store exits 1"
shows "$ERR" "ckpt fsck on a mounted store names the store" "$STORE"
shows "$ERR" "ckpt fsck on a mounted store says why" "mounted or in use"
stop_daemon || fail "unmount"

run_ckpt ls "$STORE" /ckpts
assert_eq 0 "$RC" "ckpt ls STORE /ckpts exits 0"
run_ckpt ls "$STORE" /nosuch
assert_eq 1 "$RC" "ckpt ls on a missing path exits 1"
shows "$ERR" "ckpt ls on a missing path names store, path and reason" \
	"$STORE: /nosuch: No such file or directory"
run_ckpt check "$STORE" /ckpts/plain.txt
assert_eq 1 "$RC" "ckpt check on a file exits 1"
shows "$ERR" "ckpt check on a file names store, path and reason" \
	"$STORE: /ckpts/plain.txt: Not a directory"
run_ckpt check "$STORE" /ckpts --tp-rules "$WORK/no-rules"
assert_eq 1 "$RC" "ckpt check with a missing rules file exits 1"
shows "$ERR" "ckpt check with a missing rules file names it" "$WORK/no-rules"
run_ckpt export "$STORE" /nosuch --layout tp2_pp1 "$WORK/exp"
assert_eq 1 "$RC" "ckpt export of a missing path exits 1"
shows "$ERR" "ckpt export of a missing path names store, path and reason" \
	"$STORE: /nosuch: No such file or directory"
run_ckpt fsck "$STORE"
assert_eq 0 "$RC" "ckpt fsck on the unmounted store exits 0"
run_ckpt verify "$T_DIR/no/such/store"
assert_eq 1 "$RC" "ckpt verify on a missing store exits 1"
shows "$ERR" "ckpt verify on a missing store names it" "$T_DIR/no/such/store"
run_ckpt du "$STORE" /ckpts/plain.txt
assert_eq 1 "$RC" "ckpt du of a file exits 1"
shows "$ERR" "ckpt du of a file names store, path and reason" \
	"$STORE: /ckpts/plain.txt: Not a directory"
run_ckpt prune "$T_DIR/no/such/dir" --keep-last 1
assert_eq 1 "$RC" "ckpt prune of a missing directory exits 1"
shows "$ERR" "ckpt prune of a missing directory names it and the reason" \
	"$T_DIR/no/such/dir: cannot list: No such file or directory"

finish
