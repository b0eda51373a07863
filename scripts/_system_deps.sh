# Sourced by test.sh: system packages some tests need, from Debian's apt when missing.
#   bubblewrap (bwrap): tests/test_sandbox_escapes.py attacks the python sandbox's OS isolation for real.
#   chromium: tests/test_studio_browser.py drives RLF Studio in it (Playwright's own browser download
#             is not reachable; the tests use /usr/bin/chromium, or $RLF_CHROMIUM).
# Installs only when apt-get can run (as root, or with sudo -n); never fails the run: without a
# package its tests skip and say why.
_rlf_apt_install() {  # _rlf_apt_install COMMAND PACKAGE WHAT
    if command -v "$1" >/dev/null 2>&1; then return 0; fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "system deps: no $1 and no apt-get; the $3 tests will skip"
        return 0
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo="sudo -n"
        else
            echo "system deps: no $1 and not root; the $3 tests will skip"
            return 0
        fi
    fi
    echo "system deps: installing $2 (for the $3 tests)"
    if [ -z "${_rlf_apt_updated:-}" ]; then
        $sudo apt-get update -qq || true
        _rlf_apt_updated=1
    fi
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null \
        || echo "system deps: could not install $2; the $3 tests will skip"
}
_rlf_apt_install bwrap bubblewrap "bubblewrap sandbox"
if [ -z "${RLF_CHROMIUM:-}" ] || [ ! -x "${RLF_CHROMIUM}" ]; then
    _rlf_apt_install chromium chromium "studio browser"
fi
unset -f _rlf_apt_install
unset _rlf_apt_updated
