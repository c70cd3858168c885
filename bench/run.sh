#!/usr/bin/env bash
# bench/run.sh: the side-by-side lock benchmark, end to end, on both stores.
#
# Installs redis-server and wrk with apt when missing, builds bench/cmd/lockbench (its own Go
# module, so the library never depends on its competitors), runs the library's Go benchmarks
# and every scenario against a redis-server that lockbench starts on a free loopback port, and
# writes docs/benchmarks.md, docs/benchmarks.png, docs/benchmarks-scaling-{goroutines,processes,keys}.png
# and docs/benchmarks.json (scenarios 1-9 and 13), and docs/benchmarks-primitives.md (scenarios 10-12: semaphores,
# read-write locks, fair locks), after the etcd rows (lockbench -store etcd: docs/benchmarks-etcd.md) and the
# ZooKeeper rows (lockbench -store zookeeper: docs/benchmarks-zookeeper.md). docs/benchmarks.md links the other
# three reports, with the goals of the etcd and ZooKeeper ones, and ends with bench/analysis.md. Scenario 6 runs the
# example system (example/app, config etc/flightlock-example-redis.yaml) inside lockbench and
# loads it with wrk.
#
# A full run takes about half an hour on 2 cores, the Redis scenarios about 22 minutes of it (scenario 8,
# scaling, the longest). Pass lockbench flags through, e.g.:
#   bench/run.sh -quick                    # every scenario, small sizes, one repetition: a few minutes;
#                                          # writes bench/results/quick/ (git-ignored), not docs/
#   bench/run.sh -scenario 1,5 -reps 1     # a quick look, without the Go benchmarks
#   LOCKBENCH_GOBENCH=0 bench/run.sh -scenario 10,11,12   # the primitives alone: rewrite docs/benchmarks-primitives.md only
#   LOCKBENCH_GOBENCH=0 bench/run.sh       # skip the Go benchmarks
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
docs="$root/docs"
benchtime=1s
quick=0
for a in "$@"; do
  if [[ "$a" == "-quick" || "$a" == "--quick" ]]; then
    # A check that every scenario runs, not figures to publish: docs/ stays as it is.
    docs="$here/results/quick"
    benchtime=100ms
    quick=1
  fi
done
mkdir -p "$docs"

# apt_install installs Debian packages, with sudo unless run as root.
apt_install() {
  echo "run.sh: installing $* with apt" >&2
  local sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
if ((${#need[@]})); then
  apt_install "${need[@]}"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "run.sh: building" >&2
(cd "$here" && go build -o "$work/lockbench" ./cmd/lockbench)

# The headline's guard, first: one key under 64 and 1,024 goroutines of one process and under
# 4 processes x 16, this tree's build against a base built from git (lockbench -guard builds
# it in a temporary worktree), the two builds' runs alternating in pairs. The base is
# LOCKBENCH_GUARD_AGAINST when set, else the build before the change being measured: the merge
# base of HEAD and main (where this branch left main), or HEAD~1 on main. A regression (a
# shape's pairs more than 10% slower, three in four of them slower) fails the run at the end
# (exit 3), after the reports are written.
hotkey_fell=0
if [[ "${LOCKBENCH_HOTKEY:-1}" != "0" ]]; then
  echo "run.sh: the hot key's guard (lockbench -guard)" >&2
  hotkeyflags=()
  [[ -n "${LOCKBENCH_GUARD_AGAINST:-}" ]] && hotkeyflags+=(-against "$LOCKBENCH_GUARD_AGAINST")
  ((quick)) && hotkeyflags+=(-cs 20000) # shorter runs; as many pairs, for the same verdict rule
  set +e
  (cd "$here" && "$work/lockbench" -guard "${hotkeyflags[@]}")
  rc=$?
  set -e
  case $rc in
    0) ;;
    3) hotkey_fell=1 ;;
    *) echo "run.sh: the hot key's guard failed (exit $rc)" >&2; exit $rc ;;
  esac
fi

gobench=()
if [[ "${LOCKBENCH_GOBENCH:-1}" != "0" ]]; then
  echo "run.sh: go test -bench in the root and middleware packages" >&2
  if (cd "$root" && go test -run '^$' -bench . -benchmem -benchtime "$benchtime" . ./middleware >"$work/gobench.txt" 2>&1); then
    grep -E '^(goos|goarch|pkg|cpu|Benchmark)' "$work/gobench.txt" >"$work/gobench.clean" || true
    gobench=(-gobench "$work/gobench.clean")
  else
    echo "run.sh: go test -bench failed:" >&2
    cat "$work/gobench.txt" >&2
    exit 1
  fi
fi

notes=()
# The hand-written analysis describes a full run; a quick run's report goes without it.
[[ -f "$here/analysis.md" && $quick == 0 ]] && notes=(-notes "$here/analysis.md")
example=(-example-config "$root/etc/flightlock-example-redis.yaml")

etcdreport=()
# The etcd rows: lockbench -store etcd starts a private etcd of its own (Debian's etcd-server).
# They run on every full or quick run, before the Redis scenarios, and docs/benchmarks.md
# points at their report with its goals (lockbench -etcd-report); LOCKBENCH_ETCD=0 skips them, and
# a run limited to some Redis scenarios (any flag but -quick) leaves them out. Its scenario 6
# (HTTP end to end) runs the example with etc/flightlock-example-etcd.yaml; -quick gives it the
# etcd quick sizes.
etcd_rows=1
for a in "$@"; do
  [[ "$a" == "-quick" || "$a" == "--quick" ]] || etcd_rows=0
done
if [[ "${LOCKBENCH_ETCD:-1}" != "0" && $etcd_rows == 1 ]]; then
  command -v etcd >/dev/null 2>&1 || apt_install etcd-server
  etcdflags=()
  ((quick)) && etcdflags=(-quick)
  echo "run.sh: etcd rows" >&2
  (cd "$here" && "$work/lockbench" -store etcd -out "$docs/benchmarks-etcd.md" -example-config "$root/etc/flightlock-example-etcd.yaml" "${etcdflags[@]}")
  echo "run.sh: wrote ${docs#"$root"/}/benchmarks-etcd.md" >&2
  etcdreport=(-etcd-report "$docs/benchmarks-etcd.md")
fi

zkreport=()
# The ZooKeeper rows: lockbench -store zookeeper starts a private ZooKeeper server of its own
# (Debian's zookeeper package, run with java), scenarios 1-3, and docs/benchmarks.md points at
# their report with its goals (lockbench -zookeeper-report). Like the etcd rows, they run on
# every full or quick run; LOCKBENCH_ZOOKEEPER=0 skips them.
if [[ "${LOCKBENCH_ZOOKEEPER:-1}" != "0" && $etcd_rows == 1 ]]; then
  if ! command -v java >/dev/null 2>&1 || [[ ! -f /usr/share/java/zookeeper.jar ]]; then
    apt_install zookeeper
  fi
  zkflags=()
  ((quick)) && zkflags=(-quick)
  echo "run.sh: ZooKeeper rows" >&2
  (cd "$here" && "$work/lockbench" -store zookeeper -out "$docs/benchmarks-zookeeper.md" "${zkflags[@]}")
  echo "run.sh: wrote ${docs#"$root"/}/benchmarks-zookeeper.md" >&2
  zkreport=(-zookeeper-report "$docs/benchmarks-zookeeper.md")
fi

echo "run.sh: running scenarios" >&2
(cd "$root" && "$work/lockbench" -out "$docs/benchmarks.md" -chart "$docs/benchmarks.png" \
  -json "$docs/benchmarks.json" -primitives-out "$docs/benchmarks-primitives.md" \
  "${gobench[@]}" "${notes[@]}" "${example[@]}" "${etcdreport[@]}" "${zkreport[@]}" "$@")
echo "run.sh: wrote what the scenarios run make of ${docs#"$root"/}/benchmarks.md, benchmarks.png, benchmarks-scaling-*.png," \
  "benchmarks.json (1-9) and benchmarks-primitives.md (10-12)" >&2
if ((hotkey_fell)); then
  echo "run.sh: REGRESSION: a hot-key shape is more than 10% slower than the guard's base build (see the table at the start)" >&2
  exit 3
fi
