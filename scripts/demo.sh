#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the demonstration on the built-in
# defaults. Today that is the simulator comparison of DESIGN §7 on the shipped traces with the
# paper's ipaq-2004 profile: static cache vs adaptive (K=50), the knob sweep, and ghost hints
# on and off.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

ghost_install
ghost_build

ghost_log "simulating the shipped traces (common/traces) on ipaq-2004"
python3 "$GHOST_ROOT/scripts/sim_report.py" "$GHOST_BUILD/fs/ghostsim" "$GHOST_ROOT/common/traces" "$@"
