#!/usr/bin/env bash
# A real single-host SLURM cluster (Debian slurm-wlm + munge) for the SLURM tests.
#
#   scripts/slurm-cluster.sh up       install if missing (root), write config, start daemons, wait for idle
#   scripts/slurm-cluster.sh down     stop what `up` started (idempotent)
#   scripts/slurm-cluster.sh status   print daemon pids and `sinfo`; exit 0 only when the node answers
#   scripts/slurm-cluster.sh env      print `export SLURM_CONF=...; export PATH=...` for `eval "$(...)"`
#
# Everything lives in one state dir (GPTLAB_SLURM_DIR, default /tmp/gptlab-slurm): slurm.conf, a private
# munged socket, daemon state/spool/logs and bin/sacct. There is no slurmdbd: job completions go to a
# jobcomp/filetxt log and bin/sacct (scripts/sacct-wrapper) answers submitit's `sacct` queries from it and
# from squeue, so a cancelled or failed job is seen as finished instead of hanging the caller.
#
# GPTLAB_SLURM_NODES=N (default 1) runs N slurmd daemons on this host (nodes node1..nodeN, slurmd ports
# GPTLAB_SLURMD_PORT+0..N-1, CPUs and memory split between them) so multi-node jobs really span nodes.
# With 1 the single node is `localhost`, as before. `down`/`status` follow the nodes in the written config.
set -euo pipefail

DIR="${GPTLAB_SLURM_DIR:-/tmp/gptlab-slurm}"
SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONF="$DIR/etc/slurm.conf"
PARTITION="${GPTLAB_SLURM_PARTITION:-debug}"
CTLD_PORT="${GPTLAB_SLURMCTLD_PORT:-6817}"
SLURMD_PORT="${GPTLAB_SLURMD_PORT:-6818}"
UP_TIMEOUT="${GPTLAB_SLURM_UP_TIMEOUT:-60}"
CRED_EXPIRE="${GPTLAB_SLURM_CRED_EXPIRE:-10}"
NODES="${GPTLAB_SLURM_NODES:-1}"
MUNGE_SOCKET="$DIR/munge/munge.socket.2"
PKGS=(slurm-wlm slurmctld slurmd slurm-client munge)

log() { echo "slurm-cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

pid_alive() {
    # The pid file names a live process of the expected program (a stale file may name a reused pid).
    # The program is $2, else the pid file's name less .pid.
    local pid
    [[ -s "$1" ]] || return 1
    pid=$(cat "$1")
    kill -0 "$pid" 2>/dev/null && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "${2:-$(basename "$1" .pid)}" ]]
}

node_names() {
    # The nodes of the written config (one per line), else the ones GPTLAB_SLURM_NODES asks for.
    local i
    if [[ -f "$CONF" ]]; then sed -n 's/^NodeName=\([^ ]*\) .*/\1/p' "$CONF"; return 0; fi
    if (( NODES == 1 )); then echo localhost; else for (( i = 1; i <= NODES; i++ )); do echo "node$i"; done; fi
}

slurmd_pidfile() {
    # One node keeps the historical name; several use SlurmdPidFile=.../slurmd-%n.pid.
    if [[ $(node_names | wc -l) -eq 1 ]]; then echo "$DIR/run/slurmd.pid"; else echo "$DIR/run/slurmd-$1.pid"; fi
}

install_packages() {
    # Only install what is missing; apt-get update at most once per call.
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sinfo >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    [[ ${#missing[@]} -eq 0 ]] && return 0
    [[ $(id -u) -eq 0 ]] || die "missing ${missing[*]}; run as root to install ${PKGS[*]}"
    log "installing ${PKGS[*]} (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
}

ensure_munge_key() {
    # Debian's postinst creates the key; a pre-seeded image may lack it.
    [[ -s /etc/munge/munge.key ]] && return 0
    log "creating /etc/munge/munge.key"
    install -d -o munge -g munge -m 700 /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 600 /etc/munge/munge.key
}

node_memory_mb() {
    # 90% of what slurmd detects: declaring more than the host has leaves the node `inval`.
    local mem
    mem=$(slurmd -C 2>/dev/null | tr ' ' '\n' | sed -n 's/^RealMemory=//p')
    [[ -n "$mem" ]] || die "cannot read RealMemory from 'slurmd -C'"
    echo $(( mem * 9 / 10 ))
}

write_config() {
    local host cpus mem spool pidfile logfile nodelines nodelist i
    [[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "GPTLAB_SLURM_NODES must be a positive integer (got '$NODES')"
    host=$(hostname -s)
    cpus=$(( $(nproc) / NODES )); (( cpus >= 1 )) || cpus=1
    mem=$(( $(node_memory_mb) / NODES )); (( mem >= 1 )) || mem=1
    mkdir -p "$DIR"/{etc,state,spool,log,run,bin}
    install -d -o munge -g munge -m 755 "$DIR/munge"
    if (( NODES == 1 )); then
        spool="${DIR}/spool" pidfile="${DIR}/run/slurmd.pid" logfile="${DIR}/log/slurmd.log" nodelist=localhost
        nodelines="NodeName=localhost NodeHostname=${host} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem} State=UNKNOWN"
    else
        # Several slurmd on one host: each node has its own port, and %n (the node name) keeps their
        # spool dirs, pid files and logs apart.
        spool="${DIR}/spool/%n" pidfile="${DIR}/run/slurmd-%n.pid" logfile="${DIR}/log/slurmd-%n.log"
        nodelist="node[1-${NODES}]" nodelines=""
        for (( i = 1; i <= NODES; i++ )); do
            nodelines+="${nodelines:+$'\n'}NodeName=node$i NodeHostname=${host} NodeAddr=127.0.0.1 Port=$(( SLURMD_PORT + i - 1 )) CPUs=${cpus} RealMemory=${mem} State=UNKNOWN"
            mkdir -p "$DIR/spool/node$i"
        done
    fi
    cat > "$CONF" <<EOF
# Written by scripts/slurm-cluster.sh up (rewritten whenever slurmctld is not running).
ClusterName=gptlab
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${CTLD_PORT}
SlurmdPort=${SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=${MUNGE_SOCKET},cred_expire=${CRED_EXPIRE}
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=${DIR}/state
SlurmdSpoolDir=${spool}
SlurmctldPidFile=${DIR}/run/slurmctld.pid
SlurmdPidFile=${pidfile}
SlurmctldLogFile=${DIR}/log/slurmctld.log
SlurmdLogFile=${logfile}
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
# No slurmdbd: completions go to a text file that bin/sacct reads.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=${DIR}/log/jobcomp.txt
# Preempted/timed-out jobs may be requeued (submitit checkpointing relies on it).
JobRequeue=1
ReturnToService=2
KillWait=5
# Test cluster: rescan pending jobs every 2 s (default 60/30 s) so requeued jobs restart promptly.
SchedulerParameters=sched_interval=2,bf_interval=2
InactiveLimit=0
MinJobAge=600
${nodelines}
PartitionName=${PARTITION} Nodes=${nodelist} Default=YES MaxTime=INFINITE State=UP
EOF
    ln -sf "$SCRIPTS/sacct-wrapper" "$DIR/bin/sacct"
    touch "$DIR/log/jobcomp.txt"
}

start_munge() {
    if pid_alive "$DIR/munge/munged.pid"; then return 0; fi
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCKET" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" \
        --seed-file="$DIR/munge/munged.seed" \
        || die "munged failed to start; see $DIR/munge/munged.log"
}

start_slurm() {
    export SLURM_CONF="$CONF"
    if ! pid_alive "$DIR/run/slurmctld.pid"; then
        slurmctld -f "$CONF" || die "slurmctld failed; see $DIR/log/slurmctld.log"
    fi
    local node
    for node in $(node_names); do
        if ! pid_alive "$(slurmd_pidfile "$node")" slurmd; then
            slurmd -f "$CONF" -N "$node" || die "slurmd -N $node failed; see $DIR/log/"
        fi
    done
}

wait_idle() {
    # Bounded wait: every node must report idle (or mixed/alloc when jobs from an earlier run linger).
    local deadline=$(( SECONDS + UP_TIMEOUT )) node state="" ready
    while (( SECONDS < deadline )); do
        ready=1
        for node in $(node_names); do
            state=$(SLURM_CONF="$CONF" timeout 5 sinfo -h -n "$node" -o %t 2>/dev/null || true)
            case "$state" in
                idle|mix|alloc) ;;
                down*|drain*|inval*) ready=0; SLURM_CONF="$CONF" scontrol update nodename="$node" state=resume 2>/dev/null || true ;;
                *) ready=0 ;;
            esac
            (( ready )) || break
        done
        (( ready )) && return 0
        sleep 0.5
    done
    die "node ${node} not idle after ${UP_TIMEOUT}s (state '${state}'); see $DIR/log/"
}

cmd_up() {
    local t0=$SECONDS
    install_packages
    [[ $(id -u) -eq 0 ]] || die "'up' must run as root (SlurmUser=root, munged runs as user munge)"
    ensure_munge_key
    if ! pid_alive "$DIR/run/slurmctld.pid"; then write_config; fi
    start_munge
    start_slurm
    wait_idle
    log "up in $(( SECONDS - t0 ))s: $(SLURM_CONF="$CONF" sinfo -h -o '%P %t %c CPUs %m MB')"
    log "use it with: eval \"\$($0 env)\""
}

stop_pidfile() {
    # SIGTERM, then wait up to 10 s, then SIGKILL: `down` must always finish. $2: program, as for pid_alive.
    local pidfile=$1 pid i
    pid_alive "$pidfile" "${2:-}" || { rm -f "$pidfile"; return 0; }
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
}

cmd_down() {
    if [[ -f "$CONF" ]] && pid_alive "$DIR/run/slurmctld.pid"; then
        SLURM_CONF="$CONF" timeout 10 scancel --user=root 2>/dev/null || true
        SLURM_CONF="$CONF" timeout 10 scontrol shutdown 2>/dev/null || true
    fi
    local pidfile
    for pidfile in "$DIR"/run/slurmd.pid "$DIR"/run/slurmd-*.pid; do
        [[ -e "$pidfile" ]] && stop_pidfile "$pidfile" slurmd
    done
    stop_pidfile "$DIR/run/slurmctld.pid"
    if pid_alive "$DIR/munge/munged.pid"; then
        runuser -u munge -- /usr/sbin/munged --stop --socket="$MUNGE_SOCKET" >/dev/null 2>&1 || true
        stop_pidfile "$DIR/munge/munged.pid"
    fi
    log "down (state kept in $DIR)"
}

cmd_status() {
    local name pidfile node rc=0
    for name in munged slurmctld; do
        case $name in munged) pidfile="$DIR/munge/munged.pid" ;; *) pidfile="$DIR/run/$name.pid" ;; esac
        if pid_alive "$pidfile"; then echo "$name: running (pid $(cat "$pidfile"))"; else echo "$name: stopped"; rc=1; fi
    done
    for node in $(node_names); do
        pidfile=$(slurmd_pidfile "$node") name=slurmd
        [[ "$node" == localhost ]] || name="slurmd $node"
        if pid_alive "$pidfile" slurmd; then echo "$name: running (pid $(cat "$pidfile"))"; else echo "$name: stopped"; rc=1; fi
    done
    if [[ -f "$CONF" ]]; then SLURM_CONF="$CONF" timeout 5 sinfo || rc=1; fi
    return $rc
}

cmd_env() {
    echo "export SLURM_CONF=$CONF; export PATH=$DIR/bin:\$PATH"
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) cmd_env ;;
    *) echo "usage: $0 up|down|status|env   (state dir: GPTLAB_SLURM_DIR=$DIR)" >&2; exit 2 ;;
esac
