#!/bin/bash
# make install, as a user gets it: "make install DESTDIR=..." of the build tree puts in place
# the daemon, ckpt, the mount(8) helper, the man pages ckptfs(8) and ckpt(1), the bash
# completion of ckpt, and libckptfs with its header and pkg-config file.  The man pages are in
# step with the programs: every ckptfs option and every ckpt command and option that --help
# prints is in the man page (and in the user guide), and nothing else is; the installed
# completion completes ckpt's commands, options and arguments.  Mounting through the installed
# helper is t_mount.sh.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

need make bash python3
SRC=$(cd "$LIB_DIR/../.." && pwd)
# the build tree: where $CKPTFS was built (fs/ckptfs under it), unless BUILDDIR says
BUILDDIR=${BUILDDIR:-$(cd "$(dirname "$CKPTFS")/.." && pwd)}
[ -f "$BUILDDIR/Makefile" ] || bail "no Makefile in $BUILDDIR (set BUILDDIR to the configured build tree)"

# ---------------------------------------------------------------- make install
DEST=$T_DIR/root
# a make of its own, not a child of the make check that may be running this test
if env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$BUILDDIR" install DESTDIR="$DEST" \
	>"$T_DIR/install.log" 2>&1; then
	ok "make install DESTDIR=... succeeds"
else
	not_ok "make install DESTDIR=... succeeds"
	tail -n 20 "$T_DIR/install.log" | sed 's/^/#   /'
	finish
fi

# installed PATTERN DESC: exactly one installed file matches the find -path PATTERN; sets FOUND
installed() {
	local n
	FOUND=$(find "$DEST" -path "$DEST$1" \( -type f -o -type l \) | head -n 2)
	n=$(grep -c . <<<"$FOUND")
	if [ "$n" -eq 1 ]; then
		ok "installs $2 (${FOUND#"$DEST"})"
	else
		not_ok "installs $2 ($1: $n files)"
		FOUND=
	fi
}
installed '*/bin/ckptfs' "the daemon"
DAEMON=$FOUND
installed '*/bin/ckpt' "ckpt"
TOOL=$FOUND
installed '*/mount.fuse.ckptfs' "the mount helper"
HELPER=$FOUND
installed '*/man/man8/ckptfs.8' "the man page ckptfs(8)"
MAN8=$FOUND
installed '*/man/man1/ckpt.1' "the man page ckpt(1)"
MAN1=$FOUND
installed '*/man/man8/mount.fuse.ckptfs.8' "the man page of the helper (a link to ckptfs(8))"
check "mount.fuse.ckptfs(8) sources ckptfs(8)" grep -qx '.so man8/ckptfs.8' "$FOUND"
installed '*/bash-completion/completions/ckpt' "the bash completion of ckpt"
COMPLETION=$FOUND
installed '*/include/ckptfs.h' "the trainer library's header"
installed '*/lib*/libckptfs.so.0' "the trainer library (soname libckptfs.so.0)"
installed '*/lib*/libckptfs.so' "the trainer library's link for -lckptfs"
installed '*/pkgconfig/ckptfs.pc' "the trainer library's pkg-config file"
[ -n "$DAEMON" ] && [ -n "$TOOL" ] && [ -n "$HELPER" ] && [ -n "$MAN8" ] && [ -n "$MAN1" ] &&
	[ -n "$COMPLETION" ] || bail "files missing from the installation (above)"
for f in "$DAEMON" "$TOOL" "$HELPER"; do
	check "${f#"$DEST"} is executable" test -x "$f"
done
# the helper runs the daemon of the same installation: its BINDIR is where the daemon went
bindir=$(sed -n "s/^BINDIR='\(.*\)'$/\1/p" "$HELPER")
assert_eq "$(dirname "${DAEMON#"$DEST"}")" "$bindir" "the helper starts the installed daemon"
version=$("$DAEMON" --version 2>/dev/null | sed -n 's/^ckptfs \([^,]*\),.*/\1/p')
[ -n "$version" ] || not_ok "ckptfs --version prints 'ckptfs VERSION, libfuse ...'"
check "ckptfs(8) is a man page of section 8 with the version" \
	grep -qxF ".TH CKPTFS 8 \"\" \"ckptfs $version\" \"System Administration\"" "$MAN8"
check "ckpt(1) is a man page of section 1 with the version" \
	grep -qxF ".TH CKPT 1 \"\" \"ckptfs $version\" \"User Commands\"" "$MAN1"

# ---------------------------------------------------------------- the man pages against --help
"$DAEMON" --help >"$T_DIR/ckptfs.help" 2>&1
"$TOOL" help >"$T_DIR/ckpt.help" 2>&1
for c in $(sed -n 's/^  \([a-z][a-z0-9-]*\)\( .*\)\{0,1\}$/\1/p' "$T_DIR/ckpt.help"); do
	"$TOOL" help "$c" >"$T_DIR/ckpt.help.$c" 2>&1
done
py_checks "man pages and user guide against --help" "$T_DIR" "$SRC" "$MAN8" "$MAN1" <<'EOF'
import glob, os, re, sys
tdir, src, man8, man1 = sys.argv[1:5]
failed = False

def check(cond, desc, detail=""):
    global failed
    print(("ok - " if cond else "not ok - ") + desc)
    if not cond:
        failed = True
        if detail:
            print(detail)

def section(text, title):
    """the lines of the markdown section '# title', up to the next '# ' heading"""
    m = re.search(r"^# " + re.escape(title) + r"\n(.*?)(?=^# |\Z)", text, re.M | re.S)
    return m.group(1) if m else ""

def same(want, got, desc, want_name, got_name):
    check(want == got, desc,
          f"in {want_name} only: {sorted(want - got)}; in {got_name} only: {sorted(got - want)}")

opt = r"(-o [a-z_]+|-[a-zA-Z])\b"
# ckptfs: its own options are the "ckptfs options:" block of --help (libfuse's follow)
helptext = open(os.path.join(tdir, "ckptfs.help")).read()
block = helptext.split("ckptfs options:\n", 1)[-1].split("\n\n", 1)[0]
help_opts = set(re.findall(r"^  " + opt, block, re.M))
check(len(help_opts) >= 10, f"ckptfs --help lists its options ({len(help_opts)})")
md8 = open(os.path.join(src, "docs/man/ckptfs.8.md")).read()
man_opts = set(re.findall(r"^\*\*" + opt, section(md8, "OPTIONS"), re.M))
same(help_opts, man_opts, "ckptfs(8) OPTIONS documents exactly the options of ckptfs --help",
     "--help", "ckptfs.8.md")
guide = open(os.path.join(src, "docs/user-guide.md")).read()
guide_opts = set(re.findall(r"^\| `" + opt, guide, re.M))
same(help_opts, guide_opts, "the user guide's option table has exactly the options of ckptfs --help",
     "--help", "user-guide.md")
roff8 = open(man8).read()
missing = sorted(o for o in help_opts if o.split()[-1].lstrip("-") not in roff8)
check(not missing, "every option is in the installed ckptfs(8)", f"missing: {missing}")

# ckpt: the commands of "ckpt help", each with its usage line and options
listing = open(os.path.join(tdir, "ckpt.help")).read()
help_cmds = set(re.findall(r"^  ([a-z][a-z0-9-]*)(?: |$)", listing, re.M))
check(len(help_cmds) >= 5, f"ckpt help lists its commands ({len(help_cmds)})")
md1 = open(os.path.join(src, "docs/man/ckpt.1.md")).read()
cmds_sec = section(md1, "COMMANDS")
man_heads = {c: head for head, c in re.findall(r"^### (ckpt ([a-z0-9-]+).*)$", cmds_sec, re.M)}
same(help_cmds, set(man_heads), "ckpt(1) COMMANDS has exactly the commands of ckpt help",
     "ckpt help", "ckpt.1.md")
for c in sorted(help_cmds & set(man_heads)):
    text = open(os.path.join(tdir, "ckpt.help." + c)).read()
    usage = text.splitlines()[0] if text else ""
    check(usage == "usage: " + man_heads[c], f"ckpt(1): the heading of {c} is its usage line",
          f"ckpt help {c}: '{usage}'; ckpt.1.md: '### {man_heads[c]}'")
    sub = re.search(r"^### ckpt " + re.escape(c) + r"\b.*?\n(.*?)(?=^#+ |\Z)", cmds_sec,
                    re.M | re.S).group(1)
    same(set(re.findall(r"--[a-z][a-z0-9-]*", text)),
         set(re.findall(r"^\*\*(--[a-z][a-z0-9-]*)\*\*", sub, re.M)),
         f"ckpt(1) documents exactly the options of ckpt help {c}", "ckpt help", "ckpt.1.md")
    check(re.search(r"\bckpt " + re.escape(c) + r"\b", guide) is not None,
          f"the user guide documents ckpt {c}")
roff1 = open(man1).read()
missing = sorted(c for c in help_cmds if not re.search(r"^\.SS ckpt " + c + r"\b", roff1, re.M))
check(not missing, "every command has its section in the installed ckpt(1)", f"missing: {missing}")
sys.exit(1 if failed else 0)
EOF

# ---------------------------------------------------------------- bash completion
mkdir -p "$WORK/comp/store_a" "$WORK/comp/store_b"
: >"$WORK/comp/rules.txt"
# complete WORD...: the completions of the command line WORD... (the last word is completed)
complete_line() {
	PATH=$(dirname "$TOOL"):$PATH bash -c '. "$1"; shift
		COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _ckpt; printf "%s\n" "${COMPREPLY[@]}"' \
		_ "$COMPLETION" "$@" 2>&1 | sort | tr '\n' ' ' | sed 's/ $//'
}
check "the completion registers _ckpt for ckpt" \
	bash -c '. "$1"; complete -p ckpt | grep -q -- "-F _ckpt ckpt"' _ "$COMPLETION"
assert_eq "$(sed -n 's/^  \([a-z][a-z0-9-]*\)\( .*\)\{0,1\}$/\1/p' "$T_DIR/ckpt.help" |
	{ cat; printf '%s\n' help --help --version; } | sort | tr '\n' ' ' | sed 's/ $//')" \
	"$(complete_line ckpt '')" "ckpt <TAB>: the commands of ckpt help, help, --help, --version"
assert_eq "gc" "$(complete_line ckpt g)" "ckpt g<TAB>: gc"
assert_eq "export" "$(complete_line ckpt help ex)" "ckpt help ex<TAB>: export"
assert_eq "--help --layout --meta --no-progress --progress --tp-rules" "$(complete_line ckpt export /s --)" \
	"ckpt export STORE --<TAB>: export's options"
assert_eq "$WORK/comp/store_a $WORK/comp/store_b" "$(complete_line ckpt stat "$WORK/comp/s")" \
	"ckpt stat <TAB>: directories for STORE"
assert_eq "$WORK/comp/rules.txt" "$(complete_line ckpt check /s p --tp-rules "$WORK/comp/r")" \
	"ckpt check ... --tp-rules <TAB>: files for FILE"
assert_eq "" "$(complete_line ckpt export /s "$WORK/comp/s")" \
	"ckpt export STORE <TAB>: nothing for a PATH inside the store"
assert_eq "$WORK/comp/store_a $WORK/comp/store_b" \
	"$(complete_line ckpt export /s --layout tp2_pp1 p "$WORK/comp/s")" \
	"ckpt export STORE --layout L PATH <TAB>: directories for OUTDIR"
assert_eq "--bytes --help --meta --no-progress --progress --sample --seed" \
	"$(complete_line ckpt verify /s --)" "ckpt verify STORE --<TAB>: verify's options"
assert_eq "" "$(complete_line ckpt verify /s --bytes "$WORK/comp/s")" \
	"ckpt verify STORE --bytes <TAB>: nothing for a SIZE"
assert_eq "$WORK/comp/store_a $WORK/comp/store_b" "$(complete_line ckpt prune "$WORK/comp/s")" \
	"ckpt prune <TAB>: directories for DIR"
assert_eq "" "$(complete_line ckpt du /s "$WORK/comp/s")" \
	"ckpt du STORE <TAB>: nothing for a PATH inside the store"

finish
