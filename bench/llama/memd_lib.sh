# Sourced by the bench/llama scripts: what they share about the daemon they run.
# wait_memd_up LOG PID WHO: until airs-memd (PID, logging to LOG) serves its
# bus name; exits the script with its log when it died or never got there.
wait_memd_up() {
  for _ in $(seq 200); do
    grep -q "serving org.aios.Airs1" "$1" && return 0
    kill -0 "$2" 2>/dev/null || { cat "$1" >&2; exit 1; }
    sleep 0.05
  done
  echo "$3: airs-memd did not start" >&2; exit 1
}
