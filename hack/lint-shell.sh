#!/usr/bin/env bash
# Runs shellcheck over every harness script: hack/*.sh and tests/e2e/**/*.sh, the sourced libraries
# included. Installs Debian's shellcheck when missing. Every severity (style and up) counts;
# a deliberate exception is a `# shellcheck disable=SCxxxx # reason` on the line before.
#   hack/lint-shell.sh            (make lint-shell)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ensure_pkgs shellcheck
cd "$FGPU_ROOT"
mapfile -t scripts < <(find hack tests/e2e -type f -name '*.sh' | sort)
[ ${#scripts[@]} -gt 0 ] || die "no scripts found under hack/ and tests/e2e/"
# -x -P SCRIPTDIR: follow `source "$(dirname "$0")/../lib.sh"` and the like, so the variables
# and `set -e` of the libraries are known where they are used.
shellcheck --severity=style --external-sources --source-path=SCRIPTDIR "${scripts[@]}"
log "shellcheck: ${#scripts[@]} scripts clean ($(shellcheck --version | sed -n 's/^version: //p'))"
