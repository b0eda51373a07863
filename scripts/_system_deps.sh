# Sourced by test.sh and main.sh: system packages from Debian's apt when missing.
#   bubblewrap (bwrap): tests/test_sandbox_escapes.py attacks the python sandbox's OS isolation for real.
#   chromium: tests/test_studio_browser.py drives RLF Studio in it (Playwright's own browser download
#             is not reachable: the tests use /usr/bin/chromium, or $RLF_CHROMIUM).
#   libtcmalloc-minimal4: the caching malloc that rlf-train preloads on a CPU (rlf_trainer/run/allocator.py:
#             the DeepSearch recipe's update ran 1.5-1.7x faster with it).
# RLF_SYSTEM_DEPS picks among "bwrap chromium tcmalloc" (default: all three; main.sh: tcmalloc).
# Installs only when apt-get can run (as root, or with sudo -n); never fails the run: without a
# package its tests skip and say why, and training runs on glibc's malloc.
_rlf_apt_install() {  # _rlf_apt_install CHECK PACKAGE WHAT   (CHECK: a command that succeeds when present)
    if eval "$1" >/dev/null 2>&1; then return 0; fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "system deps: no $2 and no apt-get ($3 without it)"
        return 0
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo="sudo -n"
        else
            echo "system deps: no $2 and not root ($3 without it)"
            return 0
        fi
    fi
    echo "system deps: installing $2 ($3)"
    if [ -z "${_rlf_apt_updated:-}" ]; then
        $sudo apt-get update -qq || true
        _rlf_apt_updated=1
    fi
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null \
        || echo "system deps: could not install $2 ($3 without it)"
}
for _rlf_dep in ${RLF_SYSTEM_DEPS:-bwrap chromium tcmalloc}; do
    case "$_rlf_dep" in
        bwrap) _rlf_apt_install "command -v bwrap" bubblewrap "the bubblewrap sandbox tests" ;;
        chromium)
            if [ -z "${RLF_CHROMIUM:-}" ] || [ ! -x "${RLF_CHROMIUM}" ]; then
                _rlf_apt_install "command -v chromium" chromium "the studio browser tests"
            fi ;;
        tcmalloc) _rlf_apt_install "ls /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4" libtcmalloc-minimal4 \
            "training's caching malloc" ;;
        *) echo "system deps: unknown '$_rlf_dep' in RLF_SYSTEM_DEPS (bwrap, chromium, tcmalloc)" ;;
    esac
done
unset -f _rlf_apt_install
unset _rlf_apt_updated _rlf_dep
